// args.h: the command line. One table of flags drives the parser, the validation of values, the
// --help text (which docs/flags.md reproduces) and the config table printed at start, so the four
// cannot drift apart. The two binaries share the table; where the GPU engine cannot run a CPU
// value (fp32), a flag carries the GPU binary's own default and choices, so train_rl's --help shows
// what train_rl runs and its parser refuses the rest. Flags are long and take one value (`--group_size 8`); switches (`--info`)
// take none. Unknown flags, missing values and out-of-range values are errors naming the flag.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "rl/common.h"

namespace fp8rl {

enum class FlagKind { Switch, Int, Float, String, Choice };

// Which binary parses: train_rl_cpu (the CPU engine) or train_rl / train_rl_emu (the GPU engine).
enum class FlagEngine { Cpu, Gpu };

struct FlagSpec {
    const char* name;       // without the leading "--"
    const char* group;      // heading in --help
    FlagKind kind;
    const char* default_value;  // "" = unset
    const char* choices;    // Choice: "a|b|c"; Int/Float: "min..max" (either side may be empty)
    const char* help;
    const char* gpu_default = nullptr;  // the GPU binary's default and choices, where they differ
    const char* gpu_choices = nullptr;

    const char* default_for(FlagEngine e) const { return e == FlagEngine::Gpu && gpu_default ? gpu_default : default_value; }
    const char* choices_for(FlagEngine e) const { return e == FlagEngine::Gpu && gpu_choices ? gpu_choices : choices; }
};

// The single table of every flag of train_rl_cpu and train_rl.
inline const std::vector<FlagSpec>& flag_table() {
    static const std::vector<FlagSpec> table = {
        // what to do (at most one mode; none = train)
        {"help", "mode", FlagKind::Switch, "", "", "print this table and exit"},
        {"info", "mode", FlagKind::Switch, "", "", "load and validate --model, print architecture, shapes, parameter count and bytes"},
        {"encode", "mode", FlagKind::String, "", "", "JSONL {\"text\":...} -> {\"ids\":[...]} per line with --tokenizer ('-' = stdin)"},
        {"decode", "mode", FlagKind::String, "", "", "JSONL {\"ids\":[...]} -> {\"text\":...} per line with --tokenizer ('-' = stdin)"},
        {"chat", "mode", FlagKind::String, "", "", "JSONL {\"messages\":[...]} (and optional \"tools\": function schemas) -> {\"ids\":[...]} rendered with the model's chat template"},
        {"encode_bin", "mode", FlagKind::String, "", "", "write --data (JSONL) as a token shard OUT.bin with --threads workers: {\"text\"}/{\"ids\"} documents, or with --mode sft SFT rows and their loss mask (docs/sft.md); the tokenizer of --model, or of --init with --tokenizer"},
        {"logprobs", "mode", FlagKind::String, "", "", "JSONL {\"ids\":[...]} -> {\"logprobs\":[...],\"entropy\":[...]} for positions 1..n-1"},
        {"prompt", "mode", FlagKind::String, "", "", "generate a completion of this text and print it"},
        {"prompts", "mode", FlagKind::String, "", "", "JSONL {\"prompt\":...} (or {\"ids\":[...]}) -> one completion per line"},
        {"score", "mode", FlagKind::String, "", "", "JSONL {\"task\":...,\"response\":...,\"answer\":...} -> {\"reward\":...,\"extracted\":...}; with --reward_cmd or --reward_url, scored by that scorer as training would (docs/rewards-and-tasks.md)"},
        {"output", "mode", FlagKind::String, "-", "", "where the JSONL modes write ('-' = stdout)"},
        {"plan_ranks", "mode", FlagKind::Int, "", "1..", "GPU engine only (train_rl_cpu refuses it): print the memory plan of one rank of an N-rank run with the other flags (each phase's peak: rollout and update), from the config.json of --model (or --init) alone, no weights (needs --max_prompt_tokens; --mode sft plans rows of --max_seq_len, --mode cpt windows of --seq_len); exit 0 if the larger phase fits the device (--plan_device; else this GPU's memory, or without one an H200's), else 1 with one line naming what would fit"},
        {"plan_device", "mode", FlagKind::Choice, "", "h100|h200", "--plan_ranks: plan against an H100 80 GB (81559 MiB) or an H200 (143771 MiB), as nvidia-smi reports them (default: this GPU's memory, or an H200's without one)"},
        // model and tokenizer
        {"model", "model", FlagKind::String, "", "", "HF model directory (config.json, *.safetensors, tokenizer.json)"},
        {"tokenizer", "model", FlagKind::String, "", "", "tokenizer.json or a directory holding one (default: --model); with --init, the fresh model's vocabulary: bytes = 256 byte tokens and <|endoftext|> (the default of --mode sft and cpt; rl's is the task's bytes), a path = that tokenizer's ids, its eos_token (else <|endoftext|>) and chat template"},
        {"enable_thinking", "model", FlagKind::Int, "1", "0..1", "Qwen3 chat template: 1 lets the model think, 0 adds the empty think block"},
        {"precision", "model", FlagKind::Choice, "fp32", "fp32|bf16|fp8", "precision of --logprobs, --prompt and --prompts", "bf16", "bf16|fp8"},
        {"init", "model", FlagKind::String, "", "", "train a fresh random model instead of --model: a preset (tiny|small) or a config.json path; its tokenizer: see --tokenizer"},
        // data
        {"task", "data", FlagKind::Choice, "add", "add|reverse|sort|copy|countdown|gsm8k|gsm8k_flexible|math|dapo", "task: its verifier scores responses; the synthetic ones (add, reverse, sort, copy, countdown) also generate prompts"},
        {"task_size", "data", FlagKind::Int, "0", "0..64", "synthetic task size: digits (add), characters (reverse, sort, copy), numbers (countdown); 0 = the task's default"},
        {"data", "data", FlagKind::String, "", "", "JSONL training prompts {\"prompt\":..,\"answer\":..} or {\"messages\":[..],\"answer\":..} (default: generated by --task); sft/cpt: their rows (docs/sft.md), or a token shard .bin of --encode_bin"},
        {"eval_data", "data", FlagKind::String, "", "", "JSONL held-out prompts for eval, repeatable: NAME=PATH[:TASK] is a set logged as val-core/NAME/... and scored by TASK's verifier (default --task), a bare PATH one named --task (default: --eval_prompts generated by --task, disjoint seed)"},
        {"eval_task_data", "data", FlagKind::String, "", "", "--mode sft|cpt: held-out task prompts, repeatable NAME=PATH[:TASK] as --eval_data: the task eval (greedy, mean@n, pass@k, maj@n) at each eval besides val/loss"},
        {"eval_prompts", "data", FlagKind::Int, "128", "1..", "number of held-out prompts evaluated per set (at most the size of its --eval_data)"},
        {"max_prompt_tokens", "data", FlagKind::Int, "0", "0..", "leave out the prompts of --data and --eval_data longer than N tokens (chat template included), with a logged count (verl's filter_overlong_prompts); the memory plan sizes prompts by N; 0 = no limit, the plan measures the longest prompt"},
        // rewards from the user's scorer (docs/rewards-and-tasks.md)
        {"reward_cmd", "reward", FlagKind::String, "", "", "score responses with this program instead of --task's verifier: /bin/sh -c CMD, --reward_workers processes per rank, JSON Lines {\"id\",\"task\",\"prompt\",\"response\",\"answer\",\"data\",\"step\",\"sample\"} in, {\"id\",\"reward\"[,\"correct\",\"extracted\",\"metrics\"]} out"},
        {"reward_workers", "reward", FlagKind::Int, "2", "1..256", "--reward_cmd: worker processes per rank, each holding one request at a time"},
        {"reward_url", "reward", FlagKind::String, "", "", "score responses with an HTTP server in OpenRLHF's remote reward format: POST {\"query\",\"prompts\",\"labels\"} -> {\"rewards\"} (http:// only, no TLS)"},
        {"reward_batch", "reward", FlagKind::Int, "64", "1..", "--reward_url: responses per POST"},
        {"reward_timeout", "reward", FlagKind::Float, "60", "0.001..", "seconds a --reward_cmd request or a --reward_url POST may take; past it the run stops with an error, unless --reward_on_timeout"},
        {"reward_on_timeout", "reward", FlagKind::Float, "", "..", "the reward of a response whose scoring timed out (counted in reward/timeouts) instead of stopping the run"},
        // multi-turn environments (docs/rewards-and-tasks.md)
        {"env_cmd", "environment", FlagKind::String, "", "", "multi-turn rollouts: after each assistant turn send {\"id\",\"turn\",\"messages\",\"truncated\",\"answer\",\"data\"} to this program (/bin/sh -c CMD, --env_workers per rank, JSON Lines) and read {\"id\",\"observation\",\"role\",\"done\"[,\"reward\"]}; the observation's tokens (loss mask 0) are appended and decoding goes on"},
        {"env_workers", "environment", FlagKind::Int, "2", "1..256", "--env_cmd: worker processes per rank, each holding one request at a time"},
        {"env_timeout", "environment", FlagKind::Float, "60", "0.001..", "seconds an --env_cmd request may take; past it the run stops with an error"},
        {"max_turns", "environment", FlagKind::Int, "4", "1..", "--env_cmd: assistant turns of a trajectory at most"},
        {"max_turn_tokens", "environment", FlagKind::Int, "", "1..", "--env_cmd: tokens of one assistant turn at most (default --max_new_tokens)"},
        {"max_total_tokens", "environment", FlagKind::Int, "", "1..", "--env_cmd: response tokens of a trajectory at most, the model's and the observations' (default --max_new_tokens)"},
        // sft and cpt (docs/sft.md)
        {"mode", "sft/cpt", FlagKind::Choice, "rl", "rl|sft|cpt", "what training does: rl (the RL loop), sft (supervised fine-tuning on --data conversations or prompt/completion rows) or cpt (continual pre-training on --data {\"text\"} or {\"ids\"} documents)"},
        {"batch_seqs", "sft/cpt", FlagKind::Int, "32", "1..", "sft/cpt: rows (conversations, or windows of --seq_len) per optimizer step over all ranks (a multiple of the number of ranks)"},
        {"max_seq_len", "sft/cpt", FlagKind::Int, "0", "0..", "sft: leave out the rows longer than N tokens, with a logged count; 0 = the model's max_position_embeddings"},
        {"seq_len", "sft/cpt", FlagKind::Int, "256", "1..", "cpt: tokens each window predicts (a window holds N + 1, the last one also the next window's first)"},
        {"data_mix", "sft/cpt", FlagKind::String, "", "", "sft/cpt, in place of --data: \"a.bin:0.7,b.jsonl:0.3\" blends sources (token shards or JSONL) by weight as Megatron's BlendedDataset does, each in its own seeded order"},
        {"doc_mask", "sft/cpt", FlagKind::Int, "0", "0..1", "cpt: 1 splits each window at its documents' ends, so no attention crosses documents; 0 lets it cross (InfiR2's setting)"},
        // algorithm
        {"algo", "algorithm", FlagKind::Choice, "grpo", "grpo|dapo|drgrpo|rloo", "advantage estimator and its preset (dapo: clip-higher, dynamic sampling, dual clip 10)"},
        {"group_size", "algorithm", FlagKind::Int, "8", "2..", "completions sampled per prompt (G)"},
        {"batch_prompts", "algorithm", FlagKind::Int, "32", "1..", "prompts per step over all ranks (a multiple of the number of ranks)"},
        {"minibatches", "algorithm", FlagKind::Int, "1", "1..", "optimizer updates per epoch over the step's batch"},
        {"epochs", "algorithm", FlagKind::Int, "1", "1..", "passes over the step's batch (PPO epochs)"},
        {"clip_low", "algorithm", FlagKind::Float, "0.2", "0..1", "epsilon_low: ratio lower bound 1 - clip_low"},
        {"clip_high", "algorithm", FlagKind::Float, "", "0..10", "epsilon_high: ratio upper bound 1 + clip_high (default 0.28 for dapo, else 0.24)"},
        {"dual_clip", "algorithm", FlagKind::Float, "", "0..1000", "dual-clip c for negative advantages, 0 = off (default 10 for dapo, else 3)"},
        {"kl_coef", "algorithm", FlagKind::Float, "0", "0..", "KL(policy || reference) loss coefficient; >0 keeps a frozen reference copy"},
        {"kl_estimator", "algorithm", FlagKind::Choice, "k3", "k1|abs|k2|k3", "KL estimator in the loss"},
        {"entropy_coef", "algorithm", FlagKind::Float, "0", "..", "entropy bonus coefficient (loss -= coef * entropy)"},
        {"loss_agg", "algorithm", FlagKind::Choice, "", "token-mean|token-sum|seq-mean-token-sum|seq-mean-token-mean|seq-mean-token-sum-norm", "loss aggregation (default seq-mean-token-sum-norm for drgrpo, else token-mean)"},
        {"is_correction", "algorithm", FlagKind::Choice, "tis", "off|tis|mis|seq-tis|seq-mis|icepop|geo-mask", "rollout/train mismatch weights, rho = exp(old - rollout): token TIS min(rho,C), token MIS rho*1{rho<=C}, the same on the sequence's product (saturates on long responses), icepop rho*1{floor<=rho<=C}, geo-mask: token TIS, sequences whose geometric mean of rho is outside [1/C, C] masked"},
        {"is_cap", "algorithm", FlagKind::Float, "2.0", "1..", "C of TIS/MIS/geo-mask; IcePop's upper bound"},
        {"is_floor", "algorithm", FlagKind::Float, "0.5", "0..", "IcePop's lower bound (below --is_cap)"},
        {"dynamic_sampling", "algorithm", FlagKind::Int, "", "0..1", "drop groups with equal rewards and refill (default 1 for dapo, else 0)"},
        {"max_gen_batches", "algorithm", FlagKind::Int, "10", "1..", "dynamic sampling: generation attempts per step at most"},
        {"overlong_buffer", "algorithm", FlagKind::Int, "0", "0..", "DAPO overlong shaping: soft buffer in tokens before --max_new_tokens (0 = off)"},
        {"overlong_penalty", "algorithm", FlagKind::Float, "1.0", "0..", "DAPO overlong shaping: penalty factor"},
        // precision
        {"rollout_precision", "precision", FlagKind::Choice, "bf16", "fp32|bf16|fp8", "linear layers during generation", "bf16", "bf16|fp8"},
        {"train_precision", "precision", FlagKind::Choice, "bf16", "fp32|bf16|fp8", "linear layers in the trainer's forward and backward", "bf16", "bf16|fp8"},
        {"fp8_scaling", "precision", FlagKind::Choice, "block", "block|row|tensor", "FP8 GEMM scales (rollout and training): block = 1x128 activations and 128x128 weights, row = one per token row and output channel, tensor = one per tensor from its current amax"},
        {"fp8_scales", "precision", FlagKind::Choice, "fp32", "pow2|fp32", "FP8 GEMM scales (rollout and training): fp32 = amax/448 as it is (the default), pow2 = rounded down to a power of two (TransformerEngine's power-of-two block scales, InfiR2's CPT/SFT setting)"},
        {"fp8_gemm_kernel", "precision", FlagKind::Choice, "own", "own|cublaslt", "GPU engine only: the trainer's block-scaled FP8 GEMMs (the projections' forward, dgrad and wgrad, where every dimension is a multiple of 128) on fp8rl's own wgmma kernel or on cuBLASLt (the same bits in emulation); the rollout's always run on cuBLASLt"},
        {"calibrated_clip", "precision", FlagKind::Int, "0", "0..2", "Calibrated Clipping: fit the clip bounds against high-precision shadow passes (fp32 on the CPU engine; BF16 with FP32 accumulation on the GPU); 2 = shadow passes and calib/* metrics only, the bounds stay at the reference"},
        {"cc_interval", "precision", FlagKind::Int, "20", "1..", "Calibrated Clipping: steps between calibrations"},
        // sampling
        {"temperature", "sampling", FlagKind::Float, "1.0", "0..100", "sampling temperature (0 = greedy)"},
        {"top_p", "sampling", FlagKind::Float, "1.0", "0..1", "nucleus sampling mass (1 = off)"},
        {"top_k", "sampling", FlagKind::Int, "0", "0..", "sample among the k most likely tokens (0 = off)"},
        {"max_new_tokens", "sampling", FlagKind::Int, "256", "1..", "generation budget per completion"},
        {"kv_cache", "sampling", FlagKind::Choice, "bf16", "fp32|bf16|fp8", "KV cache storage during generation", "bf16", "bf16|fp8"},
        {"rollout_slots", "sampling", FlagKind::Int, "0", "0..4096", "GPU engine only: sequences decoded together (0 = as many of a generation's requests as the memory plan fits); a finished one frees its slot at once"},
        {"kv_cache_mb", "sampling", FlagKind::Float, "0", "0..", "GPU engine only: MiB of KV cache pages (0 = what the rollout phase leaves of the device, up to every slot at full length); when full, the newest sequence is preempted and redone"},
        {"kv_scales", "sampling", FlagKind::Choice, "layer", "layer|head", "FP8 KV cache: one scale per layer for K and one for V, or one per layer and KV head"},
        {"train_kv_replay", "sampling", FlagKind::Int, "0", "0..1", "1: the old-log-prob and training forwards' attention reads K and V as the rollout read its FP8 KV cache (E4M3 at its scales; prompt rows as the prefill, response rows as decode; straight-through backward; not Calibrated Clipping's shadow passes); needs --kv_cache fp8"},
        {"mismatch_report", "sampling", FlagKind::Int, "0", "0..", "at step 0 and every N steps log mismatch/<source>/{k3_kl,abs_diff}: how much of rollout_corr/k3_kl and logprob_abs_diff the rollout's FP8 weights, its FP8 KV cache and its decode path (against a full-sequence forward) each make, by switching that source alone to BF16 / the prefill path on the step's samples (docs/rl-algorithms.md); costs up to two teacher-forced decode passes and a forward at those steps; 0 = never"},
        {"kv_page_tokens", "sampling", FlagKind::Int, "16", "1..4096", "GPU engine only: tokens per KV cache page"},
        {"cuda_graphs", "sampling", FlagKind::Int, "1", "0..1", "GPU engine only: capture each decode step batch-size bucket as a CUDA graph and replay it; 0 launches the kernels one by one"},
        {"eval_k", "sampling", FlagKind::Int, "4", "0..", "eval: samples per prompt, n of mean@n, pass@k (unbiased, k = 1, 2, 4, ... and n) and maj@n (0 = greedy only)"},
        {"eval_temperature", "sampling", FlagKind::Float, "", "0..", "eval: temperature of the samples (default --temperature)"},
        {"eval_top_p", "sampling", FlagKind::Float, "", "0..1", "eval: nucleus mass of the samples (default --top_p)"},
        {"eval_max_new_tokens", "sampling", FlagKind::Int, "", "1..", "eval: generation budget per completion, greedy and sampled (default --max_new_tokens)"},
        {"eval_greedy", "sampling", FlagKind::Int, "1", "0..1", "eval: also one greedy completion per prompt (acc/greedy)"},
        // optimizer
        {"lr", "optimizer", FlagKind::Float, "1e-6", "0..", "AdamW peak learning rate"},
        {"beta1", "optimizer", FlagKind::Float, "0.9", "0..0.999999", "AdamW beta1"},
        {"beta2", "optimizer", FlagKind::Float, "0.999", "0..0.999999", "AdamW beta2"},
        {"adam_eps", "optimizer", FlagKind::Float, "1e-8", "0..", "AdamW epsilon"},
        {"weight_decay", "optimizer", FlagKind::Float, "0.01", "0..", "AdamW decoupled weight decay"},
        {"grad_clip", "optimizer", FlagKind::Float, "1.0", "0..", "clip the global gradient norm to this (0 = off)"},
        {"warmup_steps", "optimizer", FlagKind::Int, "0", "0..", "linear warm-up steps of the learning rate"},
        {"lr_schedule", "optimizer", FlagKind::Choice, "constant", "constant|cosine|wsd", "learning rate after warm-up: constant, cosine decay to the end, or warmup-stable-decay (constant, then linear decay over the last --decay_steps)"},
        {"min_lr_ratio", "optimizer", FlagKind::Float, "0", "0..1", "cosine and wsd: final learning rate as a fraction of --lr"},
        {"decay_steps", "optimizer", FlagKind::Int, "0", "0..", "wsd: steps of the final linear decay (0 = a tenth of --steps)"},
        {"wsd_decay", "optimizer", FlagKind::Choice, "linear", "linear|cosine", "wsd: the shape of the final decay to --min_lr_ratio: a line, or half a cosine (InfiR2's CPT)"},
        {"warmup_frac", "optimizer", FlagKind::Float, "0", "0..1", "warm-up as a fraction of --steps (rounded to whole steps), in place of --warmup_steps"},
        {"zero", "optimizer", FlagKind::Int, "1", "0..2", "GPU engine only (train_rl; the CPU engine ignores it): 1 shards the FP32 master weights and AdamW moments over the ranks (ZeRO-1), 2 the FP32 gradients too, reduced layer by layer during the backward (ZeRO-2), 0 keeps them whole on every rank"},
        // memory
        {"micro_batch_tokens", "memory", FlagKind::Int, "0", "0..", "run each minibatch's forward and backward in micro-batches of consecutive sequences of at most N tokens (a longer sequence alone), gradients accumulated; 0 = one forward per minibatch"},
        {"offload_train_state", "memory", FlagKind::Int, "0", "0..1", "GPU engine only (train_rl_cpu ignores it): 1 moves the FP32 master weights and AdamW moments to pinned host memory for each rollout (and frees the gradients), so the KV cache gets their device memory; 2 x 12 bytes per parameter (of this rank's shard) over PCIe per step, results unchanged"},
        {"recompute", "memory", FlagKind::Choice, "none", "none|layer", "GPU engine only (train_rl_cpu ignores it): layer keeps each layer's input and recomputes the layer's activations just before its backward"},
        {"seed", "run", FlagKind::Int, "1234", "0..", "seed of every random choice (sampling, data order, init)"},
        {"threads", "run", FlagKind::Int, "0", "0..", "OpenMP threads (0 = OMP_NUM_THREADS or all cores)"},
        {"steps", "run", FlagKind::Int, "100", "0..", "RL steps to train (a resumed run continues up to this step)"},
        {"eval_every", "run", FlagKind::Int, "10", "0..", "evaluate every N steps and at the end (0 = never)"},
        {"save_every", "run", FlagKind::Int, "0", "0..", "write a checkpoint every N steps (0 = only at the end)"},
        {"save_format", "run", FlagKind::Choice, "bf16", "bf16|fp8|both", "checkpoint weights: bf16, fp8 = the trained FP8 weight copy as block-FP8 HF files (F8_E4M3 + 128x128 weight_scale_inv; needs --fp8_scaling block), both = bf16 plus the fp8 export in the checkpoint's fp8/"},
        {"keep_checkpoints", "run", FlagKind::Int, "0", "0..", "keep only the newest N checkpoints (and the one `latest` names); 0 = keep all"},
        {"eval_only", "run", FlagKind::Int, "0", "0..1", "load (--model, --init or --resume), evaluate every set once, print and write OUT_DIR/eval.jsonl; no training, no checkpoint, the checkpoint and trainer state untouched"},
        {"dump_eval", "run", FlagKind::Int, "0", "0..1", "with --eval_only: every eval generation to OUT_DIR/eval_generations.jsonl (set, prompt, response, sample, reward, correct, extracted)"},
        {"tensorboard", "run", FlagKind::Int, "0", "0..1", "also write the metrics as TensorBoard event files (OUT_DIR/events.out.tfevents.*)"},
        {"dump_rollouts", "run", FlagKind::Int, "0", "0..", "every N steps write OUT_DIR/rollouts/step_K.jsonl: each trained sample's prompt, response, reward, advantage and per-token log-probs, entropy, IS weight, ratio and clip side (dev/plot_rollouts.py draws one); 0 = never"},
        {"out_dir", "run", FlagKind::String, "runs/latest", "", "where log.jsonl, checkpoints and the fresh model go"},
        {"resume", "run", FlagKind::String, "", "", "continue bit-exactly from a checkpoint directory, or from a run's --out_dir (its latest checkpoint)"},
        {"collective_timeout", "run", FlagKind::Float, "600", "1..", "seconds one collective (MPI, NCCL) may wait for the other ranks before the job stops with an error naming the rank and the call"},
        {"max_bad_steps", "run", FlagKind::Int, "3", "1..", "stop after this many consecutive steps skipped for NaN/Inf loss or gradients"},
    };
    return table;
}

class Args {
public:
    // Parses argv against the table for one binary's engine; throws Error naming the offending flag.
    static Args parse(int argc, char** argv, FlagEngine engine) {
        Args a;
        for (const FlagSpec& f : flag_table()) a.values_[f.name] = f.default_for(engine);
        for (int i = 1; i < argc; i++) {
            std::string tok = argv[i];
            if (tok.size() < 3 || tok.compare(0, 2, "--") != 0)
                fail("argument '%s': expected a flag like --name value; see --help", tok.c_str());
            std::string name = tok.substr(2);
            const FlagSpec* spec = find(name);
            if (!spec) fail("unknown flag --%s; see --help for the list of flags", name.c_str());
            const bool again = a.given_.count(name) > 0;
            if (again && !repeatable(name)) fail("flag --%s given twice", name.c_str());
            a.given_[name] = true;
            if (spec->kind == FlagKind::Switch) { a.values_[name] = "1"; continue; }
            if (i + 1 >= argc) fail("flag --%s needs a value; see --help", name.c_str());
            std::string value = argv[++i];
            validate(*spec, spec->choices_for(engine), value, engine);
            if (again && value.find('\n') == std::string::npos) a.values_[name] += "\n" + value;
            else if (again) fail("--%s: a value may not hold a newline", name.c_str());
            else a.values_[name] = value;
        }
        return a;
    }

