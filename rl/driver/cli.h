// cli.h: the command line of both binaries, train_rl_cpu (the CPU engine) and train_rl (the GPU
// engine): one flag table (rl/driver/args.h), the modes (--info, --score, the tokenizer modes, --logprobs,
// the generation modes) and training, for any Engine. Each binary's main() is one call of
// cli_main with its engine; every fp8rl::Error becomes one line on stderr and exit 1.
#pragma once
#include <omp.h>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <memory>

#include "rl/driver/args.h"
#include "rl/common.h"
#include "rl/driver/driver.h"
#include "rl/driver/lm_encode.h"
#include "rl/driver/lm_trainer.h"
#include "rl/driver/memory_fit.h"
#include "rl/io/jsonl.h"
#include "rl/model/model_info.h"
#include "rl/tasks/score.h"
#include "rl/text/tokenizer_cli.h"
#include "rl/driver/train_setup.h"
#include "rl/model/weights.h"

namespace fp8rl {

// The input of a JSONL mode: a file, or stdin for '-'.
inline std::string read_mode_input(const std::string& path) {
    if (path != "-") return read_file(path);
    return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
}

// Writes a JSONL mode's output to --output: stdout for '-', else a temporary file renamed into place.
inline void write_mode_output(const std::string& path, const std::string& text) {
    if (path == "-") {
        fwrite(text.data(), 1, text.size(), stdout);
        return;
    }
    std::string tmp = path + ".tmp";
    FILE* f = fopen(tmp.c_str(), "wb");
    if (!f) fail("--output %s: cannot create %s; check the directory exists and is writable", path.c_str(), tmp.c_str());
    bool ok = fwrite(text.data(), 1, text.size(), f) == text.size();
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp.c_str(), path.c_str()) != 0) {
        remove(tmp.c_str());
        fail("--output %s: write failed (disk full or not writable?)", path.c_str());
    }
}

// --encode, --decode, --chat: JSON Lines through the tokenizer (and chat template) of
// --tokenizer, or of --model when --tokenizer is not given.
inline int run_tokenizer_mode(const Args& args, const std::string& mode) {
    std::string path = args.given("tokenizer") ? args.str("tokenizer") : args.str("model");
    if (path.empty()) fail("--%s needs --tokenizer PATH (a tokenizer.json or a model directory) or --model", mode.c_str());
    std::unique_ptr<Tokenizer> tok = Tokenizer::load(path);
    const std::string& in = args.str(mode);
    std::string text = read_mode_input(in), source = in == "-" ? "<stdin>" : in;
    std::string out;
    if (mode == "encode") out = encode_jsonl(*tok, text, source);
    else if (mode == "decode") out = decode_jsonl(*tok, text, source);
    else {
        ChatOptions opt;
        opt.enable_thinking = (int)args.integer("enable_thinking");
        out = chat_jsonl(*tok, ChatTemplate::load(path), opt, text, source);
    }
    write_mode_output(args.str("output"), out);
    return 0;
}

// Token ids of a JSON array, each checked against the vocabulary.
inline std::vector<int32_t> model_ids_from_json(const Json& ids, int vocab, const std::string& where) {
    if (!ids.is_array() || ids.items.empty()) fail("%s: \"ids\" must be a non-empty list of token ids", where.c_str());
    std::vector<int32_t> out;
    for (const Json& id : ids.items) {
        if (!id.is_int() || id.integer < 0 || id.integer >= vocab)
            fail("%s: token ids must be integers in the vocabulary [0, %d)", where.c_str(), vocab);
        out.push_back((int32_t)id.integer);
    }
    return out;
}

inline std::string float_list_json(const float* x, size_t n) {
    std::string out = "[";
    for (size_t i = 0; i < n; i++) out += (i ? "," : "") + strfmt("%.9g", x[i]);
    return out + "]";
}

// --logprobs: per line {"ids": [...]}, the log-probs and entropies of positions 1..n-1 on `engine`.
inline std::string logprobs_jsonl(Engine& engine, int vocab, Precision p, float temperature, const std::string& text,
                                  const std::string& source) {
    if (!(temperature > 0.0f)) fail("--temperature %g: --logprobs needs a temperature > 0", temperature);
    return map_jsonl(text, source, [&](const Json& row, const std::string& where) {
        const Json* ids = row.find("ids");
        if (!ids) fail("%s: expected {\"ids\": [...]}", where.c_str());
        const std::vector<Sequence> seqs = {{model_ids_from_json(*ids, vocab, where), 1}};
        TokenValues lp, ent;
        engine.logprobs(seqs, p, temperature, &lp, &ent);
        return "{\"logprobs\":" + float_list_json(lp[0].data(), lp[0].size()) + ",\"entropy\":" +
               float_list_json(ent[0].data(), ent[0].size()) + "}";
    });
}

