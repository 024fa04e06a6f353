// decode_perf_model.h: one decode step of rollout.cu on one GPU, the prediction grpo_perf_model.h sums
// and test/gpu/bench_rollout.cu prints beside what it measures. A decode step reads every weight once
// whatever its rows, each row's K and V over its context (decode attention) and each row's logits a
// few times (sampling); its other work is a few rows' worth of activations. So, on a GPU (hw.gpu:
// sass_hardware, gpu_spec.h's constants):
//   GEMMs      the four projections of every layer and the BF16 LM head, each at its shape class
//              (perf_model.h's gemm_cost: few tokens make a GEMM memory-bound, its weight streamed by
//              only its CTAs: ceil(m / 128) x ceil(n / 128) of them), the FP8 GEMMs over the rows
//              padded to 128 as rollout.cu runs them;
//   attention  kv_cache.cuh's launches as issue 58 left them (kernel_perf_model.h's
//              decode_attention_price): the step's plan, then per layer the split kernel over the
//              rows' current lengths (L: the longest row rounded up to split_keys) and its cascade
//              launch, and the combine kernel by its bytes and its short latency chain;
//   sampling   the logits written by the head GEMM and read kSamplingPasses times, at the bandwidth;
//   launches   kDecodeNodesPerLayer graph nodes a layer and kDecodeNodesOutside around them.
// The norms, RoPE and SwiGLU of a few rows are priced by their graph nodes alone. Without hw.gpu: the
// anchors model before issue 47 (decode attention at kDecodeAttentionEfficiency of HBM).
#pragma once
#include <algorithm>
#include <cmath>

#include "cuda/perf/perf_model.h"
#include "rl/model/config.h"
#include "rl/numerics/precision.h"

