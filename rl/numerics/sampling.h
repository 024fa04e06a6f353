// sampling.h: the sampling rule for one position, given its logits and one uniform number u in
// [0, 1) (from rl/numerics/rng.h). Shared by the CPU engine and CUDA kernels (one thread per row here;
// cuda/rollout/sampling.cuh runs the same steps with a block per row), so it uses no allocation: the caller
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
//      the sample is the first kept token whose running sum exceeds the target u * (kept mass).
//      The running sums are prefix sums through a fixed binary tree (the prefix tree, below), at
//      two levels of the row sum's chunks: the chunk is the first chunk with mass whose tree
//      prefix of the chunk masses 0..c exceeds the target (the last chunk with mass if none does);
//      inside it the token is the first kept one whose tree prefix of the chunk's probabilities,
//      added to the tree prefix of the chunks before it, exceeds the target (the chunk's last kept
//      token if none does). A token that is not kept (probability 0) is never drawn. Rounding
//      aside this is the plain running sum; the tree's totals may differ from the kept mass (a
//      sequential row_sum) in the last bits, which is what the two fallbacks are for.
// Tokens are ranked by their float probability exp(s - max s), which orders them like the logits
// except where two logits are so close that their probabilities round to the same float.
//
// Thresholds are found by bisection over the bit patterns of the probabilities (non-negative
// floats order like their bits), so no sort is needed: O(n) per pass, <= 31 passes per threshold.
//
// Host and device compute the same bits: exp is rl/numerics/fast_exp.h's, products are never fused into
// the next add (mul_rn), and every sum over a row (its mass, the kept masses, top-p's bisection,
// the chunk masses the inverse CDF starts from) is one chunked two-level sum (row_sum): the ids
// split into chunks of kSumChunk, each chunk summed in double in LaneSum's order, the chunk sums
// added in chunk order. The inverse CDF's running sums are the prefix tree's, whose order depends
// only on the number of terms. Neither depends on the block size or the batch, so a block sums its
// chunks and scans its prefix trees in parallel and gets the host's bits; the host's AVX2 loop
// follows LaneSum lane for lane, and the host walks the prefix tree in order (PrefixTreeScan).
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
// 297 chunks at Qwen's 151,936 ids, one per thread of cuda/rollout/sampling.cuh's blocks. The inverse CDF's
// prefix trees span the chunks (one term a chunk) and then one chunk (one term an id).
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

// The prefix tree: running sums in an order that a block computes in parallel (cuda/rollout/sampling.cuh)
// and one thread in order with O(log count) memory (PrefixTreeScan). Over terms x(0), x(1), ...,
// x(count - 1), the level-k block sums, one per whole block of 2^k terms, are
//     B_0[j] = x(j),   B_k[j] = B_{k-1}[2j] + B_{k-1}[2j + 1]   (terms [j 2^k, (j + 1) 2^k), all < count).
// The prefix of the first m terms from `start` adds to start the blocks of m's binary
// decomposition, the largest first, each the block after the terms already added:
//     prefix(start, m) = ((start + B_k1[0]) + B_k2[2^(k1-k2)]) + ...   for m = 2^k1 + 2^k2 + ..., k1 > k2 > ...
// e.g. prefix(s, 7) = ((s + ((x0 + x1) + (x2 + x3))) + (x4 + x5)) + x6. The order depends on m
// alone, never on the block size. block(k, j) returns B_k[j].
template <class B>
FP8RL_HD double tree_prefix(double start, int m, const B& block) {
    double sum = start;
    int done = 0;
    for (int k = 30; k >= 0; k--)
        if (m >> k & 1) {
            sum += block(k, done >> k);
            done += 1 << k;
        }
    return sum;
}

// The prefix tree walked in order by one thread: after push(x(0)), ..., push(x(m - 1)),
// prefix(start) = tree_prefix(start, m, ...). level[k] holds the latest whole level-k block, which
// is the one m's decomposition adds wherever bit k of m is set.
struct PrefixTreeScan {
    double level[31] = {};
    int count = 0;
    struct Latest {
        const double* level;
        FP8RL_HD double operator()(int k, int) const { return level[k]; }
    };
    FP8RL_HD double prefix(double start) const { return tree_prefix(start, count, Latest{level}); }
    FP8RL_HD void push(double x) {
        count++;
        for (int k = 0;; k++) {  // x completes the latest level-k block, k = 0, 1, ...
            const double left = level[k];
            level[k] = x;
            if (count >> k & 1) return;  // an odd number of whole level-k blocks: x is a left half
            x = left + x;                // else it is a right half: their level-(k+1) block
        }
    }
};

