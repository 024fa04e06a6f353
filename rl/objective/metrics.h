// metrics.h: the per-step loss and mismatch metrics, named as in spec-rl.md §8.2. They are kept as
// plain arrays of doubles (sums, minima, maxima) so that data-parallel ranks combine them exactly
// with three all-reduces (SUM, MIN, MAX) before finalize(); every mean is over valid tokens of the
// whole step on all ranks.
//
// Definitions (token-weighted over valid response tokens):
//   actor/pg_clipfrac         clipped branch won (L2 > L1)          actor/pg_clipfrac_lower  dual clip bound
//   actor/pg_clipfrac_low     A < 0 and r < low                     actor/pg_clipfrac_high   A > 0 and r > high
//   actor/ratio_{mean,min,max} r = π_θ/π_old                         actor/ppo_kl             mean(ℓ^old − ℓ^θ), clamped ±20 (verl)
//   actor/entropy             mean H_t                              actor/{pg_loss,kl_loss}  aggregated, mean over updates
//   rollout_corr/kl           mean(ℓ^roll − ℓ^old)                  rollout_corr/k3_kl       mean(e^x − x − 1), x = ℓ^old − ℓ^roll
//   rollout_corr/logprob_abs_diff(_max)  mean (max) |ℓ^old − ℓ^roll|
//   rollout_corr/token_mult_prob_error   mean exp(|ℓ^old − ℓ^roll|)
//   rollout_corr/rollout_is_{mean,std,min,max}  of the IS weights w_t (population std)
//   rollout_corr/rollout_is_eff_sample_size     (mean w)² / mean(w²)
//   rollout_corr/rollout_is_ratio_fraction_high  ρ_t > C (the TIS clip fraction)
//   rollout_corr/rollout_is_ratio_fraction_low   ρ_t < 1/C
//   rollout_corr/chi2_token   mean(ρ²) − 1
//   rollout_corr/rollout_rs_masked_fraction  tokens whose weight a mask set to 0 (mis, seq-mis, icepop, geo-mask)
//   training/rollout_probs_diff_{mean,max,std}  |exp(ℓ^old) − exp(ℓ^roll)| (population std)
#pragma once
#include <math.h>
#include <stdint.h>

#include <string>
#include <utility>
#include <vector>

#include "rl/objective/loss_agg.h"
#include "rl/objective/token_loss.h"

namespace fp8rl {

class StepMetrics {
public:
    enum Sum {
        kSumTokens, kSumClipped, kSumDualClipped, kSumClipLow, kSumClipHigh, kSumRatio, kSumPpoKl, kSumEntropy, kSumPgLoss, kSumKlLoss,
        kSumRcTokens, kSumRcK1, kSumRcK3, kSumRcAbsDiff, kSumRcMultErr, kSumIs, kSumIsSq, kSumIsHigh, kSumIsLow, kSumRhoSq, kSumProbDiff, kSumProbDiffSq,
        kSumRsMasked,
        kNumSums
    };
    enum Min { kRatioMin, kIsMin, kNumMins };
    enum Max { kRatioMax, kIsMax, kAbsDiffMax, kProbDiffMax, kNumMaxes };

    // All-reduce these with SUM, MIN and MAX respectively.
    std::vector<double> sums = std::vector<double>(kNumSums, 0.0);
    std::vector<double> mins = std::vector<double>(kNumMins, INFINITY);
    std::vector<double> maxes = std::vector<double>(kNumMaxes, -INFINITY);

    // One valid token of a policy update (after policy_token_loss / token_loss).
    void add_policy_token(const PolicyTokenLoss& pg, float logp, float old_logp, float entropy) {
        sums[kSumTokens] += 1;
        sums[kSumClipped] += (pg.flags & kClipped) != 0;
        sums[kSumDualClipped] += (pg.flags & kDualClipped) != 0;
        sums[kSumClipLow] += (pg.flags & kClipLow) != 0;
        sums[kSumClipHigh] += (pg.flags & kClipHigh) != 0;
        sums[kSumRatio] += pg.ratio;
        sums[kSumPpoKl] -= fmin(fmax((double)logp - (double)old_logp, -log_ratio_clamp), log_ratio_clamp);
        sums[kSumEntropy] += entropy;
        mins[kRatioMin] = fmin(mins[kRatioMin], pg.ratio);
        maxes[kRatioMax] = fmax(maxes[kRatioMax], pg.ratio);
    }

    // Every valid token of one sequence of a policy update, under the bounds in force.
    void add_policy_sequence(const SequenceTokens& s, const ClipBounds& bounds) {
        for (int t = 0; t < s.T; t++)
            if (s.mask[t])
                add_policy_token(policy_token_loss(s.logp[t], s.old_logp[t], s.adv[t], bounds), s.logp[t], s.old_logp[t],
                                 s.entropy ? s.entropy[t] : 0.0f);
    }

    // One sequence's aggregated loss terms (sequence_loss); summed over a mini-batch on all ranks
    // they are the mini-batch's loss, and finalize() averages over the step's updates.
    void add_sequence_loss(const SequenceLoss& l) {
        sums[kSumPgLoss] += l.pg_loss;
        sums[kSumKlLoss] += l.kl;
    }

