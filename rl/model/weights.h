// weights.h: the model's parameters. ONE FP32 master buffer holds every tensor; a table gives each
// tensor's HF name, shape, offset and size in a canonical order derived from the config alone, so
// any other buffer of num_floats() floats (gradients, AdamW moments) shares the same layout.
//
// Canonical order: model.embed_tokens.weight; per layer i, model.layers.{i}.{input_layernorm,
// self_attn.{q,k,v}_proj.weight, self_attn.{q,k,v}_proj.bias, q_norm, k_norm, o_proj,
// post_attention_layernorm, mlp.gate_proj, mlp.up_proj, mlp.down_proj}; model.norm.weight;
// lm_head.weight (untied only). Biases exist for Qwen2, q/k norms for Qwen3. Each tensor starts at
// a multiple of 64 floats (256 bytes, for vector loads and GPU copies), except that k and v follow
// q, and up follows gate, without a gap: the fused projections [q|k|v] and [gate|up] (and the
// [q|k|v] bias) are each one contiguous matrix. The padding between tensors is kept zero.
//
// load() reads a HF directory (single file or sharded): every tensor is checked against the
// config's shape, converted to FP32 from F32/BF16/F16 (or dequantized from FP8 with its scales:
// rl/model/fp8_dequant.h, said in one line on stderr), and missing or unexpected tensors are named.
// Tied embeddings (spec-model.md §4): tied -> embed_tokens is the logits matrix and a stored
// lm_head.weight is ignored; untied -> lm_head.weight is required; config silent -> tied iff the
// files hold no lm_head.weight. save_hf() writes a HF directory transformers loads as it is
// (write_hf_files() the same files into a directory the caller made, e.g. a checkpoint's).
#pragma once
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "rl/numerics/bf16.h"
#include "rl/common.h"
#include "rl/model/config.h"
#include "rl/io/json.h"
#include "rl/io/safetensors.h"
#include "rl/model/fp8_dequant.h"

namespace fp8rl {

struct TensorInfo {
    std::string name;            // HF name, e.g. "model.layers.0.self_attn.q_proj.weight"
    std::vector<int64_t> shape;  // e.g. [H*D, C]; Linear weights are [out, in], row-major
    size_t offset = 0;           // in floats, into the master buffer
    size_t numel = 0;
};

// The tensor table of a config, in canonical order, with offsets. `total` gets the buffer size.
inline std::vector<TensorInfo> tensor_layout(const ModelConfig& c, size_t* total = nullptr) {
    std::vector<TensorInfo> t;
    size_t offset = 0;
    // pad = false: the next tensor follows without padding, so a layer's q, k, v weights (and
    // biases) and its gate and up weights are each one contiguous matrix, the fused projections'.
    auto add = [&](std::string name, std::vector<int64_t> shape, bool pad = true) {
        TensorInfo info;
        info.name = std::move(name);
        info.shape = std::move(shape);
        info.numel = (size_t)shape_numel(info.shape);
        info.offset = offset;
        offset += info.numel;
        if (pad) offset = (offset + 63) / 64 * 64;
        t.push_back(std::move(info));
    };
    const int64_t C = c.hidden_size, I = c.intermediate_size, Q = c.q_dim(), KV = c.kv_dim();
    add("model.embed_tokens.weight", {c.vocab_size, C});
    for (int64_t i = 0; i < c.num_layers; i++) {
        std::string p = "model.layers." + std::to_string(i) + ".";
        add(p + "input_layernorm.weight", {C});
        add(p + "self_attn.q_proj.weight", {Q, C}, false);
        add(p + "self_attn.k_proj.weight", {KV, C}, false);
        add(p + "self_attn.v_proj.weight", {KV, C});
        if (c.qkv_bias) {
            add(p + "self_attn.q_proj.bias", {Q}, false);
            add(p + "self_attn.k_proj.bias", {KV}, false);
            add(p + "self_attn.v_proj.bias", {KV});
        }
        if (c.qk_norm) {
            add(p + "self_attn.q_norm.weight", {c.head_dim});
            add(p + "self_attn.k_norm.weight", {c.head_dim});
        }
        add(p + "self_attn.o_proj.weight", {C, Q});
        add(p + "post_attention_layernorm.weight", {C});
        add(p + "mlp.gate_proj.weight", {I, C}, false);
        add(p + "mlp.up_proj.weight", {I, C});
        add(p + "mlp.down_proj.weight", {C, I});
    }
    add("model.norm.weight", {C});
    if (!c.tie_word_embeddings) add("lm_head.weight", {c.vocab_size, C});
    if (total) *total = offset;
    return t;
}

// "model.layers.{i}.{suffix}", e.g. layer_tensor_name(3, "mlp.up_proj.weight").
inline std::string layer_tensor_name(int64_t layer, const std::string& suffix) {
    return "model.layers." + std::to_string(layer) + "." + suffix;
}

// tensor_to_float reads F32, BF16 or F16. FP8 weights carry their scales in separate tensors,
// and reading their bytes without them would be silently wrong (load() dequantizes them: fp8_dequant.h).
inline void require_float_weights(const TensorView& t) {
    if (t.dtype == DType::F8_E4M3 || t.dtype == DType::F8_E5M2)
        fail("%s: tensor %s is %s; FP8-quantized checkpoints are not supported, load the BF16 or FP32 checkpoint",
             t.file.c_str(), t.name.c_str(), dtype_name(t.dtype));
}

// Converts a stored F32/BF16/F16 tensor to FP32 (out: [numel]).
inline void tensor_to_float(const TensorView& t, float* out) {
    require_float_weights(t);
    const uint8_t* p = t.data;
    size_t n = (size_t)t.numel;
    switch (t.dtype) {
        case DType::F32: memcpy(out, p, n * 4); return;
        case DType::BF16:
#pragma omp parallel for schedule(static) if (n > (1 << 20))
            for (size_t i = 0; i < n; i++) out[i] = bf16_to_float((uint16_t)(p[2 * i] | (p[2 * i + 1] << 8)));
            return;
        case DType::F16:
#pragma omp parallel for schedule(static) if (n > (1 << 20))
            for (size_t i = 0; i < n; i++) out[i] = f16_to_float((uint16_t)(p[2 * i] | (p[2 * i + 1] << 8)));
            return;
        case DType::F8_E4M3: case DType::F8_E5M2: return;  // rejected above
    }
}

struct ModelWeights {
    ModelConfig config;
    std::vector<TensorInfo> tensors;  // canonical order
    std::vector<float> master;        // [num_floats()], FP32 master weights

