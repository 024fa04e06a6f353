// Tests of the Calibrated Clipping controller (rl/objective/calibrated_clip.h) on synthetic tokens with known
// answers: HP log-ratios drawn from N(0, σ²), production ones = HP + N(0, τ²) noise, so the
// production log-ratio is N(0, σ² + τ²) and the matched quantile is L_ref^sqrt(1 + τ²/σ²).
// Also: zero noise gives the reference bounds, a two-rank split decides bit for bit the same, the
// counted/fixed-point decision equals a direct sort-and-sum reading of spec-rl.md §12.8 (with L* by count
// matching, calibrated_clip.h), guards.
#include <algorithm>
#include <cmath>
#include <random>

#include "rl/objective/calibrated_clip.h"
#include "test/harness.h"
#include "test/run_binary.h"
#include "test/training_run.h"

using namespace fp8rl;

namespace {

struct Synthetic {
    double sigma = 0.1, tau = 0.0;
    int n = 20000;              // tokens of each sign
    bool varied_weights = false;  // random |A|, TIS weights and dual-clip-sized ratios
    uint64_t seed = 1;
};

std::vector<CalibToken> make_tokens(const Synthetic& cfg) {
    std::mt19937_64 gen(cfg.seed);
    std::normal_distribution<double> hp(0.0, cfg.sigma), noise(0.0, cfg.tau > 0 ? cfg.tau : 1.0);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    std::vector<CalibToken> toks;
    for (int i = 0; i < 2 * cfg.n; i++) {
        CalibToken t;
        float old = -1.0f - (float)(u(gen) * 2.0);
        float x = (float)hp(gen);
        t.hp_old_logp = old;
        t.hp_logp = old + x;
        t.old_logp = old;
        t.logp = cfg.tau > 0 ? (float)(t.hp_logp + noise(gen)) : t.hp_logp;
        double mag = cfg.varied_weights ? 0.2 + 2.0 * u(gen) : 1.0;
        t.adv = (float)(i % 2 ? mag : -mag);
        t.is_weight = cfg.varied_weights ? std::min(2.0, 0.5 + 2.0 * u(gen)) : 1.0;
        t.agg_weight = cfg.varied_weights ? 1.0 / (1 + i % 7) : 1.0;
        toks.push_back(t);
    }
    return toks;
}

CalibStats stats_of(const CalibConfig& cfg, const CalibState& st, const std::vector<CalibToken>& toks, size_t begin = 0,
                    size_t step = 1) {
    CalibStats s(cfg, st);
    for (size_t i = begin; i < toks.size(); i += step) s.add_token(toks[i]);
    return s;
}

}  // namespace

TEST(calib_lower_bound_matches_analytic_quantile) {
    CalibConfig cfg;  // GRPO reference [0.8, 1.24]
    for (double tau : {0.05, 0.1, 0.15}) {
        Synthetic syn;
        syn.tau = tau;
        syn.n = harness::sanitized ? 20000 : 100000;
        std::vector<CalibToken> toks = make_tokens(syn);
        CalibResult r = cc_decide(cfg, CalibState{}, stats_of(cfg, CalibState{}, toks));
        double analytic = std::pow(cfg.ref_low, std::sqrt(1.0 + tau * tau / (syn.sigma * syn.sigma)));
        CHECK_MSG(std::fabs(r.target_low - analytic) <= 0.02 + 1e-12, "tau %g: L* %g, analytic %g", tau, r.target_low, analytic);
        // α is the reference clip fraction Φ(ln L_ref / σ).
        double alpha = 0.5 * std::erfc(-std::log(cfg.ref_low) / syn.sigma / std::sqrt(2.0));
        CHECK_NEAR(r.alpha_ref, alpha, 0.1, 0.0);  // ~1300 of 100k tokens: sampling sd ~3%
        // Smoothing: from L = 0.6 the bound moves by at most 0.05 toward the target.
        CHECK_NEAR(r.bounds.low, 0.6 + std::min(0.05, (r.target_low - 0.6) / 2), 1e-12, 0);
        CHECK(!r.skipped);
        // FP8 noise over-clips negative tokens at the reference bound.
        CHECK(r.clipfrac_neg_fp8_at_ref > r.alpha_ref);
        CHECK(r.overclip_low_frac > 0.0);
    }
}

