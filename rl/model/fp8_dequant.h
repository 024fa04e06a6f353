// fp8_dequant.h: reading FP8-quantized HF checkpoints (DeepSeek-V3, Qwen3-*-FP8, what vLLM, SGLang and
// transformers load) into FP32. A projection `X.weight` stored as F8_E4M3 (or F8_E5M2) comes with
//   X.weight_scale_inv  F32/BF16 [ceil(N/bn), ceil(K/bk)], (bn, bk) = config.json's
//                       quantization_config.weight_block_size: W[n][k] = code x scale_inv[n/bn][k/bk]
//                       (one element, or shape [] / [1]: one multiplier for the whole tensor);
//   X.weight_scale      F32/BF16, one element (per tensor) or [N] / [N, 1] (per output channel):
//                       W = code x weight_scale (the fbgemm_fp8 / compressed-tensors convention).
// Anything else (no scale, a scale of another shape, an unknown quant_method) is refused by name.
//
// Round trip: the engines quantize the FP32 master in 128x128 tiles with scale = fl(448 / amax)
// (rl/numerics/fp8_block.h), and a tile written by --save_format fp8 holds scale_inv = fl(1/scale).
// Its dequantized amax fl(448 x scale_inv) need not give that scale back (about 7% of tiles miss by
// an ulp), so in a 128x128 tile whose largest code is 448 those largest elements are set to the
// nearest value that does: the engine's FP8 copy of a tensor tiled as the file is then the file's
// codes and scales exactly, and its log-probs those of the run that wrote it. The change is a few
// ulps of FP32 on at most a few elements per tile.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "rl/common.h"
#include "rl/io/json.h"
#include "rl/io/safetensors.h"
#include "rl/numerics/bf16.h"
#include "rl/numerics/fp8.h"
#include "rl/numerics/fp8_block.h"