    // Zeroed parameters laid out for `config` (random initialisation is the trainer's job).
    // allocate = false gives the table alone, with `master` left empty.
    static ModelWeights from_config(const ModelConfig& config, bool allocate = true) {
        ModelWeights w;
        w.config = config;
        w.tensors = tensor_layout(config, &w.num_floats_);
        if (allocate) w.master.assign(w.num_floats_, 0.0f);
        for (size_t i = 0; i < w.tensors.size(); i++) w.index_[w.tensors[i].name] = i;
        return w;
    }

    // Loads DIR (config.json, generation_config.json, model.safetensors or shards).
    // read_values = false runs every check (headers, dtypes, shapes, names) but reads no tensor
    // data and leaves `master` empty: what --info needs for a model larger than memory.
    static ModelWeights load(const std::string& dir, bool read_values = true);

    size_t num_floats() const { return num_floats_; }  // buffer size, padding included
    size_t num_params() const {                          // parameters, padding excluded
        size_t n = 0;
        for (const TensorInfo& t : tensors) n += t.numel;
        return n;
    }
    bool has(const std::string& name) const { return index_.count(name) > 0; }
    const TensorInfo& tensor(const std::string& name) const {
        auto it = index_.find(name);
        if (it == index_.end()) fail("model has no tensor %s", name.c_str());
        return tensors[it->second];
    }
    size_t offset(const std::string& name) const { return tensor(name).offset; }
    float* data(const std::string& name) { return master.data() + offset(name); }
    const float* data(const std::string& name) const { return master.data() + offset(name); }
    float* layer_data(int64_t layer, const std::string& suffix) { return data(layer_tensor_name(layer, suffix)); }
    const float* layer_data(int64_t layer, const std::string& suffix) const { return data(layer_tensor_name(layer, suffix)); }
    // The logits matrix [V, C]: lm_head.weight, or embed_tokens.weight when tied.
    const std::string& lm_head_name() const {
        static const std::string tied = "model.embed_tokens.weight", untied = "lm_head.weight";
        return config.tie_word_embeddings ? tied : untied;
    }

private:
    size_t num_floats_ = 0;
    std::unordered_map<std::string, size_t> index_;
};

namespace weights_detail {

// Old Llama conversions stored RoPE tables as buffers; transformers ignores them, and so do we.
inline bool ignorable(const std::string& name) {
    return name.size() > 21 && name.compare(name.size() - 21, 21, ".rotary_emb.inv_freq") == 0;
}

inline std::string name_list(const std::vector<std::string>& names) {
    std::string s;
    for (size_t i = 0; i < names.size() && i < 5; i++) s += (i ? ", " : "") + names[i];
    if (names.size() > 5) s += strfmt(" and %zu more", names.size() - 5);
    return s;
}

}  // namespace weights_detail

inline ModelWeights ModelWeights::load(const std::string& dir, bool read_values) {
    ModelConfig config = load_model_config(dir);
    Checkpoint ck(dir);
    if (!config.tie_given) config.tie_word_embeddings = ck.find("lm_head.weight") == nullptr;
    ModelWeights w = from_config(config, read_values);
    std::vector<std::string> missing, unexpected;
    std::map<std::string, int> fp8_read;  // scale tensors used, and the formats met (for the one line)
    int64_t block_rows = 0, block_cols = 0;
    fp8_block_size(config.raw, dir, &block_rows, &block_cols);
    for (const TensorInfo& info : w.tensors) {
        const TensorView* t = ck.find(info.name);
        if (!t) { missing.push_back(info.name); continue; }
        if (t->shape != info.shape)
            fail("%s: tensor %s has shape %s, but config.json implies %s", t->file.c_str(), info.name.c_str(),
                 shape_str(t->shape).c_str(), shape_str(info.shape).c_str());
        if (t->dtype == DType::F8_E4M3 || t->dtype == DType::F8_E5M2) {
            Fp8WeightFormat f = fp8_weight_format(*t, [&](const std::string& n) { return ck.find(n); }, block_rows, block_cols);
            fp8_read[f.scale->name] = 1;
            fp8_read[strfmt("%s, %s", dtype_name(t->dtype),
                            f.block_rows > 0 ? strfmt("%lldx%lld block scales", (long long)f.block_rows, (long long)f.block_cols).c_str()
                            : f.per_channel  ? "per-channel scales"
                                             : "per-tensor scales")] = 2;
            if (read_values) fp8_dequantize_weight(*t, f, w.master.data() + info.offset);
            continue;
        }
        require_float_weights(*t);
        if (read_values) tensor_to_float(*t, w.master.data() + info.offset);
    }
    for (const auto& kv : ck.tensors()) {
        if (w.has(kv.first) || weights_detail::ignorable(kv.first) || fp8_read.count(kv.first)) continue;
        if (kv.first == "lm_head.weight" && config.tie_word_embeddings) continue;  // tied: embed_tokens is used
        unexpected.push_back(kv.first);
    }
    if (!missing.empty()) {
        bool lm = missing.size() == 1 && missing[0] == "lm_head.weight";
        fail("%s: %zu tensor%s missing from the checkpoint: %s%s", dir.c_str(), missing.size(), missing.size() > 1 ? "s" : "",
             weights_detail::name_list(missing).c_str(),
             lm ? " (config.json says tie_word_embeddings false, so lm_head.weight is required)" : "");
    }
    if (!unexpected.empty())
        fail("%s: %zu unexpected tensor%s for a %s model of this config: %s", dir.c_str(), unexpected.size(),
             unexpected.size() > 1 ? "s" : "", arch_model_type(config.arch), weights_detail::name_list(unexpected).c_str());
    if (!fp8_read.empty()) {
        std::string formats;
        for (const auto& kv : fp8_read)
            if (kv.second == 2) formats += (formats.empty() ? "" : "; ") + kv.first;
        fprintf(stderr, "model %s: FP8 checkpoint (%s), %s into the FP32 master\n", dir.c_str(), formats.c_str(),
                read_values ? "dequantized" : "to be dequantized");
    }
    return w;
}

// config.json for a written checkpoint: the source's keys as read (or, for a model made from a
// config without one, the fields fp8rl knows), with the dtype now bfloat16 and tying made explicit.
inline Json config_json_for_writing(const ModelConfig& c) {
    auto str = [](const std::string& s) { Json j; j.type = Json::String; j.str = s; return j; };
    auto set = [](Json& obj, const std::string& key, Json value) {
        for (auto& kv : obj.fields)
            if (kv.first == key) { kv.second = std::move(value); return; }
        obj.fields.emplace_back(key, std::move(value));
    };
    auto num = [](double d) { Json j; j.type = Json::Double; j.number = d; return j; };
    auto integer = [](int64_t i) { Json j; j.type = Json::Int; j.integer = i; j.number = (double)i; return j; };
    Json out = c.raw;
    if (!out.is_object()) {
        out = Json();
        out.type = Json::Object;
        Json archs;
        archs.type = Json::Array;
        archs.items.push_back(str(arch_class_name(c.arch)));
        set(out, "architectures", archs);
        set(out, "model_type", str(arch_model_type(c.arch)));
        set(out, "vocab_size", integer(c.vocab_size));
        set(out, "hidden_size", integer(c.hidden_size));
        set(out, "intermediate_size", integer(c.intermediate_size));
        set(out, "num_hidden_layers", integer(c.num_layers));
        set(out, "num_attention_heads", integer(c.num_heads));
        set(out, "num_key_value_heads", integer(c.num_kv_heads));
        set(out, "head_dim", integer(c.head_dim));
        set(out, "rms_norm_eps", num(c.rms_norm_eps));
        set(out, "rope_theta", num(c.rope.theta));
        set(out, "hidden_act", str("silu"));
        if (c.max_position_embeddings > 0) set(out, "max_position_embeddings", integer(c.max_position_embeddings));
        if (c.bos_token_id >= 0) set(out, "bos_token_id", integer(c.bos_token_id));
        if (!c.eos_token_ids.empty()) {
            Json eos;
            eos.type = Json::Array;
            for (int64_t id : c.eos_token_ids) eos.items.push_back(integer(id));
            set(out, "eos_token_id", eos);
        }
        if (c.rope.type == "llama3") {
            Json s;
            s.type = Json::Object;
            set(s, "rope_type", str("llama3"));
            set(s, "factor", num(c.rope.factor));
            set(s, "low_freq_factor", num(c.rope.low_freq_factor));
            set(s, "high_freq_factor", num(c.rope.high_freq_factor));
            set(s, "original_max_position_embeddings", integer(c.rope.original_max_position_embeddings));
            set(out, "rope_scaling", s);
        }
    }
    Json tie;
    tie.type = Json::Bool;
    tie.boolean = c.tie_word_embeddings;
    set(out, "tie_word_embeddings", tie);
    set(out, "torch_dtype", str("bfloat16"));
    if (out.find("dtype")) set(out, "dtype", str("bfloat16"));
    return out;
}

// The files of a HF model directory besides config.json and the weights (spec-model.md §6.6).
inline const std::vector<std::string>& hf_side_files() {
    static const std::vector<std::string> names = {
        "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
        "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja"};
    return names;
}

// Copies the side files source_dir has into dir (none when source_dir is empty).
inline void copy_hf_side_files(const std::string& source_dir, const std::string& dir) {
    namespace fs = std::filesystem;
    if (source_dir.empty()) return;
    for (const std::string& name : hf_side_files()) {
        fs::path from = fs::path(source_dir) / name;
        std::error_code ec;
        if (fs::exists(from) && !fs::copy_file(from, fs::path(dir) / name, fs::copy_options::overwrite_existing, ec))
            fail("%s: cannot copy into %s (%s)", from.c_str(), dir.c_str(), ec.message().c_str());
    }
}

// Writes `w` into the existing directory `dir` as a HF model: bf16 weights under their HF names
// (lm_head omitted when tied, as transformers does), config.json, and the side files copied from
// `source_dir` when given. max_shard_bytes > 0 shards the weights with an index file. Each file is
// written atomically; for a whole directory that appears at once, use save_hf.
inline void write_hf_files(const ModelWeights& w, const std::string& dir, const std::string& source_dir = "",
                           size_t max_shard_bytes = 0) {
    std::vector<std::vector<uint8_t>> bf16(w.tensors.size());  // little-endian BF16 bytes per tensor
    std::vector<TensorToWrite> out;
    for (size_t i = 0; i < w.tensors.size(); i++) {
        const TensorInfo& t = w.tensors[i];
        bf16[i].resize(2 * t.numel);
        const float* src = w.master.data() + t.offset;
#pragma omp parallel for schedule(static) if (t.numel > (1 << 20))
        for (size_t k = 0; k < t.numel; k++) {
            uint16_t h = float_to_bf16(src[k]);
            bf16[i][2 * k] = (uint8_t)(h & 0xFF);
            bf16[i][2 * k + 1] = (uint8_t)(h >> 8);
        }
        out.push_back({t.name, DType::BF16, t.shape, bf16[i].data()});
    }
    write_checkpoint_weights(dir, out, max_shard_bytes);
    write_file_atomic(dir + "/config.json", json_dump(config_json_for_writing(w.config), 2) + "\n");
    copy_hf_side_files(source_dir, dir);
}

// write_hf_files into a temporary directory that is then renamed to `dir` (replacing an existing
// one), so a crash never leaves a half-written checkpoint under the real name.
inline void save_hf(const ModelWeights& w, const std::string& dir, const std::string& source_dir = "",
                    size_t max_shard_bytes = 0) {
    namespace fs = std::filesystem;
    std::string tmp = dir + ".tmp-" + std::to_string(getpid());
    std::error_code ec;
    fs::remove_all(tmp, ec);
    if (!fs::create_directories(tmp, ec) || ec) fail("%s: cannot create directory (%s)", tmp.c_str(), ec.message().c_str());
    try {
        write_hf_files(w, tmp, source_dir, max_shard_bytes);
        if (fs::exists(dir)) {
            std::string old = dir + ".old-" + std::to_string(getpid());
            fs::rename(dir, old);
            fs::rename(tmp, dir);
            fs::remove_all(old);
        } else {
            fs::rename(tmp, dir);
        }
    } catch (const fs::filesystem_error& e) {
        fs::remove_all(tmp, ec);
        fail("%s: cannot write the checkpoint (%s)", dir.c_str(), e.what());
    } catch (...) {
        fs::remove_all(tmp, ec);
        throw;
    }
}

}  // namespace fp8rl