TEST(calib_zero_noise_returns_reference_bounds) {
    for (double ref_high : {1.24, 1.28}) {
        CalibConfig cfg;
        cfg.ref_high = ref_high;
        Synthetic syn;
        syn.varied_weights = true;
        std::vector<CalibToken> toks = make_tokens(syn);
        CalibState ref{cfg.ref_low, cfg.ref_high};
        CalibResult r = cc_decide(cfg, ref, stats_of(cfg, ref, toks));
        CHECK(!r.skipped);
        CHECK_EQ(r.target_low, cfg.ref_low);
        CHECK_EQ(r.target_high, cfg.ref_high);
        CHECK_EQ(r.bounds.low, cfg.ref_low);
        CHECK_EQ(r.bounds.high, cfg.ref_high);
        CHECK_EQ(r.rho_fp8, r.rho_ref);
        CHECK_EQ(r.overclip_low_frac, 0.0);
        CHECK_EQ(r.ratio_abs_diff_mean, 0.0);
        // From the initial [0.6, 1.8], repeated calibrations converge to the reference bounds.
        syn.n = 4000;
        toks = make_tokens(syn);
        CalibState st;
        for (int step = 0; step < 40; step++) st = cc_decide(cfg, st, stats_of(cfg, st, toks)).bounds;
        CHECK_NEAR(st.low, cfg.ref_low, 1e-12, 0);
        CHECK_NEAR(st.high, cfg.ref_high, 0, 1e-6);
    }
}

TEST(calib_two_rank_split_decides_identically) {
    CalibConfig cfg;
    cfg.dual_clip = 3.0;
    cfg.agg = LossAgg::SeqMeanTokenMean;
    Synthetic syn;
    syn.tau = 0.12;
    syn.varied_weights = true;
    std::vector<CalibToken> toks = make_tokens(syn);
    CalibState st{0.63, 1.71};
    CalibStats one = stats_of(cfg, st, toks);
    for (size_t ranks : {2, 3}) {
        CalibStats all = stats_of(cfg, st, toks, 0, ranks);
        for (size_t k = 1; k < ranks; k++) all.merge(stats_of(cfg, st, toks, k, ranks));  // MPI_SUM
        CHECK(all.values == one.values);
        CalibResult a = cc_decide(cfg, st, one), b = cc_decide(cfg, st, all);
        CHECK_EQ(a.bounds.low, b.bounds.low);
        CHECK_EQ(a.bounds.high, b.bounds.high);
        CHECK_EQ(a.rho_fp8, b.rho_fp8);
        CHECK_EQ(a.rho_ref, b.rho_ref);
    }
    // Uneven shards too: the first 1000 tokens on one rank, the rest on the other.
    CalibStats first(cfg, st), rest(cfg, st);
    for (size_t i = 0; i < toks.size(); i++) (i < 1000 ? first : rest).add_token(toks[i]);
    first.merge(rest);
    CHECK(first.values == one.values);
}