namespace fp8rl {

// How a stored FP8 weight is scaled.
struct Fp8WeightFormat {
    const TensorView* scale = nullptr;  // weight_scale_inv or weight_scale
    int64_t block_rows = 0, block_cols = 0;  // > 0: block scales of this tile; else per tensor or channel
    bool per_channel = false;
};

// A scale tensor's values as FP32 (F32 or BF16, as the files store them).
inline std::vector<float> fp8_scale_values(const TensorView& s) {
    if (s.dtype != DType::F32 && s.dtype != DType::BF16)
        fail("%s: scale tensor %s is %s; FP8 scales must be F32 or BF16", s.file.c_str(), s.name.c_str(), dtype_name(s.dtype));
    std::vector<float> v((size_t)s.numel);
    for (size_t i = 0; i < v.size(); i++) {
        if (s.dtype == DType::F32) memcpy(&v[i], s.data + 4 * i, 4);
        else v[i] = bf16_to_float((uint16_t)(s.data[2 * i] | (s.data[2 * i + 1] << 8)));
    }
    return v;
}

// config.json's quantization_config.weight_block_size as (rows, cols); (0, 0) when absent. A
// quant_method other than the FP8 ones is refused: its tensors would be read wrongly.
inline void fp8_block_size(const Json& config, const std::string& dir, int64_t* rows, int64_t* cols) {
    *rows = *cols = 0;
    const Json* q = config.find("quantization_config");
    if (!q) return;
    const Json* method = q->find("quant_method");
    if (method && method->is_string() && method->str != "fp8" && method->str != "fbgemm_fp8" && method->str != "compressed-tensors")
        fail("%s/config.json: quantization_config.quant_method %s is not an FP8 format fp8rl reads (fp8, fbgemm_fp8, "
             "compressed-tensors); load a BF16 checkpoint", dir.c_str(), json_quote(method->str).c_str());
    const Json* b = q->find("weight_block_size");
    if (!b || b->is_null()) return;
    if (!b->is_array() || b->items.size() != 2 || !b->items[0].is_int() || !b->items[1].is_int() || b->items[0].integer <= 0 ||
        b->items[1].integer <= 0)
        fail("%s/config.json: quantization_config.weight_block_size must be [rows, cols] of positive integers", dir.c_str());
    *rows = b->items[0].integer, *cols = b->items[1].integer;
}

// The scale of FP8 weight `w` [N, K] found in `find` (name -> tensor or nullptr), checked.
template <class Find>
Fp8WeightFormat fp8_weight_format(const TensorView& w, const Find& find, int64_t block_rows, int64_t block_cols) {
    const std::string base = w.name.size() > 7 && w.name.compare(w.name.size() - 7, 7, ".weight") == 0 ? w.name : "";
    if (base.empty() || w.shape.size() != 2)
        fail("%s: tensor %s is %s but not a 2-D *.weight; fp8rl reads FP8 only for projection weights", w.file.c_str(),
             w.name.c_str(), dtype_name(w.dtype));
    const int64_t N = w.shape[0], K = w.shape[1];
    Fp8WeightFormat f;
    if (const TensorView* s = find(base + "_scale_inv")) {
        f.scale = s;
        const int64_t br = std::max<int64_t>(block_rows, 1), bc = std::max<int64_t>(block_cols, 1);
        const std::vector<int64_t> want = {(N + br - 1) / br, (K + bc - 1) / bc};
        if (block_rows > 0 && s->shape == want) {
            f.block_rows = block_rows, f.block_cols = block_cols;
            return f;
        }
        if (s->numel == 1 && s->shape.size() <= 2) return f;
        if (block_rows <= 0)
            fail("%s: %s has shape %s but config.json gives no quantization_config.weight_block_size; cannot tell its blocks",
                 s->file.c_str(), s->name.c_str(), shape_str(s->shape).c_str());
        fail("%s: %s has shape %s; weight %s at weight_block_size [%lld, %lld] needs %s", s->file.c_str(), s->name.c_str(),
             shape_str(s->shape).c_str(), shape_str(w.shape).c_str(), (long long)block_rows, (long long)block_cols,
             shape_str(want).c_str());
    }
    if (const TensorView* s = find(base + "_scale")) {
        f.scale = s;
        if (s->numel == 1 && s->shape.size() <= 2) return f;
        if (s->shape == std::vector<int64_t>{N} || s->shape == std::vector<int64_t>{N, 1}) {
            f.per_channel = true;
            return f;
        }
        fail("%s: %s has shape %s; a per-tensor scale has one element, a per-channel one [%lld] or [%lld, 1]", s->file.c_str(),
             s->name.c_str(), shape_str(s->shape).c_str(), (long long)N, (long long)N);
    }
    fail("%s: FP8 tensor %s has no scale (%s_scale_inv or %s_scale); the checkpoint is incomplete", w.file.c_str(),
         w.name.c_str(), base.c_str(), base.c_str());
}

// The amax whose engine scale fl(448 / amax) has fl(1 / scale) == scale_inv, nearest 448 x
// scale_inv; 0 when none is within a few ulps (the tile is then left as the definition gives it).
inline float amax_reproducing_scale_inv(float scale_inv) {
    for (int ds = 0; ds <= 4; ds++)
        for (int sign : {1, -1}) {
            float scale = 1.0f / scale_inv;
            for (int i = 0; i < ds; i++) scale = std::nextafter(scale, sign > 0 ? INFINITY : 0.0f);
            if (!(scale > 0.0f) || !std::isfinite(scale) || 1.0f / scale != scale_inv) continue;
            for (int da = 0; da <= 4; da++)
                for (int sa : {1, -1}) {
                    float amax = E4M3_MAX * scale_inv;
                    for (int i = 0; i < da; i++) amax = std::nextafter(amax, sa > 0 ? INFINITY : 0.0f);
                    if (amax > 0.0f && std::isfinite(amax) && fp8_scale_from_amax(amax, false) == scale &&
                        float_to_e4m3(amax * scale) == 0x7E)
                        return amax;
                }
        }
    return 0.0f;
}

// Dequantizes FP8 weight w [N, K] with format f into out [N * K].
inline void fp8_dequantize_weight(const TensorView& w, const Fp8WeightFormat& f, float* out) {
    const Fp8Format fmt = w.dtype == DType::F8_E4M3 ? Fp8Format::E4M3 : Fp8Format::E5M2;
    const int64_t N = w.shape[0], K = w.shape[1];
    const std::vector<float> s = fp8_scale_values(*f.scale);
    for (float x : s)
        if (!std::isfinite(x)) fail("%s: %s holds a non-finite scale; the checkpoint is damaged", f.scale->file.c_str(), f.scale->name.c_str());
    const int64_t col_blocks = f.block_rows > 0 ? (K + f.block_cols - 1) / f.block_cols : 0;
    auto scale_of = [&](int64_t n, int64_t k) {
        return f.block_rows > 0 ? s[(size_t)((n / f.block_rows) * col_blocks + k / f.block_cols)] : f.per_channel ? s[(size_t)n] : s[0];
    };
#pragma omp parallel for schedule(static) if (N * K > (1 << 20))
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) out[n * K + k] = fp8_to_float(w.data[n * K + k], fmt) * scale_of(n, k);
    if (fmt != Fp8Format::E4M3 || f.block_rows != FP8_BLOCK || f.block_cols != FP8_BLOCK) return;
    for (int64_t rb = 0; rb * FP8_BLOCK < N; rb++)  // the round trip's tiles (header comment)
        for (int64_t kb = 0; kb * FP8_BLOCK < K; kb++) {
            const int64_t r1 = std::min(N, (rb + 1) * FP8_BLOCK), c1 = std::min(K, (kb + 1) * FP8_BLOCK);
            bool has_max = false;
            for (int64_t n = rb * FP8_BLOCK; n < r1 && !has_max; n++)
                for (int64_t k = kb * FP8_BLOCK; k < c1; k++) has_max |= (w.data[n * K + k] & 0x7F) == 0x7E;
            const float amax = has_max ? amax_reproducing_scale_inv(scale_of(rb * FP8_BLOCK, kb * FP8_BLOCK)) : 0.0f;
            if (amax == 0.0f) continue;
            for (int64_t n = rb * FP8_BLOCK; n < r1; n++)
                for (int64_t k = kb * FP8_BLOCK; k < c1; k++)
                    if ((w.data[n * K + k] & 0x7F) == 0x7E) out[n * K + k] = w.data[n * K + k] & 0x80 ? -amax : amax;
        }
}

}  // namespace fp8rl
