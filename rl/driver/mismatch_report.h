// mismatch_report.h: --mismatch_report N. At step 0 and every N steps, the step's rollout/train
// mismatch (rollout_corr/k3_kl and rollout_corr/logprob_abs_diff, rl/objective/metrics.h: the
// rollout's log-probs ℓ^roll against the trainer's old ones ℓ^old) is attributed to its sources by
// switching each source alone to its high-precision form, on the same sampled tokens:
//
//   fp8_weights    the rollout's FP8 projections (weights and activations) -> BF16 linear layers
//   fp8_kv_cache   the rollout's FP8 KV cache -> a BF16 cache
//   decode_path    the rollout's decode path (prompt prefilled, then one decode step per token) ->
//                  one full-sequence forward at the rollout's precisions (the prefill path)
//
// mismatch/<source>/k3_kl = k3_kl(ℓ^roll, ℓ^old) − k3_kl(ℓ^switched, ℓ^old), the same for abs_diff:
// how much of the metric that source makes (positive: switching it off lowers the mismatch). The
// first term is rollout_corr/k3_kl itself. ℓ^switched of the first two sources is teacher-forced
// through the decode path (Engine::decode_logprobs: with the rollout's own numerics it reproduces
// ℓ^roll bit for bit), with the rollout's FP8 KV scales (not recalibrated) wherever the cache stays
// FP8; of decode_path it is Engine::prefill_logprobs at the rollout's weights, reading an FP8 cache at
// those scales as --train_kv_replay does (prompt rows as the prefill read them, response rows as
// decode did), so that the term is kernel order alone. A source the rollout already runs in high precision
// (bf16 or fp32) changes nothing when switched: its terms are 0, not computed.
//
// Cost, at report steps only: two teacher-forced decode passes (about a rollout each: the same
// prefill and decode steps, no sampling) when rollout weights and KV cache are both FP8, one when one
// of them is, and one forward pass (as the old-log-prob pass); on a GPU engine the phases are
// entered once more for the decode passes (rl/driver/driver.h), and with rollout and training both
// in FP8 the engine keeps its BF16 weight copy (rl/driver/train_config.h).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "rl/driver/dist.h"
#include "rl/driver/engine.h"
#include "rl/io/metric_row.h"
#include "rl/objective/metrics.h"