// The decision equals a direct reading of §12.8 with sorted ratios and plain sums.
TEST(calib_matches_direct_definition) {
    for (int trial = 0; trial < 6; trial++) {
        CalibConfig cfg;
        cfg.ref_high = trial % 2 ? 1.28 : 1.24;
        cfg.dual_clip = trial % 3 == 0 ? 0.0 : 2.5;
        Synthetic syn;
        syn.sigma = 0.08 + 0.03 * trial;
        syn.tau = 0.03 * (trial + 1);
        syn.n = 5000;
        syn.varied_weights = trial >= 2;
        syn.seed = 100 + trial;
        std::vector<CalibToken> toks = make_tokens(syn);
        CalibState st{0.6 + 0.05 * trial, 1.8 - 0.1 * trial};
        CalibResult r = cc_decide(cfg, st, stats_of(cfg, st, toks));

        auto ratio = [](float a, float b) { return std::exp(std::min(20.0, std::max(-20.0, (double)a - (double)b))); };
        std::vector<double> neg_r;
        size_t alpha_count = 0;
        for (const CalibToken& t : toks)
            if (t.adv < 0) {
                neg_r.push_back(ratio(t.logp, t.old_logp));
                alpha_count += ratio(t.hp_logp, t.hp_old_logp) < cfg.ref_low;
            }
        // L*: the grid value below which as many FP8 ratios lie as HP ratios below L_ref (nearest
        // count; ties to the value nearest the bound in force).
        double l_star = 0.5, count_gap = INFINITY;
        for (int j = 0; j <= 20; j++) {
            double g = (50.0 + 2.0 * j) / 100.0, below = 0;
            for (double x : neg_r) below += x < g;
            double gap = std::fabs(below - (double)alpha_count);
            if (gap < count_gap || (gap == count_gap && std::fabs(g - st.low) < std::fabs(l_star - st.low)))
                count_gap = gap, l_star = g;
        }
        CHECK_NEAR(r.target_low, l_star, 1e-12, 0);
        double l_new = std::min(0.9, std::max(0.5, st.low + std::min(0.05, std::max(-0.05, (l_star - st.low) / 2))));
        CHECK_NEAR(r.bounds.low, l_new, 1e-12, 0);
        auto P = [&](bool hp, double h) {
            double s = 0;
            for (const CalibToken& t : toks) {
                double x = hp ? ratio(t.hp_logp, t.hp_old_logp) : ratio(t.logp, t.old_logp);
                if (t.adv > 0 && x < h) s += t.agg_weight * t.is_weight * std::fabs(t.adv) * x;
            }
            return s;
        };
        auto N = [&](bool hp, double l) {
            double s = 0;
            for (const CalibToken& t : toks) {
                double x = hp ? ratio(t.hp_logp, t.hp_old_logp) : ratio(t.logp, t.old_logp);
                if (t.adv < 0 && x > l && (cfg.dual_clip <= 0 || x < cfg.dual_clip))
                    s += t.agg_weight * t.is_weight * std::fabs(t.adv) * x;
            }
            return s;
        };
        double rho_ref = P(true, cfg.ref_high) / N(true, cfg.ref_low);
        CHECK_NEAR(r.rho_ref, rho_ref, 1e-9, 0);
        double best_gap = INFINITY, h_star = 0, n_new = N(false, l_new);
        for (int j = 0; j <= 40; j++) {
            double h = 1.2 + 0.02 * j, gap = std::fabs(P(false, h) / n_new - rho_ref);
            if (gap < best_gap - 1e-12) best_gap = gap, h_star = h;
        }
        CHECK_NEAR(r.target_high, h_star, 1e-12, 0);
        CHECK_NEAR(r.bounds.high, std::min(2.0, std::max(1.2, st.high + std::min(0.1, std::max(-0.1, (h_star - st.high) / 2)))),
                   1e-12, 0);
    }
}

// When the reference clips nothing (α = 0), a bound that clips nothing either stays where it is
// (§12.8's literal rule sent L* to 0.5 and dragged the bound down), and one that clips rises to
// the highest grid value that clips nothing.
TEST(calib_alpha_zero_keeps_a_bound_that_clips_nothing) {
    CalibConfig cfg;
    Synthetic syn;
    syn.sigma = 0.02;  // HP ratios within ~exp(±0.1): none below 0.8
    syn.tau = 0.02;
    syn.n = 2000;
    std::vector<CalibToken> toks = make_tokens(syn);
    CalibState st{0.7, 1.5};
    CalibResult r = cc_decide(cfg, st, stats_of(cfg, st, toks));
    CHECK_EQ(r.alpha_ref, 0.0);
    CHECK_NEAR(r.target_low, 0.7, 1e-12, 0);
    CHECK_NEAR(r.bounds.low, 0.7, 1e-12, 0);
    CHECK_EQ(r.clipfrac_neg_fp8, 0.0);
    // One FP8 ratio of 0.75 (the rest as before): the highest grid value clipping nothing is 0.74.
    toks[0].logp = toks[0].old_logp + (float)std::log(0.75);
    toks[0].adv = -1.0f;
    st.low = 0.8;
    r = cc_decide(cfg, st, stats_of(cfg, st, toks));
    CHECK_NEAR(r.target_low, 0.74, 1e-12, 0);
    CHECK_EQ(r.clipfrac_neg_fp8_at_target, 0.0);
    CHECK_NEAR(r.bounds.low, 0.77, 1e-12, 0);  // damped: half way, and 0.75 < 0.77 is clipped until the next one
}

