// grpo_perf_model.h: one GRPO step of the GPU engine (rollout, then one training update) on one GPU,
// priced by what the kernels execute (sass_hardware: kernel_perf_model.h), the shape of
// perf-anchors.md: 64 prompts x 8 samples, prompts of 256 tokens, responses 176..1,024 (uniform, mean
// 600), one minibatch and one epoch (so no old-log-prob pass: driver.h), across `gpus` GPUs (data
// parallel: each GPU decodes and trains its share of the sequences).
//   prefill   the prompts' forward (perf_model.h's forward kernels without the LM head, which reads
//             only the last position: one head GEMM over the prompts' last rows)
//   decode    one decode step per new token, the rows still running (all sequences start together:
//             --rollout_slots 0 fits them), at the step's context: decode_perf_model.h (weights, decode
//             attention, sampling, graph nodes); the prompt's 256 keys shared by a prompt's 8 samples
//             (cascade attention reads them once a group)
//   train     update_perf_model.h: the fused step over the GPU's tokens (prompts + responses) in
//             micro-batches of 16,384 tokens, gradients accumulated, one AdamW update
// Not counted: host work, the reward, gradient all-reduce across GPUs, recomputation the memory plan
// may force (perf-anchors.md: +2.65 s at 1.7B on an 80 GB H100).
#pragma once
#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "cuda/perf/decode_perf_model.h"
#include "cuda/perf/perf_model.h"
#include "cuda/perf/update_perf_model.h"

