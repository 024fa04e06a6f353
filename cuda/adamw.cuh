// adamw.cuh: AdamW over the FP32 master weights on the device (llm.c's adamw.cuh in spirit): one
// pass updates w, m and v and writes the BF16 copy of w that the GEMMs read; for the projection
// weights, the FP8 128x128-block copy and its transpose (spec-gpu.md §3.1) are requantized from the
// updated master by the same call. Bit-exact with rl/objective/adamw.h's AdamW::step given the same
// gradients: the same float operations in the same order, every product unfused (mul_rn), IEEE
// division and square root; the BF16 copy is rl/numerics/bf16.h's rounding, as the CPU engine's.
#ifndef FP8RL_CUDA_ADAMW_CUH
#define FP8RL_CUDA_ADAMW_CUH
#include <cmath>
#include <cstdint>

#include "fp8_gemm.cuh"
#include "rl/objective/adamw.h"
#include "rl/numerics/bf16.h"

namespace fp8rl {

constexpr int ADAMW_THREADS = 256;
constexpr int ADAMW_MAX_BLOCKS = 4 * 132;  // grid-stride beyond: four blocks per SM of an H200

// The per-step scalars of AdamW::step (rl/objective/adamw.h), computed from the same doubles.
struct AdamWStepScalars {
    float b1, b2, decay, step_size, sqrt_bc2, eps;
};

// t: the step number (1 for the first update), as AdamW::step counts after its increment.
inline AdamWStepScalars adamw_step_scalars(const AdamWConfig& cfg, int64_t t, double lr) {
    const double bc1 = 1.0 - std::pow(cfg.beta1, (double)t);
    const double bc2 = 1.0 - std::pow(cfg.beta2, (double)t);
    return {(float)cfg.beta1, (float)cfg.beta2, (float)(1.0 - lr * cfg.weight_decay), (float)(lr / bc1),
            (float)std::sqrt(bc2), (float)cfg.eps};
}

// w, m, v, g [n] FP32; w_bf16 [n] the BF16 copy of the updated w.
static __global__ void __launch_bounds__(ADAMW_THREADS)
    adamw_kernel(float* w, float* m, float* v, __nv_bfloat16* w_bf16, const float* g, size_t n, AdamWStepScalars s) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float gi = g[i];
        float wi = mul_rn(w[i], s.decay);
        const float mi = mul_rn(s.b1, m[i]) + mul_rn(1.0f - s.b1, gi);
        const float vi = mul_rn(s.b2, v[i]) + mul_rn(mul_rn(1.0f - s.b2, gi), gi);
        wi = wi - __fdiv_rn(mul_rn(s.step_size, mi), __fdiv_rn(__fsqrt_rn(vi), s.sqrt_bc2) + s.eps);
        w[i] = wi;
        m[i] = mi;
        v[i] = vi;
        __nv_bfloat16_raw rounded;
        rounded.x = float_to_bf16(wi);
        w_bf16[i] = rounded;
    }
}

// One AdamW update of w [n] (device pointers; m, v the moments, w_bf16 the BF16 copy) with
// gradient g at learning rate lr; t is the step number, 1 for the first update.
inline void adamw_update_gpu(float* w, float* m, float* v, __nv_bfloat16* w_bf16, const float* g, size_t n,
                             const AdamWConfig& cfg, int64_t t, double lr, cudaStream_t stream) {
    if (n == 0) fail("adamw_update_gpu: the tensor has no elements");
    if (t < 1) fail("adamw_update_gpu: step number %lld must be >= 1", (long long)t);
    size_t blocks = (n + ADAMW_THREADS - 1) / ADAMW_THREADS;
    int grid = blocks < (size_t)ADAMW_MAX_BLOCKS ? (int)blocks : ADAMW_MAX_BLOCKS;
    LAUNCH_KERNEL(adamw_kernel, grid, ADAMW_THREADS, 0, stream, w, m, v, w_bf16, g, n, adamw_step_scalars(cfg, t, lr));
}

// AdamW on a projection weight w [rows][cols], then its FP8 copy requantized from the updated
// FP32 master (as the CPU engine's fp8_quantize_weight does from its master).
inline void adamw_update_projection_gpu(float* w, float* m, float* v, __nv_bfloat16* w_bf16, const float* g, int rows,
                                        int cols, const AdamWConfig& cfg, int64_t t, double lr, const Fp8WeightCopy& fp8,
                                        cudaStream_t stream) {
    check_fp8_shape("adamw_update_projection_gpu", rows, cols);
    adamw_update_gpu(w, m, v, w_bf16, g, (size_t)rows * cols, cfg, t, lr, stream);
    fp8_requantize_weight_gpu(w, rows, cols, fp8, stream);
}

}  // namespace fp8rl

#endif  // FP8RL_CUDA_ADAMW_CUH