    // One valid token's rollout/train mismatch, once per step: its old and rollout log-probs, its IS
    // weight and the cap C.
    void add_rollout_token(float old_logp, float rollout_logp, double is_weight, double cap) {
        double x = (double)old_logp - (double)rollout_logp;
        double rho = exp(fmin(fmax(x, -log_ratio_clamp), log_ratio_clamp));
        double prob_diff = fabs(exp((double)old_logp) - exp((double)rollout_logp));
        sums[kSumRcTokens] += 1;
        sums[kSumRcK1] += -x;
        sums[kSumRcK3] += rho - fmin(fmax(x, -log_ratio_clamp), log_ratio_clamp) - 1.0;
        sums[kSumRcAbsDiff] += fabs(x);
        sums[kSumRcMultErr] += exp(fabs(x));
        sums[kSumIs] += is_weight;
        sums[kSumIsSq] += is_weight * is_weight;
        sums[kSumIsHigh] += rho > cap;
        sums[kSumIsLow] += rho < 1.0 / cap;
        sums[kSumRhoSq] += rho * rho;
        sums[kSumRsMasked] += is_weight == 0.0;  // ρ ≥ e^-20 > 0: a zero weight is a mask's
        sums[kSumProbDiff] += prob_diff;
        sums[kSumProbDiffSq] += prob_diff * prob_diff;
        mins[kIsMin] = fmin(mins[kIsMin], is_weight);
        maxes[kIsMax] = fmax(maxes[kIsMax], is_weight);
        maxes[kAbsDiffMax] = fmax(maxes[kAbsDiffMax], fabs(x));
        maxes[kProbDiffMax] = fmax(maxes[kProbDiffMax], prob_diff);
    }

    // Every valid token of one sequence (arrays [T]; w from sequence_is_weights).
    void add_rollout_sequence(const float* old_logp, const float* rollout_logp, const double* w, const uint8_t* mask, int T,
                              double cap) {
        for (int t = 0; t < T; t++)
            if (mask[t]) add_rollout_token(old_logp[t], rollout_logp[t], w[t], cap);
    }

    // Combines another accumulator (what the all-reduces do across ranks).
    void merge(const StepMetrics& o) {
        for (int i = 0; i < kNumSums; i++) sums[i] += o.sums[i];
        for (int i = 0; i < kNumMins; i++) mins[i] = fmin(mins[i], o.mins[i]);
        for (int i = 0; i < kNumMaxes; i++) maxes[i] = fmax(maxes[i], o.maxes[i]);
    }

    // Named values from the reduced accumulators; `updates` = optimizer updates in the step.
    // Metrics without tokens are left out rather than reported as NaN.
    std::vector<std::pair<std::string, double>> finalize(int64_t updates) const {
        std::vector<std::pair<std::string, double>> m;
        double n = sums[kSumTokens];
        if (n > 0) {
            m.push_back({"actor/pg_clipfrac", sums[kSumClipped] / n});
            m.push_back({"actor/pg_clipfrac_lower", sums[kSumDualClipped] / n});
            m.push_back({"actor/pg_clipfrac_low", sums[kSumClipLow] / n});
            m.push_back({"actor/pg_clipfrac_high", sums[kSumClipHigh] / n});
            m.push_back({"actor/ratio_mean", sums[kSumRatio] / n});
            m.push_back({"actor/ratio_min", mins[kRatioMin]});
            m.push_back({"actor/ratio_max", maxes[kRatioMax]});
            m.push_back({"actor/ppo_kl", sums[kSumPpoKl] / n});
            m.push_back({"actor/entropy", sums[kSumEntropy] / n});
        }
        if (updates > 0) {
            m.push_back({"actor/pg_loss", sums[kSumPgLoss] / (double)updates});
            m.push_back({"actor/kl_loss", sums[kSumKlLoss] / (double)updates});
        }
        double r = sums[kSumRcTokens];
        if (r > 0) {
            double w_mean = sums[kSumIs] / r, w_sq = sums[kSumIsSq] / r, d_mean = sums[kSumProbDiff] / r;
            m.push_back({"rollout_corr/kl", sums[kSumRcK1] / r});
            m.push_back({"rollout_corr/k3_kl", sums[kSumRcK3] / r});
            m.push_back({"rollout_corr/logprob_abs_diff", sums[kSumRcAbsDiff] / r});
            m.push_back({"rollout_corr/logprob_abs_diff_max", maxes[kAbsDiffMax]});
            m.push_back({"rollout_corr/token_mult_prob_error", sums[kSumRcMultErr] / r});
            m.push_back({"rollout_corr/rollout_is_mean", w_mean});
            m.push_back({"rollout_corr/rollout_is_std", sqrt(fmax(w_sq - w_mean * w_mean, 0.0))});
            m.push_back({"rollout_corr/rollout_is_min", mins[kIsMin]});
            m.push_back({"rollout_corr/rollout_is_max", maxes[kIsMax]});
            m.push_back({"rollout_corr/rollout_is_eff_sample_size", w_sq > 0 ? w_mean * w_mean / w_sq : 0.0});
            m.push_back({"rollout_corr/rollout_is_ratio_fraction_high", sums[kSumIsHigh] / r});
            m.push_back({"rollout_corr/rollout_is_ratio_fraction_low", sums[kSumIsLow] / r});
            m.push_back({"rollout_corr/chi2_token", sums[kSumRhoSq] / r - 1.0});
            m.push_back({"rollout_corr/rollout_rs_masked_fraction", sums[kSumRsMasked] / r});
            m.push_back({"training/rollout_probs_diff_mean", d_mean});
            m.push_back({"training/rollout_probs_diff_max", maxes[kProbDiffMax]});
            m.push_back({"training/rollout_probs_diff_std", sqrt(fmax(sums[kSumProbDiffSq] / r - d_mean * d_mean, 0.0))});
        }
        return m;
    }
};

}  // namespace fp8rl
