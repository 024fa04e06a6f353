// calibrated_clip.h: the Calibrated Clipping controller of spec-rl.md §12.8, with three departures,
// all for calibrations that see few tokens (issue 51): Stage 1's L* by count matching on the grid
// (cc_low_target_index); a calibration under the A < 0 token guard pools its statistics into the
// next; the first decision of each bound is undamped (both: cc_decide).
//
// Every cc_interval steps the trainer runs high-precision (HP) shadow passes, so that each valid
// token has its production ratio r = exp(clamp(ℓ^θ − ℓ^old, ±20)) and its HP ratio r̂ (same with
// ℓ̂^θ, ℓ̂^old), its advantage A, its TIS weight w and its aggregation weight c. From them:
//   Stage 1: α = |{t ∈ T⁻ : r̂ < L_ref}| / |T⁻|, k = α·|T⁻| (= that count); L* = the value of the
//            grid {0.50, 0.52, …, 0.90} where |{t ∈ T⁻ : r < L*}| is nearest to k (ties: nearest L);
//            L_new = clamp(L + clip((L* − L)/2, ±0.05), 0.5, 0.9) (L_new = L* at the first decision).
//   Stage 2: P(r, h) = Σ_{T⁺} c·w·|A|·r·1{r < h},  N(r, l) = Σ_{T⁻} c·w·|A|·r·1{r > l}·1{r < c_dual};
//            ρ_ref = P(r̂, H_ref)/N(r̂, L_ref); H* = argmin over h ∈ {1.20, 1.22, …, 2.00} of
//            |P(r, h)/N(r, L_new) − ρ_ref| (ties: smallest h);
//            H_new = clamp(H + clip((H* − H)/2, ±0.1), 1.2, 2.0) (H_new = H* at the first decision).
//
// Data parallelism: every statistic is an int64 that ranks all-reduce with MPI_SUM, so N ranks
// decide bit for bit what one rank holding all tokens decides. Counts are counts (L* needs only the
// 21 counts of T⁻ below each grid value); the sums P and
// N are fixed-point (integer part + 2^-40 units, both int64) and exact in any order. N(r, L_new)
// is needed before L_new is known, but L_new can only take 21 values (one per grid L*), so N is
// accumulated for each of them. One all-reduce of CalibStats::values per calibration step.
#pragma once
#include <math.h>
#include <stdint.h>

#include <cmath>

#include <string>
#include <utility>
#include <vector>

#include "rl/common.h"
#include "rl/objective/loss_agg.h"
#include "rl/objective/token_loss.h"

namespace fp8rl {

// Fixed parameters of §12.8 plus the configured reference bounds and dual clip.
struct CalibConfig {
    double ref_low = 1.0 - default_clip_low;         // L_ref = 1 − ε_low
    double ref_high = 1.0 + default_clip_high_grpo;  // H_ref = 1 + ε_high (DAPO: 1.28)
    double dual_clip = 0.0;                          // c of the loss, 0 = off
    LossAgg agg = LossAgg::TokenMean;                // gives the token weight c_t
    int64_t min_tokens = 256;                        // guard on |T⁻| and |T⁺|
};

constexpr int64_t cc_default_interval = 20;
constexpr double cc_initial_low = 0.6, cc_initial_high = 1.8;
constexpr int cc_low_grid = 21;   // L* ∈ {0.50, 0.52, …, 0.90}
constexpr int cc_high_grid = 41;  // H  ∈ {1.20, 1.22, …, 2.00}
constexpr double cc_low_min = 0.5, cc_low_max = 0.9, cc_high_min = 1.2, cc_high_max = 2.0;
constexpr double cc_max_step_low = 0.05, cc_max_step_high = 0.1;
constexpr double cc_degenerate_eps = 1e-6;

// Grid values from integer indices (no accumulated rounding): 0.50 + 0.02 j and 1.20 + 0.02 j.
inline double cc_low_grid_value(int j) { return (50.0 + 2.0 * j) / 100.0; }
inline double cc_high_grid_value(int j) { return (120.0 + 2.0 * j) / 100.0; }

// The controller's state: replicated on every rank and saved in the checkpoint.
struct CalibState {
    CalibState() = default;
    CalibState(double l, double h) : low(l), high(h) {}  // bounds decided (or fixed), nothing pooled