// --prompt TEXT, --prompts FILE: generation on `engine` (Engine::generate, the rollout's own path) in
// --precision with --kv_cache, --temperature (0 = greedy), --top_k, --top_p, --max_new_tokens and
// --seed, stopping on the eos ids of config.json / generation_config.json. Prompt i is sampled with
// the key (seed, step 0, sequence i, position), so both engines draw the same tokens for the same
// logits. Every prompt is one request of one generate() call.
//   --prompts: per line {"prompt": "..."} or {"ids": [...]} -> {"ids": [...], "text": "...",
//              "logprobs": [...], "finish": "eos" | "length"} (text when there is a tokenizer;
//              logprobs under the distribution each token was drawn from: 0 for greedy).
//   --prompt:  the completion of TEXT, as text.
inline std::vector<int32_t> encode_prompt(const Tokenizer* tok, const std::string& text, int vocab, const std::string& where) {
    if (!tok) fail("%s: a text prompt needs a tokenizer (tokenizer.json in --model, or --tokenizer)", where.c_str());
    std::vector<int32_t> ids;
    for (int id : tok->encode(text)) ids.push_back(id);
    if (ids.empty()) fail("%s: the prompt encodes to no tokens", where.c_str());
    for (int32_t id : ids)
        if (id >= vocab) fail("%s: the tokenizer gives id %d, outside the model's vocabulary [0, %d)", where.c_str(), id, vocab);
    return ids;
}

inline std::vector<Generation> generate_prompts(Engine& engine, const Args& args, int vocab, const Tokenizer* tok,
                                                const std::vector<std::vector<int32_t>>& prompts) {
    SamplingConfig s;
    s.temperature = (float)args.number("temperature");
    s.top_k = (int)args.integer("top_k");
    s.top_p = (float)args.number("top_p");
    s.max_new_tokens = (int)args.integer("max_new_tokens");
    s.seed = (uint64_t)args.integer("seed");
    if (tok && tok->vocab_size() < vocab) s.vocab_limit = tok->vocab_size();  // only ids the tokenizer knows
    std::vector<GenRequest> requests;
    for (size_t i = 0; i < prompts.size(); i++) requests.push_back({prompts[i], (uint32_t)i});
    return engine.generate(requests, 0, s, parse_precision(args.str("precision"), "--precision"),
                           parse_precision(args.str("kv_cache"), "--kv_cache"), nullptr);
}

inline std::string generations_jsonl(const std::vector<Generation>& out, const Tokenizer* tok) {
    std::string lines;
    for (const Generation& g : out) {
        std::string line = "{\"ids\":[";
        for (size_t i = 0; i < g.tokens.size(); i++) line += (i ? "," : "") + std::to_string(g.tokens[i]);
        line += "]";
        if (tok) line += ",\"text\":" + json_quote(tok->decode(std::vector<int>(g.tokens.begin(), g.tokens.end())));
        line += ",\"logprobs\":" + float_list_json(g.logprobs_sampled.data(), g.logprobs_sampled.size());
        line += std::string(",\"finish\":\"") + (g.finished ? "eos" : "length") + "\"}\n";
        lines += line;
    }
    return lines;
}

