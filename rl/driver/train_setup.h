// train_setup.h: what a training run prepares before its first step, shared by train_rl_cpu and
// train_rl: which model directory to load (--model, a fresh --init model, or --resume), the
// training and held-out prompts, and the config table printed at start.
#pragma once
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "rl/driver/args.h"
#include "rl/io/checkpoint.h"
#include "rl/model/config.h"
#include "rl/tasks/data.h"
#include "rl/driver/dist.h"
#include "rl/model/init_model.h"
#include "rl/tasks/tasks.h"
#include "rl/driver/train_config.h"

namespace fp8rl {

// Seeds of the synthetic task's training and held-out examples: different seeds, disjoint sets.
inline uint64_t train_task_seed(uint64_t seed) { return seed; }
inline uint64_t eval_task_seed(uint64_t seed) { return seed ^ 0x5EEDE7A1ull; }

// --max_prompt_tokens as the data loaders apply it: how many tokens a prompt takes after the chat
// template (the driver's encode_example_prompt) and whether this rank prints what it left out. The
// default (no length) loads the data whole, as model_directory does for a fresh model's symbols.
struct PromptBudget {
    std::function<int64_t(const Example&)> length;
    bool log = false;
};

// verl's filter_overlong_prompts: the examples of `what` (from `source`) whose prompt is at most
// --max_prompt_tokens long, in their order, with one stdout line counting the rest; leaving out all
// of them is an error.
inline std::vector<Example> leave_out_long_prompts(std::vector<Example> examples, const TrainConfig& c, const PromptBudget& budget,
                                                   const char* what, const std::string& source) {
    if (c.max_prompt_tokens <= 0 || !budget.length) return examples;
    std::vector<Example> kept;
    int64_t shortest = INT64_MAX;
    for (Example& ex : examples) {
        const int64_t n = budget.length(ex);
        shortest = std::min(shortest, n);
        if (n <= c.max_prompt_tokens) kept.push_back(std::move(ex));
    }
    if (kept.empty())
        fail("--max_prompt_tokens %lld leaves out all %zu %s of %s (the shortest is %lld tokens, chat template included); "
             "give --max_prompt_tokens %lld or more",
             (long long)c.max_prompt_tokens, examples.size(), what, source.c_str(), (long long)shortest, (long long)shortest);
    if (budget.log)
        printf("left out %zu of %zu %s longer than %lld tokens (--max_prompt_tokens)\n", examples.size() - kept.size(),
               examples.size(), what, (long long)c.max_prompt_tokens);
    return kept;
}

// The first prompts of a synthetic task that the memory plan measures without a budget: a generator
// has no end to leave prompts out of, so with --max_prompt_tokens each of them must fit it.
constexpr int64_t kMeasuredTaskPrompts = 1000;

inline PromptSource training_prompts(const TrainConfig& c, const PromptBudget& budget = {}) {
    if (!c.data.empty())
        return PromptSource::from_dataset(leave_out_long_prompts(load_jsonl_dataset(c.data), c, budget, "training prompts", c.data),
                                          c.seed);
    std::string task = c.task;
    int size = c.task_size;
    PromptSource source = PromptSource::from_generator(
        [task, size](uint64_t seed, int64_t index) {
            TaskExample t = task_example(task, size, seed, (uint64_t)index);
            Example ex;
            ex.prompt = t.prompt;
            ex.answer = t.answer;
            return ex;
        },
        train_task_seed(c.seed));
    if (c.max_prompt_tokens > 0 && budget.length)
        for (int64_t i = 0; i < kMeasuredTaskPrompts; i++)
            if (const int64_t n = budget.length(source.at(i)); n > c.max_prompt_tokens)
                fail("--max_prompt_tokens %lld: --task %s --task_size %d generates a prompt of %lld tokens (training prompt %lld); "
                     "only --data and --eval_data rows are left out: give --max_prompt_tokens %lld or a smaller --task_size",
                     (long long)c.max_prompt_tokens, task.c_str(), size, (long long)n, (long long)i, (long long)n);
    return source;
}

// Held-out prompts: the first eval_prompts of --eval_data, or generated with the eval seed; either
// way within --max_prompt_tokens.
inline std::vector<Example> eval_prompts(const TrainConfig& c, const PromptBudget& budget = {}) {
    std::vector<Example> out;
    if (!c.eval_data.empty()) {
        out = leave_out_long_prompts(load_jsonl_dataset(c.eval_data), c, budget, "eval prompts", c.eval_data);
        if ((int64_t)out.size() > c.eval_prompts) out.resize((size_t)c.eval_prompts);
        return out;
    }
    if (!c.data.empty()) return out;  // a dataset without --eval_data: no eval
    for (int64_t i = 0; i < c.eval_prompts; i++) {
        TaskExample t = task_example(c.task, c.task_size, eval_task_seed(c.seed), (uint64_t)i);
        out.push_back(Example{t.prompt, {}, t.answer});
    }
    return leave_out_long_prompts(std::move(out), c, budget, "eval prompts", "--task " + c.task);
}

// The symbols of a fresh model's task tokenizer: those of the held-out prompts and the first
// training prompts.
inline std::string fresh_model_symbols(const TrainConfig& c) {
    std::vector<Example> examples = eval_prompts(c);
    PromptSource train = training_prompts(c);
    for (int64_t i = 0; i < 1000; i++) examples.push_back(train.at(i));
    return task_symbols(examples);
}

// A fresh model's vocabulary: --tokenizer bytes (the default of --mode sft and cpt), every byte, for
// any UTF-8 text; --tokenizer PATH, that HF tokenizer's; else the bytes of the task's prompts.
inline FreshVocab fresh_vocab(const Args& a, const TrainConfig& c) {
    if (!a.given("tokenizer") && c.mode == "rl") return task_fresh_vocab(fresh_model_symbols(c));
    if (a.given("tokenizer") && a.str("tokenizer") != "bytes") return tokenizer_fresh_vocab(a.str("tokenizer"));
    std::string all(256, '\0');
    for (int b = 0; b < 256; b++) all[(size_t)b] = (char)b;
    return task_fresh_vocab(all);
}

// The model directory the run loads. --resume: the checkpoint (itself a HF directory; the
// run's --model or --init may be repeated and then only names the KL reference's origin);
// --init: a fresh model written to OUT_DIR/init_model by rank 0 (its vocabulary: fresh_vocab);
// else --model (a model directory, or a run directory: its latest checkpoint). Exactly one of --model
// and --init.
inline std::string model_directory(const Args& a, const TrainConfig& c, const Dist& dist) {
    if (a.given("model") && a.given("init"))
        fail("give exactly one of --model DIR (a HF model) and --init PRESET|config.json (a fresh model)");
    if (a.given("resume")) return resolve_checkpoint(a.str("resume"));
    if (!a.given("model") && !a.given("init"))
        fail("give exactly one of --model DIR (a HF model) and --init PRESET|config.json (a fresh model)");
    if (a.given("model")) {  // a run directory (an earlier stage of CPT -> SFT -> RL) loads its latest checkpoint
        const std::string& m = a.str("model");
        return std::filesystem::exists(m + "/config.json") || !std::filesystem::exists(m + "/latest") ? m : resolve_checkpoint(m);
    }
    std::string dir = c.out_dir + "/init_model";
    if (dist.is_root()) write_fresh_model(a.str("init"), dir, fresh_vocab(a, c), c.seed);
    dist.barrier();
    return dir;
}

// The config.json a run would load, without loading anything else (--plan_ranks): --model's, or that
// of the fresh model --init would write.
inline ModelConfig planned_model_config(const Args& a, const TrainConfig& c) {
    if (a.given("model") == a.given("init"))
        fail("give exactly one of --model DIR (a HF model) and --init PRESET|config.json (a fresh model)");
    if (a.given("model")) return load_model_config(a.str("model"));
    const std::string where = "--init " + a.str("init");
    return parse_model_config(json_parse(fresh_config_text(a.str("init"), fresh_vocab(a, c)), where), where);
}

// The flags that size a sequence against the model's context (max_position_embeddings, when the
// config has one): a budget beyond it would only end in an allocation failure far from its cause.
inline void check_fits_context(const TrainConfig& c, const ModelConfig& m) {
    const int64_t ctx = m.max_position_embeddings;
    if (ctx > 0 && c.sampling.max_new_tokens >= ctx)
        fail("--max_new_tokens %d: the model's context is %lld tokens (max_position_embeddings in its config.json), prompt "
             "included; use --max_new_tokens %lld or less",
             c.sampling.max_new_tokens, (long long)ctx, (long long)ctx - 1);
}

inline void make_out_dir(const std::string& dir) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) fail("--out_dir %s: cannot create it: %s", dir.c_str(), ec.message().c_str());
}

}  // namespace fp8rl
