// bench_model.h: the random models the engine benchmarks run on, written as HF directories by the
// project's own writer (rl/model/init_model.h: random bf16 weights) with the real Qwen3 tokenizer of the
// test fixtures, so nothing is downloaded. One directory per shape under build/bench_models/, reused
// while its config.json has this shape (a 1.7B model is ~4 GB of safetensors).
#pragma once
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "rl/common.h"
#include "rl/model/init_model.h"

namespace fp8rl {

struct BenchModel {
    const char* name;
    int hidden, intermediate, layers, heads, kv_heads, head_dim;
    long vocab;
};

// Qwen3's configs (tied embeddings, q/k norms, the real vocabulary); tiny: the --init tiny shape with
// a vocabulary of 2,048, for the emulated smoke runs (the emulated head over 151,936 takes ~30 s a
// step). Its special ids move below its vocabulary; the tokenizer is still Qwen3's, so only random
// token ids suit it.
const BenchModel kQwen3_0_6B = {"Qwen3-0.6B", 1024, 3072, 28, 16, 8, 128, 151936};
const BenchModel kQwen3_1_7B = {"Qwen3-1.7B", 2048, 6144, 28, 16, 8, 128, 151936};
const BenchModel kTinyBenchModel = {"tiny", 64, 192, 2, 4, 2, 16, 2048};

constexpr const char* kQwen3TokenizerDir = "test/fixtures/tokenizer/qwen3";

// Qwen3's <|im_end|> and <|endoftext|>, or the last ids of a smaller vocabulary.
inline long bench_eos_id(const BenchModel& m) { return std::min(151645L, m.vocab - 1); }
inline long bench_pad_id(const BenchModel& m) { return std::min(151643L, m.vocab - 2); }

inline std::string bench_model_config(const BenchModel& m) {
    return strfmt("{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"hidden_size\": %d, "
                  "\"intermediate_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": %d, "
                  "\"num_key_value_heads\": %d, \"head_dim\": %d, \"hidden_act\": \"silu\", \"rms_norm_eps\": 1e-06, "
                  "\"rope_theta\": 1000000.0, \"max_position_embeddings\": 40960, \"tie_word_embeddings\": true, "
                  "\"attention_bias\": false, \"use_sliding_window\": false, \"initializer_range\": 0.02, "
                  "\"torch_dtype\": \"bfloat16\", \"bos_token_id\": %ld, \"eos_token_id\": %ld, \"vocab_size\": %ld}\n",
                  m.hidden, m.intermediate, m.layers, m.heads, m.kv_heads, m.head_dim, bench_pad_id(m), bench_eos_id(m),
                  m.vocab);
}

inline bool bench_model_written(const BenchModel& m, const std::string& dir) {
    if (!std::filesystem::exists(dir + "/model.safetensors") || !std::filesystem::exists(dir + "/tokenizer.json")) return false;
    const ModelConfig c = load_model_config(dir);
    return c.hidden_size == m.hidden && c.intermediate_size == m.intermediate && c.num_layers == m.layers &&
           c.num_heads == m.heads && c.num_kv_heads == m.kv_heads && c.head_dim == m.head_dim && c.vocab_size == m.vocab;
}

// The model's directory, written unless it already holds this shape.
inline std::string bench_model_dir(const BenchModel& m) {
    const std::string dir = std::string("build/bench_models/") + m.name;
    if (bench_model_written(m, dir)) return dir;
    std::filesystem::create_directories("build/bench_models");
    std::vector<std::pair<std::string, std::string>> files = {
        {"generation_config.json",
         strfmt("{\"eos_token_id\": %ld, \"pad_token_id\": %ld}\n", bench_eos_id(m), bench_pad_id(m))}};
    for (const char* name : {"tokenizer.json", "tokenizer_config.json"})
        files.emplace_back(name, read_file(std::string(kQwen3TokenizerDir) + "/" + name));
    write_random_model(dir, bench_model_config(m), files, 1);
    return dir;
}

}  // namespace fp8rl
