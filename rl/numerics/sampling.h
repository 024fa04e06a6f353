// sampling.h: the sampling rule for one position, given its logits and one uniform number u in
// [0, 1) (from rl/numerics/rng.h). Shared by the CPU engine and CUDA kernels (one thread per row here;
// cuda/sampling.cuh runs the same steps with a block per row), so it uses no allocation: the caller
// passes a scratch row of `n` floats.
//
// Semantics follow HF transformers' warpers, applied in HF's order:
//   1. temperature: s = logits / T (T == 0 means greedy: the argmax, lowest id on ties);
//   2. top-k (k > 0 and k < n): keep every token whose probability is >= the k-th largest one
//      (ties at the threshold are all kept, as HF's `scores < topk(...)[-1]` does);
//   3. top-p (p < 1): among the kept tokens, sorted by probability descending, keep a token while
//      the mass of the tokens before it is < p of the kept mass: the smallest set whose mass is
//      >= p, never empty. Tokens with equal probability are ordered by ascending id (HF's sort
//      leaves that order unspecified; only exact ties at the boundary can differ).
//   4. inverse CDF: walk the kept tokens in ascending id order, accumulating their probabilities;
//      the sample is the first token whose running sum exceeds u * (kept mass). The running sum is
//      the row sum's (below): the chunk where the running sum of the chunk sums first exceeds the
//      target, then inside it the first kept token whose running sum, from the chunks before it,
//      exceeds the target (its last kept token where rounding keeps that sum below).
// Tokens are ranked by their float probability exp(s - max s), which orders them like the logits
// except where two logits are so close that their probabilities round to the same float.
//
// Thresholds are found by bisection over the bit patterns of the probabilities (non-negative
// floats order like their bits), so no sort is needed: O(n) per pass, <= 31 passes per threshold.
//
// Host and device compute the same bits: exp is rl/numerics/fast_exp.h's, products are never fused into
// the next add (mul_rn), and every sum over a row (its mass, the kept masses, top-p's bisection,
// the inverse CDF's running sum) is one chunked two-level sum (row_sum): the ids split into chunks
// of kSumChunk, each chunk summed in double in LaneSum's order, the chunk sums added in chunk order.
// The chunks do not depend on the block size or the batch, so a block sums its chunks in parallel
// and gets the host's bits; the host's AVX2 loop follows LaneSum lane for lane.
//
// The caller restricts `n` to the ids that may be sampled (e.g. the tokenizer's size when the
// embedding has padding rows). Logits must not be NaN; at least one must be finite.
#pragma once
#include <cmath>
#include <cstdint>

#include "rl/numerics/fast_exp.h"
#include "rl/numerics/hostdevice.h"

