// config.h: the model's hyperparameters from a HF config.json (spec-model.md §5), for the dense
// families fp8rl runs: qwen3, qwen2 (Qwen2 / Qwen2.5) and llama (Llama-3.x). Both spellings of
// the keys are read: transformers v4 (`rope_theta`, `rope_scaling`, `torch_dtype`) and v5
// (`rope_parameters`, `dtype`). generation_config.json, when present, adds its eos ids.
// Anything fp8rl cannot run faithfully (another architecture, sliding-window attention, a RoPE
// scaling other than llama3, extra biases) is an error naming the file and the field.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "rl/common.h"
#include "rl/io/json.h"

namespace fp8rl {

enum class Arch { Qwen3, Qwen2, Llama };

inline const char* arch_model_type(Arch a) { return a == Arch::Qwen3 ? "qwen3" : a == Arch::Qwen2 ? "qwen2" : "llama"; }
inline const char* arch_class_name(Arch a) {
    return a == Arch::Qwen3 ? "Qwen3ForCausalLM" : a == Arch::Qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM";
}

// RoPE frequencies: "default" (inv_freq = theta^(-2i/D)) or "llama3" (frequency scaling, §2.5).
struct RopeConfig {
    std::string type = "default";
    double theta = 10000.0;
    double factor = 1.0;                         // llama3 only
    double low_freq_factor = 1.0;                // llama3 only
    double high_freq_factor = 4.0;               // llama3 only
    int64_t original_max_position_embeddings = 0;  // llama3 only
};

struct ModelConfig {
    Arch arch = Arch::Qwen3;
    int64_t vocab_size = 0;         // V
    int64_t hidden_size = 0;        // C
    int64_t intermediate_size = 0;  // I
    int64_t num_layers = 0;         // L
    int64_t num_heads = 0;          // H
    int64_t num_kv_heads = 0;       // KV (GQA: query head h reads kv head h / (H / KV))
    int64_t head_dim = 0;           // D: config `head_dim`, else C / H
    double rms_norm_eps = 1e-6;
    RopeConfig rope;
    int64_t max_position_embeddings = 0;  // 0 when absent
    // Tied: logits use embed_tokens.weight and there is no lm_head tensor. When config.json does
    // not say (tie_given false), the loader decides from the files (spec-model.md §4).
    bool tie_word_embeddings = true;
    bool tie_given = false;
    bool qkv_bias = false;  // Qwen2: q/k/v projections have biases
    bool qk_norm = false;   // Qwen3: per-head RMSNorm of q and k before RoPE
    std::string dtype;      // torch_dtype / dtype as written ("bfloat16", "float32", ...), "" if absent
    int64_t bos_token_id = -1;          // -1 when absent
    std::vector<int64_t> eos_token_ids;  // generation_config's, then config's; no duplicates
    Json raw;  // config.json as read, so a writer can copy it with only the dtype changed

