// train_config.h: the settings of a training run, read once from the flags (rl/driver/args.h) with the
// algorithm presets applied (DAPO: clip-higher 0.28, dual clip 10, dynamic sampling; Dr.GRPO:
// seq-mean-token-sum-norm), and the checks that need more than one flag.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>

#include "rl/io/json.h"

#include "rl/objective/adamw.h"
#include "rl/objective/advantage.h"
#include "rl/driver/args.h"
#include "rl/driver/engine.h"
#include "rl/driver/eval.h"
#include "rl/model/fp8_export.h"
#include "rl/objective/loss_agg.h"
#include "rl/objective/lr_schedule.h"
#include "rl/numerics/precision.h"
#include "rl/tasks/environment.h"
#include "rl/tasks/scorer.h"
#include "rl/tasks/tasks.h"
#include "rl/objective/token_loss.h"

namespace fp8rl {

struct TrainConfig {
    // sft and cpt (rl/driver/lm_trainer.h)
    std::string mode = "rl";
    int64_t batch_seqs = 32, max_seq_len = 0, seq_len = 256;
    bool doc_mask = false;
    std::string data_mix;  // "a.bin:0.7,b.bin:0.3" (lm_sources.h), in place of --data
    // data
    std::string task;
    int task_size = 0;
    std::string data, eval_data;
    int64_t eval_prompts = 0;
    int64_t max_prompt_tokens = 0;  // prompts longer than this are left out of the data; 0 = no limit
    int enable_thinking = 1;  // Qwen3 chat template, for dataset rows with "messages"
    RewardConfig reward;      // --reward_cmd / --reward_url; the built-in verifier of --task without them
    EnvConfig env;            // --env_cmd: multi-turn rollouts (rl/driver/multi_turn.h); budgets resolved
    // algorithm
    std::string algo;
    AdvantageEstimator estimator = AdvantageEstimator::Grpo;
    int group_size = 8;
    int64_t batch_prompts = 32;
    int minibatches = 1, epochs = 1;
    double clip_low = 0.2, clip_high = 0.24, dual_clip = 3.0;
    double kl_coef = 0.0;
    KlEstimator kl_estimator = KlEstimator::K3;
    double entropy_coef = 0.0;
    LossAgg loss_agg = LossAgg::TokenMean;
    IsCorrection is_correction = IsCorrection::TokenTis;
    double is_cap = 2.0;
    double is_floor = 0.5;  // IcePop's lower bound
    int64_t mismatch_report = 0;  // at step 0 and every N steps the mismatch by source (rl/driver/mismatch_report.h); 0 = never
    int64_t dump_rollouts = 0;  // every N steps OUT/rollouts/step_K.jsonl (rl/io/rollout_dump.h); 0 = never
    bool dynamic_sampling = false;
    int max_gen_batches = 10;
    int64_t overlong_buffer = 0;
    double overlong_penalty = 1.0;
    // precision
    Precision rollout_precision = Precision::BF16, train_precision = Precision::BF16, kv_cache = Precision::BF16;
    Fp8Scaling fp8_scaling = Fp8Scaling::Block;
    bool fp8_pow2_scales = false;  // --fp8_scales pow2 (the engines read it from EngineOptions; kept here for the recipe)
    int calibrated_clip = 0;  // 1: on; 2: shadow passes and calib/* metrics only, bounds stay at the reference
    int cc_interval = 20;
    // sampling
    SamplingConfig sampling;
    int eval_k = 4;
    // held-out evaluation (rl/driver/eval.h): the --eval_data sets, how the eval samples, --eval_only
    std::vector<EvalDataSpec> eval_sets;
    std::vector<EvalDataSpec> eval_task_sets;  // --mode sft|cpt: --eval_task_data
    EvalOptions eval;
    bool eval_only = false;
    // optimizer
    AdamWConfig adam;
    LrSchedule lr;
    double grad_clip = 1.0;
    // memory
    int64_t micro_batch_tokens = 0;  // most tokens of one forward_train/backward; 0 = the whole minibatch
    // run
    uint64_t seed = 0;
    int64_t steps = 0, eval_every = 0, save_every = 0, keep_checkpoints = 0;
    SaveFormat save_format = SaveFormat::BF16;
    std::string out_dir;
    bool tensorboard = false;
    int max_bad_steps = 3;
    // Not a flag: tests set it to run the old-log-prob pass even with one minibatch and one epoch,
    // where the driver takes the training forward's log-probs instead (Trainer::old_lp_from_training).
    bool always_old_logprob_pass = false;

