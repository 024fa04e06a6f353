// decode_perf_model.h: a byte model of one decode step of rollout.cu on one H200, the prediction
// test/gpu/bench_rollout.cu prints beside what it measures. A decode step is bound by memory: it
// reads every weight once whatever its rows (the projections' FP8 codes or BF16 values, the BF16
// head), each row's K and V over its context (decode attention), and each row's logits a few times
// (sampling); the rest of its work is a few rows' worth of activations. So:
//   weights    projection bytes + head bytes, at perf_model.h's memory-bound bandwidth;
//   attention  rows x context x layers x 2 (K, V) x kv_dim x the cache's element bytes, less what
//              cascade attention saves (a group of G rows of one prompt reads its prefix once: G - 1
//              of G prefix reads), at
//              kDecodeAttentionEfficiency of HBM (kv_cache.cuh: cp.async tiles in their storage type,
//              double-buffered: FlashInfer's design, which runs near HBM bandwidth; our scores are
//              FP32 CUDA-core dot products, ~2 FMAs per byte of FP8 K/V, 30% of the H200's FP32 rate);
//   sampling   rows x vocabulary x kSamplingPasses FP32 reads at kSamplingSmBandwidth per SM, a block
//              per row (cuda/rollout/sampling.cuh's estimate: the max, the exp and sum, the inverse CDF's walk
//              without top-k or top-p), the rows' blocks side by side on the 132 SMs;
//   launches   per layer and around them, as the graph replays them, at perf_model.h's launch gap.
// Anchors, not measurements of this code: the first lent GPU checks them (dev/gpu_check.sh).
// With hw.gpu set (sass_hardware: the model that prices what the kernels execute), decode attention is
// priced from kv_decode_split_kernel's SASS (kernel_perf_model.h: the cascade CTAs' prefix tiles per group) against its bytes at the datasheet
// bandwidth, sampling by its bytes (the logits written by the head GEMM and read kSamplingPasses times)
// at that bandwidth, and a step launches kDecodeNodesPerLayer graph nodes per layer (perf-anchors.md's
// review counted 343 at Qwen3-1.7B: 12 x 28 + 7; 10 a layer since decode attention's split kernel
// merges the rows and writes the O projection's FP8 operand, as test_gpu's decode_graph_nodes_per_layer
// counts them in emulation). The merge's code outside loops is priced with every CTA's (an over-count:
// one CTA of a row's chunks x kv heads merges it); its loops, ~1% of a row's tile work, are not.
#pragma once
#include <algorithm>

#include "cuda/perf/perf_model.h"
#include "rl/model/config.h"
#include "rl/numerics/precision.h"

namespace fp8rl {

constexpr double kDecodeAttentionEfficiency = 0.7;  // of HBM: FlashInfer-like, below its ~0.8-0.9 (FP32 scores)
constexpr double kSamplingPasses = 3;               // over a row's FP32 logits or probabilities, uncut
constexpr double kSamplingSmBandwidth = 80e9;       // bytes/s a block streams from L2 (cuda/rollout/sampling.cuh)
constexpr int kSms = 132;
// graph nodes of a step; outside the layers: rows, embedding, final norm, logits, sampling, commit, refill
constexpr double kDecodeLaunchesPerLayer = 9, kDecodeLaunchesOutside = 7, kDecodeNodesPerLayer = 10;

struct DecodePrediction {
    double weights_s, attention_s, sampling_s, launches_s;
    double attention_bytes;  // what decode attention reads in one step
    double step_s() const { return weights_s + attention_s + sampling_s + launches_s; }
    double attention_bandwidth() const { return attention_bytes / attention_s; }
};

// One decode step of `rows` sequences at a mean context of `context` tokens, the first `prefix` of
// them shared by groups of `group` rows (the samples of a prompt; 1: none shared).
inline DecodePrediction predict_decode_step(const PerfHardware& hw, const ModelConfig& c, int rows, double context,
                                            Precision weights, Precision kv_cache, double prefix = 0, int group = 1) {
    const double L = (double)c.num_layers, V = (double)c.vocab_size, C = (double)c.hidden_size;
    const double projection_bytes = projection_params(c) * (weights == Precision::FP8 ? 1 + 4.0 / (128 * 128) : perf_detail::kBF16);
    const double kv_bytes = kv_cache == Precision::FP8 ? 1 : perf_detail::kBF16;
    DecodePrediction p{};
    p.weights_s = (projection_bytes + V * C * perf_detail::kBF16) / hw.bandwidth();
    const double keys_read = context - prefix * (1 - 1.0 / std::max(group, 1));  // per row
    p.attention_bytes = rows * keys_read * L * 2 * (double)c.kv_dim() * kv_bytes;
    if (hw.gpu) {  // the per-row and cascade launches of the split kernel, per layer
        const KernelPrice a = decode_attention_price(*hw.gpu, kv_cache == Precision::FP8, rows, context, (int)c.num_heads,
                                                     (int)c.num_kv_heads, (int)c.head_dim, p.attention_bytes / L, 0, prefix, group);
        p.attention_s = L * a.seconds();
        p.sampling_s = rows * V * perf_detail::kF32 * (1 + kSamplingPasses) / hw.hbm;
        p.launches_s = (L * kDecodeNodesPerLayer + kDecodeLaunchesOutside) * hw.launch_s;
        return p;
    }
    p.attention_s = p.attention_bytes / (hw.hbm * kDecodeAttentionEfficiency);
    const double waves = std::ceil(rows / (double)kSms);  // a block per row
    p.sampling_s = waves * V * perf_detail::kF32 * kSamplingPasses / kSamplingSmBandwidth;
    p.launches_s = (L * kDecodeLaunchesPerLayer + kDecodeLaunchesOutside) * hw.launch_s;
    return p;
}

}  // namespace fp8rl