    double low = cc_initial_low;  // the bounds in force
    double high = cc_initial_high;
    // True until a calibration has decided the bound: its first decision sets it to the target
    // undamped (cc_initial_state; a departure, see cc_decide).
    bool low_unset = false, high_unset = false;
    // Statistics (CalibStats::values) of the calibrations since the last decision of L that had
    // too few A < 0 tokens, pooled into the next one (empty: none), and how many they are. They
    // were taken under the bounds above, which they did not change.
    std::vector<int64_t> pooled;
    int64_t pooled_steps = 0;
};

// A run's start: the paper's [0.6, 1.8], in force until the first calibration decides each bound.
inline CalibState cc_initial_state() {
    CalibState s;
    s.low_unset = s.high_unset = true;
    return s;
}

inline bool cc_is_calibration_step(int64_t step, int64_t interval) { return interval > 0 && step % interval == 0; }

// b + clip((target − b)/2, ±max_step), clamped to [lo, hi].
inline double cc_damped(double b, double target, double max_step, double lo, double hi) {
    return fmin(fmax(b + fmin(fmax((target - b) / 2.0, -max_step), max_step), lo), hi);
}

// L_new for the j-th grid value of L*, given the state in force.
inline double cc_low_after(const CalibState& st, int j) {
    return st.low_unset ? cc_low_grid_value(j) : cc_damped(st.low, cc_low_grid_value(j), cc_max_step_low, cc_low_min, cc_low_max);
}

// One valid token's stage inputs (production and HP log-probs of π_θ and π_old).
struct CalibToken {
    float logp, old_logp;        // production ℓ^θ, ℓ^old (what the loss uses)
    float hp_logp, hp_old_logp;  // HP shadow ℓ̂^θ, ℓ̂^old
    float adv;
    double is_weight;  // w_t, the production TIS weight
    double agg_weight; // c_t: 1, or 1/|y_i| for seq-mean-token-mean
    float entropy = 0.0f;   // the production forward's entropy at this position (diagnostics only)
    bool rewarded = false;  // the token's response scored a reward > 0 (diagnostics only)
};

// Token entropy above which a token counts as high-entropy in the over-clipping diagnostics (the
// paper's garbled responses have entropy > 1).
constexpr double cc_high_entropy = 1.0;

// The statistics as one flat int64 array (all-reduce `values` with MPI_SUM).
class CalibStats {
public:
    enum Count {
        kNeg, kPos, kValid, kNonDegenerate, kAlpha, kNegBelowRefFp8, kOverclip,
        // diagnostics of the over-clipped tokens (§12.9 plus issue 51's): where they sit
        kNegRewarded, kOverclipRewarded, kNegHighEntropy, kOverclipHighEntropy, kNumCounts
    };

    std::vector<int64_t> values;

    // The bound in force when the statistics are taken (same on every rank).
    CalibStats(const CalibConfig& cfg, const CalibState& state) : cfg_(cfg) {
        values.assign(size(), 0);
        for (int j = 0; j < cc_low_grid; j++) low_after_[j] = cc_low_after(state, j);
    }

    void add_token(const CalibToken& t) {
        double r = ratio(t.logp, t.old_logp), rh = ratio(t.hp_logp, t.hp_old_logp);
        values[kValid]++;
        values[kNonDegenerate] += fabs(r - 1.0) >= cc_degenerate_eps || fabs(rh - 1.0) >= cc_degenerate_eps;
        add_fixed(kSumAbsDiff, fabs(r - rh));
        add_fixed(kSumDrift, fabs(rh - 1.0));
        double mag = t.agg_weight * t.is_weight * fabs((double)t.adv);
        if (t.adv < 0.0f) {
            values[kNeg]++;
            values[kAlpha] += rh < cfg_.ref_low;
            values[kNegBelowRefFp8] += r < cfg_.ref_low;
            const bool overclip = rh >= cfg_.ref_low && r < cfg_.ref_low, high_entropy = t.entropy > cc_high_entropy;
            values[kOverclip] += overclip;
            values[kNegRewarded] += t.rewarded;
            values[kNegHighEntropy] += high_entropy;
            add_fixed(kSumNegEntropy, fmax((double)t.entropy, 0.0));
            if (overclip) {
                values[kOverclipRewarded] += t.rewarded;
                values[kOverclipHighEntropy] += high_entropy;
                add_fixed(kSumOverclipEntropy, fmax((double)t.entropy, 0.0));
            }
            bool below_dual = cfg_.dual_clip <= 0.0 || r < cfg_.dual_clip;
            bool below_dual_hp = cfg_.dual_clip <= 0.0 || rh < cfg_.dual_clip;
            if (rh > cfg_.ref_low && below_dual_hp) add_fixed(kSumNegRef, mag * rh);
            for (int j = 0; j < cc_low_grid; j++) {
                if (r > low_after_[j] && below_dual) add_fixed(sum_neg_fp8(j), mag * r);
                values[neg_below_new(j)] += r < low_after_[j];
                values[neg_below_grid(j)] += r < cc_low_grid_value(j);
            }
        } else if (t.adv > 0.0f) {
            values[kPos]++;
            if (rh < cfg_.ref_high) add_fixed(kSumPosRef, mag * rh);
            for (int j = 0; j < cc_high_grid; j++)
                if (r < cc_high_grid_value(j)) add_fixed(sum_pos_fp8(j), mag * r);
        }
    }

