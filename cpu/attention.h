// attention.h: causal attention with GQA on the CPU, forward and backward. Query head h reads kv
// head h / (H/KV); scores scale by D^-1/2; softmax in FP32; lse [T, H] is kept for the backward.
//
// Two forms of the forward pass:
//   - packed batch (training, --logprobs): per (sequence, head, block of kQueryBlock queries), the
//     scores are one GEMM (Q K^T) and the output another (P V), so attention runs at GEMM speed;
//   - KV cache (generation): per (query row, head) over the row's keys in the cache, as a decode step
//     has one query per sequence.
// Both compute the same function; their roundings differ (a dot product summed in SIMD lanes vs one
// FMA chain per output), which the decode-vs-forward test bounds. Each output is written by one
// task in a fixed order, so results are bitwise identical for any thread count, and a sequence's
// result does not depend on the other sequences of the batch (masked scores enter the P V product
// as exact zeros, so the query blocking does not change a row's sum either).
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include <omp.h>

#include "rl/numerics/bf16.h"
#include "rl/numerics/fast_exp.h"
#include "cpu/gemm.h"

namespace fp8rl {

struct AttentionShape {
    int H, KV, D;
    long ldq() const { return (long)H * D; }
    long ldk() const { return (long)KV * D; }
};

constexpr int kQueryBlock = 64;  // queries per score block: [64 x keys] scores stay in L2 for 1k keys

inline float dot_product(const float* a, const float* b, int n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

// Softmax of one row of raw scores p[0..valid) in place (scaled first), zeros in p[valid..keys);
// returns the row's log-sum-exp of the scaled scores. bf16: the probabilities are rounded, as they
// meet V in BF16 in flash attention.
inline float softmax_row(float* p, int valid, int keys, float scale, bool bf16) {
    float mx = -INFINITY;
    for (int j = 0; j < valid; j++) {
        p[j] *= scale;
        mx = p[j] > mx ? p[j] : mx;
    }
    fast_exp_shifted(p, p, mx, valid);
    float sum = 0.0f;
    for (int j = 0; j < valid; j++) sum += p[j];
    const float inv = 1.0f / sum;
    for (int j = 0; j < valid; j++) p[j] = bf16 ? round_bf16(p[j] * inv) : p[j] * inv;
    for (int j = valid; j < keys; j++) p[j] = 0.0f;
    return mx + std::log(sum);
}

// One unit of work over a packed batch: sequence rows [begin, end), head (forward: query head,
// backward: kv head), and for the forward a block of queries [q0, q1).
struct AttentionTask {
    long begin, end, q0, q1;
    int head;
};

// Packed forward. out [T, H, D]; lse [T, H]; q [T, H, D]; k, v [T, KV, D]; sequence s is rows
// seq_offsets[s] .. seq_offsets[s+1] with positions from 0.
inline void attention_forward_packed(float* out, float* lse, const float* q, const float* k, const float* v,
                                     const std::vector<int64_t>& seq_offsets, AttentionShape s, bool bf16) {
    const float scale = 1.0f / std::sqrt((float)s.D);
    const int group = s.H / s.KV;
    std::vector<AttentionTask> tasks;
    long longest = 0;
    for (size_t i = 0; i + 1 < seq_offsets.size(); i++) {
        const long b = seq_offsets[i], e = seq_offsets[i + 1];
        longest = e - b > longest ? e - b : longest;
        for (int h = 0; h < s.H; h++)
            for (long q0 = b; q0 < e; q0 += kQueryBlock) tasks.push_back({b, e, q0, std::min(e, q0 + kQueryBlock), h});
    }
#pragma omp parallel
    {
        std::vector<float> p((size_t)kQueryBlock * longest);  // [queries, keys] scores, then probabilities
#pragma omp for schedule(dynamic, 1)
        for (size_t ti = 0; ti < tasks.size(); ti++) {
            const AttentionTask& t = tasks[ti];
            const int nq = (int)(t.q1 - t.q0), keys = (int)(t.q1 - t.begin), kvh = t.head / group;
            const float* kb = k + t.begin * s.ldk() + kvh * s.D;
            const float* vb = v + t.begin * s.ldk() + kvh * s.D;
            gemm_nt(nq, keys, s.D, q + t.q0 * s.ldq() + t.head * s.D, (int)s.ldq(), kb, (int)s.ldk(), p.data(), keys,
                    false);
            for (int i = 0; i < nq; i++) {
                const long row = t.q0 + i;
                lse[row * s.H + t.head] = softmax_row(p.data() + (long)i * keys, (int)(row - t.begin) + 1, keys, scale, bf16);
            }
            float* o = out + t.q0 * s.ldq() + t.head * s.D;
            gemm_nn(nq, s.D, keys, p.data(), keys, vb, (int)s.ldk(), o, (int)s.ldq(), false);
            if (bf16)
                for (int i = 0; i < nq; i++)
                    for (int d = 0; d < s.D; d++) o[(long)i * s.ldq() + d] = round_bf16(o[(long)i * s.ldq() + d]);
        }
    }
}

constexpr int kPrefetchRows = 4;  // cache rows ahead of the one being read

// Fetches the cache lines of floats p[0..n) ahead of their use.
inline void prefetch_row(const float* p, long n) {
    for (long i = 0; i < n; i += 16) __builtin_prefetch(p + i, 0, 3);
}

// Forward reading a KV cache: query row t sees `key_count[t]` keys starting at row `key_start[t]`
// of K and V (rows of KV*D). One task per query row walks each key row once for all heads, so
// the cache streams through in contiguous rows (decode is bound by reading it).
// out [T, H, D]; lse [T, H]; q [T, H, D]; scratch [threads, H * max key_count].
inline void attention_forward_cached(float* out, float* lse, const float* q, const float* K, const float* V,
                                     const int64_t* key_start, const int32_t* key_count, long T, AttentionShape s,
                                     float* scratch, long scratch_stride, bool bf16) {
    const float scale = 1.0f / std::sqrt((float)s.D);
    const int group = s.H / s.KV;
    const long per_head = scratch_stride / s.H;  // [H, per_head] scores of one row
#pragma omp parallel
    {
        float* p = scratch + (long)omp_get_thread_num() * scratch_stride;
#pragma omp for schedule(dynamic, 1)
        for (long t = 0; t < T; t++) {
            const int n = key_count[t];
            const float* qt = q + t * s.ldq();
            const float* kb = K + key_start[t] * s.ldk();
            const float* vb = V + key_start[t] * s.ldk();
            for (int j = 0; j < n; j++) {
                if (j + kPrefetchRows < n) prefetch_row(kb + (j + kPrefetchRows) * s.ldk(), s.ldk());
                for (int h = 0; h < s.H; h++)
                    p[h * per_head + j] = dot_product(qt + h * s.D, kb + j * s.ldk() + (h / group) * s.D, s.D);
            }
            for (int h = 0; h < s.H; h++) lse[t * s.H + h] = softmax_row(p + h * per_head, n, n, scale, bf16);
            float* o = out + t * s.ldq();
            for (int d = 0; d < s.H * s.D; d++) o[d] = 0.0f;
            for (int j = 0; j < n; j++) {
                if (j + kPrefetchRows < n) prefetch_row(vb + (j + kPrefetchRows) * s.ldk(), s.ldk());
                for (int h = 0; h < s.H; h++) {
                    const float pj = p[h * per_head + j];
                    const float* vj = vb + j * s.ldk() + (h / group) * s.D;
                    float* oh = o + h * s.D;
#pragma omp simd
                    for (int d = 0; d < s.D; d++) oh[d] += pj * vj[d];
                }
            }
            if (bf16)
                for (int d = 0; d < s.H * s.D; d++) o[d] = round_bf16(o[d]);
        }
    }
}

// Packed backward (flash-attention style, probabilities recomputed from lse). One task per
// (sequence, kv head) owns that head's dk, dv rows and walks its query heads and query blocks in
// order, so every gradient row has one writer and a fixed summation order:
//   P = exp(Q K^T * scale - lse), dP = dO V^T, dS = P * (dP - delta) * scale,
//   dQ = dS K, dK += dS^T Q, dV += P^T dO;  delta [T, H] = rowsum(dO * O).
inline void attention_backward_packed(float* dq, float* dk, float* dv, float* delta, const float* dout,
                                      const float* out, const float* lse, const float* q, const float* k,
                                      const float* v, const std::vector<int64_t>& seq_offsets, long T,
                                      AttentionShape s) {
    const float scale = 1.0f / std::sqrt((float)s.D);
    const int group = s.H / s.KV;
#pragma omp parallel for schedule(static)
    for (long th = 0; th < T * s.H; th++) {
        const long t = th / s.H;
        const int h = (int)(th % s.H);
        delta[th] = dot_product(dout + t * s.ldq() + h * s.D, out + t * s.ldq() + h * s.D, s.D);
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
        std::vector<float> p((size_t)kQueryBlock * longest), ds((size_t)kQueryBlock * longest);  // [queries, keys]
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
                for (long q0 = t.begin; q0 < t.end; q0 += kQueryBlock) {
                    const int nq = (int)std::min<long>(kQueryBlock, t.end - q0), keys = (int)(q0 + nq - t.begin);
                    const float* qb = q + q0 * s.ldq() + h * s.D;
                    const float* dob = dout + q0 * s.ldq() + h * s.D;
                    gemm_nt(nq, keys, s.D, qb, (int)s.ldq(), kb, (int)s.ldk(), p.data(), keys, false);
                    gemm_nt(nq, keys, s.D, dob, (int)s.ldq(), vb, (int)s.ldk(), ds.data(), keys, false);
                    for (int i = 0; i < nq; i++) {
                        const long row = q0 + i;
                        const int valid = (int)(row - t.begin) + 1;
                        float *pr = p.data() + (long)i * keys, *dsr = ds.data() + (long)i * keys;
                        for (int j = 0; j < valid; j++) pr[j] *= scale;
                        fast_exp_shifted(pr, pr, lse[row * s.H + h], valid);
                        const float dl = delta[row * s.H + h];
                        for (int j = 0; j < valid; j++) dsr[j] = pr[j] * (dsr[j] - dl) * scale;
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