template <class EngineT>
int run_generation_mode(const Args& args, const std::string& mode) {
    if (!args.given("model")) fail("--%s needs --model DIR (a HF model directory)", mode.c_str());
    if (args.integer("threads") > 0) omp_set_num_threads((int)args.integer("threads"));
    // the tokenizer is optional for --prompts with ids: a model directory without tokenizer.json still runs
    const std::string tok_path = args.given("tokenizer") ? args.str("tokenizer") : args.str("model");
    std::unique_ptr<Tokenizer> tok;
    if (args.given("tokenizer") || std::ifstream(tok_path + "/tokenizer.json").good()) tok = Tokenizer::load(tok_path);
    std::vector<std::vector<int32_t>> prompts;
    std::string source;
    const int vocab = (int)load_model_config(args.str("model")).vocab_size;
    if (mode == "prompt") {
        prompts.push_back(encode_prompt(tok.get(), args.str("prompt"), vocab, "--prompt"));
    } else {
        const std::string& in = args.str(mode);
        source = in == "-" ? "<stdin>" : in;
        map_jsonl(read_mode_input(in), source, [&](const Json& row, const std::string& where) {
            const Json* ids = row.find("ids");
            const Json* prompt = row.find("prompt");
            if (ids) prompts.push_back(model_ids_from_json(*ids, vocab, where));
            else if (prompt && prompt->is_string()) prompts.push_back(encode_prompt(tok.get(), prompt->str, vocab, where));
            else fail("%s: expected {\"prompt\": \"...\"} or {\"ids\": [...]}", where.c_str());
            return std::string();
        });
        if (prompts.empty()) fail("%s: no prompts", source.c_str());
    }
    EngineT engine(args.str("model"), engine_options_from_args(args));
    const std::vector<Generation> out = generate_prompts(engine, args, vocab, tok.get(), prompts);
    if (mode == "prompt") {
        const std::vector<int32_t>& t = out[0].tokens;
        fputs((tok->decode(std::vector<int>(t.begin(), t.end())) + "\n").c_str(), stdout);
    } else {
        write_mode_output(args.str("output"), generations_jsonl(out, tok.get()));
    }
    return 0;
}

// A training run's last line: the files it wrote (its log, dashboard and TensorBoard events; only those that exist).
inline std::string files_line(const TrainConfig& cfg, const Logger& log, const std::string& dashboard) {
    std::string files = "files:";
    for (const std::string& f : {log.path(), dashboard, log.tensorboard_path()})
        if (!f.empty() && std::filesystem::exists(f)) files += " " + f;
    return files + (cfg.tensorboard ? "  (tensorboard --logdir " + cfg.out_dir + ")" : "");
}

// Training (no mode flag): DESIGN.md §2 on EngineT, data parallel over MPI ranks.
template <class EngineT>
void train_on_ranks(const Args& args, const Dist& dist, const char* binary) {
    if (args.integer("threads") > 0) omp_set_num_threads((int)args.integer("threads"));
    TrainConfig cfg = train_config_from_args(args);
    if (dist.is_root()) {
        make_out_dir(cfg.out_dir);
        if (cfg.dump_rollouts > 0) prepare_rollout_dump_dir(cfg.out_dir);
        printf("%s: %d rank(s) x %d thread(s)\n%s", binary, dist.size(), omp_get_max_threads(), config_table(args).c_str());
    }
    dist.barrier();
    const std::string dir = model_directory(args, cfg, dist);
    EngineOptions options = training_engine_options(args, cfg);
    // The FP8 KV cache's scales from every rank's prompts, not this rank's: N ranks generate what one does.
    options.kv_amax_reduce = [&dist](std::vector<float>& amax) { dist.all_reduce_max(amax); };
    std::unique_ptr<Tokenizer> tok = Tokenizer::load(dir + "/tokenizer.json");
    const PromptBudget budget{prompt_length_counter(*tok, dir, cfg.enable_thinking), dist.is_root()};
    PromptSource prompts = training_prompts(cfg, budget);
    std::vector<EvalSet> eval = eval_sets(cfg, budget);
    // An engine on a device refuses here, before allocating, a run whose memory plan does not fit.
    RunShape shape{cfg, options, dist.size(), planned_prompt_tokens(cfg, budget.length, prompts)};
    const std::string plan = EngineT::device_memory_plan(load_model_config(dir), shape);
    options.rollout_slots = shape.options.rollout_slots;  // --rollout_slots 0: what the plan fits
    if (dist.is_root()) printf("%s", plan.c_str());
    EngineT engine(dir, options);
    check_fits_context(cfg, engine.config());
    std::unique_ptr<EngineT> reference;  // a frozen copy, only when the KL term needs it
    if (cfg.kl_coef > 0) {
        if (!args.given("resume")) reference = std::make_unique<EngineT>(engine);
        else if (args.given("model")) reference = std::make_unique<EngineT>(args.str("model"), without_kv_replay(options));
        else reference = std::make_unique<EngineT>(cfg.out_dir + "/init_model", without_kv_replay(options));
    }
    Trainer trainer(cfg, dist, engine, reference.get(), *tok, dir, std::move(prompts), std::move(eval));
    if (args.given("resume")) trainer.restore(load_trainer_state(dir));
    if (cfg.eval_only) return trainer.evaluate_only(dir);  // before the logger: the run's files stay as they are
    Logger log(cfg.out_dir, dist.is_root(), trainer.step(), cfg.tensorboard);
    const std::string changed = args.given("resume") ? recipe_changes(dir, cfg) : "";
    if (!changed.empty()) log.print(changed);
    if (dist.is_root()) write_file_atomic(cfg.out_dir + "/" + kRecipeFile, recipe_json(cfg));  // beside log.jsonl
    log.print(strfmt("model: %s (%zu parameters); steps %lld..%lld", dir.c_str(), engine.num_floats(),
                     (long long)trainer.step() + 1, (long long)cfg.steps));
    trainer.run(log);
    log.print(files_line(cfg, log, trainer.dashboard_path()));
}