namespace fp8rl {

inline bool mismatch_report_step(int64_t every, int64_t step) { return every > 0 && step % every == 0; }

// The numerics of the generate() the engine ran last (its FP8 KV scales), shared by its samples.
inline std::shared_ptr<const RolloutNumerics> last_rollout_numerics(const Engine& e, Precision weights, Precision kv_cache) {
    auto n = std::make_shared<RolloutNumerics>();
    n->weights = weights;
    n->kv_cache = kv_cache;
    e.last_kv_scales(&n->k_scale, &n->v_scale);
    return n;
}

// One source's log-probs of every sample with that source switched (switched false: the rollout has
// it in high precision already, terms 0).
struct MismatchSource {
    std::string name;
    bool switched = false;
    TokenValues lp;
};

// The runs [b, e) of consecutive sequences in [begin, end) sampled with the same numerics (one
// generate() each: a step with dynamic sampling may hold several).
inline std::vector<std::pair<size_t, size_t>> same_numerics_runs(const std::vector<std::shared_ptr<const RolloutNumerics>>& numerics,
                                                                 size_t begin, size_t end) {
    std::vector<std::pair<size_t, size_t>> runs;
    for (size_t b = begin, e; b < end; b = e) {
        for (e = b + 1; e < end && numerics[e] == numerics[b];) e++;
        runs.push_back({b, e});
    }
    return runs;
}

// The switched log-probs of seqs (sampled with numerics[i], all at the rollout's weights and
// kv_cache precisions, and `sampling`), on the weights the rollout sampled with: the decode passes
// inside the rollout phase (enter_phase), the prefill pass after it in `forwards` ([begin, end) of
// each forward, as the old-log-prob pass batches them).
inline std::vector<MismatchSource> mismatch_logprobs(Engine& engine, const std::vector<Sequence>& seqs,
                                                     const std::vector<std::shared_ptr<const RolloutNumerics>>& numerics,
                                                     Precision weights, Precision kv_cache, const SamplingConfig& sampling,
                                                     const std::vector<std::pair<size_t, size_t>>& forwards,
                                                     const std::function<void(Engine::Phase)>& enter_phase) {
    const bool switch_weights = weights == Precision::FP8, switch_kv = kv_cache == Precision::FP8;
    std::vector<MismatchSource> out = {{"fp8_weights", switch_weights, {}}, {"fp8_kv_cache", switch_kv, {}}, {"decode_path", true, {}}};
    if (seqs.empty()) return out;
    auto slice = [&](size_t b, size_t e) { return std::vector<Sequence>(seqs.begin() + (long)b, seqs.begin() + (long)e); };
    if (switch_weights || switch_kv) {
        enter_phase(Engine::Phase::Rollout);
        for (const auto& run : same_numerics_runs(numerics, 0, seqs.size())) {
            for (int source = 0; source < 2; source++) {
                if (!(source == 0 ? switch_weights : switch_kv)) continue;
                RolloutNumerics n = *numerics[run.first];
                if (source == 0) n.weights = Precision::BF16;
                if (source == 1) n.kv_cache = Precision::BF16, n.k_scale.clear(), n.v_scale.clear();
                for (auto& lp : engine.decode_logprobs(slice(run.first, run.second), sampling, n)) out[(size_t)source].lp.push_back(std::move(lp));
            }
        }
        enter_phase(Engine::Phase::Update);
    }
    for (const auto& f : forwards)
        for (const auto& run : same_numerics_runs(numerics, f.first, f.second))
            for (auto& lp : engine.prefill_logprobs(slice(run.first, run.second), sampling.temperature, *numerics[run.first]))
                out[2].lp.push_back(std::move(lp));
    return out;
}

// Per sample: its tokens' old and rollout log-probs and mask [T] (old_lp null: never computed, as
// after a step stopped by NaN/Inf; such a sample is left out).
struct MismatchSample {
    const float *old_lp, *rollout_lp;
    const uint8_t* mask;
    int T;
};

// mismatch/<source>/{k3_kl,abs_diff} over the valid tokens of every rank (the sums rollout_corr's
// metrics are made of, StepMetrics::add_rollout_token, reduced together over the ranks).
inline void report_mismatch(const Dist& dist, const std::vector<MismatchSample>& samples, const std::vector<MismatchSource>& sources,
                            double is_cap, MetricRow& m) {
    std::vector<StepMetrics> acc(sources.size() + 1);  // [0]: the rollout's own log-probs
    for (size_t i = 0; i < samples.size(); i++) {
        const MismatchSample& s = samples[i];
        if (!s.old_lp) continue;
        for (size_t k = 0; k < acc.size(); k++) {
            if (k > 0 && !sources[k - 1].switched) continue;
            const float* lp = k == 0 ? s.rollout_lp : sources[k - 1].lp[i].data();
            if (k > 0 && sources[k - 1].lp[i].size() != (size_t)s.T)
                fail("--mismatch_report: sample %zu has %d tokens, its %s log-probs %zu (internal)", i, s.T, sources[k - 1].name.c_str(),
                     sources[k - 1].lp[i].size());
            for (int t = 0; t < s.T; t++)
                if (s.mask[t]) acc[k].add_rollout_token(s.old_lp[t], lp[t], 1.0, is_cap);
        }
    }
    std::vector<double> sums;  // [tokens, then (k3, |x|) of each accumulator]
    sums.push_back(acc[0].sums[StepMetrics::kSumRcTokens]);
    for (const StepMetrics& a : acc) sums.push_back(a.sums[StepMetrics::kSumRcK3]), sums.push_back(a.sums[StepMetrics::kSumRcAbsDiff]);
    dist.all_reduce_sum(sums);
    const double n = sums[0];
    if (!(n > 0)) return;
    for (size_t k = 0; k < sources.size(); k++) {
        const bool on = sources[k].switched;
        m.set("mismatch/" + sources[k].name + "/k3_kl", on ? sums[1] / n - sums[3 + 2 * k] / n : 0.0);
        m.set("mismatch/" + sources[k].name + "/abs_diff", on ? sums[2] / n - sums[4 + 2 * k] / n : 0.0);
    }
}

}  // namespace fp8rl
