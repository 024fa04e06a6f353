// train_setup.h: what a training run prepares before its first step, shared by train_rl_cpu and
// train_rl: which model directory to load (--model, a fresh --init model, or --resume), the
// training and held-out prompts, and the config table printed at start.
#pragma once
#include <filesystem>
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

inline PromptSource training_prompts(const TrainConfig& c) {
    if (!c.data.empty()) return PromptSource::from_dataset(load_jsonl_dataset(c.data), c.seed);
    std::string task = c.task;
    int size = c.task_size;
    return PromptSource::from_generator(
        [task, size](uint64_t seed, int64_t index) {
            TaskExample t = task_example(task, size, seed, (uint64_t)index);
            Example ex;
            ex.prompt = t.prompt;
            ex.answer = t.answer;
            return ex;
        },
        train_task_seed(c.seed));
}

// Held-out prompts: the first eval_prompts of --eval_data, or generated with the eval seed.
inline std::vector<Example> eval_prompts(const TrainConfig& c) {
    std::vector<Example> out;
    if (!c.eval_data.empty()) {
        out = load_jsonl_dataset(c.eval_data);
        if ((int64_t)out.size() > c.eval_prompts) out.resize((size_t)c.eval_prompts);
        return out;
    }
    if (!c.data.empty()) return out;  // a dataset without --eval_data: no eval
    for (int64_t i = 0; i < c.eval_prompts; i++) {
        TaskExample t = task_example(c.task, c.task_size, eval_task_seed(c.seed), (uint64_t)i);
        out.push_back(Example{t.prompt, {}, t.answer});
    }
    return out;
}

// The model directory the run loads. --resume: the checkpoint (itself a HF directory; the
// run's --model or --init may be repeated and then only names the KL reference's origin);
// --init: a fresh model written to OUT_DIR/init_model by rank 0 (from the task's symbols);
// else --model. Exactly one of --model and --init.
inline std::string model_directory(const Args& a, const TrainConfig& c, const Dist& dist) {
    if (a.given("model") && a.given("init"))
        fail("give exactly one of --model DIR (a HF model) and --init PRESET|config.json (a fresh model)");
    if (a.given("resume")) return resolve_checkpoint(a.str("resume"));
    if (!a.given("model") && !a.given("init"))
        fail("give exactly one of --model DIR (a HF model) and --init PRESET|config.json (a fresh model)");
    if (a.given("model")) return a.str("model");
    std::string dir = c.out_dir + "/init_model";
    if (dist.is_root()) {
        std::vector<Example> examples = eval_prompts(c);
        PromptSource train = training_prompts(c);
        for (int64_t i = 0; i < 1000; i++) examples.push_back(train.at(i));
        write_fresh_model(a.str("init"), dir, task_symbols(examples), c.seed);
    }
    dist.barrier();
    return dir;
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