    bool given(const std::string& name) const { return given_.count(check(name)) > 0; }
    const std::string& str(const std::string& name) const { return values_.at(check(name)); }
    int64_t integer(const std::string& name) const { return strtoll(str(name).c_str(), nullptr, 10); }
    double number(const std::string& name) const { return strtod(str(name).c_str(), nullptr); }
    bool flag(const std::string& name) const { return str(name) == "1"; }
    // Every value of a repeatable flag, in order (none when not given).
    std::vector<std::string> all(const std::string& name) const {
        std::vector<std::string> out;
        if (!given(name)) return out;
        const std::string& v = str(name);
        for (size_t pos = 0;;) {
            const size_t nl = v.find('\n', pos);
            out.push_back(v.substr(pos, nl - pos));
            if (nl == std::string::npos) return out;
            pos = nl + 1;
        }
    }
    // Flags that may be given more than once (all() gives each value).
    static bool repeatable(const std::string& name) { return name == "eval_data" || name == "eval_task_data"; }

    static const FlagSpec* find(const std::string& name) {
        for (const FlagSpec& f : flag_table())
            if (name == f.name) return &f;
        return nullptr;
    }

private:
    std::map<std::string, std::string> values_;
    std::map<std::string, bool> given_;

    static const std::string& check(const std::string& name) {
        if (!find(name)) fail("internal: flag --%s is not in the flag table", name.c_str());
        return name;
    }

