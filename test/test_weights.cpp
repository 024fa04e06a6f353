// Tests of rl/weights.h on the checkpoints HF transformers wrote (dev/make_tiny_models.py): every
// tensor must match what torch held (expected_<model>.json, written by the same script), shapes
// come from the config, tied/untied rules hold, and a written checkpoint reloads identically.
#include <cmath>

#include "rl/weights.h"
#include "test/harness.h"
#include "test/temp_dir.h"

using namespace fp8rl;

static const std::string fixtures = "test/fixtures/models/";
static const char* tiny_models[] = {"qwen3_tiny", "qwen2_tiny", "llama_tiny"};

TEST(weights_load_matches_torch) {
    for (const char* name : tiny_models) {
        ModelWeights w = ModelWeights::load(fixtures + name);
        Json expected = json_parse_file(fixtures + "expected_" + name + ".json");
        CHECK_EQ((int64_t)w.num_params(), expected.find("num_parameters")->integer);
        CHECK_EQ((int64_t)w.num_params(), config_num_params(w.config));
        CHECK_EQ(w.config.tie_word_embeddings, expected.find("tied")->boolean);
        size_t compared = 0;
        for (const auto& kv : expected.find("tensors")->fields) {
            std::string tname = kv.first;
            if (tname == "lm_head.weight" && w.config.tie_word_embeddings) tname = w.lm_head_name();
            CHECK_MSG(w.has(tname), "%s: no tensor %s", name, tname.c_str());
            if (!w.has(tname)) continue;
            const TensorInfo& t = w.tensor(tname);
            std::vector<int64_t> shape;
            for (const Json& d : kv.second.find("shape")->items) shape.push_back(d.integer);
            CHECK_MSG(t.shape == shape, "%s %s: shape %s vs torch %s", name, tname.c_str(), shape_str(t.shape).c_str(), shape_str(shape).c_str());
            const float* x = w.data(tname);
            double sum = 0, abs_sum = 0;
            for (size_t i = 0; i < t.numel; i++) { sum += x[i]; abs_sum += std::fabs(x[i]); }
            const auto& first = kv.second.find("first")->items;
            for (size_t i = 0; i < first.size(); i++) CHECK_EQ((double)x[i], first[i].number);  // FP32 on disk: exact
            CHECK_EQ((double)x[t.numel - 1], kv.second.find("last")->number);
            CHECK_NEAR(abs_sum, kv.second.find("abs_sum")->number, 1e-9, 1e-9);
            CHECK_NEAR(sum, kv.second.find("sum")->number, 1e-9, 1e-6);
            compared++;
        }
        CHECK_EQ(compared, expected.find("tensors")->fields.size());
    }
}

TEST(weights_layout_is_canonical_and_aligned) {
    ModelWeights w = ModelWeights::load(fixtures + "qwen2_tiny");
    CHECK_EQ(w.tensors.front().name, std::string("model.embed_tokens.weight"));
    CHECK_EQ(w.tensors[1].name, std::string("model.layers.0.input_layernorm.weight"));
    CHECK_EQ(w.tensors[3].name, std::string("model.layers.0.self_attn.q_proj.bias"));
    CHECK_EQ(w.tensors.back().name, std::string("model.norm.weight"));  // tied: no lm_head
    for (size_t i = 0; i < w.tensors.size(); i++) {
        CHECK_EQ(w.tensors[i].offset % 64, (size_t)0);
        if (i) CHECK(w.tensors[i].offset >= w.tensors[i - 1].offset + w.tensors[i - 1].numel);
    }
    CHECK(w.tensors.back().offset + w.tensors.back().numel <= w.num_floats());
    // the layout depends on the config only: a fresh model of the same config has the same table
    ModelWeights fresh = ModelWeights::from_config(w.config);
    CHECK_EQ(fresh.num_floats(), w.num_floats());
    for (size_t i = 0; i < w.tensors.size(); i++) CHECK_EQ(fresh.tensors[i].offset, w.tensors[i].offset);
    for (float v : fresh.master) CHECK_EQ(v, 0.0f);
    CHECK_EQ(w.layer_data(1, "mlp.up_proj.weight"), w.data("model.layers.1.mlp.up_proj.weight"));
    CHECK_EQ(w.lm_head_name(), std::string("model.embed_tokens.weight"));
    ModelWeights ll = ModelWeights::load(fixtures + "llama_tiny");
    CHECK_EQ(ll.tensors.back().name, std::string("lm_head.weight"));
    CHECK_EQ(ll.lm_head_name(), std::string("lm_head.weight"));
    CHECK_THROWS(w.tensor("model.layers.9.mlp.up_proj.weight"), "model has no tensor model.layers.9");
}

// bf16 written, bf16 read: load -> save -> load gives the BF16 rounding of every weight, and a
// second save -> load gives back exactly the same tensors (the round trip is a fixed point).
TEST(weights_round_trip_through_writer) {
    for (const char* name : tiny_models) {
        ModelWeights a = ModelWeights::load(fixtures + name);
        harness::TempDir dir;
        save_hf(a, dir / "out", fixtures + name);
        ModelWeights b = ModelWeights::load(dir / "out");
        CHECK_EQ(b.num_floats(), a.num_floats());
        CHECK_EQ(b.config.tie_word_embeddings, a.config.tie_word_embeddings);
        CHECK_EQ(b.config.dtype, std::string("bfloat16"));
        size_t bad = 0;
        for (size_t i = 0; i < a.num_floats(); i++) bad += b.master[i] != round_bf16(a.master[i]);
        CHECK_EQ(bad, (size_t)0);
        save_hf(b, dir / "out", dir / "out", 40000);  // over the existing directory, sharded
        CHECK(Checkpoint::file_exists(dir / "out/model.safetensors.index.json"));
        CHECK(!Checkpoint::file_exists(dir / "out/model.safetensors"));
        ModelWeights c = ModelWeights::load(dir / "out");
        CHECK(c.master == b.master);
        for (const char* f : {"tokenizer.json", "tokenizer_config.json", "generation_config.json"})
            CHECK_MSG(read_file(dir / "out/" + f) == read_file(fixtures + name + "/" + f), "%s not copied", f);
        CHECK(!Checkpoint::file_exists(dir / "out.tmp-" + std::to_string(getpid())));
    }
}
