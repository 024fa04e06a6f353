// model_layers.h: the non-GEMM kernels of the CPU model, forward and backward: embedding, RMSNorm,
// RoPE, causal GQA attention, SwiGLU, residual add. Each output element is computed by one thread
// in a fixed order, so results are bitwise identical for any OpenMP thread count. `bf16` marks the
// GPU's BF16 storage points (DESIGN.md §3): the kernel rounds what the GPU would store as BF16.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include <omp.h>

#include "rl/bf16.h"

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
// is rounded to BF16 before the weight multiply, and the product is rounded again.

inline void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, long rows, int n, float eps,
                            bool bf16) {  // y, x [rows, n]; rstd [rows]
#pragma omp parallel for schedule(static)
    for (long r = 0; r < rows; r++) {
        const float* xr = x + r * n;
        float* yr = y + r * n;
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int i = 0; i < n; i++) ss += xr[i] * xr[i];
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
        float s = rstd[r], dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int i = 0; i < n; i++) dot += w[i] * dyr[i] * xr[i];
        float c = dot * s * s * s / (float)n;
        for (int i = 0; i < n; i++) {
            float g = s * w[i] * dyr[i] - xr[i] * c;
            dxr[i] = accumulate_dx ? dxr[i] + g : g;
        }
    }
    constexpr int kCols = 32;
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < n; c0 += kCols) {
        int c1 = c0 + kCols < n ? c0 + kCols : n;
        float acc[kCols] = {};
        for (long r = 0; r < rows; r++)
            for (int c = c0; c < c1; c++) acc[c - c0] += dy[r * n + c] * x[r * n + c] * rstd[r];
        for (int c = c0; c < c1; c++) dw[c] += acc[c - c0];
    }
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

// x [rows, heads, D] rotated in place; pos [rows].
inline void rope_forward(float* x, const int32_t* pos, const RopeTable& rt, long rows, int heads, bool bf16) {
    const int h2 = rt.half, D = 2 * h2;
#pragma omp parallel for schedule(static)
    for (long r = 0; r < rows; r++) {
        const float* cs = rt.cos.data() + (size_t)pos[r] * h2;
        const float* sn = rt.sin.data() + (size_t)pos[r] * h2;
        for (int h = 0; h < heads; h++) {
            float* v = x + (r * heads + h) * D;
            for (int i = 0; i < h2; i++) {
                float c = bf16 ? round_bf16(cs[i]) : cs[i], s = bf16 ? round_bf16(sn[i]) : sn[i];
                float a = v[i], b = v[i + h2];
                float o1 = a * c - b * s, o2 = b * c + a * s;
                v[i] = bf16 ? round_bf16(o1) : o1;
                v[i + h2] = bf16 ? round_bf16(o2) : o2;
            }
        }
    }
}

