// update_perf_model.h: one optimizer update of the GPU engine on one GPU over T tokens in sequences of
// S, run in micro-batches of at most --micro_batch_tokens (gradients accumulated, one AdamW update):
// perf_model.h's fused step per micro-batch, priced as the caller's hardware says (sass_hardware:
// what the kernels execute). The training phase of a GRPO step (grpo_perf_model.h) and the whole of an
// SFT or CPT step (--mode sft|cpt: packed sequences, no rollout), by kernel class.
// Not counted: host work, the gradient all-reduce across GPUs, recomputation the memory plan may force.
#pragma once
#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "cuda/perf/perf_model.h"

namespace fp8rl {

struct UpdatePrediction {
    std::map<std::string, double> phases;  // seconds per kernel class
    std::vector<PricedKernel> kernels;     // every kernel over the micro-batches
    std::vector<KernelCost> step;          // one micro-batch's kernels, per call
    int micro_batches = 1;
    double seconds() const {
        double t = 0;
        for (const auto& p : phases) t += p.second;
        return t;
    }
};

inline UpdatePrediction predict_update(const PerfHardware& hw, const ModelConfig& c, Precision p, double tokens, int64_t seq_len,
                                       int64_t micro_batch_tokens) {
    StepShape s;
    s.model = c, s.seq_len = seq_len;
    s.micro_batches = std::max(1, (int)std::ceil(tokens / (double)micro_batch_tokens));
    s.tokens = (int64_t)std::ceil(tokens / s.micro_batches);
    const char* names[kKernelClasses] = {"projection GEMMs", "LM head GEMMs", "attention",  "FP8 quantization",
                                         "norms, RoPE, SwiGLU", "LM head softmax", "zeroing", "optimizer"};
    UpdatePrediction out;
    out.micro_batches = s.micro_batches;
    KernelTally tally;
    for (const KernelCost& k : step_kernels(hw, s, p, StepStructure::Fused)) {
        out.phases[names[(int)k.cls]] += s.micro_batches * k.seconds(hw);
        tally.add("", k, hw, s.micro_batches);
    }
    out.kernels = tally.kernels();
    out.step = step_kernels(hw, s, p, StepStructure::Fused);
    return out;
}

// An SFT step on one GPU, InfiR2's setting: `seqs` packed sequences of `seq_len` tokens each (8k), one
// sequence a micro-batch, one update, at the GPU's datasheet rates with attention from its SASS.
struct SftShape {
    int64_t seq_len = 8192, seqs = 8, micro_batch_tokens = 8192;
};

inline UpdatePrediction predict_sft_step(const GpuSpec& g, const ModelConfig& c, Precision p, const SftShape& s) {
    return predict_update(sass_hardware(g), c, p, (double)s.seqs * s.seq_len, s.seq_len, s.micro_batch_tokens);
}

}  // namespace fp8rl
