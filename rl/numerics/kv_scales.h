// kv_scales.h: the FP8 KV cache's scales from the K and V amax of a forward over the prompts
// (spec-fp8.md §9.4), one rule for both engines (cpu/engine_cpu.h, rollout.cu). Data parallel, each
// rank sees only its own prompts: the amaxes go through a reducer the driver hands the engine (the
// max over the ranks, EngineOptions::kv_amax_reduce) before they become scales. The max is exact and
// order independent, so N ranks get bit for bit the scales one rank gets over all their prompts, and
// generate what it generates.
#pragma once
#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "rl/numerics/fp8.h"

namespace fp8rl {

// In place: amax[i] = its max over the ranks (every rank calls it, with the same size). Empty: this
// rank alone (one process, tests).
using KvAmaxReduce = std::function<void(std::vector<float>& amax)>;

// The FP8 KV scale for an observed amax (spec-fp8.md §9.4): stored = e4m3(x / scale), read back as
// code * scale; scale = 1.05 * amax / 448, and 1 when amax is zero, infinite or NaN (§4.1 guards).
inline float kv_scale_from_amax(float amax) {
    if (!(amax > 0.0f) || std::isinf(amax)) return 1.0f;
    return 1.05f * amax / E4M3_MAX;
}

// Scales [layers] (a layer's amax: the max over its KV heads) or [layers][kv_heads] (per_head) from
// this rank's k_amax and v_amax [layers][kv_heads], reduced over the ranks first.
inline void kv_scales_from_amax(const float* k_amax, const float* v_amax, int layers, int kv_heads, bool per_head,
                                const KvAmaxReduce& reduce, std::vector<float>& k_scale, std::vector<float>& v_scale) {
    const size_t groups = per_head ? (size_t)kv_heads : 1, n = (size_t)layers * groups;
    std::vector<float> amax(2 * n, 0.0f);  // [K, V][layers][groups]: one collective for both
    for (size_t l = 0; l < (size_t)layers; l++)
        for (size_t h = 0; h < (size_t)kv_heads; h++) {
            const size_t g = l * groups + (per_head ? h : 0), i = l * (size_t)kv_heads + h;
            amax[g] = std::max(amax[g], k_amax[i]);
            amax[n + g] = std::max(amax[n + g], v_amax[i]);
        }
    if (reduce) reduce(amax);
    k_scale.resize(n);
    v_scale.resize(n);
    for (size_t g = 0; g < n; g++) k_scale[g] = kv_scale_from_amax(amax[g]), v_scale[g] = kv_scale_from_amax(amax[n + g]);
}

// Scales [layers] or [layers][kv_heads] laid out [layers][kv_heads] (a layer's scale repeated over
// its heads): the one layout the engines' --train_kv_replay reads, as the FP8 cache's kernels do.
inline std::vector<float> kv_scales_by_head(const std::vector<float>& scale, int layers, int kv_heads) {
    const size_t per_layer = layers > 0 ? scale.size() / (size_t)layers : 0;
    std::vector<float> out((size_t)layers * kv_heads);
    for (size_t i = 0; i < out.size(); i++) out[i] = scale[i / kv_heads * per_layer + (per_layer > 1 ? i % kv_heads : 0)];
    return out;
}

}  // namespace fp8rl