// The memory plan of an SFT/CPT run is that of an RL run whose forwards are its own: --batch_seqs rows
// of one "completion" each, planned at the longest row's tokens less one (the "prompt") plus one new token.
inline TrainConfig lm_planned_config(const TrainConfig& cfg) {
    TrainConfig planned = cfg;
    planned.batch_prompts = cfg.batch_seqs;
    planned.group_size = 1;
    planned.minibatches = 1;
    planned.eval_prompts = 1;
    planned.eval_k = 0;
    planned.sampling.max_new_tokens = 1;
    planned.eval.sampling.max_new_tokens = 1;  // memory_demand_of plans the eval's budget where it evaluates
    if (!cfg.eval_task_sets.empty()) {  // the task eval's generations (rl/driver/eval.h)
        planned.eval_prompts = cfg.eval_prompts;
        planned.eval_k = cfg.eval.k;
        planned.eval_every = 1;
        planned.sampling.max_new_tokens = planned.eval.sampling.max_new_tokens = cfg.eval.sampling.max_new_tokens;
    }
    return planned;
}

// --mode sft|cpt: rl/driver/lm_trainer.h on EngineT, data parallel over MPI ranks.
template <class EngineT>
void train_lm_on_ranks(const Args& args, const Dist& dist, const char* binary) {
    if (args.integer("threads") > 0) omp_set_num_threads((int)args.integer("threads"));
    TrainConfig cfg = train_config_from_args(args);
    PromptSource::rank_positions(cfg.batch_seqs, 1, 0, dist.size());  // refuses a batch the ranks cannot split
    if (dist.is_root()) {
        make_out_dir(cfg.out_dir);
        printf("%s: --mode %s, %d rank(s) x %d thread(s)\n%s", binary, cfg.mode.c_str(), dist.size(), omp_get_max_threads(),
               config_table(args).c_str());
    }
    dist.barrier();
    const std::string dir = model_directory(args, cfg, dist);
    const ModelConfig mc = load_model_config(dir);
    const int64_t positions = mc.max_position_embeddings;
    std::unique_ptr<Tokenizer> tok = Tokenizer::load(dir + "/tokenizer.json");
    LmSourceSpec spec;
    spec.mode = cfg.mode;
    spec.tok = tok.get();
    spec.vocab = (int)mc.vocab_size;
    spec.tokenizer_hash = tokenizer_hash(dir);
    spec.seq_len = cfg.seq_len;
    spec.doc_mask = cfg.doc_mask;
    spec.log = dist.is_root();
    std::unique_ptr<SftEncoder> enc;
    if (cfg.mode == "sft") {
        if (positions > 0 && cfg.max_seq_len > positions)
            fail("--max_seq_len %lld: the model has %lld positions (max_position_embeddings); use --max_seq_len %lld or less",
                 (long long)cfg.max_seq_len, (long long)positions, (long long)positions);
        spec.max_seq_len = cfg.max_seq_len > 0 ? cfg.max_seq_len : positions;
        enc = std::make_unique<SftEncoder>(*tok, dir, cfg.enable_thinking, end_of_turn_id(mc));
        spec.sft = enc.get();
    } else {
        if (positions > 0 && cfg.seq_len + 1 > positions)
            fail("--seq_len %lld: a window holds %lld tokens, more than the model's %lld positions (max_position_embeddings); "
                 "use --seq_len %lld or less",
                 (long long)cfg.seq_len, (long long)cfg.seq_len + 1, (long long)positions, (long long)positions - 1);
        spec.end_of_text = end_of_text_id(*tok, mc);
    }
    std::unique_ptr<LmStream> train = open_lm_stream(cfg.data, cfg.data_mix, spec, cfg.seed);
    std::unique_ptr<LmRows> eval = cfg.eval_data.empty() ? nullptr : open_lm_rows(cfg.eval_data, spec);
    EngineOptions options = training_engine_options(args, cfg);
    // (a CPT window split at documents is no longer in all; a shard's windows are planned at seq_len + 1)
    const int64_t longest = std::max(train->longest(), eval ? eval->longest() : 0);
    RunShape shape{lm_planned_config(cfg), options, dist.size(), std::max<int64_t>(1, longest - 1)};
    const std::string plan = EngineT::device_memory_plan(mc, shape);
    if (dist.is_root()) printf("%s", plan.c_str());
    EngineT engine(dir, options);
    LmTrainer trainer(cfg, dist, engine, std::move(train), std::move(eval));
    if (!cfg.eval_task_sets.empty()) {  // --eval_task_data: the RL eval's sets, under their own flag
        TrainConfig sets = cfg;
        sets.eval_sets = cfg.eval_task_sets;
        trainer.set_task_eval(eval_sets(sets), *tok, dir);
    }
    if (args.given("resume")) trainer.restore(load_trainer_state(dir));
    Logger log(cfg.out_dir, dist.is_root(), trainer.step(), cfg.tensorboard);
    const std::string changed = args.given("resume") ? recipe_changes(dir, cfg) : "";
    if (!changed.empty()) log.print(changed);
    if (dist.is_root()) write_file_atomic(cfg.out_dir + "/" + kRecipeFile, recipe_json(cfg));
    log.print(strfmt("model: %s (%zu parameters); %s steps %lld..%lld", dir.c_str(), engine.num_floats(), cfg.mode.c_str(),
                     (long long)trainer.step() + 1, (long long)cfg.steps));
    trainer.run(log);
    log.print(files_line(cfg, log, trainer.dashboard_path()));
}

