// qkv_rope.cuh: what lies between the fused [q|k|v] projection and attention, in one kernel (and
// its backward in one), as cpu/model.h's layer_forward / layer_backward compute it step by step:
//   forward   row t of the projection's output qkv [T][(H + 2 KV) D] (BF16, or FP32 when Qwen2's
//             bias joins it before the one BF16 rounding, as cpu/linear.h's bias add) split into
//             q [T][H][D], k, v [T][KV][D]; Qwen3's per-head q/k RMSNorm (qp, kp: the normed
//             inputs, kept for the backward; rstd per row and head); RoPE on q and k
//             (cuda/kernels/rope.cuh's rotation: cos/sin from the CPU's table, rounded to BF16); in a
//             decode step also K and V appended to the paged KV cache (kv_cache.cuh's KvAppend).
//   backward  dq, dk from attention through RoPE's transposed rotation (rounded to BF16, kept in
//             dq, dk for the norms' weight gradients) and the q/k norms' input gradient, and dv,
//             assembled into dqkv laid out as qkv: the fused projection's output gradient, or in
//             fp8 straight into its two FP8 operands (qkv_rope_backward_fp8, issue 59).
// The forward runs one block per token (a warp per head slot), the backward a warp per (token, head
// slot) of the H + 2 KV slots: the norms' sums add in rl/numerics/reduction_order.h's block_sum
// order over norm_threads(D) threads.
#ifndef FP8RL_CUDA_QKV_ROPE_CUH
#define FP8RL_CUDA_QKV_ROPE_CUH
#include "cuda/kernels/block_reduce.cuh"
#include "cuda/element.cuh"
#include "cuda/kernels/rmsnorm.cuh"  // warp_row_sum, kNormChunk, load8, store8
#include "cuda/kernels/rope.cuh"
#include "kv_cache.cuh"
#include "rl/numerics/bf16.h"
#include "rl/numerics/reduction_order.h"

#include <climits>
#include <cstdint>