    static void validate(const FlagSpec& f, const std::string& range, const std::string& v, FlagEngine engine) {
        if (f.kind == FlagKind::Choice) {
            std::string opts = "|" + range + "|";
            if (!v.empty() && opts.find("|" + v + "|") == std::string::npos && engine == FlagEngine::Gpu &&
                ("|" + std::string(f.choices) + "|").find("|" + v + "|") != std::string::npos)
                fail("--%s %s: the GPU engine runs %s (%s is the CPU engine's, train_rl_cpu)", f.name, v.c_str(),
                     range.c_str(), v.c_str());
            if (v.empty() || opts.find("|" + v + "|") == std::string::npos)
                fail("--%s %s: must be one of %s", f.name, v.c_str(), range.c_str());
            return;
        }
        if (f.kind != FlagKind::Int && f.kind != FlagKind::Float) return;
        char* end = nullptr;
        double x;
        if (f.kind == FlagKind::Int) {
            errno = 0;
            long long n = strtoll(v.c_str(), &end, 10);
            if (v.empty() || *end != '\0' || errno == ERANGE) fail("--%s %s: expected an integer", f.name, v.c_str());
            x = (double)n;
        } else {
            x = strtod(v.c_str(), &end);
            if (v.empty() || *end != '\0' || !std::isfinite(x)) fail("--%s %s: expected a finite number", f.name, v.c_str());
        }
        size_t dots = range.find("..");
        if (dots == std::string::npos) return;
        std::string lo = range.substr(0, dots), hi = range.substr(dots + 2);
        if ((!lo.empty() && x < strtod(lo.c_str(), nullptr)) || (!hi.empty() && x > strtod(hi.c_str(), nullptr)))
            fail("--%s %s: out of range [%s, %s]", f.name, v.c_str(), lo.empty() ? "-inf" : lo.c_str(),
                 hi.empty() ? "inf" : hi.c_str());
    }
};

inline const char* flag_kind_name(FlagKind k) {
    switch (k) {
        case FlagKind::Switch: return "switch";
        case FlagKind::Int: return "int";
        case FlagKind::Float: return "float";
        case FlagKind::String: return "string";
        case FlagKind::Choice: return "choice";
    }
    return "?";
}

// The --help text of one binary: a Markdown table, pasted as is into docs/flags.md.
inline std::string help_text(FlagEngine engine) {
    std::string out = "| flag | type | default | values | meaning |\n|---|---|---|---|---|\n";
    std::string group;
    for (const FlagSpec& f : flag_table()) {
        if (group != f.group) {
            group = f.group;
            out += strfmt("| **%s** | | | | |\n", f.group);
        }
        std::string help = f.help;
        std::string escaped;
        for (char c : help) escaped += c == '|' ? std::string("\\|") : std::string(1, c);
        std::string choices;
        for (char c : std::string(f.choices_for(engine))) choices += c == '|' ? std::string("\\|") : std::string(1, c);
        out += strfmt("| `--%s` | %s | %s | %s | %s |\n", f.name, flag_kind_name(f.kind), f.default_for(engine), choices.c_str(),
                      escaped.c_str());
    }
    return out;
}

// The config table printed at start: every flag with its value, marked when given.
inline std::string config_table(const Args& a) {
    std::string out;
    for (const FlagSpec& f : flag_table()) {
        if (f.kind == FlagKind::Switch || std::string(f.group) == "mode") continue;
        std::string value = a.str(f.name);
        std::replace(value.begin(), value.end(), '\n', ' ');  // a repeated flag's values on one line
        out += strfmt("  %-22s %-24s%s\n", f.name, value.c_str(), a.given(f.name) ? "  (given)" : "");
    }
    return out;
}

}  // namespace fp8rl
