// sampling.h: the sampling rule for one position, given its logits and one uniform number u in
// [0, 1) (from rl/numerics/rng.h). Shared by the CPU engine and CUDA kernels (one thread per row), so it
// uses no allocation: the caller passes a scratch row of `n` floats.
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
//      the sample is the first token whose running sum exceeds u * (kept mass).
// Tokens are ranked by their float probability exp(s - max s), which orders them like the logits
// except where two logits are so close that their probabilities round to the same float.
//
// Thresholds are found by bisection over the bit patterns of the probabilities (non-negative
// floats order like their bits), so no sort is needed: O(n) per pass, <= 31 passes per threshold.
//
// Host and device compute the same bits: exp is rl/numerics/fast_exp.h's, products are never fused into
// the next add (mul_rn), and every sum over a row adds in one fixed order (LaneSum), which the
// host's AVX2 loop follows lane for lane.
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

// A sum in double over a row in a fixed order: eight running sums, element i into sum i % 8,
// combined pairwise at the end. A vector loop keeps the eight sums in two 4-lane registers.
struct LaneSum {
    double lane[8] = {};
    FP8RL_HD void add(int i, double x) { lane[i & 7] += x; }
    FP8RL_HD double total() const {
        return ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
    }
};

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

// Sum of the probabilities whose bits are >= key (a non-increasing function of key).
struct MassAtLeast {
    const float* p;
    int n;
    FP8RL_HD double operator()(uint32_t key) const {
        LaneSum mass;
        for (int i = 0; i < n; i++)
            if (prob_key(p[i]) >= key) mass.add(i, p[i]);
        return mass.total();
    }
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

// scratch[i] = exp(logits[i] * inv_t - s_max) for i < n, where s_max is the largest
// logits[i] * inv_t (so the largest entry is exactly 1). Returns s_max; *z gets the entries' sum,
// in the order of MassAtLeast (so it equals the kept mass when nothing is cut).
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
    LaneSum sum;
    i = 0;
#if FP8RL_HOST_AVX2
    const __m256 vs = _mm256_set1_ps(s_max);
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();  // sums 0-3 and 4-7
    for (; i + 8 <= n; i += 8) {
        const __m256 e = fast_exp8(_mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(logits + i), vt), vs));
        _mm256_storeu_ps(scratch + i, e);
        lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    _mm256_storeu_pd(sum.lane, lo);
    _mm256_storeu_pd(sum.lane + 4, hi);
#endif
    for (; i < n; i++) {
        scratch[i] = fast_exp(mul_rn(logits[i], inv_t) - s_max);
        sum.add(i, scratch[i]);
    }
    *z = sum.total();
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

// The inverse CDF in id order over the kept entries (nonzero scratch): the first token whose running
// sum exceeds target (= u * kept mass).
FP8RL_HD int inverse_cdf(const float* scratch, int n, double target) {
    double cum = 0.0;
    int token = -1;
    for (int i = 0; i < n && (token < 0 || cum <= target); i++) {
        if (scratch[i] == 0.0f) continue;
        cum += scratch[i];
        token = i;  // the last nonzero token also catches u * kept rounding up to the total
    }
    return token;
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
    double before = 0.0;  // inverse_cdf's running sum up to the token
    for (int i = 0; i < token; i++) before += scratch[i];
    const double target = (double)u * kept, after = before + scratch[token];
    if (target < before) return (float)((before - target) / kept);
    if (target >= after) return (float)((target - after) / kept);
    return (float)(-fmin(target - before, after - target) / kept);
}

}  // namespace fp8rl
