// model_cli.h: the generation modes of the binaries on the CPU model (--logprobs, for any engine, is
// in rl/cli.h).
//   --prompts FILE:  {"prompt": "..."} or {"ids": [...]} -> {"ids": [...], "text": "...",
//                    "logprobs": [...], "finish": "eos" | "length"}, all prompts decoded as one batch.
//   --prompt TEXT:   the completion of TEXT, as text.
// Generation uses --temperature (0 = greedy), --top_k, --top_p, --max_new_tokens, --seed, --kv_cache
// and stops on the eos ids of config.json / generation_config.json. An FP8 KV cache takes its
// per-layer scales from a forward pass over the prompts (spec-fp8.md §9.4). One output line per
// input line, in order; a bad line is an error naming file:line.
#pragma once
#include <omp.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "cpu/generate.h"
#include "rl/args.h"
#include "rl/cli.h"
#include "rl/json.h"
#include "rl/jsonl.h"
#include "cpu/model.h"
#include "rl/tokenizer.h"

namespace fp8rl {

// Sampling, stopping and cache options from the flags. tok (may be null) limits the sampled ids
// to those the tokenizer knows (spec-model.md §2.2).
inline GenerateOptions generate_options_from_args(const Args& a, const CpuModel& m, const Tokenizer* tok) {
    GenerateOptions o;
    o.sampling.temperature = (float)a.number("temperature");
    o.sampling.top_k = (int)a.integer("top_k");
    o.sampling.top_p = (float)a.number("top_p");
    o.max_new_tokens = (int)a.integer("max_new_tokens");
    o.seed = (uint64_t)a.integer("seed");
    o.kv_cache = parse_precision(a.str("kv_cache"), "--kv_cache");
    o.eos_ids = m.weights->config.eos_token_ids;
    if (tok && tok->vocab_size() < m.V) o.vocab_limit = tok->vocab_size();
    return o;
}

// FP8 cache scales from a forward pass of the prompts.
inline void calibrate_kv_scales(const CpuModel& m, const ModelParams& p, const std::vector<std::vector<int32_t>>& prompts,
                                GenerateOptions& o) {
    TokenBatch batch;
    for (const auto& pr : prompts) batch.add(pr);
    ForwardActs acts;
    std::vector<float> lp(batch.num_tokens()), ent(batch.num_tokens());
    model_forward(m, p, batch, 1.0f, acts, lp.data(), ent.data(), false);
    kv_scales_from_forward(acts, o.kv_k_scale, o.kv_v_scale);
}

inline std::vector<Completion> generate_completions(const CpuModel& m, const ModelParams& p,
                                                    const std::vector<std::vector<int32_t>>& prompts, GenerateOptions o) {
    if (o.kv_cache == Precision::FP8) calibrate_kv_scales(m, p, prompts, o);
    Generator gen;
    return gen.generate(m, p, prompts, o);
}

inline std::vector<int32_t> encode_prompt(const Tokenizer* tok, const std::string& text, int vocab, const std::string& where) {
    if (!tok) fail("%s: a text prompt needs a tokenizer (tokenizer.json in --model, or --tokenizer)", where.c_str());
    std::vector<int32_t> ids;
    for (int id : tok->encode(text)) ids.push_back(id);
    if (ids.empty()) fail("%s: the prompt encodes to no tokens", where.c_str());
    for (int32_t id : ids)
        if (id >= vocab) fail("%s: the tokenizer gives id %d, outside the model's vocabulary [0, %d)", where.c_str(), id, vocab);
    return ids;
}

inline std::string generate_jsonl(const CpuModel& m, const ModelParams& p, const Tokenizer* tok, const GenerateOptions& o,
                                  const std::string& text, const std::string& source) {
    std::vector<std::vector<int32_t>> prompts;
    map_jsonl(text, source, [&](const Json& row, const std::string& where) {
        const Json* ids = row.find("ids");
        const Json* prompt = row.find("prompt");
        if (ids) prompts.push_back(model_ids_from_json(*ids, m.V, where));
        else if (prompt && prompt->is_string()) prompts.push_back(encode_prompt(tok, prompt->str, m.V, where));
        else fail("%s: expected {\"prompt\": \"...\"} or {\"ids\": [...]}", where.c_str());
        return std::string();
    });
    if (prompts.empty()) fail("%s: no prompts", source.c_str());
    std::vector<Completion> out = generate_completions(m, p, prompts, o);
    std::string lines;
    for (const Completion& c : out) {
        std::string line = "{\"ids\":[";
        for (size_t i = 0; i < c.tokens.size(); i++) line += (i ? "," : "") + std::to_string(c.tokens[i]);
        line += "]";
        if (tok) line += ",\"text\":" + json_quote(tok->decode(std::vector<int>(c.tokens.begin(), c.tokens.end())));
        line += ",\"logprobs\":" + float_list_json(c.logprobs.data(), c.logprobs.size());
        line += std::string(",\"finish\":\"") + (c.stopped_on_eos ? "eos" : "length") + "\"}\n";
        lines += line;
    }
    return lines;
}

inline std::string generate_text(const CpuModel& m, const ModelParams& p, const Tokenizer* tok, const GenerateOptions& o,
                                 const std::string& prompt) {
    std::vector<Completion> out = generate_completions(m, p, {encode_prompt(tok, prompt, m.V, "--prompt")}, o);
    return tok->decode(std::vector<int>(out[0].tokens.begin(), out[0].tokens.end())) + "\n";
}

// --prompt, --prompts: generation with the CPU model of --model in --precision (the GPU binary uses it
// too until rollout.cu exists).
inline int run_generation_mode(const Args& args, const std::string& mode) {
    if (!args.given("model")) fail("--%s needs --model DIR (a HF model directory)", mode.c_str());
    if (args.integer("threads") > 0) omp_set_num_threads((int)args.integer("threads"));
    ModelWeights weights = ModelWeights::load(args.str("model"));
    CpuModel model(weights);
    ModelParams params;
    params.prepare(model, parse_precision(args.str("precision"), "--precision"));
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

}  // namespace fp8rl
