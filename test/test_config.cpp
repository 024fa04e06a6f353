// Tests of rl/model/config.h: the HF-written configs of the tiny fixtures (transformers v5 keys), the
// Qwen3-0.6B config.json of spec-model.md §5.2 (v4 keys), llama3 RoPE in both spellings, and a
// clear error for each kind of bad config.
#include "rl/model/config.h"
#include "test/harness.h"
#include "test/temp_dir.h"

using namespace fp8rl;


static ModelConfig parse_config(const std::string& text) { return parse_model_config(json_parse(text, "config.json"), "config.json"); }

// Qwen3-0.6B's config.json as spec-model.md §5.2 lists it (transformers 4.51, v4 spellings).
static const char* qwen3_06b =
    R"({"architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
        "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
        "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
        "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
        "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
        "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";

TEST(config_qwen3_v4_keys) {
    ModelConfig c = parse_config(qwen3_06b);
    CHECK(c.arch == Arch::Qwen3);
    CHECK_EQ(c.vocab_size, (int64_t)151936);
    CHECK_EQ(c.hidden_size, (int64_t)1024);
    CHECK_EQ(c.intermediate_size, (int64_t)3072);
    CHECK_EQ(c.num_layers, (int64_t)28);
    CHECK_EQ(c.num_heads, (int64_t)16);
    CHECK_EQ(c.num_kv_heads, (int64_t)8);
    CHECK_EQ(c.head_dim, (int64_t)128);  // not C/H = 64
    CHECK_EQ(c.q_dim(), (int64_t)2048);
    CHECK_EQ(c.rms_norm_eps, 1e-6);
    CHECK_EQ(c.rope.theta, 1e6);
    CHECK_EQ(c.rope.type, std::string("default"));
    CHECK(c.tie_word_embeddings && c.tie_given);
    CHECK(c.qk_norm && !c.qkv_bias);
    CHECK_EQ(c.dtype, std::string("bfloat16"));
    CHECK_EQ(c.bos_token_id, (int64_t)151643);
    CHECK(c.eos_token_ids == std::vector<int64_t>{151645});
    CHECK_EQ(config_num_params(c), (int64_t)596049920);  // spec-model.md §3, verified arithmetic
}

TEST(config_fixtures_v5_keys) {
    ModelConfig q3 = load_model_config(harness::model_fixtures + "qwen3_tiny");
    CHECK(q3.arch == Arch::Qwen3 && q3.qk_norm && !q3.qkv_bias);
    CHECK_EQ(q3.head_dim, (int64_t)32);
    CHECK_EQ(q3.hidden_size / q3.num_heads, (int64_t)16);
    CHECK_EQ(q3.num_kv_heads, (int64_t)2);
    CHECK_EQ(q3.rope.theta, 1e6);   // from rope_parameters
    CHECK_EQ(q3.dtype, std::string("float32"));  // from "dtype"
    CHECK(q3.eos_token_ids == (std::vector<int64_t>{317, 315}));  // generation_config.json's list
    ModelConfig q2 = load_model_config(harness::model_fixtures + "qwen2_tiny");
    CHECK(q2.arch == Arch::Qwen2 && q2.qkv_bias && !q2.qk_norm);
    CHECK_EQ(q2.head_dim, (int64_t)16);  // no head_dim key: C/H
    CHECK(q2.tie_word_embeddings);
    ModelConfig ll = load_model_config(harness::model_fixtures + "llama_tiny");
    CHECK(ll.arch == Arch::Llama && !ll.qkv_bias && !ll.qk_norm);
    CHECK(!ll.tie_word_embeddings && ll.tie_given);
    CHECK_EQ(ll.num_kv_heads, (int64_t)1);
    CHECK_EQ(ll.rms_norm_eps, 1e-5);
    CHECK_EQ(ll.rope.type, std::string("llama3"));
    CHECK_EQ(ll.rope.theta, 500000.0);
    CHECK_EQ(ll.rope.factor, 32.0);
    CHECK_EQ(ll.rope.low_freq_factor, 1.0);
    CHECK_EQ(ll.rope.high_freq_factor, 4.0);
    CHECK_EQ(ll.rope.original_max_position_embeddings, (int64_t)64);
    CHECK(ll.eos_token_ids == (std::vector<int64_t>{316, 319}));
}

