// adamw.h: the optimizer of the FP32 master weights. AdamW (Loshchilov & Hutter, decoupled
// weight decay, as torch.optim.AdamW) plus clipping of the global gradient norm. The norm is a
// double sum in index order, so it is the same for any thread count.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "rl/common.h"

namespace fp8rl {

struct AdamWConfig {
    double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
};

// L2 norm of g, accumulated in double in index order.
inline double grad_norm(const float* g, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)g[i] * (double)g[i];
    return std::sqrt(s);
}

// Scales g so its norm is at most max_norm (torch's clip_grad_norm_ rule: factor
// max_norm / (norm + 1e-6), applied only when it is below 1). Returns the norm before clipping.
inline double clip_grad_norm(float* g, size_t n, double max_norm) {
    double norm = grad_norm(g, n);
    if (max_norm > 0.0 && std::isfinite(norm)) {
        double factor = max_norm / (norm + 1e-6);
        if (factor < 1.0)
            for (size_t i = 0; i < n; i++) g[i] = (float)((double)g[i] * factor);
    }
    return norm;
}

class AdamW {
public:
    AdamW() = default;
    AdamW(size_t n, AdamWConfig cfg) : cfg_(cfg), m_(n, 0.0f), v_(n, 0.0f) {}

    // One update of w [n] with gradient g [n] at learning rate lr (torch.optim.AdamW order:
    // decay, moments, bias-corrected step).
    void step(float* w, const float* g, double lr) {
        t_++;
        const double bc1 = 1.0 - std::pow(cfg_.beta1, (double)t_);
        const double bc2 = 1.0 - std::pow(cfg_.beta2, (double)t_);
        const float b1 = (float)cfg_.beta1, b2 = (float)cfg_.beta2;
        const float decay = (float)(1.0 - lr * cfg_.weight_decay);
        const float step_size = (float)(lr / bc1);
        const float sqrt_bc2 = (float)std::sqrt(bc2);
        const float eps = (float)cfg_.eps;
        const int64_t n = (int64_t)m_.size();
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++) {
            w[i] *= decay;
            m_[i] = b1 * m_[i] + (1.0f - b1) * g[i];
            v_[i] = b2 * v_[i] + (1.0f - b2) * g[i] * g[i];
            w[i] -= step_size * m_[i] / (std::sqrt(v_[i]) / sqrt_bc2 + eps);
        }
    }

    size_t size() const { return m_.size(); }
    int64_t steps_taken() const { return t_; }
    // State for checkpoints: the moments and the step count restore the optimizer exactly.
    std::vector<float>& m() { return m_; }
    std::vector<float>& v() { return v_; }
    void set_steps_taken(int64_t t) { t_ = t; }

private:
    AdamWConfig cfg_;
    std::vector<float> m_, v_;  // [n] first and second moments
    int64_t t_ = 0;
};

}  // namespace fp8rl
