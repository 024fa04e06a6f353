// model_layers.h: the non-GEMM kernels of the CPU model, forward and backward: embedding, RMSNorm,
// RoPE, SwiGLU, the fused q/k/v split, residual add (attention: cpu/attention.h). Each output element is computed by one thread
// in a fixed order, so results are bitwise identical for any OpenMP thread count. `bf16` marks the
// GPU's BF16 storage points (DESIGN.md §3): the kernel rounds what the GPU would store as BF16.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <omp.h>

#include "rl/numerics/bf16.h"
#include "rl/numerics/fast_exp.h"
#include "rl/numerics/reduction_order.h"

namespace fp8rl {

// Rounds n values to BF16 in place when `on` (the GPU stores this tensor as BF16).
inline void round_bf16_if(bool on, float* x, long n) {
    if (!on) return;
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) x[i] = round_bf16(x[i]);
}

// max |x| over n values (exact in any order, so thread-count independent).
inline float max_abs(const float* x, long n) {
    float m = 0.0f;
#pragma omp parallel for reduction(max : m) schedule(static)
    for (long i = 0; i < n; i++) m = std::fabs(x[i]) > m ? std::fabs(x[i]) : m;
    return m;
}

// amax[h] = max |x[t][h][d]| over t < T, d < D of x [T][H][D], per head h, as max_abs computes it
// (NaN skipped); max is exact in any order, so the threads' partial maxima merge to one result.
inline void max_abs_per_head(float* amax, const float* x, long T, int H, int D) {
    for (int h = 0; h < H; h++) amax[h] = 0.0f;
#pragma omp parallel
    {
        std::vector<float> m((size_t)H, 0.0f);
#pragma omp for schedule(static) nowait
        for (long t = 0; t < T; t++)
            for (int h = 0; h < H; h++)
                for (int d = 0; d < D; d++) {
                    const float a = std::fabs(x[(t * H + h) * D + d]);
                    m[(size_t)h] = a > m[(size_t)h] ? a : m[(size_t)h];
                }
#pragma omp critical
        for (int h = 0; h < H; h++) amax[h] = m[(size_t)h] > amax[h] ? m[(size_t)h] : amax[h];
    }
}

// ---------------------------------------------------------------------------------------------
// Embedding: x[t] = E[ids[t]] (no scaling).

inline void embedding_forward(float* x, const float* E, const int32_t* ids, long T, int C) {  // x [T, C]
#pragma omp parallel for schedule(static)
    for (long t = 0; t < T; t++)
        for (int c = 0; c < C; c++) x[t * C + c] = E[(long)ids[t] * C + c];
}

// dE[ids[t]] += dx[t]; threads split the columns, each walks the tokens in order (deterministic).
inline void embedding_backward(float* dE, const float* dx, const int32_t* ids, long T, int C) {
    constexpr int kCols = 16;
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < C; c0 += kCols)
        for (long t = 0; t < T; t++)
            for (int c = c0; c < c0 + kCols && c < C; c++) dE[(long)ids[t] * C + c] += dx[t * C + c];
}

// ---------------------------------------------------------------------------------------------
// RMSNorm over rows of n values: y = w * (x * rstd), rstd = 1/sqrt(mean(x^2) + eps). Also the
// per-head q/k norm of Qwen3 (rows = tokens x heads, n = head_dim). With bf16, as HF does, x*rstd
// is rounded to BF16 before the weight multiply, and the product is rounded again. A row's sums and
// the weight gradient's column sums add in the GPU kernels' order (rl/numerics/reduction_order.h).

inline void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, long rows, int n, float eps,
                            bool bf16) {  // y, x [rows, n]; rstd [rows]
#pragma omp parallel for schedule(static)
    for (long r = 0; r < rows; r++) {
        const float* xr = x + r * n;
        float* yr = y + r * n;
        const float ss = block_sum(n, norm_threads(n), [&](int i) { return xr[i] * xr[i]; });
        float s = 1.0f / std::sqrt(ss / (float)n + eps);
        rstd[r] = s;
        for (int i = 0; i < n; i++) {
            float v = xr[i] * s;
            yr[i] = bf16 ? round_bf16(w[i] * round_bf16(v)) : w[i] * v;
        }
    }
}