    int64_t q_dim() const { return num_heads * head_dim; }      // H * D
    int64_t kv_dim() const { return num_kv_heads * head_dim; }  // KV * D
};

namespace config_detail {

inline const Json& require(const Json& obj, const char* key, const std::string& src) {
    const Json* v = obj.find(key);
    if (!v || v->is_null()) fail("%s: missing field \"%s\"", src.c_str(), key);
    return *v;
}

// A positive integer field no larger than `max` (bounds keep every product of shapes in range).
inline int64_t positive_int(const Json& obj, const char* key, int64_t max, const std::string& src) {
    const Json& v = require(obj, key, src);
    if (!v.is_int()) fail("%s: field \"%s\" must be an integer, got %s", src.c_str(), key, json_type_name(v.type));
    if (v.integer <= 0 || v.integer > max)
        fail("%s: field \"%s\" = %lld is out of range (1..%lld)", src.c_str(), key, (long long)v.integer, (long long)max);
    return v.integer;
}

inline double positive_number(const Json& v, const char* key, const std::string& src) {
    if (!v.is_number()) fail("%s: field \"%s\" must be a number, got %s", src.c_str(), key, json_type_name(v.type));
    if (!(v.number > 0)) fail("%s: field \"%s\" must be positive, got %g", src.c_str(), key, v.number);
    return v.number;
}

inline bool optional_bool(const Json& obj, const char* key, bool fallback, const std::string& src) {
    const Json* v = obj.find(key);
    if (!v || v->is_null()) return fallback;
    if (!v->is_bool()) fail("%s: field \"%s\" must be true or false, got %s", src.c_str(), key, json_type_name(v->type));
    return v->boolean;
}

// Appends the ids of an int-or-list field (bos/eos), skipping ones already there.
inline void append_ids(const Json* v, const char* key, std::vector<int64_t>& ids, const std::string& src) {
    if (!v || v->is_null()) return;
    std::vector<const Json*> items;
    if (v->is_array()) for (const Json& x : v->items) items.push_back(&x);
    else items.push_back(v);
    for (const Json* x : items) {
        if (!x->is_int() || x->integer < 0) fail("%s: field \"%s\" must be a non-negative integer or a list of them", src.c_str(), key);
        bool seen = false;
        for (int64_t id : ids) seen |= id == x->integer;
        if (!seen) ids.push_back(x->integer);
    }
}

// RoPE: v5's rope_parameters, or v4's top-level rope_theta plus rope_scaling.
inline RopeConfig parse_rope(const Json& cfg, const std::string& src) {
    RopeConfig r;
    const Json* params = cfg.find("rope_parameters");
    if (params && params->is_null()) params = nullptr;
    if (params && !params->is_object()) fail("%s: field \"rope_parameters\" must be an object", src.c_str());
    const Json* scaling = cfg.find("rope_scaling");
    if (scaling && scaling->is_null()) scaling = nullptr;
    if (scaling && !scaling->is_object()) fail("%s: field \"rope_scaling\" must be an object or null", src.c_str());
    const Json* theta = params ? params->find("rope_theta") : nullptr;
    if (!theta || theta->is_null()) theta = cfg.find("rope_theta");
    if (!theta || theta->is_null()) fail("%s: missing field \"rope_theta\" (or \"rope_parameters.rope_theta\")", src.c_str());
    r.theta = positive_number(*theta, "rope_theta", src);
    const Json* s = params ? params : scaling;  // where the scaling type and its factors live
    if (!s) return r;
    const Json* type = s->find("rope_type");
    if (!type || type->is_null()) type = s->find("type");  // the older spelling inside rope_scaling
    if (type && !type->is_null()) {
        if (!type->is_string()) fail("%s: field \"rope_type\" must be a string", src.c_str());
        r.type = type->str;
    }
    if (r.type == "default") return r;
    if (r.type != "llama3")
        fail("%s: RoPE scaling type \"%s\" is not supported (fp8rl runs \"default\" and \"llama3\")", src.c_str(), r.type.c_str());
    r.factor = positive_number(require(*s, "factor", src), "factor", src);
    r.low_freq_factor = positive_number(require(*s, "low_freq_factor", src), "low_freq_factor", src);
    r.high_freq_factor = positive_number(require(*s, "high_freq_factor", src), "high_freq_factor", src);
    if (!(r.high_freq_factor > r.low_freq_factor))
        fail("%s: llama3 RoPE needs high_freq_factor > low_freq_factor (got %g and %g)", src.c_str(), r.high_freq_factor, r.low_freq_factor);
    r.original_max_position_embeddings = positive_int(*s, "original_max_position_embeddings", INT64_C(1) << 30, src);
    return r;
}

}  // namespace config_detail

// Reads a parsed config.json; `src` names the file in errors.
inline ModelConfig parse_model_config(const Json& cfg, const std::string& src) {
    using namespace config_detail;
    if (!cfg.is_object()) fail("%s: not a JSON object", src.c_str());
    ModelConfig c;
    const Json& mt = require(cfg, "model_type", src);
    if (!mt.is_string()) fail("%s: field \"model_type\" must be a string", src.c_str());
    if (mt.str == "qwen3") c.arch = Arch::Qwen3;
    else if (mt.str == "qwen2") c.arch = Arch::Qwen2;
    else if (mt.str == "llama") c.arch = Arch::Llama;
    else fail("%s: model_type \"%s\" is not supported; fp8rl runs qwen3, qwen2 and llama", src.c_str(), mt.str.c_str());
    if (const Json* archs = cfg.find("architectures")) {
        if (archs->is_array() && !archs->items.empty()) {
            const Json& a = archs->items[0];
            if (!a.is_string() || a.str != arch_class_name(c.arch))
                fail("%s: architectures[0] is %s, expected \"%s\" for model_type %s", src.c_str(),
                     a.is_string() ? json_quote(a.str).c_str() : json_type_name(a.type), arch_class_name(c.arch), mt.str.c_str());
        } else if (!archs->is_null() && !archs->is_array()) {
            fail("%s: field \"architectures\" must be a list", src.c_str());
        }
    }
    const int64_t max_dim = INT64_C(1) << 20;  // generous for any real model, small enough that products fit
    c.vocab_size = positive_int(cfg, "vocab_size", INT64_C(1) << 24, src);
    c.hidden_size = positive_int(cfg, "hidden_size", max_dim, src);
    c.intermediate_size = positive_int(cfg, "intermediate_size", max_dim, src);
    c.num_layers = positive_int(cfg, "num_hidden_layers", 4096, src);
    c.num_heads = positive_int(cfg, "num_attention_heads", 4096, src);
    const Json* kv = cfg.find("num_key_value_heads");
    c.num_kv_heads = kv && !kv->is_null() ? positive_int(cfg, "num_key_value_heads", 4096, src) : c.num_heads;
    if (c.num_heads % c.num_kv_heads != 0)
        fail("%s: num_attention_heads (%lld) is not a multiple of num_key_value_heads (%lld)", src.c_str(),
             (long long)c.num_heads, (long long)c.num_kv_heads);
    const Json* hd = cfg.find("head_dim");
    if (hd && !hd->is_null()) {
        c.head_dim = positive_int(cfg, "head_dim", 65536, src);
    } else {
        if (c.hidden_size % c.num_heads != 0)
            fail("%s: no \"head_dim\" and hidden_size (%lld) is not a multiple of num_attention_heads (%lld)", src.c_str(),
                 (long long)c.hidden_size, (long long)c.num_heads);
        c.head_dim = c.hidden_size / c.num_heads;
    }
    if (c.head_dim % 2 != 0) fail("%s: head_dim %lld is odd; RoPE needs an even head dimension", src.c_str(), (long long)c.head_dim);
    if (c.num_heads * c.head_dim > max_dim) fail("%s: num_attention_heads * head_dim is too large", src.c_str());
    c.rms_norm_eps = positive_number(require(cfg, "rms_norm_eps", src), "rms_norm_eps", src);
    c.rope = parse_rope(cfg, src);
    if (const Json* mp = cfg.find("max_position_embeddings"); mp && !mp->is_null())
        c.max_position_embeddings = positive_int(cfg, "max_position_embeddings", INT64_C(1) << 40, src);

    if (const Json* t = cfg.find("tie_word_embeddings"); t && !t->is_null()) {
        c.tie_word_embeddings = optional_bool(cfg, "tie_word_embeddings", true, src);
        c.tie_given = true;
    }
    c.qkv_bias = c.arch == Arch::Qwen2;  // built into Qwen2, no config key
    c.qk_norm = c.arch == Arch::Qwen3;
    if (c.arch != Arch::Qwen2 && optional_bool(cfg, "attention_bias", false, src))
        fail("%s: attention_bias true is not supported (fp8rl's %s has no attention biases)", src.c_str(), mt.str.c_str());
    if (optional_bool(cfg, "mlp_bias", false, src)) fail("%s: mlp_bias true is not supported", src.c_str());
    if (optional_bool(cfg, "use_sliding_window", false, src))
        fail("%s: use_sliding_window true is not supported; fp8rl runs full attention in every layer", src.c_str());
    if (const Json* act = cfg.find("hidden_act"); act && !act->is_null() && !(act->is_string() && act->str == "silu"))
        fail("%s: hidden_act must be \"silu\" (SwiGLU)", src.c_str());
    if (const Json* lt = cfg.find("layer_types"); lt && lt->is_array())
        for (const Json& k : lt->items)
            if (!k.is_string() || k.str != "full_attention")
                fail("%s: layer_types has %s; fp8rl runs only full_attention layers", src.c_str(),
                     k.is_string() ? json_quote(k.str).c_str() : json_type_name(k.type));

    const Json* dt = cfg.find("dtype");
    if (!dt || dt->is_null()) dt = cfg.find("torch_dtype");
    if (dt && dt->is_string()) c.dtype = dt->str;
    if (const Json* b = cfg.find("bos_token_id"); b && b->is_int()) c.bos_token_id = b->integer;
    append_ids(cfg.find("eos_token_id"), "eos_token_id", c.eos_token_ids, src);
    c.raw = cfg;
    return c;
}

// Reads DIR/config.json and, when present, DIR/generation_config.json (its eos ids come first).
inline ModelConfig load_model_config(const std::string& dir) {
    std::string path = dir + "/config.json";
    ModelConfig c = parse_model_config(json_parse_file(path), path);
    std::string gen_path = dir + "/generation_config.json";
    if (FILE* f = fopen(gen_path.c_str(), "rb")) {
        fclose(f);
        Json gen = json_parse_file(gen_path);
        if (!gen.is_object()) fail("%s: not a JSON object", gen_path.c_str());
        std::vector<int64_t> ids;
        config_detail::append_ids(gen.find("eos_token_id"), "eos_token_id", ids, gen_path);
        for (int64_t id : c.eos_token_ids)
            if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
        c.eos_token_ids = ids;
    }
    for (int64_t id : c.eos_token_ids)
        if (id >= c.vocab_size) fail("%s: eos token id %lld is not below vocab_size %lld", path.c_str(), (long long)id, (long long)c.vocab_size);
    return c;
}

// Number of parameters the config implies (lm_head counted only when untied).
inline int64_t config_num_params(const ModelConfig& c) {
    int64_t C = c.hidden_size, I = c.intermediate_size;
    int64_t per_layer = 2 * C                              // input and post-attention norms
                        + c.q_dim() * C + 2 * c.kv_dim() * C + C * c.q_dim()  // q, k, v, o
                        + 3 * I * C;                       // gate, up, down
    if (c.qkv_bias) per_layer += c.q_dim() + 2 * c.kv_dim();
    if (c.qk_norm) per_layer += 2 * c.head_dim;
    return c.vocab_size * C * (c.tie_word_embeddings ? 1 : 2) + c.num_layers * per_layer + C;
}

}  // namespace fp8rl