namespace fp8rl {

struct SamplingParams {
    float temperature = 1.0f;  // 0 = greedy
    int top_k = 0;             // <= 0 or >= n: off
    float top_p = 1.0f;        // >= 1: off
};

struct SampledToken {
    int token;
    // log-prob of `token` under the distribution that was sampled (after temperature, top-k, top-p;
    // renormalized over the kept tokens). 0 for greedy: the distribution is a point mass.
    float logprob;
    // log softmax(logits / T)[token] over all n ids, without top-k/top-p (T = 1 for greedy): the
    // quantity a trainer recomputes from its own logits divided by the sampling temperature.
    float logprob_full;
};

// A sum in double over a chunk in a fixed order: eight running sums, element i into sum i % 8,
// combined pairwise at the end. A vector loop keeps the eight sums in two 4-lane registers.
struct LaneSum {
    double lane[8] = {};
    FP8RL_HD void add(int i, double x) { lane[i & 7] += x; }
    FP8RL_HD double total() const {
        return ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
    }
};

// The row sum's chunk: 512 ids, a multiple of 8 (so id i is in lane i % 8 of its chunk's LaneSum);
// 297 chunks at Qwen's 151,936 ids, one per thread of cuda/sampling.cuh's blocks. A chunk bounds the
// inverse CDF's sequential walk; the number of chunks, the sequential addition of their sums.
constexpr int kSumChunk = 512;
FP8RL_HD int sum_chunks(int n) { return (n + kSumChunk - 1) / kSumChunk; }
FP8RL_HD int chunk_hi(int n, int c) { return n < (c + 1) * kSumChunk ? n : (c + 1) * kSumChunk; }  // its end

// The sum of x(i) over the ids of chunk c of a row of n, in LaneSum's order. Eight ids a step, so
// that every lane index is a constant and a GPU thread keeps the lanes in registers.
template <class X>
FP8RL_HD double chunk_sum(int n, int c, const X& x) {
    LaneSum sum;
    const int hi = chunk_hi(n, c);
    for (int i = c * kSumChunk; i < hi; i += 8)
        for (int l = 0; l < 8; l++)
            if (i + l < hi) sum.lane[l] += x(i + l);
    return sum.total();
}

// The row sum of x(i) over i < n: the chunk sums added in chunk order.
template <class X>
FP8RL_HD double row_sum(int n, const X& x) {
    double total = 0.0;
    for (int c = 0; c < sum_chunks(n); c++) total += chunk_sum(n, c, x);
    return total;
}

// A probability's bit pattern: for non-negative floats it orders like the value.
FP8RL_HD uint32_t prob_key(float x) { return float_bits(x); }

// Number of probabilities whose bits are >= key (a non-increasing function of key).
struct CountAtLeast {
    const float* p;
    int n;
    FP8RL_HD double operator()(uint32_t key) const {
        int count = 0;
        for (int i = 0; i < n; i++) count += prob_key(p[i]) >= key;
        return count;
    }
};

// p[i] where its bits are >= key, else 0 (adding 0.0 leaves a non-negative sum as skipping does).
struct MassTerm {
    const float* p;
    uint32_t key;
    FP8RL_HD double operator()(int i) const { return prob_key(p[i]) >= key ? (double)p[i] : 0.0; }
};

// Sum of the probabilities whose bits are >= key (a non-increasing function of key).
struct MassAtLeast {
    const float* p;
    int n;
    FP8RL_HD double operator()(uint32_t key) const { return row_sum(n, MassTerm{p, key}); }
};

// The largest key in [lo, hi] with f(key) >= target, for f non-increasing and f(lo) >= target.
template <class F>
FP8RL_HD uint32_t largest_key_at_least(uint32_t lo, uint32_t hi, const F& f, double target) {
    while (lo < hi) {
        const uint32_t mid = lo + (hi - lo + 1) / 2;
        if (f(mid) >= target)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

// A row's probability exp(logits[i] * inv_t - s_max), stored in scratch[i] and returned to row_sum.
struct ExpTerm {
    const float* logits;
    float inv_t, s_max;
    float* scratch;
    FP8RL_HD double operator()(int i) const { return scratch[i] = fast_exp(mul_rn(logits[i], inv_t) - s_max); }
};

// scratch[i] = exp(logits[i] * inv_t - s_max) for i < n, where s_max is the largest
// logits[i] * inv_t (so the largest entry is exactly 1). Returns s_max; *z gets the entries' row
// sum (so it equals the kept mass when nothing is cut).
FP8RL_HD float exp_shifted_row(const float* logits, int n, float inv_t, float* scratch, double* z) {
    float s_max = -INFINITY;
    int i = 0;
#if FP8RL_HOST_AVX2
    const __m256 vt = _mm256_set1_ps(inv_t);
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    for (; i + 8 <= n; i += 8) vmax = _mm256_max_ps(vmax, _mm256_mul_ps(_mm256_loadu_ps(logits + i), vt));
    float lanes[8];
    _mm256_storeu_ps(lanes, vmax);
    for (float x : lanes) s_max = fmaxf(s_max, x);
#endif
    for (; i < n; i++) s_max = fmaxf(s_max, mul_rn(logits[i], inv_t));
    const ExpTerm exps{logits, inv_t, s_max, scratch};
#if FP8RL_HOST_AVX2
    // row_sum(n, exps), eight ids at a time: a chunk's LaneSum in two 4-lane registers
    const __m256 vs = _mm256_set1_ps(s_max);
    double total = 0.0;
    for (int c = 0; c < sum_chunks(n); c++) {
        const int hi = chunk_hi(n, c);
        __m256d lo4 = _mm256_setzero_pd(), hi4 = _mm256_setzero_pd();  // sums 0-3 and 4-7
        for (i = c * kSumChunk; i + 8 <= hi; i += 8) {
            const __m256 e = fast_exp8(_mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(logits + i), vt), vs));
            _mm256_storeu_ps(scratch + i, e);
            lo4 = _mm256_add_pd(lo4, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
            hi4 = _mm256_add_pd(hi4, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
        }
        LaneSum sum;
        _mm256_storeu_pd(sum.lane, lo4);
        _mm256_storeu_pd(sum.lane + 4, hi4);
        for (; i < hi; i++) sum.add(i, exps(i));
        total += sum.total();
    }
    *z = total;
#else
    *z = row_sum(n, exps);
#endif
    return s_max;
}

// Greedy pick: the argmax (lowest id on ties), with its full log-softmax at T = 1.
FP8RL_HD SampledToken sample_greedy(const float* logits, int n, float* scratch) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    double z;
    exp_shifted_row(logits, n, 1.0f, scratch, &z);
    return SampledToken{best, 0.0f, (float)-log(z)};
}

// Zeroes scratch[i] for the tokens top-p removes. `kept_mass` is the mass of the nonzero entries.
FP8RL_HD void apply_top_p(float* scratch, int n, float top_p, double kept_mass) {
    const double target = (double)top_p * kept_mass;
    const uint32_t key = largest_key_at_least(0u, prob_key(1.0f), MassAtLeast{scratch, n}, target);
    double before = key == prob_key(1.0f) ? 0.0 : MassAtLeast{scratch, n}(key + 1);
    bool kept_any = before > 0.0;
    for (int i = 0; i < n; i++) {
        const uint32_t b = prob_key(scratch[i]);
        if (b < key) {
            scratch[i] = 0.0f;
        } else if (b == key) {  // the boundary tie group, in ascending id order; never keep nothing
            if (before < target || !kept_any) {
                before += scratch[i];
                kept_any = true;
            } else {
                scratch[i] = 0.0f;
            }
        }
    }
}

// The mass of chunk c of p (a row of n).
struct ChunkMass {
    const float* p;
    int n;
    FP8RL_HD double operator()(int c) const { return chunk_sum(n, c, MassTerm{p, 0u}); }
};

// The inverse CDF's chunk: the first chunk c whose running sum of chunk masses mass(c) (chunk
// order, as row_sum adds them) exceeds target, or the last chunk with mass if rounding keeps the
// total below; *before gets the running sum of the chunks before it.
template <class M>
FP8RL_HD int inverse_cdf_chunk(int chunks, const M& mass, double target, double* before) {
    double cum = 0.0;
    int chunk = -1;
    for (int c = 0; c < chunks && !(chunk >= 0 && cum > target); c++) {
        const double m = mass(c);
        if (m > 0.0) {
            chunk = c;
            *before = cum;
        }
        cum += m;
    }
    return chunk;
}

// The inverse CDF inside chunk c over its kept entries (nonzero p): the first token whose running
// sum in id order, from `cum` (the chunks before), exceeds target; the chunk's last kept token if
// none does.
FP8RL_HD int inverse_cdf_in_chunk(const float* p, int n, int c, double cum, double target) {
    int token = -1;
    for (int i = c * kSumChunk; i < chunk_hi(n, c) && (token < 0 || cum <= target); i++) {
        if (p[i] == 0.0f) continue;
        cum += p[i];
        token = i;
    }
    return token;
}

// The inverse CDF over the kept entries (nonzero scratch) with target = u * kept mass.
FP8RL_HD int inverse_cdf(const float* scratch, int n, double target) {
    double before = 0.0;
    const int c = inverse_cdf_chunk(sum_chunks(n), ChunkMass{scratch, n}, target, &before);
    return inverse_cdf_in_chunk(scratch, n, c, before, target);
}

// The draw of `token` with its log-probs under the kept mass and under all of z_all (the masses of
// exp(s - s_max), s = logits * inv_t).
FP8RL_HD SampledToken sampled_token(const float* logits, int token, float inv_t, float s_max, double kept,
                                    double z_all) {
    const float s_tok = mul_rn(logits[token], inv_t) - s_max;
    return SampledToken{token, (float)(s_tok - log(kept)), (float)(s_tok - log(z_all))};
}

// The distribution a non-greedy draw samples from: scratch[i] = exp(logits[i] / T - s_max) for the
// tokens temperature, top-k and top-p keep, 0 for the rest; *kept their mass, *z_all the mass of all.
FP8RL_HD float kept_distribution(const float* logits, int n, const SamplingParams& params, float* scratch,
                                 double* kept, double* z_all) {
    const float s_max = exp_shifted_row(logits, n, 1.0f / params.temperature, scratch, z_all);
    *kept = *z_all;
    if (params.top_k > 0 && params.top_k < n) {
        const uint32_t key = largest_key_at_least(0u, prob_key(1.0f), CountAtLeast{scratch, n}, params.top_k);
        for (int i = 0; i < n; i++)
            if (prob_key(scratch[i]) < key) scratch[i] = 0.0f;
        *kept = MassAtLeast{scratch, n}(0u);
    }
    if (params.top_p < 1.0f) {
        apply_top_p(scratch, n, params.top_p, *kept);
        *kept = MassAtLeast{scratch, n}(0u);
    }
    return s_max;
}

// Samples one token from `logits` [n] with uniform u in [0, 1); scratch [n] is overwritten.
FP8RL_HD SampledToken sample_token(const float* logits, int n, const SamplingParams& params, float u,
                                   float* scratch) {
    if (params.temperature == 0.0f) return sample_greedy(logits, n, scratch);
    double kept, z_all;
    const float s_max = kept_distribution(logits, n, params, scratch, &kept, &z_all);
    return sampled_token(logits, inverse_cdf(scratch, n, (double)u * kept), 1.0f / params.temperature, s_max, kept, z_all);
}

// How far the draw with uniform u is from `token`, the distance a departure between two engines is
// judged by (a near tie is a small one). Greedy: logit[argmax] - logit[token] at T = 1, in nats (0
// for the argmax). Sampled: in fractions of the kept mass, the distance of u from the inverse-CDF
// interval [before, before + p) that draws `token`, negative inside it (then minus the distance to
// its nearer edge); +inf for a token top-k or top-p cut. scratch [n] is overwritten.
FP8RL_HD float sample_offset(const float* logits, int n, const SamplingParams& params, float u, int token,
                             float* scratch) {
    if (params.temperature == 0.0f) {
        float best = logits[0];
        for (int i = 1; i < n; i++) best = fmaxf(best, logits[i]);
        return best - logits[token];
    }
    double kept, z_all;
    kept_distribution(logits, n, params, scratch, &kept, &z_all);
    if (scratch[token] == 0.0f) return INFINITY;
    // The interval of u * kept that inverse_cdf maps to the token: from the running sum before it
    // to the one after it, cut at its chunk's end (where the next chunk's draws begin), and
    // reaching that end if it is its chunk's last kept token.
    const int c = token / kSumChunk;
    const ChunkMass mass{scratch, n};
    double before = 0.0;
    for (int chunk = 0; chunk < c; chunk++) before += mass(chunk);
    const double chunk_end = before + mass(c);
    for (int i = c * kSumChunk; i < token; i++) before += scratch[i];
    bool last = true;
    for (int i = token + 1; i < chunk_hi(n, c); i++) last = last && scratch[i] == 0.0f;
    const double target = (double)u * kept, after = last ? chunk_end : fmin(before + scratch[token], chunk_end);
    if (target < before) return (float)((before - target) / kept);
    if (target >= after) return (float)((target - after) / kept);
    return (float)(-fmin(target - before, after - target) / kept);
}

}  // namespace fp8rl