TEST(calib_guards_keep_bounds) {
    CalibConfig cfg;
    CalibState st{0.7, 1.5};
    // One mini-batch, one epoch: every ratio is 1.
    Synthetic syn;
    syn.sigma = 0.0;
    CalibResult r = cc_decide(cfg, st, stats_of(cfg, st, make_tokens(syn)));
    CHECK(r.skipped);
    CHECK(r.reason.find("degenerate") != std::string::npos);
    CHECK_EQ(r.bounds.low, 0.7);
    CHECK_EQ(r.bounds.high, 1.5);
    // Too few tokens.
    syn.sigma = 0.1;
    syn.n = 100;
    r = cc_decide(cfg, st, stats_of(cfg, st, make_tokens(syn)));
    CHECK(r.skipped && r.reason.find("negative-advantage tokens < 256") != std::string::npos);
    CHECK_EQ(r.bounds.low, 0.7);
    // Enough negative tokens but no positive ones: the lower bound moves, the upper stays.
    syn.n = 2000;
    std::vector<CalibToken> toks = make_tokens(syn), neg_only;
    for (const CalibToken& t : toks)
        if (t.adv < 0) neg_only.push_back(t);
    r = cc_decide(cfg, st, stats_of(cfg, st, neg_only));
    CHECK(r.skipped && r.reason.find("positive-advantage tokens") != std::string::npos);
    CHECK(r.bounds.low != 0.7);
    CHECK_EQ(r.bounds.high, 1.5);
    std::vector<std::pair<std::string, double>> m = cc_metrics(r);
    bool has_skipped = false;
    for (const auto& kv : m) has_skipped |= kv.first == "calib/skipped" && kv.second == 1.0;
    CHECK(has_skipped);
    // A non-finite advantage is an error, not a silent decision.
    CalibStats s(cfg, st);
    CalibToken bad = toks[0];
    bad.adv = -INFINITY;
    CHECK_THROWS(s.add_token(bad), "out of range");
    CHECK(cc_is_calibration_step(0, 20) && cc_is_calibration_step(40, 20) && !cc_is_calibration_step(19, 20));
}

// The two departures of cc_decide (issue 51). From the run's start (cc_initial_state) the first
// decision sets each bound to its target, undamped (L*'s ties to L_ref); later ones are damped. A
// calibration with fewer than 256 A < 0 tokens skips and keeps the bounds, its statistics pooled
// into the next one, which then decides exactly as one calibration holding both steps' tokens would.
TEST(calib_first_decision_undamped_and_small_calibrations_pool) {
    CalibConfig cfg;
    Synthetic syn;
    syn.tau = 0.1;
    syn.n = 2000;
    std::vector<CalibToken> toks = make_tokens(syn);
    CalibState st = cc_initial_state();
    CalibResult r = cc_decide(cfg, st, stats_of(cfg, st, toks));
    CHECK(!r.skipped);
    CHECK(r.target_low < 0.78 && r.target_high > 1.2);  // targets away from the start 0.6 and from the damped step
    CHECK_EQ(r.bounds.low, r.target_low);
    CHECK_EQ(r.bounds.high, r.target_high);
    CHECK(!r.bounds.low_unset && !r.bounds.high_unset);
    CalibState moved{0.6, 1.8};
    moved.low = r.bounds.low - 0.2;
    moved.high = r.bounds.high > 1.6 ? 1.2 : 2.0;
    CalibResult damped = cc_decide(cfg, moved, stats_of(cfg, moved, toks));
    CHECK_EQ(damped.target_low, r.target_low);
    CHECK_NEAR(damped.bounds.low, moved.low + 0.05, 1e-12, 0);
    const double gap = damped.target_high - moved.high;
    CHECK_MSG(std::fabs(gap) > 0.2, "H* %g, H %g", damped.target_high, moved.high);
    CHECK_NEAR(damped.bounds.high, moved.high + (gap > 0 ? 0.1 : -0.1), 1e-12, 0);

    // Two calibrations of 150 tokens of each sign, each below the guard: the first pools.
    syn.n = 150;
    std::vector<CalibToken> a = make_tokens(syn);
    syn.seed = 2;
    std::vector<CalibToken> b = make_tokens(syn), both = a;
    both.insert(both.end(), b.begin(), b.end());
    for (const CalibState& start : {cc_initial_state(), CalibState{0.7, 1.5}}) {
        CalibResult first = cc_decide(cfg, start, stats_of(cfg, start, a));
        CHECK(first.skipped && first.pooled && first.reason.find("pooled into the next calibration") != std::string::npos);
        CHECK_EQ(first.bounds.low, start.low);
        CHECK_EQ(first.bounds.high, start.high);
        CHECK_EQ(first.bounds.low_unset, start.low_unset);
        CHECK_EQ(first.bounds.pooled_steps, (int64_t)1);
        CalibResult second = cc_decide(cfg, first.bounds, stats_of(cfg, first.bounds, b));
        CalibResult once = cc_decide(cfg, start, stats_of(cfg, start, both));
        CHECK(!second.pooled && !once.pooled && !once.skipped);
        CHECK_EQ(second.pooled_steps, (int64_t)2);
        CHECK(second.bounds.pooled.empty() && second.bounds.pooled_steps == 0);
        CHECK_EQ(second.neg_tokens, 300.0);
        CHECK_EQ(second.bounds.low, once.bounds.low);
        CHECK_EQ(second.bounds.high, once.bounds.high);
        CHECK_EQ(second.alpha_ref, once.alpha_ref);
        CHECK_EQ(second.clipfrac_neg_fp8, once.clipfrac_neg_fp8);
        CHECK_EQ(second.rho_fp8, once.rho_fp8);
    }
    // A first decision where the reference clips nothing: every grid value below the lowest FP8
    // ratio ties, and the tie goes to the reference bound, not to the start 0.6.
    Synthetic quiet;
    quiet.sigma = 0.02;  // no ratio below exp(-0.15) = 0.86
    quiet.tau = 0.02;
    quiet.n = 2000;
    CalibResult calm = cc_decide(cfg, st, stats_of(cfg, st, make_tokens(quiet)));
    CHECK_EQ(calm.alpha_ref, 0.0);
    CHECK_NEAR(calm.bounds.low, cfg.ref_low, 1e-12, 0);
    // Degenerate ratios (one mini-batch) are dropped, not pooled: they would never decide.
    syn.sigma = 0.0;
    syn.tau = 0.0;
    CalibResult flat = cc_decide(cfg, st, stats_of(cfg, st, make_tokens(syn)));
    CHECK(flat.skipped && !flat.pooled && flat.bounds.pooled.empty());
}

