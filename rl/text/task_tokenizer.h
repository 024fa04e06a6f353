// task_tokenizer.h: the tokenizer of a fresh model trained from scratch on a synthetic task. A
// byte-level BPE (the GPT-2 / Qwen kind, so HF tokenizers, transformers and our own tokenizer
// load it like any real model's) whose vocabulary is only the bytes the task uses plus one
// special token, <|endoftext|>, which ends a response. Tens of entries instead of 150k: a
// random policy then emits a right answer often enough for RL from scratch to get a signal.
// There are no merges, so every byte is one token.
#pragma once
#include <string>
#include <vector>

#include "rl/common.h"
#include "rl/tasks/data.h"
#include "rl/io/json.h"

namespace fp8rl {

inline const char* kTaskEosToken = "<|endoftext|>";

// GPT-2's byte-to-unicode map: printable bytes stand for themselves, the others are shifted to
// code points 256+ so every byte has a visible, non-space character. Returns it as UTF-8.
inline std::string byte_level_char(unsigned char b) {
    auto printable = [](int c) { return (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255); };
    int cp = b;
    if (!printable(b)) {
        int n = 0;
        for (int c = 0; c < b; c++)
            if (!printable(c)) n++;
        cp = 256 + n;
    }
    std::string out;
    if (cp < 0x80) out += (char)cp;
    else {
        out += (char)(0xC0 | (cp >> 6));
        out += (char)(0x80 | (cp & 0x3F));
    }
    return out;
}

// The sorted distinct bytes of every prompt and answer, plus the ten digits.
inline std::string task_symbols(const std::vector<Example>& examples) {
    bool used[256] = {};
    for (char c = '0'; c <= '9'; c++) used[(unsigned char)c] = true;
    for (const Example& ex : examples) {
        for (unsigned char c : ex.prompt) used[c] = true;
        for (unsigned char c : ex.answer) used[c] = true;
        for (const auto& m : ex.messages)
            for (unsigned char c : m.second) used[c] = true;
    }
    std::string out;
    for (int b = 0; b < 256; b++)
        if (used[b]) out += (char)b;
    return out;
}

// tokenizer.json text: ids 0..n-1 are the symbols in byte order, id n is <|endoftext|>.
inline std::string task_tokenizer_json(const std::string& symbols) {
    std::string vocab;
    for (size_t i = 0; i < symbols.size(); i++) {
        if (i) vocab += ",";
        vocab += json_quote(byte_level_char((unsigned char)symbols[i])) + ":" + std::to_string(i);
    }
    std::string eos = json_quote(kTaskEosToken);
    size_t eos_id = symbols.size();
    return "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":[{\"id\":" + std::to_string(eos_id) +
           ",\"content\":" + eos +
           ",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":true}],"
           "\"normalizer\":null,"
           "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":true},"
           "\"post_processor\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":false,\"use_regex\":true},"
           "\"decoder\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":true},"
           "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,\"continuing_subword_prefix\":null,"
           "\"end_of_word_suffix\":null,\"fuse_unk\":false,\"byte_fallback\":false,\"ignore_merges\":false,\"vocab\":{" +
           vocab + "," + eos + ":" + std::to_string(eos_id) + "},\"merges\":[]}}\n";
}

// tokenizer_config.json: tells transformers which token ends a sequence and pads.
inline std::string task_tokenizer_config_json() {
    std::string eos = json_quote(kTaskEosToken);
    return "{\"tokenizer_class\":\"PreTrainedTokenizerFast\",\"bos_token\":null,\"eos_token\":" + eos + ",\"pad_token\":" + eos +
           ",\"unk_token\":null,\"add_bos_token\":false,\"clean_up_tokenization_spaces\":false,\"model_max_length\":4096}\n";
}

inline int64_t task_vocab_size(const std::string& symbols) { return (int64_t)symbols.size() + 1; }
inline int64_t task_eos_id(const std::string& symbols) { return (int64_t)symbols.size(); }

}  // namespace fp8rl
