// run_summary.h: the three lines a run ends with, for someone who has not read the step lines:
// what was learned, how fast, and what FP8 changed against the rollout's own log-probs and the
// fp32 reference (Calibrated Clipping's shadow passes).
#pragma once
#include <cmath>
#include <string>
#include <vector>

#include "rl/common.h"
#include "rl/io/metric_row.h"
#include "rl/driver/train_config.h"

namespace fp8rl {

// Mean of `key` over rows [begin, end) where it is finite; NaN when none is.
inline double rows_mean(const std::vector<MetricRow>& rows, const std::string& key, size_t begin, size_t end) {
    double sum = 0;
    int n = 0;
    for (size_t i = begin; i < end && i < rows.size(); i++)
        if (double v = rows[i].get(key); std::isfinite(v)) sum += v, n++;
    return n ? sum / n : NAN;
}

inline std::string run_summary(const TrainConfig& c, const std::vector<MetricRow>& rows, double seconds) {
    if (rows.empty()) return "summary: no steps were run";
    const size_t n = rows.size(), k = std::min<size_t>(10, n);
    const std::string greedy = "val-core/" + c.task + "/acc/greedy";
    double last_acc = NAN, first_step_90 = NAN;
    for (const MetricRow& r : rows)
        if (double a = r.get(greedy); std::isfinite(a)) {
            last_acc = a;
            if (a >= 0.9 && !std::isfinite(first_step_90)) first_step_90 = r.get("training/global_step") + 1;
        }
    std::string learned = strfmt("summary: learned %s: exactly correct %.1f%% of samples in the first %zu steps, %.1f%% in the last %zu",
                                 c.task.c_str(), 100 * rows_mean(rows, "critic/correct/mean", 0, k), k,
                                 100 * rows_mean(rows, "critic/correct/mean", n - k, n), k);
    if (std::isfinite(last_acc)) {
        learned += strfmt("; greedy accuracy on %lld held-out prompts %.3f", (long long)c.eval_prompts, last_acc);
        learned += std::isfinite(first_step_90) ? strfmt(" (>= 0.9 from step %.0f)", first_step_90) : std::string(" (never >= 0.9)");
    }
    std::string speed = strfmt("  speed: %zu steps in %.0f s (%.2f s/step; rollout %.0f tokens/s, training %.0f tokens/s)", n,
                               seconds, seconds / (double)n, rows_mean(rows, "perf/gen_tokens_per_s", 0, n),
                               rows_mean(rows, "perf/train_tokens_per_s", 0, n));
    std::string fp8 = strfmt("  precision: rollout %s, training %s, KV cache %s, FP8 scaling %s; the trainer's log-probs differ "
                             "from the rollout's by %.1e per token on average",
                             precision_name(c.rollout_precision), precision_name(c.train_precision), precision_name(c.kv_cache),
                             fp8_scaling_name(c.fp8_scaling), rows_mean(rows, "rollout_corr/logprob_abs_diff", 0, n));
    if (c.calibrated_clip) {
        double diff = rows_mean(rows, "calib/ratio_abs_diff_mean", 0, n);
        if (std::isfinite(diff)) fp8 += strfmt("; ratios differ from fp32's by %.1e", diff);
        fp8 += strfmt("; Calibrated Clipping bounds [%.2f, %.2f] at the end (reference [%.2f, %.2f])", rows.back().get("calib/clip_low"),
                      rows.back().get("calib/clip_high"), 1 - c.clip_low, 1 + c.clip_high);
    }
    fp8 += strfmt("; clipped tokens %.2f%% (A<0) and %.2f%% (A>0)", 100 * rows_mean(rows, "actor/pg_clipfrac_low", 0, n),
                  100 * rows_mean(rows, "actor/pg_clipfrac_high", 0, n));
    return learned + "\n" + speed + "\n" + fp8;
}

}  // namespace fp8rl