// Issue 51's "CC tracks the reference": on a configuration no other test trains (the copy task, one
// answer token, row scaling, lr 1e-3, 4 minibatches, a calibration every 2 steps), once the damped
// bound has left its initial 0.6 (calibrations from step 10 on), the fraction of negative-advantage
// tokens below the new bound stays within a factor of 2 of the fp32 reference's fraction at L_ref
// (sums over the calibrations: one calibration holds 0-100 reference-clipped tokens). Under ASan (40
// s a step there) a run of 2 steps of 64 sequences, each a calibration: the sanitizer sees the same
// code, and the bound is checked by the plain build.
TEST(calib_bound_tracks_the_reference_in_training) {
    std::string d = temp_dir("calib_tracks");
    const std::string shape = harness::sanitized ? " --group_size 8 --batch_prompts 8 --cc_interval 1 --steps 2"
                                                 : " --group_size 16 --batch_prompts 64 --cc_interval 2 --steps 22";
    harness::RunResult r = run_cmd(harness::binary() + " --init tiny --task copy --task_size 1 --max_new_tokens 1" + shape +
                                   " --minibatches 4 --lr 1e-3 --temperature 1.0 --eval_every 0 --rollout_precision fp8"
                                   " --train_precision fp8 --kv_cache fp8 --fp8_scaling row --calibrated_clip 1"
                                   " --seed 7 --out_dir " + d + "/run");
    CHECK_MSG(r.status == 0, "%s", r.output.c_str());
    if (r.status) return;
    if (harness::sanitized) {
        int calibrations = 0;
        for (const Json& row : log_rows(d + "/run")) calibrations += row.find("calib/alpha_ref") != nullptr;
        CHECK_MSG(calibrations == 2, "%d calibrations logged in 2 steps at --cc_interval 1", calibrations);
        return;
    }
    double cc = 0, ref = 0;
    int calibrations = 0;
    for (const Json& row : log_rows(d + "/run")) {
        const Json *step = row.find("training/global_step"), *alpha = row.find("calib/alpha_ref"),
                   *clipped = row.find("calib/clipfrac_neg_fp8");
        if (!step || step->number < 10 || !alpha || !clipped) continue;
        cc += clipped->number;
        ref += alpha->number;
        calibrations++;
    }
    CHECK_MSG(calibrations >= 4, "%d calibrations with a new lower bound from step 10", calibrations);
    CHECK_MSG(ref > 0 && cc >= 0.5 * ref && cc <= 2.0 * ref, "CC clipped %g, the reference %g (summed fractions)", cc, ref);
}