namespace fp8rl {

// The shapes and per-model tensors of the kernels (device pointers; norm weights null without
// Qwen3's q/k norm, bias null without Qwen2's).
struct QkvShape {
    int H, KV, D;
    float eps;
    const __nv_bfloat16* bias;    // [(H + 2 KV) D]
    const __nv_bfloat16* q_norm;  // [D]
    const __nv_bfloat16* k_norm;  // [D]
    FP8RL_HD int slots() const { return H + 2 * KV; }
};

// The forward's outputs: q [T][H][D], k, v [T][KV][D]; with the q/k norm qp, kp (laid out as q, k)
// and rstd_q [T][H], rstd_k [T][KV].
struct QkvOut {
    __nv_bfloat16 *q, *k, *v, *qp, *kp;
    float *rstd_q, *rstd_k;
};

// Slot h of a token's H + 2 KV: query head h, key head h - H, value head h - H - KV.
__device__ __forceinline__ int qkv_head(int h, int H, int KV, int* kind) {
    *kind = h < H ? 0 : h < H + KV ? 1 : 2;
    return h < H ? h : h < H + KV ? h - H : h - H - KV;
}

__device__ __forceinline__ void rope_factors(const RopeTableView& table, int32_t p, int i, float* c, float* s) {
    if (p < 0 || p >= table.positions) __trap();  // past the uploaded table
    *c = round_bf16(table.cos[(size_t)p * table.half + i]);
    *s = round_bf16(table.sin[(size_t)p * table.half + i]);
}

// One block per token, a warp per head slot (slots w, w + warps, ...): a decode step's token is one
// block (issue 47), its heads' loads in flight together. Lane l holds the slot's values l + 32 k:
// those are block_sum's (rl/numerics/reduction_order.h) threads l + 32 k over norm_threads(D)
// threads, so the norm's sum is that of warp k's butterfly (warp_reduce) for each k, added in k
// order (for D > 256, thread t's terms t + 256 j added first, in j order), the CPU engine's bits.
constexpr int kQkvRopeWarps = 8;

template <class In>
__global__ void __launch_bounds__(kQkvRopeWarps * 32)
    qkv_rope_forward_kernel(QkvOut out, const In* qkv, const int32_t* pos, RopeTableView table, QkvShape s,
                            KvAppend append) {
    DYNAMIC_SHARED(float, staged);  // [warps][D] each warp's slot before RoPE
    const int t = blockIdx.x, D = s.D, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int threads = norm_threads(D), virtual_warps = threads / 32;
    float* head = staged + (size_t)warp * D;
    for (int slot = warp; slot < s.slots(); slot += kQkvRopeWarps) {
        int kind;
        const int hh = qkv_head(slot, s.H, s.KV, &kind), heads = kind == 0 ? s.H : s.KV;
        const size_t in = (size_t)t * s.slots() * D + (size_t)slot * D, at = ((size_t)t * heads + hh) * D;
        const __nv_bfloat16* w = kind == 0 ? s.q_norm : s.k_norm;
        float part[kNormMaxThreads / 32] = {};  // block_sum's threads lane + 32 k
        for (int i = lane; i < D; i += 32) {
            float x = as_float(qkv[in + i]);
            if (s.bias) x = round_bf16(x + as_float(s.bias[(size_t)slot * D + i]));
            if (kind == 2) {
                store_float(out.v + at + i, x);
                if (append.slots) kv_append_value(append, t, (long)hh * D + i, x, false);
                continue;
            }
            if (w) store_float((kind == 0 ? out.qp : out.kp) + at + i, x);
            head[i] = x;
            const int k = (i % threads) / 32;
            FP8RL_UNROLL
            for (int u = 0; u < kNormMaxThreads / 32; u++)  // part[k] += x^2, registers indexed by constants
                if (u == k) part[u] += mul_rn(x, x);
        }
        if (kind == 2) continue;  // the whole warp
        if (w) {
            float ss = 0.0f;
            FP8RL_UNROLL
            for (int k = 0; k < kNormMaxThreads / 32; k++) {
                const float warp_sum = warp_reduce(part[k], SumOp());
                if (k < virtual_warps) ss = k == 0 ? warp_sum : ss + warp_sum;
            }
            const float r = 1.0f / sqrtf(ss / (float)D + s.eps);
            if (lane == 0) (kind == 0 ? out.rstd_q : out.rstd_k)[(size_t)t * heads + hh] = r;
            for (int i = lane; i < D; i += 32) head[i] = round_bf16(as_float(w[i]) * round_bf16(head[i] * r));
        }
        __syncwarp();
        __nv_bfloat16* y = (kind == 0 ? out.q : out.k) + at;
        for (int i = lane; i < table.half; i += 32) {
            float c, sn;
            rope_factors(table, pos[t], i, &c, &sn);
            const float a = head[i], b = head[i + table.half];
            const float o1 = round_bf16(mul_rn(a, c) - mul_rn(b, sn)), o2 = round_bf16(mul_rn(b, c) + mul_rn(a, sn));
            store_float(y + i, o1);
            store_float(y + i + table.half, o2);
            if (kind == 1 && append.slots) {
                kv_append_value(append, t, (long)hh * D + i, o1, true);
                kv_append_value(append, t, (long)hh * D + i + table.half, o2, true);
            }
        }
        __syncwarp();  // the next slot overwrites head
    }
}

// dq [T][H][D], dk [T][KV][D] (attention's gradients, rotated back in place), dv; the forward's qp,
// kp, rstd_q, rstd_k with the norm. dqkv [T][(H + 2 KV) D].
struct QkvGrad {
    __nv_bfloat16 *dq, *dk;
    const __nv_bfloat16 *dv, *qp, *kp;
    const float *rstd_q, *rstd_k;
};

// cos and sin (rounded to BF16) for the 8 values of a head at c .. c + count - 1 (count <= 8, zeros
// past it): pair index i mod half of each; two 16-byte loads each when the 8 share one half.
__device__ __forceinline__ void rope_factors8(const RopeTableView& table, int32_t p, int c, int count, float cs[8],
                                              float sn[8]) {
    const int i = c % table.half;
    if (table.half % 8 == 0) {
        if (p < 0 || p >= table.positions) __trap();  // past the uploaded table
        load8(table.cos + (size_t)p * table.half + i, count, cs);
        load8(table.sin + (size_t)p * table.half + i, count, sn);
        for (int e = 0; e < 8; e++) cs[e] = round_bf16(cs[e]), sn[e] = round_bf16(sn[e]);
        return;
    }
    for (int e = 0; e < 8; e++) {
        cs[e] = sn[e] = 0.0f;
        if (e < count) rope_factors(table, p, (c + e) % table.half, &cs[e], &sn[e]);
    }
}

// The backward of one (token t, head slot) row of D values, by the warp: lane l holds the row's
// values 256 j + 8 l .. + 7 of chunk j (16-byte loads), as rmsnorm.cuh's kernels, so the norm's dot
// product adds in block_sum's order over norm_threads(D) threads (warp_row_sum), the CPU engine's
// bits. RoPE's partner values (i +- D/2) come through `staged`, the warp's [2][D] floats of shared
// memory; the rotated gradient stays there for the norm's output pass. emit(c, count, v) receives
// the row's d[q|k|v] values c .. c + count - 1 (0 < count <= 8), each once.
template <class Emit>
__device__ inline void qkv_rope_backward_row(int t, int slot, const QkvGrad& g, const int32_t* pos,
                                             const RopeTableView& table, const QkvShape& s, float* staged,
                                             const Emit& emit) {
    const int D = s.D, lane = threadIdx.x % 32;
    int kind;
    const int hh = qkv_head(slot, s.H, s.KV, &kind), heads = kind == 0 ? s.H : s.KV;
    const size_t at = ((size_t)t * heads + hh) * D;
    const int chunks = (D + kNormChunk - 1) / kNormChunk;
    if (kind == 2) {
        for (int j = 0; j < chunks; j++) {
            const int c = j * kNormChunk + 8 * lane, count = c < D ? min(8, D - c) : 0;
            float v[8];
            load8(g.dv + at + c, count, v);
            if (count) emit(c, count, v);
        }
        return;
    }
    float* in = staged;  // [D] attention's gradient
    float* dy = in + D;  // [D] after RoPE's transposed rotation, rounded once
    __nv_bfloat16* d = (kind == 0 ? g.dq : g.dk) + at;
    for (int j = 0; j < chunks; j++) {
        const int c = j * kNormChunk + 8 * lane, count = c < D ? min(8, D - c) : 0;
        float v[8];
        load8_written(d + c, count, v);  // the kernel writes d (below)
        for (int e = 0; e < count; e++) in[c + e] = v[e];
    }
    __syncwarp();
    const __nv_bfloat16* w = kind == 0 ? s.q_norm : s.k_norm;
    const __nv_bfloat16* x = (kind == 0 ? g.qp : g.kp) + at;
    const int32_t p = pos[t];
    float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // block_sum's threads 8 lane + e
    for (int j = 0; j < chunks; j++) {
        const int c = j * kNormChunk + 8 * lane, count = c < D ? min(8, D - c) : 0;
        float cs[8], sn[8], r[8], wv[8], xv[8];
        rope_factors8(table, p, c, count, cs, sn);
        for (int e = 0; e < 8; e++) {
            r[e] = 0.0f;
            if (e >= count) continue;
            const int i = c + e;  // first half: (a, b) = (in[i], in[i + half]); second: (in[i - half], in[i])
            if (i < table.half)
                r[e] = round_bf16(mul_rn(in[i], cs[e]) - mul_rn(in[i + table.half], -sn[e]));
            else
                r[e] = round_bf16(mul_rn(in[i], cs[e]) + mul_rn(in[i - table.half], -sn[e]));
            dy[i] = r[e];
        }
        if (!w) {
            if (count) emit(c, count, r);
            continue;
        }
        store8(d + c, count, r);  // the norm's weight gradient reads it
        load8(w + c, count, wv);
        load8(x + c, count, xv);
        for (int e = 0; e < 8; e++) part[e] += mul_rn(mul_rn(wv[e], r[e]), xv[e]);
    }
    if (!w) return;  // the whole warp
    const float rs = (kind == 0 ? g.rstd_q : g.rstd_k)[(size_t)t * heads + hh];
    const float k = warp_row_sum(part, D) * rs * rs * rs / (float)D;
    for (int j = 0; j < chunks; j++) {
        const int c = j * kNormChunk + 8 * lane, count = c < D ? min(8, D - c) : 0;
        if (count == 0) continue;
        float wv[8], xv[8], out[8];
        load8(w + c, count, wv);
        load8(x + c, count, xv);
        for (int e = 0; e < 8; e++) out[e] = mul_rn(mul_rn(rs, wv[e]), e < count ? dy[c + e] : 0.0f) - mul_rn(xv[e], k);
        emit(c, count, out);
    }
}

// A warp per (token, head slot), kQkvRopeWarps slots a block (qkv_rope_backward_row), into dqkv.
__global__ void __launch_bounds__(kQkvRopeWarps * 32)
    qkv_rope_backward_kernel(__nv_bfloat16* dqkv, QkvGrad g, const int32_t* pos, RopeTableView table, QkvShape s) {
    DYNAMIC_SHARED(float, staged);  // [warps][2][D]: the slot's gradient before and after RoPE's backward
    const int t = blockIdx.x, warp = threadIdx.x / 32, slot = blockIdx.y * kQkvRopeWarps + warp;
    if (slot >= s.slots()) return;  // the whole warp
    __nv_bfloat16* row = dqkv + ((size_t)t * s.slots() + slot) * s.D;
    qkv_rope_backward_row(t, slot, g, pos, table, s, staged + (size_t)warp * 2 * s.D,
                          [&](int c, int count, const float* v) { store8(row + c, count, v); });
}

// In fp8 the backward's d[q|k|v] [padded][(H + 2 KV) D] goes to the QKV GEMMs only: fp8_gemm.cuh's
// tile quantizer runs qkv_rope_backward_row for the (token, head slot) rows of each tile, a warp a
// row, into the tile instead of a BF16 dqkv (D divides 128, so a tile holds whole slots), and writes
// both FP8 operands from it. Rows from `valid` and columns past the slots are zeros. The stage
// rotates dq and dk in place, so it must run once: block scaling only (row and tensor stage twice).
struct QkvRopeGradTile {
    QkvGrad g;
    const int32_t* pos;
    RopeTableView table;
    QkvShape s;
    int valid;
    __device__ void stage(int rows, int cols, int r0, int c0, float* tile) const {
        STATIC_SHARED(float, staged, [QUANT_THREADS / 32 * 2 * FP8_BLOCK]);  // each warp's [2][D], D <= 128
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, per_tile = FP8_BLOCK / s.D;
        for (int item = warp; item < FP8_BLOCK * per_tile; item += QUANT_THREADS / 32) {
            const int tr = item / per_tile, slot = c0 / s.D + item % per_tile, t = r0 + tr, first = slot * s.D - c0;
            auto into_tile = [&](int c, int, const float* v) {  // D % 8 == 0: whole chunks; rounded as dqkv stores them
                float b[8];
                for (int e = 0; e < 8; e++) b[e] = round_bf16(v[e]);
                *tile_chunk(tile, tr, (first + c) / 4) = make_float4(b[0], b[1], b[2], b[3]);
                *tile_chunk(tile, tr, (first + c) / 4 + 1) = make_float4(b[4], b[5], b[6], b[7]);
            };
            if (t < valid && t < rows && slot * s.D < cols) {
                qkv_rope_backward_row(t, slot, g, pos, table, s, staged + (size_t)warp * 2 * s.D, into_tile);
            } else {
                const float zeros[8] = {};
                for (int c = 8 * lane; c < s.D; c += 256) into_tile(c, 8, zeros);
            }
            __syncwarp();  // the next row overwrites the warp's staged values
        }
        __syncthreads();
    }
};

// Whether qkv_rope_backward_fp8 takes heads of dimension D (a tile holds whole heads, 8 columns a lane).
FP8RL_HD bool qkv_rope_backward_fp8_fits(int D) { return D > 0 && FP8_BLOCK % D == 0 && D % 8 == 0; }

inline void check_qkv_shape(const char* who, long T, const QkvShape& s, const RopeTableView& table) {
    if (T < 0 || T > INT_MAX) fail("%s: token count %ld outside [0, 2^31)", who, T);
    if (s.H <= 0 || s.KV <= 0 || s.D <= 0 || s.D % 2 || s.D != 2 * table.half)
        fail("%s: %d query and %d key/value heads of dimension %d (RoPE table of %d pairs)", who, s.H, s.KV, s.D,
             table.half);
    if ((s.q_norm == nullptr) != (s.k_norm == nullptr)) fail("%s: the q and k norms come together", who);
}

// qkv [T][(H + 2 KV) D] -> out (see QkvOut); pos [T]; with append.slots, K and V also appended.
template <class In>
void qkv_rope_forward(const QkvOut& out, const In* qkv, long T, const int32_t* pos, const RopeTableView& table,
                      const QkvShape& s, cudaStream_t stream, const KvAppend& append = {}) {
    check_qkv_shape("qkv_rope_forward", T, s, table);
    if (append.slots && (append.width != (long)s.KV * s.D || append.head_dim != s.D))
        fail("qkv_rope_forward: a KV cache of %ld values per row (head dim %d) for %d heads of %d", append.width,
             append.head_dim, s.KV, s.D);
    if (T == 0) return;
    const size_t smem = sizeof(float) * kQkvRopeWarps * (size_t)s.D;
    allow_dynamic_smem(qkv_rope_forward_kernel<In>, smem);
    LAUNCH_KERNEL(qkv_rope_forward_kernel<In>, dim3((unsigned)T), kQkvRopeWarps * 32, smem, stream, out, qkv, pos, table,
                  s, append);
}

// dqkv [T][(H + 2 KV) D] from g (see QkvGrad; dq, dk hold RoPE's backward after the call).
inline void qkv_rope_backward(__nv_bfloat16* dqkv, const QkvGrad& g, long T, const int32_t* pos,
                              const RopeTableView& table, const QkvShape& s, cudaStream_t stream) {
    check_qkv_shape("qkv_rope_backward", T, s, table);
    if (T == 0) return;
    const size_t smem = sizeof(float) * kQkvRopeWarps * 2 * (size_t)s.D;
    allow_dynamic_smem(qkv_rope_backward_kernel, smem);
    LAUNCH_KERNEL(qkv_rope_backward_kernel, dim3((unsigned)T, (unsigned)((s.slots() + kQkvRopeWarps - 1) / kQkvRopeWarps)),
                  kQkvRopeWarps * 32, smem, stream, dqkv, g, pos, table, s);
}

// qkv_rope_backward's dqkv [padded][(H + 2 KV) D] as its FP8 operands for the QKV GEMMs' backward,
// 1x128 blocks (QkvRopeGradTile; rows from T to padded: zeros): codes [padded][N] + scale_inv
// VEC128 along N, codes_t [N][padded] + scale_inv_t along the rows; dq, dk as qkv_rope_backward
// leaves them. D must divide 128 and be a multiple of 8.
inline void qkv_rope_backward_fp8(const QkvGrad& g, long T, long padded, const int32_t* pos, const RopeTableView& table,
                                  const QkvShape& s, bool pow2, uint8_t* codes, float* scale_inv, uint8_t* codes_t,
                                  float* scale_inv_t, cudaStream_t stream) {
    check_qkv_shape("qkv_rope_backward_fp8", T, s, table);
    if (T > padded || padded > INT_MAX || !qkv_rope_backward_fp8_fits(s.D))
        fail("qkv_rope_backward_fp8: %ld of %ld rows, head dimension %d (a tile holds whole heads: D divides 128, "
             "a multiple of 8)", T, padded, s.D);
    if (!codes || !codes_t) fail("qkv_rope_backward_fp8: needs both FP8 targets, the rowwise and the transposed");
    fp8_quantize_tiles_gpu("qkv_rope_backward_fp8", QkvRopeGradTile{g, pos, table, s, (int)T}, (int)padded, s.slots() * s.D,
                           pow2, codes, scale_inv, codes_t, scale_inv_t, stream);
}

}  // namespace fp8rl

#endif  // FP8RL_CUDA_QKV_ROPE_CUH
