// fp8_export.h: --save_format fp8: the engine's FP8 weight copy written as the block-FP8 HF format
// that vLLM, SGLang and transformers read for DeepSeek-V3 and Qwen3-*-FP8:
//   each projection X.weight [N, K]    F8_E4M3, the trained copy's codes bit for bit;
//   X.weight_scale_inv [ceil(N/128), ceil(K/128)]  F32, W = code x scale_inv per 128x128 tile;
//   norms, embeddings, biases and the head in BF16 (the master rounded, as save_hf writes them);
//   config.json with quantization_config {quant_method fp8, fmt e4m3, activation_scheme dynamic,
//   weight_block_size [128, 128]}.
// The engines hold the fused projections [q|k|v] and [gate|up] as one matrix each, tiled from row
// 0; a HF tensor starting at a multiple of 128 rows inside it takes its rows' codes and tiles as they
// are (a last partial tile keeps the shared tile's scale, which covers it). One starting elsewhere
// (e.g. v_proj when q and k hold 192 rows) cannot be cut out of the tiles: it is quantized again
// from the FP32 master on its own tiles, with the engine's rule, and the caller is told in one line.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "rl/common.h"
#include "rl/io/json.h"
#include "rl/io/safetensors.h"
#include "rl/numerics/bf16.h"
#include "rl/numerics/fp8_block.h"
#include "rl/model/weights.h"