namespace fp8rl {

constexpr int kCascadeGroupRows = 8;  // kv_cache.cuh's kCascadeRows: rows a cascade CTA serves

struct GrpoShape {
    int prompts = 64, group = 8, prompt_len = 256, response_min = 176, response_max = 1024, gpus = 1;
    int64_t micro_batch_tokens = 16384;
    double sequences() const { return (double)prompts * group / gpus; }
    double mean_response() const { return (response_min + response_max) / 2.0; }
};

struct GrpoPrediction {
    std::map<std::string, double> rollout, train;  // seconds per phase
    std::vector<PricedKernel> kernels;             // every kernel of the step, "rollout: " or "train: " first
    std::vector<KernelCost> train_gemms;           // one training micro-batch's projection GEMMs, per call
    double decode_attention_bytes = 0;             // the K/V bytes decode attention reads over the rollout
    double rollout_s() const {
        double t = 0;
        for (const auto& p : rollout) t += p.second;
        return t;
    }
    double train_s() const {
        double t = 0;
        for (const auto& p : train) t += p.second;
        return t;
    }
    double step_s() const { return rollout_s() + train_s(); }
};

namespace perf_detail {
// The live rows of a prompt's `group` samples when each is alive with probability `alive`: binomial.
inline double binomial(int n, int k, double p) {
    double c = 1;
    for (int i = 0; i < k; i++) c = c * (n - i) / (i + 1);
    return c * std::pow(p, k) * std::pow(1 - p, n - k);
}
// rollout.cu's decode_bucket: the rows padded to a power of two, at most the slots
inline double decode_bucket(double rows, double slots) {
    double b = 1;
    while (b < rows) b *= 2;
    return std::min(b, slots);
}
}  // namespace perf_detail

// anchors: price with these instead (the model before issue 47: assumed efficiencies, H200 rates)
inline GrpoPrediction predict_grpo_step(const GpuSpec& g, const ModelConfig& c, Precision p, Precision kv, const GrpoShape& s,
                                        const PerfHardware* anchors = nullptr) {
    using namespace perf_detail;
    const PerfHardware hw = anchors ? *anchors : sass_hardware(g);
    GrpoPrediction out;
    KernelTally tally;
    const double rows0 = s.sequences(), prompts = rows0 / s.group;
    // prefill: the forward kernels of the prompts, one micro-batch of all of them
    StepShape prefill;
    prefill.model = c, prefill.seq_len = s.prompt_len, prefill.tokens = (int64_t)std::llround(rows0) * s.prompt_len;
    prefill.training = false;
    for (const KernelCost& k : step_kernels(hw, prefill, p, StepStructure::Fused))
        if (k.phase == StepPhase::Forward && k.cls != KernelClass::HeadGemm && k.cls != KernelClass::HeadSoftmax) {
            out.rollout["prefill"] += k.seconds(hw);
            tally.add("rollout: prefill: ", k, hw);
        }
    const KernelCost head = gemm_cost(hw, "LM head GEMM", KernelClass::HeadGemm, c.vocab_size, (int64_t)rows0, c.hidden_size,
                                      Precision::BF16, GemmOutput::F32);
    out.rollout["prefill"] += head.call_seconds(hw);
    tally.add("rollout: prefill: ", head, hw);
    // decode: step t (1-based) runs the sequences whose response is at least t tokens long; a prompt's
    // live samples form a cascade group when they are 2 or more (rollout.cu's write_cascade_groups)
    const int G = std::min(s.group, kCascadeGroupRows);
    for (int t = 1; t <= s.response_max; t++) {
        const double alive = t <= s.response_min ? 1.0 : (double)(s.response_max - t + 1) / (s.response_max - s.response_min + 1);
        const double rows = std::max(1.0, (double)std::lround(rows0 * alive));
        DecodeStep d;
        d.rows = rows, d.grid_rows = decode_bucket(rows, rows0), d.context = s.prompt_len + t, d.max_len = s.prompt_len + s.response_max;
        if (p == Precision::FP8) d.pad_rows = std::max(0.0, std::ceil(d.grid_rows / 128) * 128 - d.grid_rows);
        if (G > 1) {
            double grouped = 0, members = 0;  // P(X >= 2), E[X; X >= 2] of a prompt's live rows X
            for (int k = 2; k <= G; k++) grouped += binomial(G, k, alive), members += k * binomial(G, k, alive);
            d.prefix = s.prompt_len, d.cascade_groups = prompts * grouped, d.group_members = grouped > 0 ? members / grouped : 0;
        }
        const DecodePrediction dp = predict_decode_step(hw, c, d, p, kv);
        out.rollout["decode weights"] += dp.weights_s;
        out.rollout["decode attention"] += dp.attention_s;
        out.decode_attention_bytes += dp.attention_bytes;
        out.rollout["sampling"] += dp.sampling_s;
        out.rollout["decode launches"] += dp.launches_s;
        for (const PricedKernel& k : dp.kernels)
            tally.add("rollout: decode: " + k.name, k.calls, k.seconds, k.bytes, k.flops, k.bound());
    }
    // training: the GPU's tokens in micro-batches, one optimizer update
    const int64_t seq_len = (int64_t)std::lround(s.prompt_len + s.mean_response());
    const UpdatePrediction u = predict_update(hw, c, p, rows0 * seq_len, seq_len, s.micro_batch_tokens);
    out.train = u.phases;
    for (const PricedKernel& k : u.kernels) tally.add("train: ", k);
    for (const KernelCost& k : u.step)
        if (k.cls == KernelClass::LayerGemm) out.train_gemms.push_back(k);
    // data parallel: the FP32 gradients all-reduced over NVLink (NCCL: 2 (n - 1) / n of the bytes at the
    // bus bandwidth; gpu_spec.h)
    if (s.gpus > 1 && !anchors) {
        size_t params = 0;
        tensor_layout(c, &params);
        const double bytes = (double)params * perf_detail::kF32, seconds = bytes * 2 * (s.gpus - 1) / s.gpus / g.nccl_bus_bandwidth;
        out.train["gradient all-reduce"] = seconds;
        tally.add("train: gradient all-reduce (NCCL)", 1, seconds, bytes, 0, "nvlink");
    }
    out.kernels = tally.kernels();
    return out;
}

}  // namespace fp8rl
