// init_model.h: a fresh model to train from scratch (--init). It is written as an ordinary HF
// directory (config.json with its tokenizer's vocabulary, tokenizer files, random bf16 weights)
// and then loaded like any real checkpoint, so fresh and real models share one loading path and a
// fresh model loads in transformers. Presets name small Qwen3 shapes; a config.json path gives any
// shape (its vocabulary and special ids are replaced by the tokenizer's). The tokenizer is a task
// tokenizer (rl/text/task_tokenizer.h: a task's bytes, or all 256) or a HF tokenizer's (--tokenizer DIR).
#pragma once
#include <cmath>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "rl/common.h"
#include "rl/model/config.h"
#include "rl/io/json.h"
#include "rl/io/logger.h"
#include "rl/numerics/rng.h"
#include "rl/io/safetensors.h"
#include "rl/text/chat.h"
#include "rl/text/task_tokenizer.h"
#include "rl/text/tokenizer.h"
#include "rl/model/weights.h"

namespace fp8rl {

// The presets' shapes (Qwen3: q/k norms, tied embeddings). tiny ~0.1M parameters, small ~0.8M.
inline std::string preset_config_text(const std::string& name) {
    struct Preset { const char* name; int hidden, inter, layers, heads, kv, head_dim; };
    static const Preset presets[] = {{"tiny", 64, 192, 2, 4, 2, 16}, {"small", 128, 384, 4, 4, 2, 32}};
    for (const Preset& p : presets)
        if (name == p.name)
            return strfmt("{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"hidden_size\": %d, "
                          "\"intermediate_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": %d, "
                          "\"num_key_value_heads\": %d, \"head_dim\": %d, \"hidden_act\": \"silu\", \"rms_norm_eps\": 1e-06, "
                          "\"rope_theta\": 10000.0, \"max_position_embeddings\": 512, \"tie_word_embeddings\": true, "
                          "\"attention_bias\": false, \"use_sliding_window\": false, \"initializer_range\": 0.02, "
                          "\"torch_dtype\": \"float32\", \"vocab_size\": 1}",
                          p.hidden, p.inter, p.layers, p.heads, p.kv, p.head_dim);
    return "";
}

// Replaces (or adds) an object member.
inline void json_set(Json& obj, const std::string& key, Json value) {
    for (auto& kv : obj.fields)
        if (kv.first == key) {
            kv.second = std::move(value);
            return;
        }
    obj.fields.emplace_back(key, std::move(value));
}

inline Json json_int(int64_t v) {
    Json j;
    j.type = Json::Int;
    j.integer = v;
    j.number = (double)v;
    return j;
}
inline Json json_null() { return Json(); }

// A fresh model's vocabulary: its size, end-of-text id (eos and pad), bos id (-1: none) and the
// tokenizer files written beside config.json.
struct FreshVocab {
    int64_t size = 0, eos = 0, bos = -1;
    std::vector<std::pair<std::string, std::string>> files;  // (name, text)
};

// The task tokenizer of `symbols`.
inline FreshVocab task_fresh_vocab(const std::string& symbols) {
    FreshVocab v;
    v.size = task_vocab_size(symbols);
    v.eos = task_eos_id(symbols);
    v.files = {{"tokenizer.json", task_tokenizer_json(symbols)}, {"tokenizer_config.json", task_tokenizer_config_json()}};
    return v;
}

// A HF tokenizer's vocabulary (`path`: a tokenizer.json or a directory holding one): every id it
// has (vocabulary and added tokens), its tokenizer_config.json's eos_token (else <|endoftext|>) as
// the end of text, its bos_token, and its tokenizer.json, tokenizer_config.json and
// chat_template.jinja (the chat template, in one or the other) copied.
inline FreshVocab tokenizer_fresh_vocab(const std::string& path) {
    std::unique_ptr<Tokenizer> tok = Tokenizer::load(path);
    FreshVocab v;
    v.size = tok->vocab_size();
    const std::string eos = tokenizer_config_token(path, "eos_token"), bos = tokenizer_config_token(path, "bos_token");
    v.eos = tok->token_to_id(eos.empty() ? kTaskEosToken : eos);
    if (v.eos < 0)
        fail("--init with --tokenizer %s: no end-of-text token (%s); give a tokenizer with one, or --tokenizer bytes",
             path.c_str(), eos.empty() ? "tokenizer_config.json names no eos_token and the vocabulary has no <|endoftext|>"
                                       : ("its eos_token " + eos + " is not in the vocabulary").c_str());
    if (!bos.empty()) v.bos = tok->token_to_id(bos);
    v.files = {{"tokenizer.json", read_file(tok->source())}};
    const std::filesystem::path dir = std::filesystem::path(tokenizer_config_path(path)).parent_path();
    for (const char* name : {"tokenizer_config.json", "chat_template.jinja"})
        if (std::filesystem::is_regular_file(dir / name)) v.files.emplace_back(name, read_file((dir / name).string()));
    return v;
}

// config.json of the fresh model: the preset or file, with the vocabulary `v`.
inline std::string fresh_config_text(const std::string& init, const FreshVocab& v) {
    std::string text = preset_config_text(init), src = "--init " + init;
    if (text.empty()) {
        if (!std::filesystem::is_regular_file(init))
            fail("--init %s: neither a preset (tiny, small) nor a config.json file", init.c_str());
        text = read_file(init);
        src = init;
    }
    Json cfg = json_parse(text, src);
    if (!cfg.is_object()) fail("%s: not a JSON object", src.c_str());
    json_set(cfg, "vocab_size", json_int(v.size));
    json_set(cfg, "eos_token_id", json_int(v.eos));
    json_set(cfg, "pad_token_id", json_int(v.eos));
    json_set(cfg, "bos_token_id", v.bos >= 0 ? json_int(v.bos) : json_null());
    return json_dump(cfg, 2) + "\n";
}

// A standard normal from two Philox words (Box-Muller, cosine branch).
inline float normal_from_bits(uint32_t a, uint32_t b) {
    double u1 = ((double)a + 1.0) / 4294967296.0;  // (0, 1]
    double u2 = (double)b / 4294967296.0;
    return (float)(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

// HF's initialization of these architectures: N(0, std) for embeddings and linear weights,
// ones for RMSNorm weights, zeros for biases. Element k of tensor t draws from (seed, t, k).
inline void init_weights(ModelWeights& w, uint64_t seed, double std) {
    for (size_t t = 0; t < w.tensors.size(); t++) {
        const TensorInfo& info = w.tensors[t];
        float* p = w.master.data() + info.offset;
        bool norm = info.name.find("norm") != std::string::npos, bias = info.name.find(".bias") != std::string::npos;
#pragma omp parallel for schedule(static) if (info.numel > (1 << 20))
        for (size_t k = 0; k < info.numel; k++) {
            Philox4 r = rng_bits(seed, (uint32_t)t, (uint32_t)(k >> 32), (uint32_t)k, kRngInit);
            p[k] = norm ? 1.0f : bias ? 0.0f : (float)std * normal_from_bits(r.w[0], r.w[1]);
        }
    }
}

// Writes a model of config.json text `config` with random weights (init_weights) to `dir` as a HF
// directory (replacing it); `files` (name, text) join config.json, e.g. the tokenizer's.
inline void write_random_model(const std::string& dir, const std::string& config,
                               const std::vector<std::pair<std::string, std::string>>& files, uint64_t seed) {
    namespace fs = std::filesystem;
    std::string staging = dir + ".source";
    std::error_code ec;
    fs::remove_all(staging, ec);
    fs::create_directories(staging, ec);
    if (ec) fail("%s: cannot create directory: %s", staging.c_str(), ec.message().c_str());
    write_file_atomic(staging + "/config.json", config);
    for (const auto& f : files) write_file_atomic(staging + "/" + f.first, f.second);
    ModelWeights w = ModelWeights::from_config(load_model_config(staging));
    const Json* range = w.config.raw.find("initializer_range");
    init_weights(w, seed, range && range->is_number() ? range->number : 0.02);
    save_hf(w, dir, staging);
    fs::remove_all(staging, ec);
}

// Writes the fresh model to `dir` (replacing it) and returns nothing: load it with
// ModelWeights::load(dir) like any model.
inline void write_fresh_model(const std::string& init, const std::string& dir, const FreshVocab& v, uint64_t seed) {
    std::vector<std::pair<std::string, std::string>> files = v.files;
    files.emplace_back("generation_config.json", strfmt("{\"eos_token_id\": %lld, \"pad_token_id\": %lld}\n",
                                                        (long long)v.eos, (long long)v.eos));
    write_random_model(dir, fresh_config_text(init, v), files, seed);
}

}  // namespace fp8rl
