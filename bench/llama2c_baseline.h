// llama2c_baseline.h: the batch-1 generation loop of llama2.c's run.c (Karpathy, MIT), rewritten
// here as the baseline bench_model measures in the same run: the same work per token in the same
// way (one OpenMP-parallel dot product per output row of each matmul, attention parallel over
// heads, RoPE angles from powf/cosf/sinf, softmax and multinomial sampling over the vocabulary),
// on the same weights as the model under test. What `make runomp` (-Ofast) gets from the compiler
// is written out: the dot products and the softmax exponentials are vectorised (omp simd, fast
// exp). run.c's RoPE rotates interleaved pairs where HF rotates halves: the same cost, different
// tokens, which a speed baseline does not need to match.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include <omp.h>

#include "rl/numerics/fast_exp.h"
#include "cpu/model.h"
#include "rl/numerics/rng.h"

namespace fp8rl {

class Llama2cBaseline {
public:
    explicit Llama2cBaseline(const CpuModel& m) : m_(m), p_(m.weights->master.data()) {}

    // Generates `steps` tokens after token 1 at temperature 1; returns the last token (kept so the
    // work cannot be optimised away).
    int generate(int steps, uint64_t seed) {
        const int C = m_.C, kv = m_.KV * m_.D;
        x_.assign(C, 0), xb_.assign(C, 0), xb2_.assign(C, 0), q_.assign(m_.H * m_.D, 0);
        hb_.assign(m_.I, 0), hb2_.assign(m_.I, 0), logits_.assign(m_.V, 0);
        att_.assign((size_t)m_.H * (steps + 1), 0);
        key_cache_.assign((size_t)m_.L * (steps + 1) * kv, 0);
        value_cache_.assign(key_cache_.size(), 0);
        int token = 1;
        for (int pos = 0; pos < steps; pos++) {
            forward(token, pos, steps + 1);
            token = sample_mult(rng_uniform(seed, 0, 0, (uint32_t)pos));
        }
        return token;
    }

private:
    const CpuModel& m_;
    const float* p_;  // the master buffer: tensors [N, K] row-major, as run.c's matmul reads them
    std::vector<float> x_, xb_, xb2_, q_, hb_, hb2_, logits_, att_, key_cache_, value_cache_;

    static void rmsnorm(float* o, const float* x, const float* w, int n) {
        float ss = 0.0f;
        for (int j = 0; j < n; j++) ss += x[j] * x[j];
        ss = 1.0f / std::sqrt(ss / n + 1e-5f);
        for (int j = 0; j < n; j++) o[j] = w[j] * (ss * x[j]);
    }

    // xout [d] = W [d, n] . x [n]
    static void matmul(float* xout, const float* x, const float* w, int n, int d) {
#pragma omp parallel for
        for (int i = 0; i < d; i++) {
            float val = 0.0f;
#pragma omp simd reduction(+ : val)
            for (int j = 0; j < n; j++) val += w[(long)i * n + j] * x[j];
            xout[i] = val;
        }
    }

    static void softmax(float* x, int n) {
        float max_val = x[0];
        for (int i = 1; i < n; i++) max_val = x[i] > max_val ? x[i] : max_val;
        fast_exp_shifted(x, x, max_val, n);
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int i = 0; i < n; i++) sum += x[i];
        for (int i = 0; i < n; i++) x[i] /= sum;
    }

    int sample_mult(float coin) {
        softmax(logits_.data(), m_.V);
        float cdf = 0.0f;
        for (int i = 0; i < m_.V; i++) {
            cdf += logits_[i];
            if (coin < cdf) return i;
        }
        return m_.V - 1;
    }

    void forward(int token, int pos, int seq_len) {
        const int C = m_.C, D = m_.D, kv_dim = m_.KV * m_.D, kv_mul = m_.H / m_.KV;
        std::copy(p_ + m_.embed + (long)token * C, p_ + m_.embed + (long)(token + 1) * C, x_.data());
        for (int l = 0; l < m_.L; l++) {
            const LayerTensors& w = m_.layers[l];
            rmsnorm(xb_.data(), x_.data(), p_ + w.ln1, C);
            const long loff = (long)l * seq_len * kv_dim;
            float* k = key_cache_.data() + loff + (long)pos * kv_dim;
            float* v = value_cache_.data() + loff + (long)pos * kv_dim;
            matmul(q_.data(), xb_.data(), p_ + w.wq, C, m_.H * D);
            matmul(k, xb_.data(), p_ + w.wk, C, kv_dim);
            matmul(v, xb_.data(), p_ + w.wv, C, kv_dim);
            for (int i = 0; i < m_.H * D; i += 2) {
                const int head_dim = i % D;
                const float freq = 1.0f / powf(10000.0f, head_dim / (float)D), val = pos * freq;
                const float fcr = cosf(val), fci = sinf(val);
                for (int r = 0; r < (i < kv_dim ? 2 : 1); r++) {
                    float* vec = r == 0 ? q_.data() : k;
                    const float v0 = vec[i], v1 = vec[i + 1];
                    vec[i] = v0 * fcr - v1 * fci;
                    vec[i + 1] = v0 * fci + v1 * fcr;
                }
            }
#pragma omp parallel for
            for (int h = 0; h < m_.H; h++) {
                const float* q = q_.data() + h * D;
                float* att = att_.data() + (long)h * seq_len;
                for (int t = 0; t <= pos; t++) {
                    const float* kt = key_cache_.data() + loff + (long)t * kv_dim + (h / kv_mul) * D;
                    float score = 0.0f;
#pragma omp simd reduction(+ : score)
                    for (int i = 0; i < D; i++) score += q[i] * kt[i];
                    att[t] = score / std::sqrt((float)D);
                }
                softmax(att, pos + 1);
                float* xb = xb_.data() + h * D;
                for (int i = 0; i < D; i++) xb[i] = 0.0f;
                for (int t = 0; t <= pos; t++) {
                    const float* vt = value_cache_.data() + loff + (long)t * kv_dim + (h / kv_mul) * D;
#pragma omp simd
                    for (int i = 0; i < D; i++) xb[i] += att[t] * vt[i];
                }
            }
            matmul(xb2_.data(), xb_.data(), p_ + w.wo, m_.H * D, C);
            for (int i = 0; i < C; i++) x_[i] += xb2_[i];
            rmsnorm(xb_.data(), x_.data(), p_ + w.ln2, C);
            matmul(hb_.data(), xb_.data(), p_ + w.wg, C, m_.I);
            matmul(hb2_.data(), xb_.data(), p_ + w.wu, C, m_.I);
            for (int i = 0; i < m_.I; i++) hb_[i] = hb_[i] * (1.0f / (1.0f + expf(-hb_[i]))) * hb2_[i];
            matmul(xb_.data(), hb_.data(), p_ + w.wd, m_.I, C);
            for (int i = 0; i < C; i++) x_[i] += xb_[i];
        }
        rmsnorm(x_.data(), x_.data(), p_ + m_.final_norm, C);
        matmul(logits_.data(), x_.data(), p_ + m_.lm_head, C, m_.V);
    }
};

}  // namespace fp8rl