TEST(config_llama3_rope_v4_spellings) {
    const char* base = R"({"model_type": "llama", "vocab_size": 128256, "hidden_size": 2048,
        "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
        "eos_token_id": [128001, 128008, 128009], "tie_word_embeddings": true, "rope_scaling": )";
    for (const char* key : {"rope_type", "type"}) {
        ModelConfig c = parse_config(std::string(base) + "{\"" + key + R"(": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})");
        CHECK_EQ(c.rope.type, std::string("llama3"));
        CHECK_EQ(c.rope.factor, 32.0);
        CHECK_EQ(c.rope.original_max_position_embeddings, (int64_t)8192);
        CHECK_EQ(c.head_dim, (int64_t)64);
        CHECK(c.eos_token_ids == (std::vector<int64_t>{128001, 128008, 128009}));
        CHECK_EQ(config_num_params(c), (int64_t)1235814400);  // Llama-3.2-1B, spec-model.md §5.3
    }
}

TEST(config_rejects_bad_configs) {
    std::string good = qwen3_06b;
    auto with = [&](const std::string& from, const std::string& to) {
        std::string s = good;
        size_t at = s.find(from);
        if (at == std::string::npos) fp8rl::fail("test setup: %s not in config", from.c_str());
        return s.replace(at, from.size(), to);
    };
    CHECK_THROWS(parse_config(with("\"model_type\": \"qwen3\"", "\"model_type\": \"gpt2\"")), "model_type \"gpt2\" is not supported");
    CHECK_THROWS(parse_config(with("\"hidden_size\": 1024,", "")), "missing field \"hidden_size\"");
    CHECK_THROWS(parse_config(with("\"rope_theta\": 1000000,", "")), "missing field \"rope_theta\"");
    CHECK_THROWS(parse_config(with("\"num_hidden_layers\": 28", "\"num_hidden_layers\": \"28\"")), "\"num_hidden_layers\" must be an integer");
    CHECK_THROWS(parse_config(with("\"num_attention_heads\": 16", "\"num_attention_heads\": 0")), "out of range");
    CHECK_THROWS(parse_config(with("\"num_key_value_heads\": 8", "\"num_key_value_heads\": 5")), "not a multiple of num_key_value_heads");
    CHECK_THROWS(parse_config(with("\"rope_scaling\": null", "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}")),
                 "RoPE scaling type \"yarn\" is not supported");
    CHECK_THROWS(parse_config(with("\"use_sliding_window\": false", "\"use_sliding_window\": true")), "use_sliding_window");
    CHECK_THROWS(parse_config(with("\"Qwen3ForCausalLM\"", "\"Qwen3ForSequenceClassification\"")), "architectures[0]");
    CHECK_THROWS(parse_config(with("\"attention_bias\": false", "\"attention_bias\": true")), "attention_bias");
    CHECK_THROWS(parse_config("[1, 2]"), "not a JSON object");
    harness::TempDir dir;
    harness::write_text(dir / "config.json", "{\"model_type\": \"qwen3\",");
    CHECK_THROWS(load_model_config(dir.path), "config.json:1:");
    CHECK_THROWS(load_model_config(dir.path + "/nowhere"), "cannot open file");
    harness::write_text(dir / "config.json", qwen3_06b);
    harness::write_text(dir / "generation_config.json", "{\"eos_token_id\": [151645, 151643]}");
    CHECK(load_model_config(dir.path).eos_token_ids == (std::vector<int64_t>{151645, 151643}));
    harness::write_text(dir / "generation_config.json", "{\"eos_token_id\": [200000]}");
    CHECK_THROWS(load_model_config(dir.path), "eos token id 200000");
    harness::write_text(dir / "generation_config.json", "{\"eos_token_id\": \"x\"}");
    CHECK_THROWS(load_model_config(dir.path), "generation_config.json: field \"eos_token_id\"");
}