    // Every valid token of one sequence (arrays [T]; token weights from the loss aggregation).
    // entropy (may be null) and rewarded feed only the diagnostics.
    void add_sequence(const float* logp, const float* old_logp, const float* hp_logp, const float* hp_old_logp,
                      const float* adv, const double* is_weight, const uint8_t* mask, int T, const float* entropy = nullptr,
                      bool rewarded = false) {
        int64_t len = valid_tokens(mask, T);
        double c = cfg_.agg == LossAgg::SeqMeanTokenMean && len > 0 ? 1.0 / (double)len : 1.0;
        for (int t = 0; t < T; t++)
            if (mask[t])
                add_token({logp[t], old_logp[t], hp_logp[t], hp_old_logp[t], adv[t], is_weight[t], c,
                           entropy ? entropy[t] : 0.0f, rewarded});
    }

    // Adds another rank's (or mini-batch's) statistics: what MPI_SUM does.
    void merge(const CalibStats& o) { merge(o.values); }
    void merge(const std::vector<int64_t>& o) {
        if (o.size() != values.size())
            fail("calibrated clipping: %zu pooled statistics, expected %zu; the checkpoint is damaged", o.size(), values.size());
        for (size_t i = 0; i < values.size(); i++) values[i] += o[i];
    }

    // Accessors used by the decision.
    int64_t count(Count c) const { return values[c]; }
    int64_t neg_below_new_count(int j) const { return values[neg_below_new(j)]; }
    int64_t neg_below_grid_count(int j) const { return values[neg_below_grid(j)]; }
    double neg_ref() const { return fixed(kSumNegRef); }
    double pos_ref() const { return fixed(kSumPosRef); }
    double neg_fp8(int j) const { return fixed(sum_neg_fp8(j)); }
    double pos_fp8(int j) const { return fixed(sum_pos_fp8(j)); }
    double abs_diff_sum() const { return fixed(kSumAbsDiff); }
    double drift_sum() const { return fixed(kSumDrift); }
    double neg_entropy_sum() const { return fixed(kSumNegEntropy); }
    double overclip_entropy_sum() const { return fixed(kSumOverclipEntropy); }

private:
    CalibConfig cfg_;
    double low_after_[cc_low_grid];

    // Layout after the counts: fixed-point sums (2 slots each), then the per-grid arrays.
    enum Fixed {
        kSumAbsDiff = kNumCounts, kSumNegRef = kSumAbsDiff + 2, kSumPosRef = kSumNegRef + 2, kSumDrift = kSumPosRef + 2,
        kSumNegEntropy = kSumDrift + 2, kSumOverclipEntropy = kSumNegEntropy + 2, kFixedEnd = kSumOverclipEntropy + 2
    };
    static int neg_below_grid(int j) { return kFixedEnd + j; }
    static int neg_below_new(int j) { return kFixedEnd + cc_low_grid + j; }
    static int sum_neg_fp8(int j) { return kFixedEnd + 2 * cc_low_grid + 2 * j; }
    static int sum_pos_fp8(int j) { return kFixedEnd + 4 * cc_low_grid + 2 * j; }
    static size_t size() { return (size_t)(kFixedEnd + 4 * cc_low_grid + 2 * cc_high_grid); }

