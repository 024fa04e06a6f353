// train_rl_cpu.cpp: main() of the CPU reference binary. It reads the flag table (rl/args.h),
// runs the one mode asked for, and turns every fp8rl::Error into one line on stderr and exit 1.
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>

#include <omp.h>

#include <memory>

#include "rl/args.h"
#include "rl/common.h"
#include "rl/driver.h"
#include "cpu/engine_cpu.h"
#include "cpu/model_cli.h"
#include "rl/model_info.h"
#include "rl/score.h"
#include "rl/tokenizer_cli.h"
#include "rl/weights.h"
#include "rl/train_setup.h"

using namespace fp8rl;

// The input of a JSONL mode: a file, or stdin for '-'.
static std::string read_mode_input(const std::string& path) {
    if (path != "-") return read_file(path);
    return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
}

// Writes a JSONL mode's output to --output: stdout for '-', else a temporary file renamed into place.
static void write_mode_output(const std::string& path, const std::string& text) {
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
static int run_tokenizer_mode(const Args& args, const std::string& mode) {
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

// --logprobs, --prompts, --prompt: the CPU model of --model in --precision.
static int run_model_mode(const Args& args, const std::string& mode) {
    if (!args.given("model")) fail("--%s needs --model DIR (a HF model directory)", mode.c_str());
    if (args.integer("threads") > 0) omp_set_num_threads((int)args.integer("threads"));
    ModelWeights weights = ModelWeights::load(args.str("model"));
    CpuModel model(weights);
    ModelParams params;
    params.prepare(model, parse_precision(args.str("precision"), "--precision"));
    if (mode == "logprobs") {
        const std::string& in = args.str(mode);
        write_mode_output(args.str("output"), logprobs_jsonl(model, params, (float)args.number("temperature"),
                                                             read_mode_input(in), in == "-" ? "<stdin>" : in));
        return 0;
    }
    // the tokenizer is optional for --prompts with ids: a model directory without tokenizer.json still runs
    std::string tok_path = args.given("tokenizer") ? args.str("tokenizer") : args.str("model");
    std::unique_ptr<Tokenizer> tok;
    if (args.given("tokenizer") || std::ifstream(tok_path + "/tokenizer.json").good()) tok = Tokenizer::load(tok_path);
    GenerateOptions opts = generate_options_from_args(args, model, tok.get());
    if (mode == "prompt") {
        fputs(generate_text(model, params, tok.get(), opts, args.str("prompt")).c_str(), stdout);
        return 0;
    }
    const std::string& in = args.str(mode);
    write_mode_output(args.str("output"),
                      generate_jsonl(model, params, tok.get(), opts, read_mode_input(in), in == "-" ? "<stdin>" : in));
    return 0;
}

// Training (no mode flag): DESIGN.md §2 on the CPU engine, data parallel over MPI ranks.
static void train_on_ranks(const Args& args, const Dist& dist) {
    if (args.integer("threads") > 0) omp_set_num_threads((int)args.integer("threads"));
    TrainConfig cfg = train_config_from_args(args);
    if (dist.is_root()) {
        make_out_dir(cfg.out_dir);
        printf("train_rl_cpu: %d rank(s) x %d thread(s)\n%s", dist.size(), omp_get_max_threads(), config_table(args).c_str());
    }
    dist.barrier();
    const std::string dir = model_directory(args, cfg, dist);
    CpuEngine engine(dir);
    check_fits_context(cfg, engine.config());
    std::unique_ptr<CpuEngine> reference;  // a frozen copy, only when the KL term needs it
    if (cfg.kl_coef > 0) {
        if (!args.given("resume")) reference = std::make_unique<CpuEngine>(engine);
        else if (args.given("model")) reference = std::make_unique<CpuEngine>(args.str("model"));
        else reference = std::make_unique<CpuEngine>(cfg.out_dir + "/init_model");
    }
    std::unique_ptr<Tokenizer> tok = Tokenizer::load(dir + "/tokenizer.json");
    Trainer trainer(cfg, dist, engine, reference.get(), *tok, dir, training_prompts(cfg), eval_prompts(cfg));
    if (args.given("resume")) trainer.restore(load_trainer_state(dir));
    Logger log(cfg.out_dir, dist.is_root(), trainer.step(), cfg.tensorboard);
    log.print(strfmt("model: %s (%zu parameters); steps %lld..%lld", dir.c_str(), engine.num_floats(),
                     (long long)trainer.step() + 1, (long long)cfg.steps));
    trainer.run(log);
    std::string files = "files:";  // only those this run wrote
    for (const std::string& f : {log.path(), trainer.dashboard_path(), log.tensorboard_path()})
        if (!f.empty() && std::filesystem::exists(f)) files += " " + f;
    log.print(files + (cfg.tensorboard ? "  (tensorboard --logdir " + cfg.out_dir + ")" : ""));
}

// An error on one rank stops every rank (the others would wait in a collective forever).
static int train(const Args& args) {
    Dist dist;
    try {
        train_on_ranks(args, dist);
    } catch (const Error& e) {
        if (dist.size() == 1) throw;
        fprintf(stderr, "error: (rank %d) %s\n", dist.rank(), e.what());
        dist.abort_all(1);
    }
    return 0;
}

static int run(const Args& args) {
    if (args.flag("help")) {
        fputs("usage: train_rl_cpu [--flag value ...]\n\n", stdout);
        fputs(help_text().c_str(), stdout);
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
        write_mode_output(args.str("output"), score_jsonl(read_mode_input(in), in == "-" ? "<stdin>" : in));
        return 0;
    }
    for (const char* mode : {"encode", "decode", "chat"})
        if (args.given(mode)) return run_tokenizer_mode(args, mode);
    for (const char* mode : {"logprobs", "prompts", "prompt"})
        if (args.given(mode)) return run_model_mode(args, mode);
    return train(args);
}

int main(int argc, char** argv) {
    try {
        return run(Args::parse(argc, argv));
    } catch (const Error& e) {
        fprintf(stderr, "error: %s\n", e.what());
        return 1;
    } catch (const std::bad_alloc&) {
        fprintf(stderr, "error: out of memory; the large buffers grow with the model and with --batch_prompts x "
                        "--group_size sequences of prompt + --max_new_tokens tokens: lower one of them\n");
        return 1;
    }
}
