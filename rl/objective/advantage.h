// advantage.h: outcome advantages per group of G responses to one prompt (spec-rl.md §1), DAPO's
// dynamic-sampling filter and overlong reward shaping (§6). A batch holds its groups contiguously:
// rewards[g * G + i] is response i of group g.
#pragma once
#include <cmath>
#include <string>
#include <vector>

#include "rl/common.h"

namespace fp8rl {

// GRPO: (R - mean) / (std + eps); Dr.GRPO: R - mean; RLOO: R - mean of the others
// = G/(G-1) (R - mean). DAPO uses GRPO's estimator.
enum class AdvantageEstimator { Grpo, DrGrpo, Rloo };

constexpr double grpo_std_eps = 1e-6;  // verl: added outside the std (spec-rl.md §1.1)

inline AdvantageEstimator parse_advantage_estimator(const std::string& algo) {
    if (algo == "grpo" || algo == "dapo") return AdvantageEstimator::Grpo;
    if (algo == "drgrpo") return AdvantageEstimator::DrGrpo;
    if (algo == "rloo") return AdvantageEstimator::Rloo;
    fail("unknown advantage estimator '%s'; use grpo, dapo, drgrpo or rloo", algo.c_str());
}

inline bool all_equal(const double* r, size_t n) {
    for (size_t i = 1; i < n; i++)
        if (r[i] != r[0]) return false;
    return true;
}

// Advantages of one group of n >= 2 rewards. std is Bessel-corrected (torch.std, verl) unless
// unbiased_std is false (population std). A group of equal rewards gets exactly 0.
inline void group_advantages(const double* rewards, size_t n, AdvantageEstimator est, bool unbiased_std, double* adv) {
    if (n < 2) fail("advantages need a group of at least 2 responses (got %zu); raise --group_size", n);
    if (all_equal(rewards, n)) {
        for (size_t i = 0; i < n; i++) adv[i] = 0.0;
        return;
    }
    double mean = 0.0;
    for (size_t i = 0; i < n; i++) mean += rewards[i];
    mean /= (double)n;
    double ss = 0.0;
    for (size_t i = 0; i < n; i++) ss += (rewards[i] - mean) * (rewards[i] - mean);
    double std_dev = std::sqrt(ss / (double)(unbiased_std ? n - 1 : n));
    for (size_t i = 0; i < n; i++) {
        double centered = rewards[i] - mean;
        switch (est) {
            case AdvantageEstimator::Grpo: adv[i] = centered / (std_dev + grpo_std_eps); break;
            case AdvantageEstimator::DrGrpo: adv[i] = centered; break;
            case AdvantageEstimator::Rloo: adv[i] = centered * (double)n / (double)(n - 1); break;
        }
    }
}

// Advantages of a batch of whole groups (rewards.size() a multiple of group_size).
inline std::vector<double> batch_advantages(const std::vector<double>& rewards, size_t group_size,
                                            AdvantageEstimator est, bool unbiased_std = true) {
    if (group_size == 0 || rewards.size() % group_size != 0)
        fail("advantages: %zu rewards do not form groups of %zu", rewards.size(), group_size);
    std::vector<double> adv(rewards.size());
    for (size_t g = 0; g < rewards.size(); g += group_size)
        group_advantages(&rewards[g], group_size, est, unbiased_std, &adv[g]);
    return adv;
}

// DAPO dynamic sampling: the groups whose rewards are not all equal (zero std gives zero
// advantages, hence no gradient). The driver keeps these and generates more batches, up to its
// limit, until it has enough; `dropped` feeds dynamic_sampling/kept_group_fraction.
struct GroupFilter {
    std::vector<size_t> kept;  // group indices, ascending
    size_t dropped = 0;
};

inline GroupFilter filter_informative_groups(const std::vector<double>& rewards, size_t group_size) {
    if (group_size == 0 || rewards.size() % group_size != 0)
        fail("dynamic sampling: %zu rewards do not form groups of %zu", rewards.size(), group_size);
    GroupFilter f;
    for (size_t g = 0; g * group_size < rewards.size(); g++) {
        if (all_equal(&rewards[g * group_size], group_size)) f.dropped++;
        else f.kept.push_back(g);
    }
    return f;
}

// DAPO overlong shaping (verl's overlong_buffer): 0 up to max_len - buffer tokens, then a linear
// ramp down to -factor at max_len (and -factor beyond). buffer = 0 turns it off.
inline double overlong_penalty(int64_t length, int64_t max_len, int64_t buffer, double factor) {
    if (buffer <= 0) return 0.0;
    if (buffer > max_len) fail("overlong buffer %lld exceeds the length budget %lld", (long long)buffer, (long long)max_len);
    int64_t exceed = length - (max_len - buffer);
    if (exceed <= 0) return 0.0;
    if (length >= max_len) return -factor;
    return -(double)exceed / (double)buffer * factor;
}

}  // namespace fp8rl
