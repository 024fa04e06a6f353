// memory_fit.h: a training run's device memory from its flags alone, on any number of ranks: the
// largest forward and generation it asks of an engine (MemoryDemand), and, for a plan that does not
// fit the device, which single change of the flags would make it fit. The engine turns a demand into
// its plan (cuda/engine/memory_plan.h, GpuEngine::plan_request); this file only varies the flags, so the
// refusal at the start of training and the one of --plan_ranks are the same line.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cuda/engine/memory_plan.h"
#include "rl/driver/engine.h"
#include "rl/driver/train_config.h"

namespace fp8rl {

// What a run's memory depends on: its settings, the engine's options, the rank count and the longest
// prompt (measured, or --max_prompt_tokens).
struct RunShape {
    TrainConfig cfg;
    EngineOptions options;
    int ranks = 1;
    int64_t longest_prompt = 0;
};

// The largest forward of a run, for an engine's memory plan. A sequence is at most the longest
// prompt + --max_new_tokens tokens. A forward holds --micro_batch_tokens (or that one sequence, when
// longer) or, at 0, a minibatch of this rank: batch_prompts / (minibatches x ranks) prompts x
// group_size sequences. Not counted: the groups dynamic sampling keeps beyond the batch (its last
// attempt's surplus).
inline MemoryDemand memory_demand_of(const RunShape& s) {
    const TrainConfig& cfg = s.cfg;
    const int64_t ranks = s.ranks;
    MemoryDemand d;
    // the eval's budget (--eval_max_new_tokens) where it evaluates and generates longer than training
    // (with --env_cmd a trajectory's --max_total_tokens: no generate() call outgrows prompt + that)
    const int budget = (int)cfg.response_budget();
    const int new_tokens = cfg.eval_every > 0 || cfg.eval_only ? std::max(budget, cfg.eval.sampling.max_new_tokens) : budget;
    d.longest_sequence = s.longest_prompt + new_tokens;
    const int64_t per_rank = (cfg.batch_prompts + (int64_t)cfg.minibatches * ranks - 1) / ((int64_t)cfg.minibatches * ranks);
    d.tokens_per_forward = cfg.micro_batch_tokens > 0 ? std::max(cfg.micro_batch_tokens, d.longest_sequence)
                                                      : per_rank * cfg.group_size * d.longest_sequence;
    d.reference_policy = cfg.kl_coef > 0;
    d.ranks = s.ranks;
    const int64_t eval_per_rank = (cfg.eval_prompts + ranks - 1) / ranks;
    d.rollout_requests = std::max((cfg.batch_prompts + ranks - 1) / ranks * cfg.group_size,
                                  cfg.eval_every > 0 || cfg.eval_only ? eval_per_rank * std::max(1, cfg.eval_k) : 0);
    d.rollout_prompts = std::max((cfg.batch_prompts + ranks - 1) / ranks, cfg.eval_every > 0 || cfg.eval_only ? eval_per_rank : 0);
    d.longest_prompt = s.longest_prompt;
    // --env_cmd: a trajectory's turns run in the KV cache turn 1 sized for prompt + --max_total_tokens
    // (Engine::start_turns), and only the prompts are prefilled
    d.max_new_tokens = new_tokens;
    d.kv_cache = cfg.kv_cache;
    return d;
}

// An engine's plan request for a run (the GPU engine: plan_request of memory_demand_of).
using PlanRequestOf = std::function<MemoryPlanRequest(const RunShape&)>;

namespace memory_fit_detail {

// The largest v in [lo, hi] with fits(v), fits holding up to some value and not above it; 0 if none.
inline int64_t largest_fitting(int64_t lo, int64_t hi, const std::function<bool(int64_t)>& fits) {
    int64_t best = 0;
    while (lo <= hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (fits(mid)) best = mid, lo = mid + 1;
        else hi = mid - 1;
    }
    return best;
}

}  // namespace memory_fit_detail

// The refusal of a run whose plan exceeds free_bytes ("" when it fits): memory_plan_refusal's line
// (its numbers, --recompute layer, the most tokens per micro-batch), with the changes of other flags
// that fit, each on its own, from the run with --recompute layer (and --zero 1, which on several ranks
// is an option of its own, as --zero 2 is): the most --rollout_slots, the most --max_new_tokens, the
// fewest ranks (that split --batch_prompts); or, when no rank count fits, what ranks split.
inline std::string run_memory_refusal(const ModelConfig& c, const RunShape& s, const PlanRequestOf& request,
                                      const PlanConstants& k, size_t free_bytes, size_t total_bytes) {
    using memory_fit_detail::largest_fitting;
    const MemoryPlanRequest r = request(s);
    const MemoryPlan p = plan_memory(c, r, k);
    if (p.total() <= free_bytes) return "";
    auto fits = [&](const RunShape& x) { return plan_memory(c, request(x), k).total() <= free_bytes; };
    std::vector<std::string> more, notes;
    if (!s.options.offload_train_state && p.rollout_min() > free_bytes) {  // the rollout is the larger phase
        RunShape x = s;
        x.options.offload_train_state = true;
        const size_t t = plan_memory(c, request(x), k).total();
        if (t < p.total()) more.push_back(strfmt("--offload_train_state 1 (%s%s)", bytes_text(t).c_str(), t <= free_bytes ? ", fits" : ""));
    }
    RunShape base = s;
    std::vector<std::string> with;  // the changes the searches below start from
    if (s.options.zero == 0) {  // on one rank the same run; on more, --zero 1 shards the optimizer
        base.options.zero = 1;
        const size_t t = plan_memory(c, request(base), k).total();
        if (s.ranks > 1) more.push_back(strfmt("--zero 1 (%s%s)", bytes_text(t).c_str(), t <= free_bytes ? ", fits" : ""));
        with.push_back("--zero 1");
    }
    if (s.options.zero < 2 && s.ranks > 1) {  // ZeRO-2 shards the gradients too
        RunShape z = s;
        z.options.zero = 2;
        const size_t t = plan_memory(c, request(z), k).total();
        more.push_back(strfmt("--zero 2 (%s%s)", bytes_text(t).c_str(), t <= free_bytes ? ", fits" : ""));
    }
    if (!s.options.recompute_layer) with.push_back("--recompute layer");
    base.options.recompute_layer = true;
    const std::string with_text = with.empty() ? "" : " with " + (with.size() == 1 ? with[0] : with[0] + " and " + with[1]);
    if (fits(base)) {
        if (with.size() == 2 && s.ranks > 1) more.push_back("--zero 1 with --recompute layer (fits)");
        return memory_plan_refusal(c, r, k, free_bytes, total_bytes, more, notes);
    }
    const int64_t slots = largest_fitting(1, s.options.rollout_slots - 1, [&](int64_t v) {
        RunShape x = base;
        x.options.rollout_slots = (int)v;
        return fits(x);
    });
    if (slots > 0) more.push_back(strfmt("--rollout_slots %lld%s", (long long)slots, with_text.c_str()));
    const int64_t new_tokens = largest_fitting(1, s.cfg.sampling.max_new_tokens - 1, [&](int64_t v) {
        RunShape x = base;
        x.cfg.sampling.max_new_tokens = (int)v;
        return fits(x);
    });
    if (new_tokens > 0) more.push_back(strfmt("--max_new_tokens %lld%s", (long long)new_tokens, with_text.c_str()));
    const int64_t split = s.cfg.batch_prompts / s.cfg.minibatches;  // every rank needs a prompt of each minibatch
    int ranks = 0;
    for (int64_t n = s.ranks + 1; n <= split && ranks == 0; n++) {
        RunShape x = base;
        x.ranks = (int)n;
        if (split % n == 0 && fits(x)) ranks = (int)n;
    }
    if (ranks > 0) more.push_back(strfmt("%d ranks%s", ranks, with_text.c_str()));
    else
        notes.push_back(strfmt("no rank count up to %lld (--batch_prompts / --minibatches) fits%s: ZeRO-%d splits only the "
                               "%s (%s of the %s)",
                               (long long)split, with_text.c_str(), s.options.zero == 2 ? 2 : 1, sharded_state_text(p).c_str(),
                               bytes_text(sharded_state_bytes(p)).c_str(), bytes_text(p.total()).c_str()));
    return memory_plan_refusal(c, r, k, free_bytes, total_bytes, more, notes);
}

// --rollout_slots 0: the most slots, up to the requests one generation samples, whose plan fits
// free_bytes (1 when none does: the plan then refuses with what would fit). Other values stay.
inline RunShape with_rollout_slots(const ModelConfig& c, RunShape s, const PlanRequestOf& request, const PlanConstants& k,
                                   size_t free_bytes) {
    if (s.options.rollout_slots > 0) return s;
    const int64_t requests = std::min<int64_t>(std::max<int64_t>(1, memory_demand_of(s).rollout_requests), 4096);
    const int64_t slots = memory_fit_detail::largest_fitting(1, requests, [&](int64_t v) {
        RunShape x = s;
        x.options.rollout_slots = (int)v;
        return plan_memory(c, request(x), k).total() <= free_bytes;
    });
    s.options.rollout_slots = (int)std::max<int64_t>(slots, 1);
    return s;
}

// A run's plan against a device: its printed lines, its total (the larger phase at its least), the
// refusal ("" when it fits), the rollout slots it plans (--rollout_slots, or what 0 resolves to) and
// each phase's peak on that device (the rollout's with the KV pool it gets there).
struct PlannedMemory {
    std::string text, refusal;
    size_t total = 0;
    int rollout_slots = 0;
    size_t rollout_peak = 0, update_peak = 0;
};

inline PlannedMemory plan_against(const ModelConfig& c, const RunShape& asked, const PlanRequestOf& request,
                                  const PlanConstants& k, size_t free_bytes, size_t total_bytes) {
    const RunShape s = with_rollout_slots(c, asked, request, k, free_bytes);
    const MemoryPlan p = plan_memory(c, request(s), k);
    std::string text = memory_plan_text(p, free_bytes);
    if (asked.options.rollout_slots == 0)
        text += strfmt("  rollout slots: %d of the %lld requests a generation samples (--rollout_slots 0: the most the plan fits)\n",
                       s.options.rollout_slots, (long long)memory_demand_of(s).rollout_requests);
    return {text, run_memory_refusal(c, s, request, k, free_bytes, total_bytes), p.total(), s.options.rollout_slots,
            p.rollout_peak(free_bytes), p.update_peak()};
}

// The plan's printed lines when it fits free_bytes (and s's --rollout_slots 0 resolved to the slots
// it plans); else the refusal, as an error.
inline std::string fitting_memory_plan(const ModelConfig& c, RunShape& s, const PlanRequestOf& request,
                                       const PlanConstants& k, size_t free_bytes, size_t total_bytes) {
    const PlannedMemory m = plan_against(c, s, request, k, free_bytes, total_bytes);
    if (!m.refusal.empty()) fail("%s", m.refusal.c_str());
    s.options.rollout_slots = m.rollout_slots;
    return m.text;
}

}  // namespace fp8rl
