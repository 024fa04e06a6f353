// train_rl_cpu.cpp: main() of the CPU reference binary. It reads the flag table (rl/args.h),
// runs the one mode asked for, and turns every fp8rl::Error into one line on stderr and exit 1.
#include <cstdio>
#include <exception>
#include <iostream>
#include <iterator>

#include "rl/args.h"
#include "rl/common.h"
#include "rl/model_info.h"
#include "rl/score.h"
#include "rl/tokenizer_cli.h"
#include "rl/weights.h"

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
    fail("no mode selected and training is not built yet; see --help");
}

int main(int argc, char** argv) {
    try {
        return run(Args::parse(argc, argv));
    } catch (const Error& e) {
        fprintf(stderr, "error: %s\n", e.what());
        return 1;
    } catch (const std::bad_alloc&) {
        fprintf(stderr, "error: out of memory; use a smaller model or batch\n");
        return 1;
    }
}