    static double ratio(float logp, float old_logp) {
        double d = (double)logp - (double)old_logp;
        return exp(fmin(fmax(d, -log_ratio_clamp), log_ratio_clamp));
    }

    // Fixed point: integer part and fraction in units of 2^-40, summed separately (exact in int64
    // for any summation order; 2^23 tokens of magnitude up to 2^40 fit).
    static constexpr double fixed_unit = 1099511627776.0;  // 2^40
    void add_fixed(int slot, double v) {
        if (!(v >= 0.0 && v < fixed_unit))
            fail("calibrated clipping: token term %g is out of range; check advantages and IS weights for NaN/Inf", v);
        double whole = floor(v);
        values[slot] += (int64_t)whole;
        values[slot + 1] += (int64_t)llround((v - whole) * fixed_unit);
    }
    double fixed(int slot) const { return (double)values[slot] + (double)values[slot + 1] / fixed_unit; }
};

// What one calibration decided, with the §12.9 metrics.
struct CalibResult {
    CalibState bounds;         // in force from the next step
    bool skipped = false;      // a guard fired (reason says which); skipped stages keep their bound
    std::string reason;
    double target_low = NAN, target_high = NAN;
    double alpha_ref = NAN, clipfrac_neg_fp8_at_ref = NAN, clipfrac_neg_fp8 = NAN, overclip_low_frac = NAN;
    double rho_ref = NAN, rho_fp8 = NAN, ratio_abs_diff_mean = NAN;
    // Diagnostics (issue 51): the HP ratios' own drift mean |r̂ − 1| (the noise-to-drift ratio is
    // ratio_abs_diff_mean over it); the fraction of T⁻ below L* itself (before damping); where the
    // over-clipped tokens sit against all of T⁻ (mean entropy, share above cc_high_entropy,
    // share from rewarded responses).
    double ratio_hp_drift_mean = NAN, clipfrac_neg_fp8_at_target = NAN;
    double neg_entropy_mean = NAN, overclip_entropy_mean = NAN, neg_high_entropy_frac = NAN, overclip_high_entropy_frac = NAN;
    double neg_rewarded_frac = NAN, overclip_rewarded_frac = NAN;
    double neg_tokens = 0, pos_tokens = 0;  // |T⁻|, |T⁺| (the guards' counts, pooled ones included)
    int64_t pooled_steps = 1;  // calibration steps whose tokens these statistics hold
    bool pooled = false;       // too few A < 0 tokens: kept for the next calibration
};

// Stage 1's grid index of L*, chosen by COUNT MATCHING: the grid value whose FP8 clip count
// |{t ∈ T⁻ : r < L*}| is nearest to the reference's k = |{t ∈ T⁻ : r̂ < L_ref}| (= α·|T⁻|), ties to
// the value nearest the bound in force `low`. This departs from spec-rl.md §12.8's literal Stage 1
// ("L* = 0.5 if α = 0, else r_(k) with k = ceil(α·n), clamped and rounded to the grid"; issue 51),
// because with the few reference-clipped tokens of a calibration (k of 0-10 at this project's
// scale) the quantile is decided by one or two tokens:
//   - α = 0 (the reference clips nothing) gave L* = 0.5, so the bound fell by 0.05 on exactly the
//     steps that said the bound in force is fine (the demo: step 280, L 0.70 -> 0.65);
//   - k = 1 gave L* = the single lowest FP8 ratio, wherever noise put it;
//   - r_(k) itself is not below r_(k), and rounding to the grid moves it again: the bound that
//     results clips k - 1 tokens or some other count. Counting at the grid values measures what
//     the bound will clip, which is what Stage 1 means to match.
// With many tokens both rules give the same L* up to one grid step (test
// calib_lower_bound_matches_analytic_quantile). The grid itself costs nothing measurable: the
// fraction below L* sums to 0.99-1.00x the reference's over the outliers runs (docs/results.md,
// "Calibrated Clipping against the reference"); the under-clipping there came from the damped
// first steps and the token guard (cc_decide).
inline int cc_low_target_index(const CalibStats& s, double low) {
    const int64_t k = s.count(CalibStats::kAlpha);
    int best = 0;
    int64_t best_gap = INT64_MAX;
    double best_dist = INFINITY;
    for (int j = 0; j < cc_low_grid; j++) {
        const int64_t c = s.neg_below_grid_count(j), gap = c > k ? c - k : k - c;
        const double dist = fabs(cc_low_grid_value(j) - low);
        if (gap < best_gap || (gap == best_gap && dist < best_dist)) {
            best = j;
            best_gap = gap;
            best_dist = dist;
        }
    }
    return best;
}

// Stage 2's grid index of H*: |ρ_fp8(h) − ρ_ref| smallest, ties to the smallest h.
inline int cc_high_target_index(const CalibStats& s, int low_index, double rho_ref, double* rho_at_best) {
    int best = 0;
    double best_gap = INFINITY, neg = s.neg_fp8(low_index);
    for (int j = 0; j < cc_high_grid; j++) {
        double rho = s.pos_fp8(j) / neg, gap = fabs(rho - rho_ref);
        if (gap < best_gap) {
            best_gap = gap;
            best = j;
            *rho_at_best = rho;
        }
    }
    return best;
}

// The decision from the all-reduced statistics; every rank gets the same result.
// Two departures from §12.8's schedule (issue 51; docs/results.md, "Calibrated Clipping against
// the reference"), both for calibrations that see few tokens, as at this project's scale (a few
// hundred A < 0 tokens, 0-30 of them below L_ref):
//   - pooling: a calibration whose T⁻ is below the 256-token guard still skips, but its statistics
//     are kept and added to the next calibration's (the bounds they were taken under have not
//     changed), instead of being dropped; §12.8 already pools a step's mini-batches. Without it,
//     Stage 1 acted on 1-2 of a run's 8 calibrations on the outliers point and the bound stayed
//     near its start;
//   - the first decision of each bound sets it to its target undamped, and L*'s ties then go to
//     L_ref, not to the start. The damping b + clip((b* − b)/2, ±δ) smooths noisy targets against
//     the bound's history; before the first calibration there is no history, only the start
//     [0.6, 1.8], and damping from it took 4-6 decisions to reach a target of 0.8, clipping
//     0.1-0.6x the reference's fraction meanwhile (the start is the paper's; its ablation found a
//     start at [0.8, 1.2] as good: 56.20 against 56.51). Later decisions are damped as the paper's.
inline CalibResult cc_decide(const CalibConfig& cfg, const CalibState& current, const CalibStats& step_stats) {
    CalibStats s = step_stats;
    if (!current.pooled.empty()) s.merge(current.pooled);
    CalibResult out;
    out.bounds = current;
    out.bounds.pooled.clear();
    out.bounds.pooled_steps = 0;
    out.pooled_steps = current.pooled_steps + 1;
    out.neg_tokens = (double)s.count(CalibStats::kNeg);
    out.pos_tokens = (double)s.count(CalibStats::kPos);
    int64_t neg = s.count(CalibStats::kNeg), pos = s.count(CalibStats::kPos), valid = s.count(CalibStats::kValid);
    if (valid > 0) {
        out.ratio_abs_diff_mean = s.abs_diff_sum() / (double)valid;
        out.ratio_hp_drift_mean = s.drift_sum() / (double)valid;
    }
    if (neg > 0) {
        out.alpha_ref = (double)s.count(CalibStats::kAlpha) / (double)neg;
        out.clipfrac_neg_fp8_at_ref = (double)s.count(CalibStats::kNegBelowRefFp8) / (double)neg;
        out.overclip_low_frac = (double)s.count(CalibStats::kOverclip) / (double)neg;
        out.neg_entropy_mean = s.neg_entropy_sum() / (double)neg;
        out.neg_high_entropy_frac = (double)s.count(CalibStats::kNegHighEntropy) / (double)neg;
        out.neg_rewarded_frac = (double)s.count(CalibStats::kNegRewarded) / (double)neg;
    }
    if (int64_t over = s.count(CalibStats::kOverclip)) {
        out.overclip_entropy_mean = s.overclip_entropy_sum() / (double)over;
        out.overclip_high_entropy_frac = (double)s.count(CalibStats::kOverclipHighEntropy) / (double)over;
        out.overclip_rewarded_frac = (double)s.count(CalibStats::kOverclipRewarded) / (double)over;
    }
    auto skip = [&](const std::string& why) {
        out.skipped = true;
        out.reason += (out.reason.empty() ? "" : "; ") + why;
    };
    if (s.count(CalibStats::kNonDegenerate) == 0) {
        skip("degenerate ratios (all within 1e-6 of 1: calibration needs >= 2 mini-batches or epochs)");
        return out;
    }
    if (neg < cfg.min_tokens) {
        skip(strfmt("%lld negative-advantage tokens < %lld (pooled into the next calibration)", (long long)neg,
                    (long long)cfg.min_tokens));
        out.pooled = true;
        out.bounds.pooled = s.values;
        out.bounds.pooled_steps = out.pooled_steps;
        return out;
    }
    // Ties go to the bound in force; before the first decision that is only the start 0.6, so they
    // go to the reference bound (with α = 0 every bound that clips nothing ties).
    int low_index = cc_low_target_index(s, current.low_unset ? cfg.ref_low : current.low);
    out.target_low = cc_low_grid_value(low_index);
    out.clipfrac_neg_fp8_at_target = (double)s.neg_below_grid_count(low_index) / (double)neg;
    out.bounds.low = cc_low_after(current, low_index);
    out.bounds.low_unset = false;
    out.clipfrac_neg_fp8 = (double)s.neg_below_new_count(low_index) / (double)neg;
    if (pos < cfg.min_tokens) {
        skip(strfmt("%lld positive-advantage tokens < %lld", (long long)pos, (long long)cfg.min_tokens));
        return out;
    }
    if (s.neg_ref() == 0.0 || s.neg_fp8(low_index) == 0.0) {
        skip("no active negative-advantage update (N = 0)");
        return out;
    }
    out.rho_ref = s.pos_ref() / s.neg_ref();
    int high_index = cc_high_target_index(s, low_index, out.rho_ref, &out.rho_fp8);
    out.target_high = cc_high_grid_value(high_index);
    out.bounds.high = current.high_unset ? out.target_high
                                         : cc_damped(current.high, out.target_high, cc_max_step_high, cc_high_min, cc_high_max);
    out.bounds.high_unset = false;
    return out;
}

// The calib/* metrics of a calibration step (spec-rl.md §12.9); the bounds in force are logged
// every step by the trainer as calib/clip_low and calib/clip_high. NaN entries are left out.
inline std::vector<std::pair<std::string, double>> cc_metrics(const CalibResult& r) {
    std::vector<std::pair<std::string, double>> all = {
        {"calib/target_low", r.target_low},
        {"calib/target_high", r.target_high},
        {"calib/alpha_ref", r.alpha_ref},
        {"calib/clipfrac_neg_fp8_at_ref", r.clipfrac_neg_fp8_at_ref},
        {"calib/clipfrac_neg_fp8", r.clipfrac_neg_fp8},
        {"calib/overclip_low_frac", r.overclip_low_frac},
        {"calib/rho_ref", r.rho_ref},
        {"calib/rho_fp8", r.rho_fp8},
        {"calib/ratio_abs_diff_mean", r.ratio_abs_diff_mean},
        {"calib/ratio_hp_drift_mean", r.ratio_hp_drift_mean},
        {"calib/clipfrac_neg_fp8_at_target", r.clipfrac_neg_fp8_at_target},
        {"calib/neg_entropy_mean", r.neg_entropy_mean},
        {"calib/overclip_entropy_mean", r.overclip_entropy_mean},
        {"calib/neg_high_entropy_frac", r.neg_high_entropy_frac},
        {"calib/overclip_high_entropy_frac", r.overclip_high_entropy_frac},
        {"calib/neg_rewarded_frac", r.neg_rewarded_frac},
        {"calib/overclip_rewarded_frac", r.overclip_rewarded_frac},
        {"calib/neg_tokens", r.neg_tokens},
        {"calib/pos_tokens", r.pos_tokens},
        {"calib/pooled_steps", (double)r.pooled_steps},
        {"calib/pooled", r.pooled ? 1.0 : 0.0},
        {"calib/skipped", r.skipped ? 1.0 : 0.0},
    };
    std::vector<std::pair<std::string, double>> out;
    for (const auto& kv : all)
        if (!std::isnan(kv.second)) out.push_back(kv);
    return out;
}

}  // namespace fp8rl