// --plan_ranks N: the memory plan of one rank of an N-rank training run with the other flags, from the
// config.json of --model (or of the fresh model of --init) alone: no weights, tokenizer, data or
// device; prompts are planned at --max_prompt_tokens. Printed, then exit 0 when it fits an H200, else
// the refusal a training start would give (naming what would fit) and exit 1.
template <class EngineT>
int run_plan_mode(const Args& args) {
    if constexpr (!EngineT::plans_device_memory) {
        fail("--plan_ranks plans the GPU engine's device memory: run it with train_rl (or train_rl_emu, without a GPU); "
             "train_rl_cpu holds its model in host memory");
    } else {
        const TrainConfig given = train_config_from_args(args);
        // sft/cpt: the plan of the RL run with their forwards (lm_planned_config), rows of --max_seq_len or --seq_len + 1
        const bool lm = given.mode != "rl";
        if (lm && given.mode == "sft" && given.max_seq_len <= 0)
            fail("--plan_ranks with --mode sft reads no data: give --max_seq_len N, the longest conversation to plan for");
        if (!lm && given.max_prompt_tokens <= 0)
            fail("--plan_ranks reads no data: give --max_prompt_tokens N, the longest prompt to plan for (training leaves "
                 "longer ones out)");
        const TrainConfig cfg = lm ? lm_planned_config(given) : given;
        const int64_t prompt_tokens = !lm ? cfg.max_prompt_tokens : given.mode == "sft" ? std::max<int64_t>(1, cfg.max_seq_len - 1) : cfg.seq_len;
        const int ranks = (int)args.integer("plan_ranks");
        PromptSource::rank_positions(cfg.batch_prompts, cfg.minibatches, 0, ranks);  // refuses a batch the ranks cannot split
        const ModelConfig c = planned_model_config(args, cfg);
        if (!lm) check_fits_context(cfg, c);
        const RunShape shape{cfg, training_engine_options(args, cfg), ranks, prompt_tokens};
        // the device named, else this process's GPU, else an H200
        const std::string named = args.str("plan_device");
        const size_t own = named.empty() ? EngineT::own_device_bytes() : 0;
        const size_t device = named == "h100" ? kH100Bytes : named == "h200" || own == 0 ? kH200Bytes : own;
        const std::string what = named == "h100" ? "an H100" : named == "h200" || own == 0 ? "an H200" : "this GPU";
        const PlannedMemory m = EngineT::offline_memory_plan(c, shape, device);
        printf("--plan_ranks %d: one rank of %d, on %s (%s)\n%s", ranks, ranks, what.c_str(), bytes_text(device).c_str(),
               m.text.c_str());
        if (!m.refusal.empty()) fail("%s", m.refusal.c_str());
        // m.total: the update phase's peak or the rollout's least (one longest sequence), whichever is larger; the
        // rollout's KV pool then takes what the device leaves
        printf("fits: needs %s of %s (update phase peak %s; rollout phase peak %s with the KV pool it takes from what is "
               "left)\n", bytes_text(m.total).c_str(), bytes_text(device).c_str(), bytes_text(m.update_peak).c_str(),
               bytes_text(m.rollout_peak).c_str());
        return 0;
    }
}