// dx (+)= dL/dx; dw += dL/dw. dx = rstd*(w*dy) - x * rstd^3/n * sum(w*dy*x).
inline void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                             const float* rstd, long rows, int n, bool accumulate_dx) {
#pragma omp parallel for schedule(static)
    for (long r = 0; r < rows; r++) {
        const float *xr = x + r * n, *dyr = dy + r * n;
        float* dxr = dx + r * n;
        const float s = rstd[r], dot = block_sum(n, norm_threads(n), [&](int i) { return w[i] * dyr[i] * xr[i]; });
        float c = dot * s * s * s / (float)n;
        for (int i = 0; i < n; i++) {
            float g = s * w[i] * dyr[i] - xr[i] * c;
            dxr[i] = accumulate_dx ? dxr[i] + g : g;
        }
    }
    constexpr int kCols = 32;
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < n; c0 += kCols)
        column_sum_add_range(dw, rows, c0, std::min(n, c0 + kCols),
                             [&](long r, int c) { return dy[r * n + c] * x[r * n + c] * rstd[r]; });
}

// ---------------------------------------------------------------------------------------------
// RoPE, rotate-half form (pairs i, i + D/2). The table holds cos/sin of p * inv_freq[i] in FP32,
// as HF computes them; bf16 uses them rounded to BF16, as HF casts them to the activation dtype.

struct RopeTable {
    int half = 0;                  // D / 2
    std::vector<float> inv_freq;   // [D/2]
    std::vector<float> cos, sin;   // [positions, D/2]
    long positions = 0;

    // Grows the table to cover positions [0, n); call outside parallel regions.
    void ensure(long n) {
        if (n <= positions) return;
        cos.resize((size_t)n * half);
        sin.resize((size_t)n * half);
        for (long p = positions; p < n; p++)
            for (int i = 0; i < half; i++) {
                float a = (float)p * inv_freq[i];  // FP32 angle, as HF's position x inv_freq product
                cos[(size_t)p * half + i] = (float)std::cos((double)a);
                sin[(size_t)p * half + i] = (float)std::sin((double)a);
            }
        positions = n;
    }
};

// x [rows, heads, D] rotated in place by each row's angles (inverse: by their negatives, the
// transposed rotation the backward pass applies to gradients); pos [rows]. bf16 rounds the
// forward rotation's output, as the GPU stores it; gradients are rounded by the caller.
inline void rope_rotate(float* x, const int32_t* pos, const RopeTable& rt, long rows, int heads, bool bf16,
                        bool inverse) {
    const int h2 = rt.half, D = 2 * h2;
#pragma omp parallel for schedule(static)
    for (long r = 0; r < rows; r++) {
        const float* cs = rt.cos.data() + (size_t)pos[r] * h2;
        const float* sn = rt.sin.data() + (size_t)pos[r] * h2;
        for (int h = 0; h < heads; h++) {
            float* v = x + (r * heads + h) * D;
            for (int i = 0; i < h2; i++) {
                float c = bf16 ? round_bf16(cs[i]) : cs[i], s = bf16 ? round_bf16(sn[i]) : sn[i];
                if (inverse) s = -s;
                float a = v[i], b = v[i + h2];
                float o1 = a * c - b * s, o2 = b * c + a * s;
                const bool round = bf16 && !inverse;
                v[i] = round ? round_bf16(o1) : o1;
                v[i + h2] = round ? round_bf16(o2) : o2;
            }
        }
    }
}

inline void rope_forward(float* x, const int32_t* pos, const RopeTable& rt, long rows, int heads, bool bf16) {
    rope_rotate(x, pos, rt, rows, heads, bf16, false);
}

// Gradient through the rotation: the transposed rotation, applied to dx in place.
inline void rope_backward(float* dx, const int32_t* pos, const RopeTable& rt, long rows, int heads, bool bf16) {
    rope_rotate(dx, pos, rt, rows, heads, bf16, true);
}

// ---------------------------------------------------------------------------------------------
// SwiGLU: a = silu(g) * u, silu(z) = z / (1 + exp(-z)), exp from rl/numerics/fast_exp.h, over the
// fused [gate|up] projection's output gu [T][2I] (row t: g = gu[t][0, I), u = gu[t][I, 2I)); a [T][I].
// One rounding of the fused output with bf16. The AVX2 loops run the scalar code's operations in its
// order (same bits).