namespace fp8rl {

constexpr double kDecodeAttentionEfficiency = 0.7;  // of HBM: FlashInfer-like, below its ~0.8-0.9 (FP32 scores)
constexpr double kSamplingPasses = 3;               // over a row's FP32 logits or probabilities, uncut
constexpr double kSamplingSmBandwidth = 80e9;       // bytes/s a block streams from L2 (cuda/rollout/sampling.cuh)
constexpr int kSms = 132;
// graph nodes of a step (rollout.cu's decode_launches); outside the layers: rows, embedding, the decode
// plan, final norm, logits, sampling, commit, refill; a layer: 11 (issue 58: the combine kernel is one).
// The anchors model (before issue 47) keeps its 9 launches a layer and 7 outside.
constexpr double kDecodeLaunchesPerLayer = 9, kDecodeLaunchesOutside = 7, kDecodeNodesPerLayer = 11, kDecodeNodesOutside = 8;

// One decode step's rows as rollout.cu launches them.
struct DecodeStep {
    double rows = 0;       // live rows
    double grid_rows = 0;  // the bucket: the plan's rows (idle rows have no keys); 0: rows
    double pad_rows = 0;   // the FP8 operand's rows past grid_rows (the combine writes their zero codes)
    double context = 0;    // a live row's keys
    double prefix = 0;     // of them, its prompt's, shared by its group's rows (cascade); 0: none
    double max_len = 0;    // the rollout's max_len (the grid's L is the rows' length rounded up, at most this); 0: context
    double cascade_groups = 0, group_members = 0;  // kernel_perf_model.h's DecodeAttentionShape
};

struct DecodePrediction {
    double weights_s = 0, attention_s = 0, sampling_s = 0, launches_s = 0;
    double attention_bytes = 0;         // what decode attention reads in one step
    std::vector<PricedKernel> kernels;  // on a GPU: each kernel of the step (GEMMs summed over the layers)
    double step_s() const { return weights_s + attention_s + sampling_s + launches_s; }
    double attention_bandwidth() const { return attention_bytes / attention_s; }
};

inline DecodePrediction predict_decode_step(const PerfHardware& hw, const ModelConfig& c, const DecodeStep& d,
                                            Precision weights, Precision kv_cache) {
    const double L = (double)c.num_layers, V = (double)c.vocab_size, C = (double)c.hidden_size, rows = d.rows;
    const double kv_bytes = kv_cache == Precision::FP8 ? 1 : perf_detail::kBF16;
    const double group = d.cascade_groups > 0 ? d.group_members : 1;
    DecodePrediction p;
    p.attention_bytes = rows * (d.context - d.prefix * (1 - 1.0 / std::max(group, 1.0))) * L * 2 * (double)c.kv_dim() * kv_bytes;
    if (!hw.gpu) {  // the anchors: every weight's bytes, decode attention at a fraction of HBM
        const double projection_bytes = projection_params(c) * (weights == Precision::FP8 ? 1 + 4.0 / (128 * 128) : perf_detail::kBF16);
        p.weights_s = (projection_bytes + V * C * perf_detail::kBF16) / hw.bandwidth();
        p.attention_s = p.attention_bytes / (hw.hbm * kDecodeAttentionEfficiency);
        p.sampling_s = std::ceil(rows / (double)kSms) * V * perf_detail::kF32 * kSamplingPasses / kSamplingSmBandwidth;
        p.launches_s = (L * kDecodeLaunchesPerLayer + kDecodeLaunchesOutside) * hw.launch_s;
        return p;
    }
    const GpuSpec& g = *hw.gpu;
    auto add = [&](const std::string& name, double calls, double seconds, double bytes, double flops, const char* bound) {
        p.kernels.push_back(PricedKernel{name, calls, seconds, bytes, flops, 0, {{bound, seconds}}});
    };
    // the projections over the rows the GEMMs run (FP8: padded to 128), the head over the rows
    const int64_t n = weights == Precision::FP8 ? (int64_t)std::ceil(rows / 128) * 128 : (int64_t)rows;
    const int64_t Cn = c.hidden_size, In = c.intermediate_size, Qn = c.q_dim(), Nn = c.q_dim() + 2 * c.kv_dim();
    const struct {
        const char* name;
        int64_t m, k;
    } projections[] = {{"QKV GEMM", Nn, Cn}, {"O GEMM", Cn, Qn}, {"gate|up GEMM", 2 * In, Cn}, {"down GEMM", Cn, In}};
    for (const auto& pr : projections) {
        KernelCost k = gemm_cost(hw, pr.name, KernelClass::LayerGemm, pr.m, n, pr.k, weights, GemmOutput::BF16);
        k.launches = 0;  // a graph node: counted with the launches
        p.weights_s += L * k.call_seconds(hw);
        add(pr.name, L, L * k.call_seconds(hw), L * k.bytes, L * k.work, k.bound(hw));
    }
    KernelCost head = gemm_cost(hw, "LM head GEMM", KernelClass::HeadGemm, c.vocab_size, (int64_t)rows, c.hidden_size,
                                Precision::BF16, GemmOutput::F32);
    head.launches = 0;
    p.weights_s += head.call_seconds(hw);
    add(head.name, 1, head.call_seconds(hw), head.bytes, head.work, head.bound(hw));
    // decode attention, every layer alike
    DecodeAttentionShape a;
    a.fp8_kv = kv_cache == Precision::FP8, a.H = (int)c.num_heads, a.KV = (int)c.num_kv_heads, a.D = (int)c.head_dim;
    a.grid_rows = std::max(d.grid_rows, rows), a.live_rows = rows, a.pad_rows = d.pad_rows;
    a.own_keys = d.context - d.prefix, a.prefix = d.prefix, a.max_len = d.max_len > 0 ? d.max_len : d.context;
    a.cascade_groups = d.cascade_groups, a.group_members = d.group_members;
    a.cascade_grid = d.cascade_groups > 0 ? std::floor(a.grid_rows / 2) : 0;  // rollout.cu: max_groups = rows / 2
    const DecodeAttentionPrice at = decode_attention_price(g, a);
    auto body = [](const KernelPrice& k) { return k.seconds() - k.launch_s; };  // graph nodes: gaps counted below
    const double per_row = body(at.per_row), cascade = body(at.cascade), combine = body(at.combine), plan = body(at.plan);
    p.attention_s = L * (per_row + cascade + combine) + plan;
    p.attention_bytes = L * at.bytes;
    add("kv_decode_plan_kernel", 1, plan, at.plan.hbm_s * g.bandwidth(), 0, at.plan.bound());
    add("kv_decode_split_kernel (per-row CTAs)", L, L * per_row, L * at.per_row.hbm_s * g.bandwidth(), 0, at.per_row.bound());
    if (a.cascade_grid > 0)
        add("kv_decode_split_kernel (cascade CTAs)", L, L * cascade, L * at.cascade.hbm_s * g.bandwidth(), 0, at.cascade.bound());
    add(at.combine_priced ? "kv_decode_combine_kernel" : "kv_decode_combine_kernel (no SASS found: bytes and latency only)", L,
        L * combine, L * at.combine.hbm_s * g.bandwidth(), 0, at.combine.bound());
    // sampling: the head's FP32 logits written, then read kSamplingPasses times
    const double sampling_bytes = rows * V * perf_detail::kF32 * (1 + kSamplingPasses);
    p.sampling_s = sampling_bytes / g.bandwidth();
    add("sampling", 1, p.sampling_s, sampling_bytes, 0, "hbm");
    const double nodes = L * kDecodeNodesPerLayer + kDecodeNodesOutside;
    p.launches_s = nodes * hw.launch_s;
    add("graph node gaps", nodes, p.launches_s, 0, 0, "launch");
    return p;
}

// `rows` live rows at `context` keys, the first `prefix` of them shared by groups of `group` rows (the
// samples of a prompt; 1: none shared), every row in the grid and in a full group.
inline DecodePrediction predict_decode_step(const PerfHardware& hw, const ModelConfig& c, int rows, double context,
                                            Precision weights, Precision kv_cache, double prefix = 0, int group = 1) {
    DecodeStep d;
    d.rows = rows, d.grid_rows = rows, d.context = context, d.max_len = context;
    if (group > 1) {
        d.prefix = prefix, d.cascade_groups = std::ceil(rows / (double)group);
        d.group_members = std::min<double>(group, rows);
    }
    return predict_decode_step(hw, c, d, weights, kv_cache);
}

}  // namespace fp8rl
