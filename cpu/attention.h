// attention.h: causal attention with GQA on the CPU, forward and backward. Query head h reads kv
// head h / (H/KV); scores scale by D^-1/2; softmax in FP32; lse [T, H] is kept for the backward.
//
// The CPU engine is the GPU engine's oracle, so with BF16 activations attention rounds where the
// GPU kernels round, in their order (rl/numerics/attention_tiles.h), and with FP32 it rounds nowhere:
//   packed batch (training, --logprobs, and a generator's prefill over its cache): the training
//     kernel's online softmax (cuda/kernels/attention.cuh) over key tiles of kFlashTile, in the exp2
//     domain (rl/numerics/exp2.h, c = scale log2(e)): per tile the running max m of the raw scores s
//     grows, the partial sums and the output are rescaled by 2^(old m c - new m c), the tile's
//     2^(s c - m c) (one FMA, then exp2) join the kFlashLanes partial sums unrounded and meet V rounded
//     to BF16; the output is scaled by 1 / sum and rounded once; lse = m scale + log(sum). Per (sequence, head, block of kFlashTile queries) the
//     scores are one GEMM (Q K^T) and each key tile's P V another, so attention runs at GEMM speed.
//   decode (a generator's decode step over its cache): the decode kernel's flash-decoding
//     (kv_cache.cuh): the row's keys cut into chunks, each an online softmax over kDecodeTile-key
//     tiles, normalised by its own sum, the chunks merged by their log-sum-exps. The kernel runs
//     on the tensor cores: scores are BF16 products summed in d order, times the K scale (FP8: the
//     cache keeps code values); P V adds P split into two BF16 (P_hi V, then P_lo V, per 16 keys),
//     and the V scale multiplies the chunk's output before its sum divides it.
//   backward: P = 2^(s c - lse log2(e)) recomputed from lse; P and dS rounded to BF16 where they
//     meet dO, K and Q.
// The packed and prefill exps are rl/numerics/exp2.h's (ex2.approx's FP32 twin, as the emulated kernels
// compute it; a real GPU's differ by at most 3.7e-7 relative each: docs/gpu-engine.md), decode's
// rl/numerics/fast_exp.h's. Each output is written by one task in a fixed order, so results are
// bitwise identical for any thread count, and a sequence's result does not depend on the other
// sequences of the batch (masked scores enter the products as exact zeros).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <omp.h>

#include "rl/numerics/attention_tiles.h"
#include "rl/numerics/bf16.h"
#include "rl/numerics/exp2.h"
#include "rl/numerics/fast_exp.h"
#include "rl/numerics/fast_log.h"
#include "rl/numerics/reduction_order.h"
#include "cpu/gemm.h"

