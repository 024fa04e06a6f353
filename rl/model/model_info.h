// model_info.h: the report of `train_rl_cpu --model DIR --info`: architecture, hyperparameters,
// every tensor's shape (one layer shown for all), parameter count and bytes. It needs the config
// and the tensor table only, so it works on a model loaded with read_values = false.
#pragma once
#include <string>

#include "rl/common.h"
#include "rl/model/weights.h"

namespace fp8rl {

// 1234567 -> "1,234,567"
inline std::string with_commas(uint64_t n) {
    std::string s = std::to_string(n);
    for (int i = (int)s.size() - 3; i > 0; i -= 3) s.insert((size_t)i, ",");
    return s;
}

inline std::string model_info(const ModelWeights& w, const std::string& dir) {
    const ModelConfig& c = w.config;
    std::string out = strfmt("model          %s\n", dir.c_str());
    out += strfmt("architecture   %s (%s)\n", arch_model_type(c.arch), arch_class_name(c.arch));
    out += strfmt("layers         %lld, hidden %lld, intermediate %lld, vocab %lld\n", (long long)c.num_layers,
                  (long long)c.hidden_size, (long long)c.intermediate_size, (long long)c.vocab_size);
    out += strfmt("attention      %lld query heads, %lld kv heads (GQA %lld:1), head_dim %lld%s%s\n", (long long)c.num_heads,
                  (long long)c.num_kv_heads, (long long)(c.num_heads / c.num_kv_heads), (long long)c.head_dim,
                  c.qk_norm ? ", q/k RMSNorm" : "", c.qkv_bias ? ", q/k/v biases" : "");
    out += strfmt("rope           %s, theta %g", c.rope.type.c_str(), c.rope.theta);
    if (c.rope.type == "llama3")
        out += strfmt(" (factor %g, low %g, high %g, original max positions %lld)", c.rope.factor, c.rope.low_freq_factor,
                      c.rope.high_freq_factor, (long long)c.rope.original_max_position_embeddings);
    out += strfmt("\nnorm eps       %g\n", c.rms_norm_eps);
    out += strfmt("embeddings     %s\n", c.tie_word_embeddings ? "tied (lm_head = embed_tokens)" : "untied (lm_head.weight)");
    std::string eos;
    for (int64_t id : c.eos_token_ids) eos += (eos.empty() ? "" : ", ") + std::to_string(id);
    out += strfmt("eos ids        %s\n", eos.empty() ? "(none)" : eos.c_str());
    out += strfmt("stored dtype   %s\n", c.dtype.empty() ? "(not given)" : c.dtype.c_str());
    out += "tensors\n";
    const std::string layer0 = "model.layers.0.";
    for (const TensorInfo& t : w.tensors) {
        bool in_layer0 = t.name.compare(0, layer0.size(), layer0) == 0;
        if (t.name.compare(0, 13, "model.layers.") == 0 && !in_layer0) continue;
        std::string name = in_layer0 ? "model.layers.{0.." + std::to_string(c.num_layers - 1) + "}." + t.name.substr(layer0.size()) : t.name;
        out += strfmt("  %-56s %s\n", name.c_str(), shape_str(t.shape).c_str());
    }
    uint64_t n = w.num_params();
    out += strfmt("parameters     %s (%.3f M)\n", with_commas(n).c_str(), (double)n / 1e6);
    out += strfmt("bytes          %s as BF16, %s as the FP32 master buffer\n", with_commas(2 * n).c_str(),
                  with_commas(4 * (uint64_t)w.num_floats()).c_str());
    return out;
}

}  // namespace fp8rl
