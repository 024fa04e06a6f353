// Tests of rl/model/weights.h on the checkpoints HF transformers wrote (dev/make_tiny_models.py): every
// tensor must match what torch held (expected_<model>.json, written by the same script), shapes
// come from the config, tied/untied rules hold, and a written checkpoint reloads identically.
#include <cmath>
#include <cstring>
#include <filesystem>

#include "rl/model/weights.h"
#include "test/harness.h"
#include "test/temp_dir.h"

using namespace fp8rl;

static const char* tiny_models[] = {"qwen3_tiny", "qwen2_tiny", "llama_tiny"};

TEST(weights_load_matches_torch) {
    for (const char* name : tiny_models) {
        ModelWeights w = ModelWeights::load(harness::model_fixtures + name);
        Json expected = json_parse_file(harness::model_fixtures + "expected_" + name + ".json");
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
    ModelWeights w = ModelWeights::load(harness::model_fixtures + "qwen2_tiny");
    CHECK_EQ(w.tensors.front().name, std::string("model.embed_tokens.weight"));
    CHECK_EQ(w.tensors[1].name, std::string("model.layers.0.input_layernorm.weight"));
    CHECK_EQ(w.tensors[5].name, std::string("model.layers.0.self_attn.q_proj.bias"));
    CHECK_EQ(w.tensors.back().name, std::string("model.norm.weight"));  // tied: no lm_head
    // k and v follow q, and up follows gate, without a gap (the fused projections); every other
    // tensor starts on 64 floats
    auto fused_tail = [](const std::string& n) {
        for (const char* s : {"k_proj.weight", "v_proj.weight", "k_proj.bias", "v_proj.bias", "up_proj.weight"})
            if (n.size() > strlen(s) && n.compare(n.size() - strlen(s), strlen(s), s) == 0) return true;
        return false;
    };
    int fused = 0;
    for (size_t i = 0; i < w.tensors.size(); i++) {
        if (fused_tail(w.tensors[i].name)) {
            fused++;
            CHECK_EQ(w.tensors[i].offset, w.tensors[i - 1].offset + w.tensors[i - 1].numel);
        } else {
            CHECK_EQ(w.tensors[i].offset % 64, (size_t)0);
        }
        if (i) CHECK(w.tensors[i].offset >= w.tensors[i - 1].offset + w.tensors[i - 1].numel);
    }
    CHECK_EQ(fused, 5 * (int)w.config.num_layers);
    CHECK(w.tensors.back().offset + w.tensors.back().numel <= w.num_floats());
    // the layout depends on the config only: a fresh model of the same config has the same table
    ModelWeights fresh = ModelWeights::from_config(w.config);
    CHECK_EQ(fresh.num_floats(), w.num_floats());
    for (size_t i = 0; i < w.tensors.size(); i++) CHECK_EQ(fresh.tensors[i].offset, w.tensors[i].offset);
    for (float v : fresh.master) CHECK_EQ(v, 0.0f);
    CHECK_EQ(w.layer_data(1, "mlp.up_proj.weight"), w.data("model.layers.1.mlp.up_proj.weight"));
    CHECK_EQ(w.lm_head_name(), std::string("model.embed_tokens.weight"));
    ModelWeights ll = ModelWeights::load(harness::model_fixtures + "llama_tiny");
    CHECK_EQ(ll.tensors.back().name, std::string("lm_head.weight"));
    CHECK_EQ(ll.lm_head_name(), std::string("lm_head.weight"));
    CHECK_THROWS(w.tensor("model.layers.9.mlp.up_proj.weight"), "model has no tensor model.layers.9");
}

// bf16 written, bf16 read: load -> save -> load gives the BF16 rounding of every weight, and a
// second save -> load gives back exactly the same tensors (the round trip is a fixed point).
TEST(weights_round_trip_through_writer) {
    for (const char* name : tiny_models) {
        ModelWeights a = ModelWeights::load(harness::model_fixtures + name);
        harness::TempDir dir;
        save_hf(a, dir / "out", harness::model_fixtures + name);
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
            CHECK_MSG(read_file(dir / "out/" + f) == read_file(harness::model_fixtures + name + "/" + f), "%s not copied", f);
        CHECK(!Checkpoint::file_exists(dir / "out.tmp-" + std::to_string(getpid())));
    }
}

// A checkpoint directory made from a loaded fixture: its config.json text, and its tensors as F32
// with the changes a test asks for (dropped, added, reshaped or re-typed tensors).
struct Variant {
    std::string config;
    std::vector<TensorToWrite> tensors;
    std::vector<std::vector<uint8_t>> storage;  // bytes for tensors the test re-encodes

    explicit Variant(const ModelWeights& w, const std::string& source) : config(read_file(source + "/config.json")) {
        for (const TensorInfo& t : w.tensors) tensors.push_back({t.name, DType::F32, t.shape, w.master.data() + t.offset});
    }
    TensorToWrite& get(const std::string& name) {
        for (TensorToWrite& t : tensors)
            if (t.name == name) return t;
        fail("test setup: no tensor %s", name.c_str());
    }
    void drop(const std::string& name) {
        for (size_t i = 0; i < tensors.size(); i++)
            if (tensors[i].name == name) { tensors.erase(tensors.begin() + (long)i); return; }
        fail("test setup: no tensor %s", name.c_str());
    }
    void replace_in_config(const std::string& from, const std::string& to) {
        size_t at = config.find(from);
        if (at == std::string::npos) fail("test setup: %s not in config", from.c_str());
        config.replace(at, from.size(), to);
    }
    void write(const std::string& dir) {
        std::filesystem::create_directories(dir);
        harness::write_text(dir + "/config.json", config);
        write_safetensors(dir + "/model.safetensors", tensors);
    }
};

TEST(weights_rejects_bad_checkpoints) {
    const std::string q3 = harness::model_fixtures + "qwen3_tiny", ll = harness::model_fixtures + "llama_tiny";
    ModelWeights w3 = ModelWeights::load(q3), wl = ModelWeights::load(ll);
    harness::TempDir dir;
    int case_no = 0;
    auto expect = [&](Variant& v, const char* needle) {
        std::string d = dir / ("case" + std::to_string(case_no++));
        v.write(d);
        CHECK_THROWS(ModelWeights::load(d), needle);
    };
    { Variant v(w3, q3); v.drop("model.layers.1.mlp.up_proj.weight");
      expect(v, "1 tensor missing from the checkpoint: model.layers.1.mlp.up_proj.weight"); }
    { Variant v(w3, q3); v.drop("model.layers.0.self_attn.q_norm.weight"); v.drop("model.layers.1.self_attn.k_norm.weight");
      expect(v, "2 tensors missing from the checkpoint: model.layers.0.self_attn.q_norm.weight, model.layers.1.self_attn.k_norm.weight"); }
    { Variant v(w3, q3); v.get("model.layers.0.mlp.down_proj.weight").shape = {128, 64};
      expect(v, "model.safetensors: tensor model.layers.0.mlp.down_proj.weight has shape [128, 64], but config.json implies [64, 128]"); }
    { Variant v(w3, q3); v.replace_in_config("\"intermediate_size\": 128", "\"intermediate_size\": 96");
      expect(v, "tensor model.layers.0.mlp.gate_proj.weight has shape [128, 64], but config.json implies [96, 64]"); }
    { Variant v(w3, q3); v.tensors.push_back({"model.layers.2.mlp.up_proj.weight", DType::F32, {1}, w3.master.data()});
      expect(v, "1 unexpected tensor for a qwen3 model of this config: model.layers.2.mlp.up_proj.weight"); }
    { Variant v(w3, q3); v.tensors.push_back({"model.layers.0.self_attn.q_proj.bias", DType::F32, {128}, w3.master.data()});
      expect(v, "unexpected tensor for a qwen3 model of this config: model.layers.0.self_attn.q_proj.bias"); }
    { Variant v(wl, ll); v.drop("lm_head.weight");
      expect(v, "lm_head.weight (config.json says tie_word_embeddings false, so lm_head.weight is required)"); }
    { Variant v(w3, q3); v.replace_in_config("{", "{ \"model_type\": \"qwen3\", ");  // duplicate key: not valid JSON
      expect(v, "/config.json:21:3: invalid JSON: duplicate key \"model_type\""); }
    { Variant v(w3, q3); v.config = "not json";
      expect(v, "config.json:1:1: invalid JSON"); }
    { Variant v(w3, q3); std::vector<uint8_t> f8(64 * 128, 0x38);  // o_proj is [C, H*D] = [64, 128]
      v.get("model.layers.0.self_attn.o_proj.weight").dtype = DType::F8_E4M3; v.get("model.layers.0.self_attn.o_proj.weight").data = f8.data();
      expect(v, "FP8 tensor model.layers.0.self_attn.o_proj.weight has no scale (model.layers.0.self_attn.o_proj.weight_scale_inv"); }
    { Variant v(w3, q3); v.write(dir / "trunc");
      std::string bytes = read_file(dir / "trunc/model.safetensors");
      harness::write_text(dir / "trunc/model.safetensors", bytes.substr(0, bytes.size() - 100));
      CHECK_THROWS(ModelWeights::load(dir / "trunc"), "trunc/model.safetensors: the tensors cover"); }
}

TEST(weights_tied_rules) {
    const std::string q3 = harness::model_fixtures + "qwen3_tiny", ll = harness::model_fixtures + "llama_tiny";
    ModelWeights w3 = ModelWeights::load(q3), wl = ModelWeights::load(ll);
    harness::TempDir dir;
    {  // tied config, file with a (different) lm_head: it is ignored, embed_tokens is the logits matrix
        Variant v(w3, q3);
        v.tensors.push_back({"lm_head.weight", DType::F32, {320, 64}, wl.data("lm_head.weight")});
        v.write(dir / "a");
        ModelWeights w = ModelWeights::load(dir / "a");
        CHECK(w.config.tie_word_embeddings && !w.has("lm_head.weight"));
        CHECK(w.master == w3.master);
    }
    {  // config silent about tying: tied iff the files hold no lm_head.weight
        Variant v(w3, q3);
        v.replace_in_config("\"tie_word_embeddings\": true,", "");
        v.write(dir / "b");
        CHECK(ModelWeights::load(dir / "b").config.tie_word_embeddings);
        Variant u(wl, ll);
        u.replace_in_config("\"tie_word_embeddings\": false,", "");
        u.write(dir / "c");
        ModelWeights w = ModelWeights::load(dir / "c");
        CHECK(!w.config.tie_word_embeddings && w.has("lm_head.weight"));
        CHECK(memcmp(w.data("lm_head.weight"), wl.data("lm_head.weight"), 320 * 64 * 4) == 0);
    }
}

// F16 and BF16 files convert exactly (every F16/BF16 value is an FP32 value).
TEST(weights_load_converts_half_dtypes) {
    const std::string q3 = harness::model_fixtures + "qwen3_tiny";
    ModelWeights w3 = ModelWeights::load(q3);
    harness::TempDir dir;
    Variant v(w3, q3);
    v.storage.resize(v.tensors.size());
    for (size_t i = 0; i < v.tensors.size(); i++) {
        TensorToWrite& t = v.tensors[i];
        const float* src = (const float*)t.data;
        size_t n = (size_t)shape_numel(t.shape);
        bool half = i % 2 == 0;
        for (size_t k = 0; k < n; k++) {
            uint16_t h = half ? float_to_f16(src[k]) : float_to_bf16(src[k]);
            v.storage[i].push_back((uint8_t)(h & 0xFF));
            v.storage[i].push_back((uint8_t)(h >> 8));
        }
        t.dtype = half ? DType::F16 : DType::BF16;
        t.data = v.storage[i].data();
    }
    v.write(dir / "m");
    ModelWeights w = ModelWeights::load(dir / "m");
    size_t bad = 0;
    for (size_t i = 0; i < w.tensors.size(); i++) {
        const TensorInfo& t = w.tensors[i];
        for (size_t k = 0; k < t.numel; k++) {
            float x = w3.master[t.offset + k];
            float want = i % 2 == 0 ? f16_to_float(float_to_f16(x)) : round_bf16(x);
            bad += w.master[t.offset + k] != want;
        }
    }
    CHECK_EQ(bad, (size_t)0);
}

// A model made from a config alone (no config.json behind it, as the trainer's fresh models):
// save_hf generates config.json from the fields, and loading it gives back the same model.
TEST(weights_fresh_model_round_trip) {
    ModelConfig c;
    c.arch = Arch::Llama;
    c.vocab_size = 96;
    c.hidden_size = 32;
    c.intermediate_size = 48;
    c.num_layers = 3;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 8;
    c.rms_norm_eps = 1e-5;
    c.rope.type = "llama3";
    c.rope.theta = 500000.0;
    c.rope.factor = 8.0;
    c.rope.low_freq_factor = 1.0;
    c.rope.high_freq_factor = 4.0;
    c.rope.original_max_position_embeddings = 32;
    c.max_position_embeddings = 256;
    c.tie_word_embeddings = false;
    c.bos_token_id = 1;
    c.eos_token_ids = {2, 3};
    ModelWeights w = ModelWeights::from_config(c);
    for (const TensorInfo& t : w.tensors)  // BF16-exact values; the padding between tensors stays zero
        for (size_t i = t.offset; i < t.offset + t.numel; i++) w.master[i] = round_bf16((float)((i * 7919) % 1000) / 999.0f - 0.5f);
    harness::TempDir dir;
    save_hf(w, dir / "fresh");
    CHECK(!Checkpoint::file_exists(dir / "fresh/tokenizer.json"));  // nothing to copy from
    ModelWeights r = ModelWeights::load(dir / "fresh");
    const ModelConfig& g = r.config;
    CHECK(g.arch == Arch::Llama && g.vocab_size == 96 && g.hidden_size == 32 && g.intermediate_size == 48);
    CHECK(g.num_layers == 3 && g.num_heads == 4 && g.num_kv_heads == 2 && g.head_dim == 8);
    CHECK_EQ(g.rms_norm_eps, 1e-5);
    CHECK(g.rope.type == "llama3" && g.rope.theta == 500000.0 && g.rope.factor == 8.0);
    CHECK_EQ(g.rope.original_max_position_embeddings, (int64_t)32);
    CHECK(!g.tie_word_embeddings && g.tie_given);
    CHECK_EQ(g.bos_token_id, (int64_t)1);
    CHECK(g.eos_token_ids == (std::vector<int64_t>{2, 3}));
    CHECK_EQ(g.dtype, std::string("bfloat16"));
    CHECK(r.master == w.master);  // values were BF16 already: exact
}

// write_hf_files fills a directory the caller made (a trainer checkpoint's temporary directory).
TEST(weights_write_hf_files_into_existing_directory) {
    const std::string q2 = harness::model_fixtures + "qwen2_tiny";
    ModelWeights w = ModelWeights::load(q2);
    harness::TempDir dir;
    harness::write_text(dir / "trainer_state.bin", "x");
    write_hf_files(w, dir.path, q2);
    CHECK(Checkpoint::file_exists(dir / "trainer_state.bin"));  // left alone
    CHECK(Checkpoint::file_exists(dir / "chat_template.jinja"));
    ModelWeights r = ModelWeights::load(dir.path);
    CHECK_EQ(r.num_params(), w.num_params());
}

// read_values = false checks everything but reads no data (--info on models larger than memory).
TEST(weights_load_without_values_checks_the_same) {
    const std::string q3 = harness::model_fixtures + "qwen3_tiny";
    ModelWeights full = ModelWeights::load(q3);
    ModelWeights table = ModelWeights::load(q3, false);
    CHECK(table.master.empty());
    CHECK_EQ(table.num_floats(), full.num_floats());
    CHECK_EQ(table.num_params(), full.num_params());
    harness::TempDir dir;
    Variant v(full, q3);
    v.get("model.layers.1.mlp.gate_proj.weight").shape = {64, 128};
    v.write(dir / "bad");
    CHECK_THROWS(ModelWeights::load(dir / "bad", false), "tensor model.layers.1.mlp.gate_proj.weight has shape [64, 128]");
    Variant f(full, q3);
    std::vector<uint8_t> f8(320 * 64, 0x38);
    f.get("model.embed_tokens.weight").dtype = DType::F8_E5M2;
    f.get("model.embed_tokens.weight").data = f8.data();
    f.write(dir / "f8");
    CHECK_THROWS(ModelWeights::load(dir / "f8", false), "FP8 tensor model.embed_tokens.weight has no scale");
}