    // The most tokens of a response: --max_new_tokens, or with --env_cmd a trajectory's --max_total_tokens
    // (the model's turns and the observations). The overlong shaping and the loss's horizon count these.
    int64_t response_budget() const { return env.enabled() ? env.max_total_tokens : sampling.max_new_tokens; }
};

// The numerics a run trains with (recipe.json beside its log.jsonl) and a checkpoint was trained with
// (beside its trainer state), so a reader of the directory, or a resumed run, knows them: the mode
// (rl, sft, cpt), the precisions, the FP8 scales' granularity and kind, Calibrated Clipping.
inline const char* const kRecipeFile = "recipe.json";

inline std::string recipe_json(const TrainConfig& c) {
    return strfmt("{\"mode\": \"%s\", \"rollout_precision\": \"%s\", \"train_precision\": \"%s\", \"kv_cache\": \"%s\", "
                  "\"fp8_scaling\": \"%s\", \"fp8_scales\": \"%s\", \"calibrated_clip\": %d}\n",
                  c.mode.c_str(), precision_name(c.rollout_precision), precision_name(c.train_precision),
                  precision_name(c.kv_cache), fp8_scaling_name(c.fp8_scaling), c.fp8_pow2_scales ? "pow2" : "fp32",
                  c.calibrated_clip);
}

// A resumed run's line on what changed since the checkpoint's recipe ("" when nothing did, or the
// checkpoint predates recipe.json): a granularity or precision changed on purpose is allowed, and said.
inline std::string recipe_changes(const std::string& checkpoint_dir, const TrainConfig& c) {
    const std::string path = checkpoint_dir + "/" + kRecipeFile;
    if (!std::filesystem::exists(path)) return "";
    const Json was = json_parse_file(path), now = json_parse(recipe_json(c), "this run's recipe");
    std::string changes;
    for (const auto& kv : now.fields) {
        const Json* old = was.find(kv.first);
        if (old && json_dump(*old) != json_dump(kv.second))
            changes += strfmt("%s%s %s -> %s", changes.empty() ? "" : ", ", kv.first.c_str(), json_dump(*old).c_str(),
                              json_dump(kv.second).c_str());
    }
    return changes.empty() ? "" : "resume: the checkpoint was trained with other numerics: " + changes;
}

inline EngineOptions engine_options_from_args(const Args& a) {
    EngineOptions o;
    o.zero = (int)a.integer("zero");
    o.collective_timeout_s = a.number("collective_timeout");
    o.recompute_layer = a.str("recompute") == "layer";
    o.rollout_slots = (int)a.integer("rollout_slots");
    o.kv_cache_mb = a.number("kv_cache_mb");
    o.offload_train_state = a.integer("offload_train_state") == 1;
    o.kv_page_tokens = (int)a.integer("kv_page_tokens");
    o.kv_scale_per_head = a.str("kv_scales") == "head";
    o.train_kv_replay = a.integer("train_kv_replay") == 1;
    o.fp8_scaling = parse_fp8_scaling(a.str("fp8_scaling"), "--fp8_scaling");
    o.fp8_pow2_scales = a.str("fp8_scales") == "pow2";
    o.own_fp8_gemm = a.str("fp8_gemm_kernel") == "own";
    o.cuda_graphs = a.integer("cuda_graphs") == 1;
    return o;
}

// A training run's engine options: one FP8 copy of the projections when rollout and training both
// run in fp8 at block scaling (the only granularity whose copy transposes exactly), and no FP8
// weights at all when neither does (a true BF16 baseline).
inline EngineOptions training_engine_options(const Args& a, const TrainConfig& c) {
    EngineOptions o = engine_options_from_args(a);
    // sft and cpt generate nothing: their one copy needs no --rollout_precision fp8
    const bool rollout_fp8 = c.mode == "rl" ? c.rollout_precision == Precision::FP8 : c.train_precision == Precision::FP8;
    // --mismatch_report teacher-forces the rollout with BF16 weights: the engine keeps their copy
    o.one_fp8_weight_copy = rollout_fp8 && c.train_precision == Precision::FP8 && o.fp8_scaling == Fp8Scaling::Block &&
                            !(c.mode == "rl" && c.mismatch_report > 0);
    o.fp8_weights = rollout_fp8 || c.train_precision == Precision::FP8;
    return o;
}

// The scorer's flags (training, eval and --score).
inline RewardConfig reward_config_from_args(const Args& a) {
    RewardConfig r;
    r.cmd = a.str("reward_cmd");
    r.url = a.str("reward_url");
    if (a.given("reward_cmd") && r.cmd.find_first_not_of(" \t") == std::string::npos) fail("--reward_cmd: empty command");
    if (!r.cmd.empty() && !r.url.empty()) fail("give at most one of --reward_cmd and --reward_url");
    if (a.given("reward_workers") && r.cmd.empty()) fail("--reward_workers applies to --reward_cmd, which is not given");
    if (a.given("reward_batch") && r.url.empty()) fail("--reward_batch applies to --reward_url, which is not given");
    for (const char* f : {"reward_timeout", "reward_on_timeout"})
        if (a.given(f) && !r.external()) fail("--%s applies to --reward_cmd and --reward_url, neither of which is given", f);
    r.workers = (int)a.integer("reward_workers");
    r.batch = (int)a.integer("reward_batch");
    r.timeout_s = a.number("reward_timeout");
    r.has_timeout_reward = a.given("reward_on_timeout");
    r.timeout_reward = a.number("reward_on_timeout");
    return r;
}

// The environment's flags (--env_cmd and the budgets of its trajectories), after --max_new_tokens.
inline EnvConfig env_config_from_args(const Args& a, int max_new_tokens) {
    EnvConfig e;
    e.cmd = a.str("env_cmd");
    if (a.given("env_cmd") && e.cmd.find_first_not_of(" \t") == std::string::npos) fail("--env_cmd: empty command");
    for (const char* f : {"env_workers", "env_timeout", "max_turns", "max_turn_tokens", "max_total_tokens"})
        if (a.given(f) && e.cmd.empty()) fail("--%s applies to --env_cmd, which is not given", f);
    e.workers = (int)a.integer("env_workers");
    e.timeout_s = a.number("env_timeout");
    e.max_turns = (int)a.integer("max_turns");
    e.max_turn_tokens = a.given("max_turn_tokens") ? (int)a.integer("max_turn_tokens") : max_new_tokens;
    e.max_total_tokens = a.given("max_total_tokens") ? (int)a.integer("max_total_tokens") : max_new_tokens;
    return e;
}

inline TrainConfig train_config_from_args(const Args& a) {
    TrainConfig c;
    c.mode = a.str("mode");
    c.batch_seqs = a.integer("batch_seqs");
    c.max_seq_len = a.integer("max_seq_len");
    c.seq_len = a.integer("seq_len");
    c.doc_mask = a.integer("doc_mask") == 1;
    c.data_mix = a.str("data_mix");
    if (a.given("data_mix") && (c.mode == "rl" || a.given("data")))
        fail("--data_mix: give it in place of --data, with --mode sft or cpt (RL reads one --data)");
    if (c.mode != "rl" && !a.given("data") && !a.given("data_mix") && !a.given("plan_ranks"))  // --plan_ranks reads no data
        fail("--mode %s trains on --data FILE.jsonl (%s); see docs/sft.md", c.mode.c_str(),
             c.mode == "sft" ? "{\"messages\": [...]} or {\"prompt\": ..., \"completion\": ...} rows" : "{\"text\": ...} rows");
    c.task = a.str("task");
    c.data = a.str("data");
    c.eval_data = a.str("eval_data");
    c.eval_prompts = a.integer("eval_prompts");
    c.max_prompt_tokens = a.integer("max_prompt_tokens");
    c.enable_thinking = (int)a.integer("enable_thinking");
    c.reward = reward_config_from_args(a);
    if (is_synthetic_task(c.task)) c.task_size = a.integer("task_size") ? (int)a.integer("task_size") : default_task_size(c.task);
    else if (c.data.empty() && c.data_mix.empty())
        fail("--task %s has no built-in prompts; give --data FILE.jsonl (see dev/ for GSM8K/MATH preparation)", c.task.c_str());
    else if (a.integer("task_size"))
        fail("--task_size applies to the synthetic tasks only, not --task %s", c.task.c_str());

    c.algo = a.str("algo");
    const bool dapo = c.algo == "dapo";
    c.estimator = parse_advantage_estimator(c.algo);
    c.group_size = (int)a.integer("group_size");
    c.batch_prompts = a.integer("batch_prompts");
    c.minibatches = (int)a.integer("minibatches");
    c.epochs = (int)a.integer("epochs");
    c.clip_low = a.number("clip_low");
    c.clip_high = a.given("clip_high") ? a.number("clip_high") : dapo ? 0.28 : 0.24;
    c.dual_clip = a.given("dual_clip") ? a.number("dual_clip") : dapo ? 10.0 : 3.0;
    if (c.dual_clip != 0.0 && c.dual_clip <= 1.0) fail("--dual_clip %g: must be above 1 (or 0 = off)", c.dual_clip);
    c.kl_coef = a.number("kl_coef");
    const std::string kl = a.str("kl_estimator");  // the flag table admits only these
    c.kl_estimator = kl == "k1" ? KlEstimator::K1 : kl == "abs" ? KlEstimator::Abs : kl == "k2" ? KlEstimator::K2 : KlEstimator::K3;
    c.entropy_coef = a.number("entropy_coef");
    c.loss_agg = parse_loss_agg(a.given("loss_agg") ? a.str("loss_agg") : c.algo == "drgrpo" ? "seq-mean-token-sum-norm" : "token-mean");
    const std::string is = a.str("is_correction");
    c.is_correction = is == "off" ? IsCorrection::Off : is == "tis" ? IsCorrection::TokenTis : is == "mis" ? IsCorrection::TokenMis
                    : is == "seq-tis" ? IsCorrection::SeqTis : is == "seq-mis" ? IsCorrection::SeqMis
                    : is == "icepop" ? IsCorrection::IcePop : IsCorrection::GeoMask;
    c.is_cap = a.number("is_cap");
    c.is_floor = a.number("is_floor");
    if (c.is_floor >= c.is_cap) fail("--is_floor %g is not below --is_cap %g: IcePop keeps rho in [floor, cap]", c.is_floor, c.is_cap);
    c.dynamic_sampling = a.given("dynamic_sampling") ? a.integer("dynamic_sampling") == 1 : dapo;
    c.max_gen_batches = (int)a.integer("max_gen_batches");
    c.overlong_buffer = a.integer("overlong_buffer");
    c.overlong_penalty = a.number("overlong_penalty");
    if (c.batch_prompts % c.minibatches != 0)
        fail("--batch_prompts %lld is not a multiple of --minibatches %d", (long long)c.batch_prompts, c.minibatches);

    c.rollout_precision = parse_precision(a.str("rollout_precision"), "--rollout_precision");
    c.train_precision = parse_precision(a.str("train_precision"), "--train_precision");
    c.kv_cache = parse_precision(a.str("kv_cache"), "--kv_cache");
    if (a.integer("train_kv_replay") == 1 && c.kv_cache != Precision::FP8)
        fail("--train_kv_replay 1 replays the FP8 KV cache in training, but --kv_cache is %s; give --kv_cache fp8 or --train_kv_replay 0",
             precision_name(c.kv_cache));
    if (a.integer("train_kv_replay") == 1 && c.train_precision == Precision::FP32)
        fail("--train_kv_replay 1 with --train_precision fp32: an fp32 forward is Calibrated Clipping's shadow pass, never "
             "replayed; train in bf16 or fp8");
    c.fp8_scaling = parse_fp8_scaling(a.str("fp8_scaling"), "--fp8_scaling");
    c.fp8_pow2_scales = a.str("fp8_scales") == "pow2";
    c.calibrated_clip = (int)a.integer("calibrated_clip");
    c.cc_interval = (int)a.integer("cc_interval");

    c.sampling.temperature = (float)a.number("temperature");
    c.sampling.top_p = (float)a.number("top_p");
    c.sampling.top_k = (int)a.integer("top_k");
    c.sampling.max_new_tokens = (int)a.integer("max_new_tokens");
    c.sampling.seed = (uint64_t)a.integer("seed");
    c.env = env_config_from_args(a, c.sampling.max_new_tokens);
    if (c.env.enabled() && c.mode != "rl") fail("--env_cmd gives multi-turn RL rollouts; --mode %s generates nothing", c.mode.c_str());
    if (c.sampling.temperature == 0.0f)
        fail("--temperature 0 (greedy) gives every response of a group the same text, so no advantage; RL needs > 0");
    c.eval_k = (int)a.integer("eval_k");
    for (const std::string& spec : a.all("eval_data")) c.eval_sets.push_back(parse_eval_data_spec(spec, c.task));
    for (size_t i = 0; i < c.eval_sets.size(); i++)
        for (size_t j = 0; j < i; j++)
            if (c.eval_sets[i].name == c.eval_sets[j].name)
                fail("--eval_data: two sets are named %s; name each NAME=PATH", c.eval_sets[i].name.c_str());
    if (c.mode != "rl" && c.eval_sets.size() > 1)
        fail("--mode %s takes one --eval_data (its held-out loss); task sets go in --eval_task_data", c.mode.c_str());
    for (const std::string& spec : a.all("eval_task_data")) c.eval_task_sets.push_back(parse_eval_data_spec(spec, c.task));
    if (c.mode == "rl" && !c.eval_task_sets.empty()) fail("--eval_task_data is the task eval of --mode sft|cpt; an RL run's sets are --eval_data");
    for (size_t i = 0; i < c.eval_task_sets.size(); i++)
        for (size_t j = 0; j < i; j++)
            if (c.eval_task_sets[i].name == c.eval_task_sets[j].name)
                fail("--eval_task_data: two sets are named %s; name each NAME=PATH", c.eval_task_sets[i].name.c_str());
    c.eval.sampling = c.sampling;
    if (a.given("eval_temperature")) c.eval.sampling.temperature = (float)a.number("eval_temperature");
    if (a.given("eval_top_p")) c.eval.sampling.top_p = (float)a.number("eval_top_p");
    if (a.given("eval_max_new_tokens")) c.eval.sampling.max_new_tokens = (int)a.integer("eval_max_new_tokens");
    c.eval.k = c.eval_k;
    c.eval.greedy = a.flag("eval_greedy");
    c.eval.dump = a.flag("dump_eval");
    c.eval_only = a.flag("eval_only");
    if (c.eval.dump && !c.eval_only) fail("--dump_eval 1 writes the generations of an --eval_only 1 run; add --eval_only 1");
    if (!c.eval.greedy && c.eval.k == 0) fail("--eval_greedy 0 with --eval_k 0 leaves the eval nothing to generate");
    if (c.eval_only && c.mode != "rl") fail("--eval_only 1 evaluates an RL task's sets (--mode rl); SFT/CPT runs evaluate their held-out loss");
    if (c.overlong_buffer > c.response_budget())
        fail("--overlong_buffer %lld exceeds the response budget %lld (--max_new_tokens, or --max_total_tokens with --env_cmd)",
             (long long)c.overlong_buffer, (long long)c.response_budget());

    c.adam.beta1 = a.number("beta1");
    c.adam.beta2 = a.number("beta2");
    c.adam.eps = a.number("adam_eps");
    c.adam.weight_decay = a.number("weight_decay");
    c.grad_clip = a.number("grad_clip");
    c.micro_batch_tokens = a.integer("micro_batch_tokens");
    c.steps = a.integer("steps");
    c.lr.lr = a.number("lr");
    if (a.given("warmup_steps") && a.given("warmup_frac")) fail("give one of --warmup_steps and --warmup_frac");
    const int64_t warmup_steps = a.given("warmup_frac") ? std::llround(a.number("warmup_frac") * (double)c.steps) : a.integer("warmup_steps");
    c.lr.warmup = warmup_steps * c.minibatches * c.epochs;  // flags count steps, the schedule updates
    c.lr.total = c.steps * c.minibatches * c.epochs;
    c.lr.cosine = a.str("lr_schedule") == "cosine";
    c.lr.wsd = a.str("lr_schedule") == "wsd";
    c.lr.wsd_cosine = a.str("wsd_decay") == "cosine";
    c.lr.decay = (a.integer("decay_steps") ? a.integer("decay_steps") : std::max<int64_t>(1, c.steps / 10)) * c.minibatches * c.epochs;
    if (c.lr.wsd && c.lr.decay > c.lr.total - c.lr.warmup)
        fail("--decay_steps %lld: longer than the steps after warm-up (%lld); lower it or --warmup_steps",
             (long long)a.integer("decay_steps"), (long long)(c.steps - warmup_steps));
    c.lr.min_ratio = a.number("min_lr_ratio");

    c.seed = (uint64_t)a.integer("seed");
    c.eval_every = a.integer("eval_every");
    c.save_every = a.integer("save_every");
    c.keep_checkpoints = a.integer("keep_checkpoints");
    c.save_format = parse_save_format(a.str("save_format"));
    if (c.save_format != SaveFormat::BF16 && c.fp8_scaling != Fp8Scaling::Block)
        fail("--save_format %s: the block-FP8 format holds 128x128 weight scales; it needs --fp8_scaling block, not %s",
             a.str("save_format").c_str(), fp8_scaling_name(c.fp8_scaling));
    c.out_dir = a.str("out_dir");
    c.tensorboard = a.flag("tensorboard");
    c.dump_rollouts = a.integer("dump_rollouts");
    c.mismatch_report = a.integer("mismatch_report");
    if (c.mismatch_report > 0 && !c.env.cmd.empty())  // a trajectory is several generate() calls, observations between
        fail("--mismatch_report teacher-forces single-turn responses; with --env_cmd a response holds observations between "
             "turns: drop one of the two");
    c.max_bad_steps = (int)a.integer("max_bad_steps");
    return c;
}

}  // namespace fp8rl