// The inverse CDF over terms x(0..count) (each >= 0; a term > 0 is kept) with the running sums of
// the prefix tree from `start`: the first kept i whose prefix(start, i + 1) exceeds target, else
// the last kept i (-1 if none is kept); *before gets prefix(start, i) of that i.
template <class X>
FP8RL_HD int tree_inverse_cdf(int count, const X& x, double start, double target, double* before) {
    PrefixTreeScan scan;
    int pick = -1;
    for (int i = 0; i < count; i++) {
        const double xi = x(i);
        if (!(xi > 0.0)) {
            scan.push(xi);
            continue;
        }
        pick = i;
        *before = scan.prefix(start);
        scan.push(xi);
        if (scan.prefix(start) > target) break;
    }
    return pick;
}

// p[i] in double: a chunk's terms, from its first id.
struct ProbTerm {
    const float* p;
    FP8RL_HD double operator()(int i) const { return (double)p[i]; }
};

// The inverse CDF over the kept entries (nonzero p) with target = u * kept mass: the chunk by the
// prefix tree over the chunk masses, then the token by the prefix tree over the chunk's ids from
// the prefix of the chunks before it.
FP8RL_HD int inverse_cdf(const float* p, int n, double target) {
    double before = 0.0, unused = 0.0;
    const int c = tree_inverse_cdf(sum_chunks(n), ChunkMass{p, n}, 0.0, target, &before);
    const int lo = c * kSumChunk;
    return lo + tree_inverse_cdf(chunk_hi(n, c) - lo, ProbTerm{p + lo}, before, target, &unused);
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

// The targets tree_inverse_cdf(count, x, start, target) maps to kept term i: [*lo, *hi), from the
// largest prefix through a kept term before i (0 if none) to the prefix through i, unbounded above
// (+inf) if no kept term follows i. Empty only where rounding orders two prefixes against their
// terms' order. Returns prefix(start, i), where the next level's running sums start.
template <class X>
FP8RL_HD double tree_cdf_interval(int count, const X& x, double start, int i, double* lo, double* hi) {
    PrefixTreeScan scan;
    double before = start;
    *lo = 0.0;
    *hi = INFINITY;
    for (int j = 0; j < count; j++) {
        const double xj = x(j);
        if (j == i) before = scan.prefix(start);
        scan.push(xj);
        if (!(xj > 0.0)) continue;
        const double after = scan.prefix(start);
        if (j < i) {
            *lo = fmax(*lo, after);
        } else if (j == i) {
            *hi = after;
        } else {
            return before;  // a kept term follows i: the prefix through i bounds i's targets
        }
    }
    *hi = INFINITY;
    return before;
}

// How far the draw with uniform u is from `token`, the distance a departure between two engines is
// judged by (a near tie is a small one). Greedy: logit[argmax] - logit[token] at T = 1, in nats (0
// for the argmax). Sampled: in fractions of the kept mass, the distance of u from the interval of
// targets u * kept that inverse_cdf maps to `token`, negative inside it (then minus the distance to
// its nearer edge); +inf for a token top-k or top-p cut. The interval is its chunk's (over the chunk
// masses) cut by the token's own (over the chunk's ids), each by tree_cdf_interval, and ends at the
// kept mass at most (u < 1 never reaches it). scratch [n] is overwritten.
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
    const int c = token / kSumChunk, first = c * kSumChunk;
    double chunk_lo, chunk_hi_target, token_lo, token_hi;
    const double before = tree_cdf_interval(sum_chunks(n), ChunkMass{scratch, n}, 0.0, c, &chunk_lo, &chunk_hi_target);
    tree_cdf_interval(chunk_hi(n, c) - first, ProbTerm{scratch + first}, before, token - first, &token_lo, &token_hi);
    const double target = (double)u * kept, lo = fmax(chunk_lo, token_lo),
                 hi = fmin(fmin(chunk_hi_target, token_hi), kept);
    if (target < lo) return (float)((lo - target) / kept);
    if (target >= hi) return (float)((target - hi) / kept);
    return (float)(-fmin(target - lo, hi - target) / kept);
}

}  // namespace fp8rl
