// kv_cache.h: the key/value cache of generation. Per layer it holds K (after k-norm and RoPE) and
// V of every (slot, position), as the chosen format stores them: FP32, BF16, or FP8 E4M3 with one
// scale per layer for K and one for V (spec-fp8.md §9), or, with --kv_scales head, one per layer and
// KV head (the option §9.1 allows: a head whose values are small keeps its precision). Values are kept as the FP32 numbers the
// stored bytes decode to, FP8 ones without their scale (the code's value, kept()): attention applies
// the scale where the GPU kernels apply it (head_scales), so the emulation is exact.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "rl/numerics/bf16.h"
#include "rl/common.h"
#include "rl/numerics/fp8.h"
#include "rl/numerics/kv_scales.h"
#include "rl/numerics/precision.h"

namespace fp8rl {

struct KvCache {
    Precision format = Precision::BF16;
    int layers = 0;
    int max_len = 0;  // positions per slot
    long slots = 0;
    int width = 0;                   // KV * D
    std::vector<float> k, v;         // [layers, slots * max_len, width]
    // FP8 only: [layers][groups], scale g of a layer for columns [g, g + 1) * width / groups (groups
    // 1: per layer; KV: per KV head)
    std::vector<float> k_scale, v_scale;
    int groups = 1;

    // Sizes the cache; allocates only when it grows.
    void allocate(int n_layers, long n_slots, int len, int kv_width, Precision fmt) {
        format = fmt;
        layers = n_layers;
        slots = n_slots;
        max_len = len;
        width = kv_width;
        size_t n = (size_t)layers * slots * max_len * width;
        if (k.size() < n) {
            k.resize(n);
            v.resize(n);
        }
        groups = 1;
        k_scale.assign(layers, 1.0f);
        v_scale.assign(layers, 1.0f);
    }

    // FP8 scales [layers][groups] (from kv_scale_from_amax of the trainer's calibration): groups 1 per
    // layer, or one per KV head.
    void set_scales(const std::vector<float>& ks, const std::vector<float>& vs) {
        const int g = layers > 0 ? (int)(ks.size() / layers) : 0;
        if (ks.size() != vs.size() || g < 1 || ks.size() != (size_t)g * layers || width % g != 0)
            fail("KV cache: %zu/%zu scales given for %d layers of width %d (need layers x groups, groups dividing "
                 "the width)", ks.size(), vs.size(), layers, width);
        groups = g;
        k_scale = ks;
        v_scale = vs;
    }

    long row(long slot, long pos) const { return slot * max_len + pos; }
    float* keys(int layer) { return k.data() + (size_t)layer * slots * max_len * width; }
    float* values(int layer) { return v.data() + (size_t)layer * slots * max_len * width; }

    // The value the stored bytes for x stand for.
    float stored(float x, float scale) const { return format == Precision::FP8 ? kept(x, scale) * scale : kept(x, scale); }
    // What the cache keeps for x: the stored value, FP8's without its scale (the E4M3 code's value).
    float kept(float x, float scale) const {
        if (format == Precision::FP32) return x;
        if (format == Precision::BF16) return round_bf16(x);
        return e4m3_to_float(float_to_e4m3(x / scale));
    }
    // Layer `layer`'s K (key) or V scale of each KV head [kv_heads]: what multiplies the kept values
    // (1 unless FP8).
    std::vector<float> head_scales(int layer, int kv_heads, bool key) const {
        std::vector<float> s((size_t)kv_heads, 1.0f);
        if (format != Precision::FP8) return s;
        const float* scales = (key ? k_scale : v_scale).data() + (size_t)layer * groups;
        for (int h = 0; h < kv_heads; h++) s[(size_t)h] = scales[groups > 1 ? h * groups / kv_heads : 0];
        return s;
    }

    // Writes T rows of K and V [T, width] of `layer` at cache rows row_index[t].
    void store(int layer, long T, const int64_t* row_index, const float* kt, const float* vt) {
        float* K = keys(layer);
        float* V = values(layer);
        const float* ks = k_scale.data() + (size_t)layer * groups;
        const float* vs = v_scale.data() + (size_t)layer * groups;
        const int group_width = width / groups;
#pragma omp parallel for schedule(static)
        for (long t = 0; t < T; t++)
            for (int i = 0; i < width; i++) {
                K[row_index[t] * width + i] = kept(kt[t * width + i], ks[i / group_width]);
                V[row_index[t] * width + i] = kept(vt[t * width + i], vs[i / group_width]);
            }
    }
};

// --train_kv_replay: k and v [T][kv_heads * D] of one layer, in place, through the FP8 cache with
// these scales ([kv_heads]), in two steps around the training attention:
//   ToCodes   x -> the value of the E4M3 code of x / scale: what the rollout's cache kept (exact in
//             BF16); attention then reads it with the scales as decode does (attention_forward_packed);
//   ToStored  code -> code x scale, the value decode's products stand for, rounded to BF16 when the
//             activations are BF16 tensors: what the backward reads (straight through: attention's dK
//             and dV flow to K and V as they were).
// The GPU's twin is cuda/kernels/kv_replay.cuh.
enum class KvReplayStep { ToCodes, ToStored };
inline void kv_fp8_replay(float* k, float* v, long T, int kv_heads, int D, const float* k_scale, const float* v_scale,
                          KvReplayStep step, bool bf16) {
    auto trip = [step, bf16](float x, float s) {
        if (step == KvReplayStep::ToCodes) return e4m3_to_float(float_to_e4m3(x / s));
        return bf16 ? round_bf16(x * s) : x * s;
    };
    const long width = (long)kv_heads * D;
    for (long i = 0; i < T * width; i++) {
        const int h = (int)(i % width / D);
        k[i] = trip(k[i], k_scale[h]);
        v[i] = trip(v[i], v_scale[h]);
    }
}

}  // namespace fp8rl
