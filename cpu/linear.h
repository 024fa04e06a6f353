// linear.h: the linear layers of the CPU model (y = x W^T + b), forward and backward, in the
// precision of the call. fp32 and bf16 use the FP32 GEMMs of cpu/gemm.h (bf16 hands them weights
// and inputs already rounded to BF16, then rounds the output as the GPU stores it). fp8 runs all
// three GEMMs through the emulated scaled FP8 GEMM (cpu/fp8_gemm_ref.h) at the weight's
// granularity (--fp8_scaling; block: weights in 128x128 blocks quantized once per update, X and dY
// in 1x128 groups, wgrad operands along tokens).
#pragma once
#include <cstddef>

#include "cpu/fp8_gemm_ref.h"
#include "cpu/gemm.h"
#include "cpu/model_layers.h"
#include "rl/numerics/precision.h"

namespace fp8rl {

// One linear layer as a call reads it. w is the master weight (fp32) or its BF16-rounded copy;
// fp8 is its FP8 quantization (fp8 precision only).
struct LinearWeight {
    const float* w;  // [N, K]
    const float* b;  // [N] or nullptr
    int N, K;
    const Fp8Weight* fp8 = nullptr;
    const float* packed = nullptr;  // W packed for gemm_nt_packed (fp32, bf16), or nullptr
};

// y [T, N] = x [T, K] . W^T (+ b).
inline void linear_forward(float* y, const float* x, long T, const LinearWeight& W, Precision p) {
    if (p == Precision::FP8)
        fp8_linear_fprop(x, (int)T, *W.fp8, y, false);
    else if (W.packed)  // the same bits as gemm_nt on W
        gemm_nt_packed((int)T, W.N, W.K, x, W.K, W.packed, y, W.N, false);
    else
        gemm_nt((int)T, W.N, W.K, x, W.K, W.w, W.K, y, W.N, false);
    if (W.b) {
#pragma omp parallel for schedule(static)
        for (long t = 0; t < T; t++)
            for (int n = 0; n < W.N; n++) y[t * W.N + n] += W.b[n];
    }
    round_bf16_if(stores_bf16(p), y, T * W.N);
}

// dx [T, K] (+)= dy [T, N] . W (left in FP32: the caller rounds once all contributions are in);
// dW [N, K] += dy^T . x; db [N] += column sums of dy (when the layer has a bias).
inline void linear_backward(float* dx, bool accumulate_dx, float* dW, float* db, const float* dy, const float* x,
                            long T, const LinearWeight& W, Precision p) {
    if (p == Precision::FP8) {
        fp8_linear_dgrad(dy, (int)T, *W.fp8, dx, accumulate_dx);
        fp8_linear_wgrad(dy, x, (int)T, W.N, W.K, W.fp8->pow2_scales, W.fp8->scaling, dW, true);
    } else {  // accumulating as cuBLASLt's beta = 1 does: the product, then the add
        if (accumulate_dx)
            gemm_nn_then_add((int)T, W.K, W.N, dy, W.N, W.w, W.K, dx, W.K);
        else
            gemm_nn((int)T, W.K, W.N, dy, W.N, W.w, W.K, dx, W.K, false);
        gemm_tn_then_add(W.N, W.K, (int)T, dy, W.N, x, W.K, dW, W.K);
    }
    if (db) {  // in the GPU's column-sum order (rl/numerics/reduction_order.h)
        constexpr int kCols = 32;
#pragma omp parallel for schedule(static)
        for (int c0 = 0; c0 < W.N; c0 += kCols)
            column_sum_add_range(db, T, c0, std::min(W.N, c0 + kCols), [&](long t, int n) { return dy[t * W.N + n]; });
    }
}

}  // namespace fp8rl