#if FP8RL_HOST_AVX2
// exp(-g) on eight lanes, as fast_exp(-g) (the sign flipped exactly).
inline __m256 exp_negated8(__m256 g) { return fast_exp8(_mm256_xor_ps(g, _mm256_set1_ps(-0.0f))); }
#endif

inline void swiglu_forward(float* a, const float* gu, long T, int I, bool bf16) {
#pragma omp parallel for schedule(static)
    for (long t = 0; t < T; t++) {
        const float *g = gu + t * 2 * I, *u = g + I;
        float* at = a + t * I;
        int i = 0;
#if FP8RL_HOST_AVX2
        const __m256 one = _mm256_set1_ps(1.0f);
        for (; i + 8 <= I; i += 8) {
            const __m256 gv = _mm256_loadu_ps(g + i);
            _mm256_storeu_ps(at + i, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, exp_negated8(gv))),
                                                   _mm256_loadu_ps(u + i)));
        }
#endif
        for (; i < I; i++) at[i] = g[i] / (1.0f + fast_exp(-g[i])) * u[i];
        if (bf16)
            for (i = 0; i < I; i++) at[i] = round_bf16(at[i]);
    }
}

// sig = sigmoid(g): dg = da * u * sig * (1 + g * (1 - sig)), du = da * g * sig, into dgu [T][2I]
// (the fused projection's output gradient, laid out as gu).
inline void swiglu_backward(float* dgu, const float* da, const float* gu, long T, int I) {
#pragma omp parallel for schedule(static)
    for (long t = 0; t < T; t++) {
        const float *g = gu + t * 2 * I, *u = g + I, *dat = da + t * I;
        float *dg = dgu + t * 2 * I, *du = dg + I;
        int i = 0;
#if FP8RL_HOST_AVX2
        const __m256 one = _mm256_set1_ps(1.0f);
        for (; i + 8 <= I; i += 8) {
            const __m256 gv = _mm256_loadu_ps(g + i), dav = _mm256_loadu_ps(dat + i);
            const __m256 sig = _mm256_div_ps(one, _mm256_add_ps(one, exp_negated8(gv)));
            const __m256 grow = _mm256_add_ps(one, _mm256_mul_ps(gv, _mm256_sub_ps(one, sig)));
            _mm256_storeu_ps(dg + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(dav, _mm256_loadu_ps(u + i)), sig), grow));
            _mm256_storeu_ps(du + i, _mm256_mul_ps(_mm256_mul_ps(dav, gv), sig));
        }
#endif
        for (; i < I; i++) {
            const float sig = 1.0f / (1.0f + fast_exp(-g[i]));
            dg[i] = dat[i] * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
            du[i] = dat[i] * g[i] * sig;
        }
    }
}

// The fused [q|k|v] projection's output qkv [T][Q + 2K] split into q [T][Q], k, v [T][K], and
// (join) the gradients dq, dk, dv assembled into dqkv, laid out as qkv.
inline void split_qkv(float* q, float* k, float* v, const float* qkv, long T, int Q, int K) {
    const int N = Q + 2 * K;
#pragma omp parallel for schedule(static)
    for (long t = 0; t < T; t++) {
        std::copy(qkv + t * N, qkv + t * N + Q, q + t * Q);
        std::copy(qkv + t * N + Q, qkv + t * N + Q + K, k + t * K);
        std::copy(qkv + t * N + Q + K, qkv + (t + 1) * N, v + t * K);
    }
}

inline void join_qkv(float* dqkv, const float* dq, const float* dk, const float* dv, long T, int Q, int K) {
    const int N = Q + 2 * K;
#pragma omp parallel for schedule(static)
    for (long t = 0; t < T; t++) {
        std::copy(dq + t * Q, dq + (t + 1) * Q, dqkv + t * N);
        std::copy(dk + t * K, dk + (t + 1) * K, dqkv + t * N + Q);
        std::copy(dv + t * K, dv + (t + 1) * K, dqkv + t * N + Q + K);
    }
}

// y = a + b (the residual stream), rounded when the stream is BF16.
inline void residual_add(float* y, const float* a, const float* b, long n, bool bf16) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) y[i] = bf16 ? round_bf16(a[i] + b[i]) : a[i] + b[i];
}

}  // namespace fp8rl