namespace fp8rl {

// --save_format: what a checkpoint's HF files hold. both = bf16 in the checkpoint directory and the
// fp8 export in its subdirectory fp8/.
enum class SaveFormat { BF16, FP8, Both };

inline SaveFormat parse_save_format(const std::string& s) {
    if (s == "bf16") return SaveFormat::BF16;
    if (s == "fp8") return SaveFormat::FP8;
    if (s == "both") return SaveFormat::Both;
    fail("--save_format %s: must be one of bf16, fp8, both", s.c_str());
}

// A HF tensor inside one of the engines' fused projections: rows [row0, row0 + rows) of projection j.
struct FusedPart {
    int projection;  // the engines' order (cpu/model.h Projection): 0 [q|k|v], 1 o, 2 [gate|up], 3 down
    std::string suffix;
    int64_t row0, rows;
};

inline std::vector<FusedPart> fused_projection_parts(const ModelConfig& c) {
    const int64_t Q = c.q_dim(), KV = c.kv_dim(), I = c.intermediate_size, C = c.hidden_size;
    return {{0, "self_attn.q_proj.weight", 0, Q},   {0, "self_attn.k_proj.weight", Q, KV},
            {0, "self_attn.v_proj.weight", Q + KV, KV}, {1, "self_attn.o_proj.weight", 0, C},
            {2, "mlp.gate_proj.weight", 0, I},      {2, "mlp.up_proj.weight", I, I},
            {3, "mlp.down_proj.weight", 0, C}};
}
constexpr int kFusedProjections = 4;

// One exported FP8 tensor: codes [rows][K] and scales [ceil(rows/128)][ceil(K/128)].
struct Fp8Export {
    std::vector<uint8_t> codes;
    std::vector<float> scale_inv;
};

// Rows [row0, row0 + rows) of a 128x128-block tensor q (row0 a multiple of 128), its scale grid
// without the layout's padding.
inline Fp8Export fp8_block_rows(const Fp8Tensor& q, int64_t row0, int64_t rows) {
    if (q.layout != Fp8Layout::Blk128x128 || row0 % FP8_BLOCK) fail("internal: fp8_block_rows needs 128x128 blocks at a tile row");
    Fp8Export e;
    const int64_t K = q.cols, kb = fp8_num_blocks(q.cols);
    e.codes.assign(q.data.begin() + row0 * K, q.data.begin() + (row0 + rows) * K);
    for (int64_t rb = row0 / FP8_BLOCK; rb < (row0 + rows + FP8_BLOCK - 1) / FP8_BLOCK; rb++)
        for (int64_t b = 0; b < kb; b++) e.scale_inv.push_back(q.scale_inv[blk128_scale_index((int)rb, (int)b, q.cols)]);
    return e;
}

inline Json quantization_config_json() {
    return json_parse("{\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", \"activation_scheme\": \"dynamic\", "
                      "\"weight_block_size\": [128, 128]}",
                      "quantization_config");
}

// Writes the FP8 export into the existing directory `dir`: table gives the config and tensor layout,
// master [num_floats] the FP32 master weights, copies [L * kFusedProjections] the engine's FP8 copies
// (128x128 blocks), pow2 whether its scales are powers of two (--fp8_scales pow2, for the tensors
// quantized again). Side files are copied from source_dir. Returns the notice line ("" if none).
inline std::string write_fp8_hf_files(const ModelWeights& table, const std::vector<float>& master,
                                      const std::vector<Fp8Tensor>& copies, const std::string& dir,
                                      const std::string& source_dir, bool pow2) {
    const ModelConfig& c = table.config;
    if (master.size() != table.num_floats()) fail("internal: the FP8 export got %zu master floats for %zu", master.size(), table.num_floats());
    if (copies.size() != (size_t)c.num_layers * kFusedProjections)
        fail("internal: the FP8 export got %zu weight copies for %lld layers", copies.size(), (long long)c.num_layers);
    std::vector<Fp8Export> fp8;  // kept alive until written
    fp8.reserve((size_t)c.num_layers * 7);
    std::vector<std::vector<uint8_t>> bf16;
    std::vector<TensorToWrite> out;
    std::vector<std::string> requantized;
    std::map<std::string, bool> projection_names;
    for (int64_t l = 0; l < c.num_layers; l++)
        for (const FusedPart& p : fused_projection_parts(c)) {
            const TensorInfo& t = table.tensor(layer_tensor_name(l, p.suffix));
            const Fp8Tensor& q = copies[(size_t)l * kFusedProjections + p.projection];
            const int64_t K = t.shape[1];
            if (q.layout != Fp8Layout::Blk128x128 || q.cols != K || p.row0 + p.rows > q.rows)
                fail("internal: FP8 copy of layer %lld projection %d is not the 128x128-block fused matrix", (long long)l, p.projection);
            if (p.row0 % FP8_BLOCK == 0) {
                fp8.push_back(fp8_block_rows(q, p.row0, p.rows));
            } else {
                fp8.push_back(fp8_block_rows(fp8_quantize_blockwise(master.data() + t.offset, (int)p.rows, (int)K, pow2), 0, p.rows));
                if (l == 0) requantized.push_back(strfmt("%s (from row %lld)", p.suffix.c_str(), (long long)p.row0));
            }
            projection_names[t.name] = true;
            out.push_back({t.name, DType::F8_E4M3, t.shape, fp8.back().codes.data()});
            out.push_back({t.name + "_scale_inv", DType::F32, {(p.rows + FP8_BLOCK - 1) / FP8_BLOCK, (K + FP8_BLOCK - 1) / FP8_BLOCK},
                           fp8.back().scale_inv.data()});
        }
    bf16.reserve(table.tensors.size());
    for (const TensorInfo& t : table.tensors) {
        if (projection_names.count(t.name)) continue;
        bf16.emplace_back(2 * t.numel);
        for (size_t k = 0; k < t.numel; k++) {
            uint16_t h = float_to_bf16(master[t.offset + k]);
            bf16.back()[2 * k] = (uint8_t)(h & 0xFF), bf16.back()[2 * k + 1] = (uint8_t)(h >> 8);
        }
        out.push_back({t.name, DType::BF16, t.shape, bf16.back().data()});
    }
    write_checkpoint_weights(dir, out);
    Json config = config_json_for_writing(c);
    bool set = false;
    for (auto& kv : config.fields)
        if (kv.first == "quantization_config") kv.second = quantization_config_json(), set = true;
    if (!set) config.fields.emplace_back("quantization_config", quantization_config_json());
    write_file_atomic(dir + "/config.json", json_dump(config, 2) + "\n");
    copy_hf_side_files(source_dir, dir);
    if (requantized.empty()) return "";
    std::string names;
    for (const std::string& r : requantized) names += (names.empty() ? "" : ", ") + r;
    return "  fp8 export: " + names + " not at a multiple of 128 rows of its fused projection: quantized again on its own "
           "128x128 tiles from the FP32 master, in every layer";
}

}  // namespace fp8rl
