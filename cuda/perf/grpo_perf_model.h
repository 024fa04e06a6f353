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

struct GrpoShape {
    int prompts = 64, group = 8, prompt_len = 256, response_min = 176, response_max = 1024, gpus = 1;
    int64_t micro_batch_tokens = 16384;
    double sequences() const { return (double)prompts * group / gpus; }
    double mean_response() const { return (response_min + response_max) / 2.0; }
};

struct GrpoPrediction {
    std::map<std::string, double> rollout, train;  // seconds per phase
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

// anchors: price with these instead (the model before issue 47: assumed efficiencies, H200 rates)
inline GrpoPrediction predict_grpo_step(const GpuSpec& g, const ModelConfig& c, Precision p, Precision kv, const GrpoShape& s,
                                        const PerfHardware* anchors = nullptr) {
    const PerfHardware hw = anchors ? *anchors : sass_hardware(g);
    GrpoPrediction out;
    const double rows0 = s.sequences();
    // prefill: the forward kernels of the prompts, one micro-batch of all of them
    StepShape prefill;
    prefill.model = c, prefill.seq_len = s.prompt_len, prefill.tokens = (int64_t)std::llround(rows0) * s.prompt_len;
    for (const KernelCost& k : step_kernels(hw, prefill, p, StepStructure::Fused))
        if (k.phase == StepPhase::Forward && k.cls != KernelClass::HeadGemm && k.cls != KernelClass::HeadSoftmax)
            out.rollout["prefill"] += k.seconds(hw);
    out.rollout["prefill"] += gemm_cost(hw, "head", KernelClass::HeadGemm, c.vocab_size, (int64_t)rows0, c.hidden_size,
                                        Precision::BF16, GemmOutput::F32).call_seconds(hw);
    // decode: step t (1-based) runs the sequences whose response is at least t tokens long
    for (int t = 1; t <= s.response_max; t++) {
        const double alive = t <= s.response_min ? 1.0 : (double)(s.response_max - t + 1) / (s.response_max - s.response_min + 1);
        const int rows = std::max(1, (int)std::lround(rows0 * alive));
        const DecodePrediction d = predict_decode_step(hw, c, rows, s.prompt_len + t, p, kv, s.prompt_len, s.group);
        out.rollout["decode weights"] += d.weights_s;
        out.rollout["decode attention"] += d.attention_s;
        out.rollout["sampling"] += d.sampling_s;
        out.rollout["decode launches"] += d.launches_s;
    }
    // training: the GPU's tokens in micro-batches, one optimizer update
    const int64_t seq_len = (int64_t)std::lround(s.prompt_len + s.mean_response());
    out.train = predict_update(hw, c, p, rows0 * seq_len, seq_len, s.micro_batch_tokens).phases;
    return out;
}

}  // namespace fp8rl