// Gradient through the rotation: the transposed rotation, applied to dx in place.
inline void rope_backward(float* dx, const int32_t* pos, const RopeTable& rt, long rows, int heads, bool bf16) {
    const int h2 = rt.half, D = 2 * h2;
#pragma omp parallel for schedule(static)
    for (long r = 0; r < rows; r++) {
        const float* cs = rt.cos.data() + (size_t)pos[r] * h2;
        const float* sn = rt.sin.data() + (size_t)pos[r] * h2;
        for (int h = 0; h < heads; h++) {
            float* v = dx + (r * heads + h) * D;
            for (int i = 0; i < h2; i++) {
                float c = bf16 ? round_bf16(cs[i]) : cs[i], s = bf16 ? round_bf16(sn[i]) : sn[i];
                float a = v[i], b = v[i + h2];
                v[i] = a * c + b * s;
                v[i + h2] = b * c - a * s;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Causal attention with GQA. Query row t sees `key_count[t]` keys starting at row `key_start[t]` of
// K and V (so the same kernel reads a packed batch or a KV cache). Query head h reads kv head
// h / (H/KV). Scores scale by D^-1/2; softmax in FP32; lse [T, H] is kept for the backward pass.

struct AttentionShape {
    int H, KV, D;
    long ldq() const { return (long)H * D; }
    long ldk() const { return (long)KV * D; }
};

inline float dot_product(const float* a, const float* b, int n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

// out [T, H, D]; lse [T, H]; q [T, H, D]; K, V rows of KV*D; scratch [threads, max key_count].
inline void attention_forward(float* out, float* lse, const float* q, const float* K, const float* V,
                              const int64_t* key_start, const int32_t* key_count, long T, AttentionShape s,
                              float* scratch, long scratch_stride, bool bf16) {
    const float scale = 1.0f / std::sqrt((float)s.D);
    const int group = s.H / s.KV;
#pragma omp parallel
    {
        float* p = scratch + (long)omp_get_thread_num() * scratch_stride;
#pragma omp for schedule(dynamic, 4)
        for (long th = 0; th < T * s.H; th++) {
            long t = th / s.H;
            int h = (int)(th % s.H), kvh = h / group, n = key_count[t];
            const float* qv = q + t * s.ldq() + h * s.D;
            const float* kb = K + key_start[t] * s.ldk() + kvh * s.D;
            const float* vb = V + key_start[t] * s.ldk() + kvh * s.D;
            float mx = -INFINITY;
            for (int j = 0; j < n; j++) {
                p[j] = dot_product(qv, kb + j * s.ldk(), s.D) * scale;
                mx = p[j] > mx ? p[j] : mx;
            }
            float sum = 0.0f;
            for (int j = 0; j < n; j++) {
                p[j] = std::exp(p[j] - mx);
                sum += p[j];
            }
            float inv = 1.0f / sum;
            float* o = out + t * s.ldq() + h * s.D;
            for (int d = 0; d < s.D; d++) o[d] = 0.0f;
            for (int j = 0; j < n; j++) {
                float pj = p[j] * inv;
                if (bf16) pj = round_bf16(pj);  // the probabilities meet V in BF16, as in flash attention
                const float* vj = vb + j * s.ldk();
#pragma omp simd
                for (int d = 0; d < s.D; d++) o[d] += pj * vj[d];
            }
            if (bf16)
                for (int d = 0; d < s.D; d++) o[d] = round_bf16(o[d]);
            lse[th] = mx + std::log(sum);
        }
    }
}

// Backward of attention over a packed batch (keys = the sequence's own rows, causal). The scores are
// recomputed from lse. Two passes so that every gradient row has one writer: dq per (query, head),
// then dk/dv per (key, kv head) walking the queries after it. delta [T, H] = rowsum(dout * out).
inline void attention_backward(float* dq, float* dk, float* dv, float* delta, const float* dout, const float* out,
                               const float* lse, const float* q, const float* K, const float* V,
                               const int64_t* seq_begin, const int64_t* seq_end, long T, AttentionShape s) {
    const float scale = 1.0f / std::sqrt((float)s.D);
    const int group = s.H / s.KV;
#pragma omp parallel for schedule(static)
    for (long th = 0; th < T * s.H; th++) {
        long t = th / s.H;
        int h = (int)(th % s.H);
        delta[th] = dot_product(dout + t * s.ldq() + h * s.D, out + t * s.ldq() + h * s.D, s.D);
    }
#pragma omp parallel for schedule(dynamic, 4)
    for (long th = 0; th < T * s.H; th++) {
        long t = th / s.H;
        int h = (int)(th % s.H), kvh = h / group;
        const float* qv = q + t * s.ldq() + h * s.D;
        const float* dov = dout + t * s.ldq() + h * s.D;
        float* dqv = dq + t * s.ldq() + h * s.D;
        for (int d = 0; d < s.D; d++) dqv[d] = 0.0f;
        for (long j = seq_begin[t]; j <= t; j++) {
            const float* kj = K + j * s.ldk() + kvh * s.D;
            float p = std::exp(dot_product(qv, kj, s.D) * scale - lse[th]);
            float ds = p * (dot_product(dov, V + j * s.ldk() + kvh * s.D, s.D) - delta[th]) * scale;
#pragma omp simd
            for (int d = 0; d < s.D; d++) dqv[d] += ds * kj[d];
        }
    }
#pragma omp parallel for schedule(dynamic, 4)
    for (long jk = 0; jk < T * s.KV; jk++) {
        long j = jk / s.KV;
        int kvh = (int)(jk % s.KV);
        const float* kj = K + j * s.ldk() + kvh * s.D;
        const float* vj = V + j * s.ldk() + kvh * s.D;
        float* dkj = dk + j * s.ldk() + kvh * s.D;
        float* dvj = dv + j * s.ldk() + kvh * s.D;
        for (int d = 0; d < s.D; d++) dkj[d] = dvj[d] = 0.0f;
        for (int h = kvh * group; h < (kvh + 1) * group; h++)
            for (long t = j; t < seq_end[j]; t++) {
                long th = t * s.H + h;
                const float* qv = q + t * s.ldq() + h * s.D;
                const float* dov = dout + t * s.ldq() + h * s.D;
                float p = std::exp(dot_product(qv, kj, s.D) * scale - lse[th]);
                float ds = p * (dot_product(dov, vj, s.D) - delta[th]) * scale;
#pragma omp simd
                for (int d = 0; d < s.D; d++) {
                    dkj[d] += ds * qv[d];
                    dvj[d] += p * dov[d];
                }
            }
    }
}

// ---------------------------------------------------------------------------------------------
// SwiGLU: a = silu(g) * u, silu(z) = z * sigmoid(z). One rounding of the fused output with bf16.

inline void swiglu_forward(float* a, const float* g, const float* u, long n, bool bf16) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) {
        float v = g[i] / (1.0f + std::exp(-g[i])) * u[i];
        a[i] = bf16 ? round_bf16(v) : v;
    }
}

inline void swiglu_backward(float* dg, float* du, const float* da, const float* g, const float* u, long n) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) {
        float sig = 1.0f / (1.0f + std::exp(-g[i]));
        dg[i] = da[i] * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
        du[i] = da[i] * g[i] * sig;
    }
}

// y = a + b (the residual stream), rounded when the stream is BF16.
inline void residual_add(float* y, const float* a, const float* b, long n, bool bf16) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) y[i] = bf16 ? round_bf16(a[i] + b[i]) : a[i] + b[i];
}

}  // namespace fp8rl