// An error on one rank stops every rank (the others would wait in a collective forever).
template <class EngineT>
int train(const Args& args, const char* binary) {
    Dist dist;
    dist.set_timeout(args.number("collective_timeout"));
    try {
        if (args.str("mode") == "rl") train_on_ranks<EngineT>(args, dist, binary);
        else train_lm_on_ranks<EngineT>(args, dist, binary);
    } catch (const Error& e) {
        if (dist.size() == 1) throw;
        fprintf(stderr, "error: (rank %d) %s\n", dist.rank(), e.what());
        dist.abort_all(1);
    }
    return 0;
}

template <class EngineT>
int run_cli(const Args& args, const char* binary, FlagEngine flags) {
    if (args.flag("help")) {
        fprintf(stdout, "usage: %s [--flag value ...]\n\n", binary);
        fputs(help_text(flags).c_str(), stdout);
        return 0;
    }
    if (args.flag("info")) {
        if (!args.given("model")) fail("--info needs --model DIR");
        ModelWeights w = ModelWeights::load(args.str("model"), /*read_values=*/false);
        fputs(model_info(w, args.str("model")).c_str(), stdout);
        return 0;
    }
    if (args.given("score")) {
        const std::string& in = args.str("score");
        const std::string text = read_mode_input(in), source = in == "-" ? "<stdin>" : in;
        const RewardConfig reward = reward_config_from_args(args);
        if (!reward.external()) {
            write_mode_output(args.str("output"), score_jsonl(text, source));
            return 0;
        }
        std::unique_ptr<Scorer> scorer = make_scorer(reward);
        write_mode_output(args.str("output"), score_jsonl_external(text, source, *scorer, args.str("task")));
        return 0;
    }
    if (args.given("encode_bin")) return run_encode_bin(args);
    for (const char* mode : {"encode", "decode", "chat"})
        if (args.given(mode)) return run_tokenizer_mode(args, mode);
    if (args.given("logprobs")) {
        if (!args.given("model")) fail("--logprobs needs --model DIR (a HF model directory)");
        if (args.integer("threads") > 0) omp_set_num_threads((int)args.integer("threads"));
        EngineT engine(args.str("model"), engine_options_from_args(args));
        const std::string& in = args.str("logprobs");
        write_mode_output(args.str("output"),
                          logprobs_jsonl(engine, (int)engine.config().vocab_size, parse_precision(args.str("precision"), "--precision"),
                                         (float)args.number("temperature"), read_mode_input(in), in == "-" ? "<stdin>" : in));
        return 0;
    }
    for (const char* mode : {"prompts", "prompt"})
        if (args.given(mode)) return run_generation_mode<EngineT>(args, mode);
    if (args.given("plan_ranks")) return run_plan_mode<EngineT>(args);
    return train<EngineT>(args, binary);
}

// main() of a binary: its engine, its name (in --help and the config table) and which defaults and
// choices its flags have (rl/driver/args.h).
template <class EngineT>
int cli_main(int argc, char** argv, const char* binary, FlagEngine flags) {
    try {
        return run_cli<EngineT>(Args::parse(argc, argv, flags), binary, flags);
    } catch (const Error& e) {
        fprintf(stderr, "error: %s\n", e.what());
        return 1;
    } catch (const std::bad_alloc&) {
        fprintf(stderr, "error: out of memory; the large buffers grow with the model and with --batch_prompts x "
                        "--group_size sequences of prompt + --max_new_tokens tokens: lower one of them\n");
        return 1;
    }
}

}  // namespace fp8rl