namespace fp8rl {

struct AttentionShape {
    int H, KV, D;
    long ldq() const { return (long)H * D; }
    long ldk() const { return (long)KV * D; }
};

// a . b summed in index order from 0: the order of a tensor-core product's chain (cuda/kernels/mma.cuh in
// emulation) and of the decode kernel's loop.
inline float dot_in_order(const float* a, const float* b, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

// The training kernel's softmax state of one row: the running max and the lanes' partial sums.
struct FlashRow {
    float max = -INFINITY, lane_sum[kFlashLanes] = {};

    // One key tile of the row: s[0..n) its raw scores (q . k), keys past `valid` masked; c =
    // exp2_domain(scale) > 0. Returns the factor that rescales what the earlier tiles gave; leaves in
    // p[0..n) the tile's weights 2^(s c - max c) (rounded to BF16 with bf16, 0 where masked).
    float add_tile(float* p, const float* s, int valid, int n, float c, bool bf16) {
        float tile_max = -INFINITY;
        for (int j = 0; j < valid; j++) tile_max = s[j] > tile_max ? s[j] : tile_max;
        const float new_max = tile_max > max ? tile_max : max, new_max_c = mul_rn(new_max, c);
        const float rescale = exp2_approx(mul_rn(max, c) - new_max_c);  // 2^-inf = 0 on the first tile
        max = new_max;
        for (float& l : lane_sum) l *= rescale;
        exp2_fma_row(p, s, c, new_max_c, valid);
        for (int j = 0; j < valid; j++) {
            lane_sum[j % 8 / 2] += p[j];  // lane t of a C fragment holds columns 8i + 2t, 8i + 2t + 1
            if (bf16) p[j] = round_bf16(p[j]);
        }
        for (int j = valid; j < n; j++) p[j] = 0.0f;
        return rescale;
    }
    // The row's sum, as the lanes add it (a quad shuffle: (l0 + l1) + (l2 + l3)).
    float total() const { return (lane_sum[0] + lane_sum[1]) + (lane_sum[2] + lane_sum[3]); }
    // The row's log-sum-exp of the scaled scores, in the natural base: max scale + log(sum), one FMA.
    float lse(float scale) const { return fmaf(max, scale, std::log(total())); }
};

// One unit of work over a packed batch: sequence rows [begin, end), head (forward: query head,
// backward: kv head), and for the forward a block of queries [q0, q1).
struct AttentionTask {
    long begin, end, q0, q1;
    int head;
};

// Packed forward. out [T, H, D]; lse [T, H]; q [T, H, D]; k, v [T, KV, D]; sequence s is rows
// seq_offsets[s] .. seq_offsets[s+1] with positions from 0. k_scale, v_scale [KV] (null: 1): K and V
// are FP8 codes' values (--train_kv_replay), read as decode reads them: a KV head's K scale joins the
// scores' D^-1/2, its V scale the output's 1 / sum (the kernel's, cuda/kernels/attention.cuh).
inline void attention_forward_packed(float* out, float* lse, const float* q, const float* k, const float* v,
                                     const std::vector<int64_t>& seq_offsets, AttentionShape s, bool bf16,
                                     const float* k_scale = nullptr, const float* v_scale = nullptr) {
    const float inv_sqrt_d = 1.0f / std::sqrt((float)s.D);
    const int group = s.H / s.KV;
    std::vector<AttentionTask> tasks;
    long longest = 0;
    for (size_t i = 0; i + 1 < seq_offsets.size(); i++) {
        const long b = seq_offsets[i], e = seq_offsets[i + 1];
        longest = e - b > longest ? e - b : longest;
        for (int h = 0; h < s.H; h++)
            for (long q0 = b; q0 < e; q0 += kFlashTile) tasks.push_back({b, e, q0, std::min(e, q0 + kFlashTile), h});
    }
#pragma omp parallel
    {
        std::vector<float> scores((size_t)kFlashTile * longest), p((size_t)kFlashTile * kFlashTile);  // [queries, keys]
        FlashRow rows[kFlashTile];
        float rescale[kFlashTile];
#pragma omp for schedule(dynamic, 1)
        for (size_t ti = 0; ti < tasks.size(); ti++) {
            const AttentionTask& t = tasks[ti];
            const int nq = (int)(t.q1 - t.q0), keys = (int)(t.q1 - t.begin), kvh = t.head / group;
            const float scale = inv_sqrt_d * (k_scale ? k_scale[kvh] : 1.0f), out_scale = v_scale ? v_scale[kvh] : 1.0f;
            const float c = exp2_domain(scale);
            const float* kb = k + t.begin * s.ldk() + kvh * s.D;
            const float* vb = v + t.begin * s.ldk() + kvh * s.D;
            float* o = out + t.q0 * s.ldq() + t.head * s.D;  // [nq] rows of ldq
            gemm_nt(nq, keys, s.D, q + t.q0 * s.ldq() + t.head * s.D, (int)s.ldq(), kb, (int)s.ldk(), scores.data(),
                    keys, false);
            for (int i = 0; i < nq; i++) {
                rows[i] = FlashRow();
                for (int d = 0; d < s.D; d++) o[i * s.ldq() + d] = 0.0f;
            }
            for (int k0 = 0; k0 < keys; k0 += kFlashTile) {
                const int n = std::min(kFlashTile, keys - k0);
                for (int i = 0; i < nq; i++) {
                    const int valid = std::min(n, (int)(t.q0 + i - t.begin) + 1 - k0);  // >= 1: k0 <= the block's first query
                    rescale[i] = rows[i].add_tile(p.data() + (size_t)i * n, scores.data() + (size_t)i * keys + k0, valid,
                                                  n, c, bf16);
                    for (int d = 0; d < s.D; d++) o[i * s.ldq() + d] *= rescale[i];
                }
                gemm_nn(nq, s.D, n, p.data(), n, vb + (long)k0 * s.ldk(), (int)s.ldk(), o, (int)s.ldq(), true);
            }
            for (int i = 0; i < nq; i++) {
                const float inv = out_scale / rows[i].total();
                lse[(t.q0 + i) * s.H + t.head] = rows[i].lse(scale);
                for (int d = 0; d < s.D; d++) {
                    float& x = o[i * s.ldq() + d];
                    x = bf16 ? round_bf16(x * inv) : x * inv;
                }
            }
        }
    }
}

// Which GPU kernel a cached attention call stands for: a prefill (the training kernel over the K, V
// the cache holds, rounded to BF16 as the GPU prefill reads them) or a decode step (flash-decoding
// over the cache's FP32 values).
enum class CachedRows { Prefill, Decode };

// Floats of scratch per thread that attention_forward_cached needs for rows of at most max_keys keys.
inline long cached_attention_scratch_floats(AttentionShape s, long max_keys) {
    const long prefill = (long)s.H * max_keys + 2L * s.ldk();  // the row's weights [H][keys], a K and a V row
    const long decode = (long)decode_max_chunks(max_keys, kDecodeSplitKeys) * s.H * (s.D + 1) + (long)s.H * (kDecodeTile + 2);
    return std::max(prefill, decode);
}

constexpr int kPrefetchRows = 4;  // cache rows ahead of the one being read

// Fetches the cache lines of floats p[0..n) ahead of their use.
inline void prefetch_row(const float* p, long n) {
    for (long i = 0; i < n; i += 16) __builtin_prefetch(p + i, 0, 3);
}

// One prefill row of attention_forward_cached: the training kernel's tiles over keys kb, vb [n][ldk].
inline void cached_prefill_row(float* o, float* lse, const float* qt, const float* kb, const float* vb, int n,
                               AttentionShape s, const float* k_scale, const float* v_scale, float* scratch,
                               FlashRow* rows, bool bf16) {
    const float scale = 1.0f / std::sqrt((float)s.D), c = exp2_domain(scale);
    const int group = s.H / s.KV;
    float *w = scratch, *k_row = w + (long)s.H * n, *v_row = k_row + s.ldk();  // w [H][n]
    for (int j = 0; j < n; j++) {
        if (j + kPrefetchRows < n) prefetch_row(kb + (j + kPrefetchRows) * s.ldk(), s.ldk());
        for (long c = 0; c < s.ldk(); c++) {  // the stored value (kv_cache.cuh's kv_value), read in BF16 (its round_trip)
            const float x = kb[j * s.ldk() + c] * k_scale[c / s.D];
            k_row[c] = bf16 ? round_bf16(x) : x;
        }
        for (int h = 0; h < s.H; h++) w[(long)h * n + j] = dot_in_order(qt + h * s.D, k_row + (h / group) * s.D, s.D);
    }
    for (int h = 0; h < s.H; h++) rows[h] = FlashRow();
    for (int d = 0; d < s.H * s.D; d++) o[d] = 0.0f;
    for (int k0 = 0; k0 < n; k0 += kFlashTile) {
        const int tile = std::min(kFlashTile, n - k0);
        for (int h = 0; h < s.H; h++) {
            float* wh = w + (long)h * n + k0;
            const float rescale = rows[h].add_tile(wh, wh, tile, tile, c, bf16);
            for (int d = 0; d < s.D; d++) o[h * s.D + d] *= rescale;
        }
        for (int j = k0; j < k0 + tile; j++) {
            for (long c = 0; c < s.ldk(); c++) {
                const float x = vb[j * s.ldk() + c] * v_scale[c / s.D];
                v_row[c] = bf16 ? round_bf16(x) : x;
            }
            for (int h = 0; h < s.H; h++) {
                const float wj = w[(long)h * n + j];
                const float* vj = v_row + (h / group) * s.D;
                float* oh = o + h * s.D;
#pragma omp simd
                for (int d = 0; d < s.D; d++) oh[d] += wj * vj[d];
            }
        }
    }
    for (int h = 0; h < s.H; h++) {
        const float inv = 1.0f / rows[h].total();
        lse[h] = rows[h].lse(scale);
        for (int d = 0; d < s.D; d++) o[h * s.D + d] = bf16 ? round_bf16(o[h * s.D + d] * inv) : o[h * s.D + d] * inv;
    }
}

// One decode row of attention_forward_cached: the decode kernels' chunks over keys kb, vb [n][ldk]
// (kept values: times k_scale, v_scale [KV] for the stored ones) whose first `prefix` are its prompt's
// whole tiles (decode_prefix_keys; kv_decode_split_kernel, its chunks and then their merge). With bf16
// P V follows the kernel's tensor cores: per 16 keys P_hi V, then P_lo V (P = P_hi + P_lo, each
// BF16); keys past the tile's would add +0 to sums that are never -0, so they are left out.
inline void cached_decode_row(float* o, float* lse, const float* qt, const float* kb, const float* vb, int n, int prefix,
                              AttentionShape s, const float* k_scale, const float* v_scale, float* scratch, bool bf16) {
    const float scale = 1.0f / std::sqrt((float)s.D);
    const int group = s.H / s.KV, splits = decode_row_chunks(n, prefix, kDecodeSplitKeys);
    float* part_o = scratch;                                  // [splits][H][D]
    float* part_lse = part_o + (long)splits * s.H * s.D;      // [splits][H]
    float* p = part_lse + (long)splits * s.H;                 // [H][kDecodeTile]
    float *max = p + (long)s.H * kDecodeTile, *sum = max + s.H;  // [H] each
    for (int c = 0; c < splits; c++) {
        long begin, end;
        decode_chunk_keys(n, prefix, kDecodeSplitKeys, c, &begin, &end);
        float *po = part_o + (long)c * s.H * s.D, *pl = part_lse + (long)c * s.H;
        for (int e = 0; e < s.H * s.D; e++) po[e] = 0.0f;
        for (int h = 0; h < s.H; h++) max[h] = -INFINITY, sum[h] = 0.0f;
        for (long k0 = begin; k0 < end; k0 += kDecodeTile) {
            const int keys = (int)std::min<long>(kDecodeTile, end - k0);
            for (int j = 0; j < keys; j++) {
                const float* kj = kb + (k0 + j) * s.ldk();
                if (k0 + j + kPrefetchRows < end) prefetch_row(kj + kPrefetchRows * s.ldk(), s.ldk());
                for (int h = 0; h < s.H; h++)
                    p[h * kDecodeTile + j] =
                        dot_in_order(qt + h * s.D, kj + (h / group) * s.D, s.D) * k_scale[h / group] * scale;
            }
            for (int h = 0; h < s.H; h++) {
                float* ph = p + h * kDecodeTile;
                float new_max = max[h];
                for (int j = 0; j < keys; j++) new_max = ph[j] > new_max ? ph[j] : new_max;
                const float rescale = fast_exp(max[h] - new_max);  // exp(-inf) = 0 on the first tile
                float lanes[kDecodeTile];
                for (int j = 0; j < kDecodeTile; j++) lanes[j] = ph[j] = j < keys ? fast_exp(ph[j] - new_max) : 0.0f;
                max[h] = new_max;
                sum[h] = sum[h] * rescale + warp_butterfly_sum(lanes);
                for (int d = 0; d < s.D; d++) po[h * s.D + d] *= rescale;
            }
            for (int j0 = 0; j0 < keys; j0 += 16)
                for (int part = 0; part < (bf16 ? 2 : 1); part++)  // P_hi, then P_lo (FP32: P as it is)
                    for (int j = j0; j < std::min(j0 + 16, keys); j++) {
                        const float* vj = vb + (k0 + j) * s.ldk();
                        for (int h = 0; h < s.H; h++) {
                            const float pj = p[h * kDecodeTile + j], hi = bf16 ? round_bf16(pj) : pj;
                            const float w = part == 0 ? hi : round_bf16(pj - hi);
                            const float* vh = vj + (h / group) * s.D;
                            float* oh = po + h * s.D;
#pragma omp simd
                            for (int d = 0; d < s.D; d++) oh[d] += w * vh[d];
                        }
                    }
        }
        for (int h = 0; h < s.H; h++) {
            pl[h] = begin < end ? max[h] + fast_log(sum[h]) : -INFINITY;  // an empty chunk weighs 0
            if (begin < end)
                for (int d = 0; d < s.D; d++) po[h * s.D + d] = po[h * s.D + d] * v_scale[h / group] / sum[h];
        }
    }
    for (int h = 0; h < s.H; h++) {  // the merge, chunks in order
        float lse_max = -INFINITY;
        for (int c = 0; c < splits; c++) lse_max = std::max(lse_max, part_lse[c * s.H + h]);
        float weight_sum = 0.0f;
        for (int c = 0; c < splits; c++) weight_sum += fast_exp(part_lse[c * s.H + h] - lse_max);
        for (int d = 0; d < s.D; d++) {
            float acc = 0.0f;
            for (int c = 0; c < splits; c++)
                acc += fast_exp(part_lse[c * s.H + h] - lse_max) * part_o[((long)c * s.H + h) * s.D + d];
            o[h * s.D + d] = bf16 ? round_bf16(acc / weight_sum) : acc / weight_sum;
        }
        lse[h] = lse_max + std::log(weight_sum);
    }
}

// Forward reading a KV cache: query row t sees `key_count[t]` keys starting at row `key_start[t]`
// of K and V (rows of KV*D), as a prefill or as a decode step computes it (`rows`; a decode row's
// first key_prefix[t] keys are its prompt's whole tiles, decode_prefix_keys; null: none). One task per
// query row walks the key rows once for all heads, so the cache streams through in contiguous rows
// (decode is bound by reading it). out [T, H, D]; lse [T, H]; q [T, H, D]; scratch [threads,
// scratch_stride >= cached_attention_scratch_floats(s, max key_count)]. K and V hold what KvCache keeps;
// k_scale, v_scale [KV] (KvCache::head_scales) turn them into the stored values.
inline void attention_forward_cached(float* out, float* lse, const float* q, const float* K, const float* V,
                                     const float* k_scale, const float* v_scale, const int64_t* key_start,
                                     const int32_t* key_count, const int32_t* key_prefix, long T, AttentionShape s,
                                     float* scratch, long scratch_stride, bool bf16, CachedRows rows) {
#pragma omp parallel
    {
        float* thread_scratch = scratch + (long)omp_get_thread_num() * scratch_stride;
        std::vector<FlashRow> flash(rows == CachedRows::Prefill ? s.H : 0);  // a prefill row's state per head
#pragma omp for schedule(dynamic, 1)
        for (long t = 0; t < T; t++) {
            const float *kb = K + key_start[t] * s.ldk(), *vb = V + key_start[t] * s.ldk();
            if (rows == CachedRows::Prefill)
                cached_prefill_row(out + t * s.ldq(), lse + t * s.H, q + t * s.ldq(), kb, vb, key_count[t], s, k_scale,
                                   v_scale, thread_scratch, flash.data(), bf16);
            else
                cached_decode_row(out + t * s.ldq(), lse + t * s.H, q + t * s.ldq(), kb, vb, key_count[t],
                                  key_prefix ? key_prefix[t] : 0, s, k_scale, v_scale, thread_scratch, bf16);
        }
    }
}

// Packed backward (flash-attention style, probabilities recomputed from lse). One task per
// (sequence, kv head) owns that head's dk, dv rows and walks its query heads and query blocks in
// order, so every gradient row has one writer and a fixed summation order:
//   P = 2^(Q K^T c - lse log2(e)) (c = scale log2(e)), dP = dO V^T, dS = P * (dP - delta) * scale,
//   dQ = dS K, dK += dS^T Q, dV += P^T dO;  delta [T, H] = rowsum(dO * O).
// bf16: P and dS are rounded to BF16 once dS is formed, as the kernels round them to meet dO, K and Q
// on the tensor cores (the caller rounds dq, dk, dv, which the kernels store in BF16).
inline void attention_backward_packed(float* dq, float* dk, float* dv, float* delta, const float* dout,
                                      const float* out, const float* lse, const float* q, const float* k,
                                      const float* v, const std::vector<int64_t>& seq_offsets, long T,
                                      AttentionShape s, bool bf16) {
    const float scale = 1.0f / std::sqrt((float)s.D), c = exp2_domain(scale);
    const int group = s.H / s.KV;
#pragma omp parallel for schedule(static)
    for (long th = 0; th < T * s.H; th++) {
        const long t = th / s.H;
        const int h = (int)(th % s.H);
        delta[th] = dot_in_order(dout + t * s.ldq() + h * s.D, out + t * s.ldq() + h * s.D, s.D);  // attention_delta_kernel's order
    }
    std::vector<AttentionTask> tasks;
    long longest = 0;
    for (size_t i = 0; i + 1 < seq_offsets.size(); i++) {
        const long b = seq_offsets[i], e = seq_offsets[i + 1];
        longest = e - b > longest ? e - b : longest;
        for (int kvh = 0; kvh < s.KV; kvh++) tasks.push_back({b, e, b, e, kvh});
    }
#pragma omp parallel
    {
        std::vector<float> p((size_t)kFlashTile * longest), ds((size_t)kFlashTile * longest);  // [queries, keys]
#pragma omp for schedule(dynamic, 1)
        for (size_t ti = 0; ti < tasks.size(); ti++) {
            const AttentionTask& t = tasks[ti];
            const int n = (int)(t.end - t.begin), kvh = t.head;
            const float* kb = k + t.begin * s.ldk() + kvh * s.D;
            const float* vb = v + t.begin * s.ldk() + kvh * s.D;
            float* dkb = dk + t.begin * s.ldk() + kvh * s.D;
            float* dvb = dv + t.begin * s.ldk() + kvh * s.D;
            for (int j = 0; j < n; j++)
                for (int d = 0; d < s.D; d++) dkb[(long)j * s.ldk() + d] = dvb[(long)j * s.ldk() + d] = 0.0f;
            for (int h = kvh * group; h < (kvh + 1) * group; h++)
                for (long q0 = t.begin; q0 < t.end; q0 += kFlashTile) {
                    const int nq = (int)std::min<long>(kFlashTile, t.end - q0), keys = (int)(q0 + nq - t.begin);
                    const float* qb = q + q0 * s.ldq() + h * s.D;
                    const float* dob = dout + q0 * s.ldq() + h * s.D;
                    gemm_nt(nq, keys, s.D, qb, (int)s.ldq(), kb, (int)s.ldk(), p.data(), keys, false);
                    gemm_nt(nq, keys, s.D, dob, (int)s.ldq(), vb, (int)s.ldk(), ds.data(), keys, false);
                    for (int i = 0; i < nq; i++) {
                        const long row = q0 + i;
                        const int valid = (int)(row - t.begin) + 1;
                        float *pr = p.data() + (long)i * keys, *dsr = ds.data() + (long)i * keys;
                        exp2_fma_row(pr, pr, c, exp2_domain(lse[row * s.H + h]), valid);
                        const float dl = delta[row * s.H + h];
                        for (int j = 0; j < valid; j++) dsr[j] = pr[j] * (dsr[j] - dl) * scale;
                        if (bf16)
                            for (int j = 0; j < valid; j++) pr[j] = round_bf16(pr[j]), dsr[j] = round_bf16(dsr[j]);
                        for (int j = valid; j < keys; j++) pr[j] = dsr[j] = 0.0f;
                    }
                    gemm_nn(nq, s.D, keys, ds.data(), keys, kb, (int)s.ldk(), dq + q0 * s.ldq() + h * s.D, (int)s.ldq(),
                            false);
                    gemm_tn(keys, s.D, nq, ds.data(), keys, qb, (int)s.ldq(), dkb, (int)s.ldk(), true);
                    gemm_tn(keys, s.D, nq, p.data(), keys, dob, (int)s.ldq(), dvb, (int)s.ldk(), true);
                }
        }
    }
}

}  // namespace fp8rl
