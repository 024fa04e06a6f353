// perf_model.h: a FLOP and byte model of one training step of the GPU engine (cuda/engine/engine_gpu.cuh,
// loss.cuh) on one H200: forward + backward + gradient norm and clip + AdamW over one micro-batch of
// T tokens packed in sequences of S, in bf16 or fp8, for two structures of the engine's kernels:
//   unfused  the engine before issue 28: every projection quantizes its own input with the tile
//            quantizer (fp8_gemm.cuh, ~7 ps per element, the transposed copy always written); q, k, v
//            and gate, up as separate GEMMs; separate norms, RoPEs and residual adds; dgrad outputs in
//            FP32, then a cast; activations and their gradients zeroed every step; the FP8 weight
//            copies re-quantized by the tile quantizer after AdamW;
//   fused    issue 28's: add + RMSNorm and SwiGLU write the FP8 operands; one QKV and one gate|up
//            GEMM; q/k-norm + RoPE in one kernel; the remaining quantizers at bandwidth; BF16 dgrad
//            outputs; no zeroing but the gradients'; AdamW writes the BF16 and FP8 copies in its pass.
// A kernel's time is max(work / rate, bytes / achievable bandwidth) + its launches x a launch
// overhead; bytes count each input read once and each output written once (HBM traffic, no L2
// reuse). The rates are anchors, not measurements of this code (PerfHardware; docs/perf-model.md):
// test/gpu/bench_train_step.cu and bench_fp8_gemm.cu print the predictions beside what they measure.
// Not counted: host work and synchronizations, biases (Qwen2), communication (one GPU).
#pragma once
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "cuda/perf/kernel_perf_model.h"
#include "rl/model/config.h"
#include "rl/model/weights.h"
#include "rl/numerics/precision.h"

namespace fp8rl {

// The rates a kernel reaches, from the anchors of perf-anchors.md (shared docs) and what was measured
// on this workplace's H200s (.library/device/KINDS.md), as fractions of the datasheet.
struct PerfHardware {
    double bf16_peak = 989e12, fp8_peak = 1979e12, hbm = 4.8e12;  // H200 SXM, dense, by the datasheet
    // cuBLAS BF16 on large GEMMs; 8192^3 on random data measured 769-798 TFLOP/s here (0.78-0.81)
    double bf16_gemm_eff = 0.75;
    // FP8 block-scaled (1x128 / 128x128) over BF16 at the same shape: cuBLAS 12.9 "1.75x for large
    // matmuls, at least 1.25x for most other cases"; FBGEMM's blockwise 870 against BF16 585 TFLOP/s
    // on an H100 is 1.49x. The middle of cuBLAS's range; the CLI prints both ends.
    double fp8_gemm_speedup = 1.5;
    // memory-bound kernels (norms, quantizers, AdamW, memsets): a device-to-device copy measured
    // 4.3 TB/s here (0.9); wide loads and stores are assumed, as issue 28 asks of the quantizers
    double hbm_eff = 0.85;
    double launch_s = 3e-6;  // per kernel launch or GEMM call: the gap between back-to-back kernels
    // the tile quantizer of fp8_gemm.cuh before issue 28: one 2-byte load in flight per thread,
    // software E4M3 encoding, single-byte stores (perf-anchors.md, issue 28)
    double tile_quantizer_s_per_element = 7e-12;
    // attention forward TFLOP/s; 0: FlashAttention-2's by sequence length (attention_tflops)
    double attention_fwd_tflops = 0;
    // set: the model that prices what the kernels execute (kernel_perf_model.h): attention and decode
    // attention from their SASS at this GPU's issue rates, everything else at its datasheet peaks
    // (sass_hardware); null: the anchors above
    const GpuSpec* gpu = nullptr;

    double bandwidth() const { return gpu ? gpu->bandwidth() : hbm * hbm_eff; }
    // L2 (gpu_spec.h's constants; the anchors take the H100's): its hits' bandwidth, and the bytes a
    // reused working set may take and stay resident
    double l2_bandwidth() const { return gpu ? gpu->l2_bandwidth : GpuSpec().l2_bandwidth; }
    double l2_resident_bytes() const {
        const GpuSpec g = gpu ? *gpu : GpuSpec();
        return g.l2_capacity * g.l2_resident_fraction;
    }
    // a GEMM's rate at training shapes: the GPU's cuBLASLt rates (gpu_spec.h) or the anchors above
    double gemm_rate(Precision p) const {
        if (gpu) return p == Precision::FP8 ? gpu->gemm_fp8 : gpu->gemm_bf16;
        const double bf16 = bf16_peak * bf16_gemm_eff;
        return p == Precision::FP8 ? std::min(bf16 * fp8_gemm_speedup, fp8_peak) : bf16;
    }
};

// The hardware of the model that prices what the kernels execute on GPU g (gpu_spec.h's constants):
// GEMMs at cuBLASLt's rates by shape class (the trainer's FP8 projections on the own kernel from its
// SASS: fp8_block_gemm_cost), attention and decode attention from sass_counts.h,
// memory-bound kernels at the achievable bandwidth or what their loads in flight allow.
inline PerfHardware sass_hardware(const GpuSpec& g) {
    PerfHardware hw;
    hw.bf16_peak = g.bf16_peak(), hw.fp8_peak = g.fp8_peak(), hw.hbm = g.hbm;
    hw.hbm_eff = g.hbm_efficiency, hw.launch_s = g.launch_s;
    hw.gpu = &g;
    return hw;
}

// Attention TFLOP/s at sequence length S (FLOPs counted as the kernels execute them, causal):
// FlashAttention-2 on an H100 (the H200's tensor cores), head dim 128, at 512, 1k, 2k, 4k tokens:
// causal forward 191, 260, 298, 319 (perf-anchors.md); its backward runs at its forward's rate times
// 214/309, 260/350, 291/362, 310/368 (the FA3 paper's figures without a mask, FA2's backward over its
// forward). Linear in log2(S) between the points, the nearest point outside them. Ours is FA2's
// structure (cuda/kernels/attention.cuh); hw.attention_fwd_tflops replaces the forward figures.
inline double attention_tflops(const PerfHardware& hw, double S, bool backward) {
    const double fwd[4] = {191, 260, 298, 319}, bwd_over_fwd[4] = {214.0 / 309, 260.0 / 350, 291.0 / 362, 310.0 / 368};
    const double x = std::min(3.0, std::max(0.0, std::log2(S / 512)));
    const int i = std::min(2, (int)x);
    const double f = x - i;
    const double rate = hw.attention_fwd_tflops > 0 ? hw.attention_fwd_tflops : fwd[i] + f * (fwd[i + 1] - fwd[i]);
    return backward ? rate * (bwd_over_fwd[i] + f * (bwd_over_fwd[i + 1] - bwd_over_fwd[i])) : rate;
}

// FlashAttention-3's published rate at sequence length S (gpu_spec.h's kFa3*), linear in log2 S between
// 512 and 4k tokens; shorter sequences take 512's (FA3 is slower there: still an upper bound), longer
// ones 4k's (FA3's figures rise by a few percent to 16k: a ceiling a little low there).
inline double fa3_tflops(double S, bool backward) {
    const double* r = backward ? kFa3BackwardTflops : kFa3ForwardTflops;
    const double x = std::min(3.0, std::max(0.0, std::log2(S / 512)));
    const int i = std::min(2, (int)x);
    return r[i] + (x - i) * (r[i + 1] - r[i]);
}

enum class KernelClass { LayerGemm, HeadGemm, Attention, Quantize, Elementwise, HeadSoftmax, Zeroing, Optimizer };
constexpr int kKernelClasses = 8;
inline const char* kernel_class_name(KernelClass c) {
    const char* names[kKernelClasses] = {"projection GEMMs",
                                         "LM head GEMMs (BF16)",
                                         "attention",
                                         "FP8 quantization (standalone)",
                                         "norms, RoPE, SwiGLU, adds, casts",
                                         "LM head softmax",
                                         "zeroing",
                                         "gradient norm, clip, AdamW"};
    return names[(int)c];
}

enum class StepPhase { Forward, Backward, Optimizer };
enum class StepStructure { Unfused, Fused };
inline const char* structure_name(StepStructure s) { return s == StepStructure::Unfused ? "unfused" : "fused (#28)"; }

enum class GemmOutput { BF16, F32, F32_Accumulate };  // F32_Accumulate: beta = 1, D read and written

// One kernel (or GEMM call) of the step, `calls` times per step.
struct KernelCost {
    std::string name;
    KernelClass cls;
    StepPhase phase;
    bool per_layer;  // in every decoder layer: calls = layers x calls per layer
    double calls;
    int launches;   // per call (rmsnorm_backward: its kernel and a column sum's two)
    double work;    // per call: FLOPs, or elements for the tile quantizer
    double rate;    // work per second when compute-bound; 0: memory-bound
    double bytes;   // per call, to and from HBM
    double l2_bytes = 0;  // per call, served by L2 hits (the LM head's tile workspace), at L2's bandwidth
    int64_t rows = 0, cols = 0;  // a standalone quantizer's input, so a benchmark can time it alone
    bool weight = false;         // ... a weight: FP32 master in, 128x128 blocks (else BF16 in, 1x128 groups)
    int outputs = 3;             // ... an activation's: 1 rowwise codes, 2 transposed, 3 both
    // what binds the compute side: "tensor" (GEMMs), or the SASS-priced kernel's bound (attention)
    const char* compute_bound = "tensor";
    // bytes/s its loads in flight allow (Little's law: streaming_bandwidth, or a decode GEMM's CTAs);
    // 0: the achievable bandwidth
    double stream_bandwidth = 0;
    // a GEMM's shape (D [n][m] over k); on the own FP8 block GEMM (fp8_block_gemm_cost) also cuBLASLt's
    // price of the same call beside it and the published shape class whose rate bounds it
    int64_t gemm_m = 0, gemm_n = 0, gemm_k = 0;
    double cublaslt_call_s = 0;
    const DeepGemmRate* ceiling = nullptr;
    std::string sass_kernel = "";  // ... and the instantiation priced (sass_counts.h's name)

    double hbm_seconds(const PerfHardware& hw) const {
        return bytes / (stream_bandwidth > 0 ? std::min(stream_bandwidth, hw.bandwidth()) : hw.bandwidth());
    }
    double l2_seconds(const PerfHardware& hw) const {
        return l2_bytes / (stream_bandwidth > 0 ? std::min(stream_bandwidth, hw.l2_bandwidth()) : hw.l2_bandwidth());
    }
    double memory_seconds(const PerfHardware& hw) const { return std::max(hbm_seconds(hw), l2_seconds(hw)); }
    double call_seconds(const PerfHardware& hw) const {
        return std::max(rate > 0 ? work / rate : 0.0, memory_seconds(hw)) + launches * hw.launch_s;
    }
    double seconds(const PerfHardware& hw) const { return calls * call_seconds(hw); }
    // "tensor"|"issue"|"smem"|"latency" (compute), "hbm", "l2", "latency" (loads in flight) or "launch"
    const char* bound(const PerfHardware& hw) const {
        const double compute = rate > 0 ? work / rate : 0.0, memory = memory_seconds(hw);
        if (launches * hw.launch_s > std::max(compute, memory)) return "launch";
        if (compute >= memory) return compute_bound;
        if (l2_seconds(hw) > hbm_seconds(hw))
            return stream_bandwidth > 0 && stream_bandwidth < hw.l2_bandwidth() ? "latency" : "l2";
        return stream_bandwidth > 0 && stream_bandwidth < hw.bandwidth() ? "latency" : "hbm";
    }
};

namespace perf_detail {
constexpr double kBF16 = 2, kF32 = 4;
constexpr double kFP8 = 1 + 4.0 / 128;  // codes and one FP32 scale per 1x128 group (weights' 128x128: less)
constexpr const char* kNormForward = "rmsnorm_forward_kernel<";  // sass_counts.h: the fused add + RMSNorm
inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
}  // namespace perf_detail

// One GEMM call D [n][m] = B [n][k] . A [m][k]^T (fp8_gemm.cuh's orientation: m the weight's rows, n
// the tokens): 2mnk FLOPs, both operands read once, D written (and read when accumulating). On a GPU
// (hw.gpu) by shape class: cuBLASLt's rate times its wave efficiency (tiles of gemm_tile x gemm_tile
// over the SMs: a last wave part-filled) and its tiles' fill (a tile of 64 tokens computes 128 rows'
// worth), and when few tokens make it memory-bound (decode: n <= 256),
// the weight streamed by only its CTAs (gemm_cta_bandwidth each, Little's law): a 16-CTA GEMM
// cannot draw the whole HBM bandwidth.
inline KernelCost gemm_cost(const PerfHardware& hw, std::string name, KernelClass cls, int64_t m, int64_t n, int64_t k,
                            Precision p, GemmOutput out) {
    using namespace perf_detail;
    const double in = p == Precision::FP8 ? kFP8 : kBF16;
    const double d = out == GemmOutput::BF16 ? kBF16 : out == GemmOutput::F32 ? kF32 : 2 * kF32;
    KernelCost g{std::move(name), cls, StepPhase::Forward, false, 1, 1, 2.0 * m * n * k, hw.gemm_rate(p),
                 (double)(m + n) * k * in + (double)m * n * d};
    if (hw.gpu) {
        const double tile = hw.gpu->gemm_tile, tiles = std::ceil(m / tile) * std::ceil(n / tile), sms = hw.gpu->sms;
        g.rate *= tiles / (std::ceil(tiles / sms) * sms) * ((double)m * n / (tiles * tile * tile));
        if (n <= 256) g.stream_bandwidth = std::min(tiles, sms) * hw.gpu->gemm_cta_bandwidth;
    }
    g.gemm_m = m, g.gemm_n = n, g.gemm_k = k;
    return g;
}

// The instantiation fp8_block_gemm.cuh's launcher runs for a GEMM, as sass_counts.h names it:
// fp8_block_gemm_kernel<ABlock, Out, Accumulate, OddBlocks> (A a weight's BLK128x128 scales; D BF16, FP32 or
// FP32 +=; an odd number of k blocks), whose code outside loops is one tail and one epilogue.
inline std::string fp8_block_gemm_kernel_name(bool weight, GemmOutput out, int64_t k) {
    return strfmt("fp8_block_gemm_kernel<%s, %s, %s, %s>", weight ? "true" : "false",
                  out == GemmOutput::BF16 ? "__nv_bfloat16" : "float", out == GemmOutput::F32_Accumulate ? "true" : "false",
                  k / block_gemm::kBlockK % 2 ? "true" : "false");
}

// The trainer's FP8 projection GEMMs on fp8rl's own block GEMM (cuda/kernels/fp8_block_gemm.cuh, issue 59)
// where the shape fits it (m, n, k multiples of 128), a GPU is priced and sass_counts.h holds the kernel
// (else cuBLASLt's price, as gemm_cost): kernel_perf_model.h's
// fp8_block_gemm_price from the SASS row of the instantiation the call runs (fp8_block_gemm_kernel_name),
// never faster than DeepGEMM's published rate for the shape class; cuBLASLt's price of the same call kept
// beside it. `weight`: A is a weight with BLK128x128 scales (fprop, dgrad), else x^T's VEC128 (wgrad).
inline KernelCost fp8_block_gemm_cost(const PerfHardware& hw, std::string name, int64_t m, int64_t n, int64_t k, GemmOutput out,
                                      bool weight) {
    KernelCost g = gemm_cost(hw, name, KernelClass::LayerGemm, m, n, k, Precision::FP8, out);
    if (!hw.gpu || m % block_gemm::kTile || n % block_gemm::kTile || k % block_gemm::kBlockK) return g;
    // the instantiation's SASS row is in sass_counts.h once ./train_rl holds it (GemmRunner's Fp8GemmKernel::Own)
    const std::string instantiation = fp8_block_gemm_kernel_name(weight, out, k);
    const SassKernel* kernel = find_sass_kernel(instantiation);
    if (!kernel) return g;
    g.cublaslt_call_s = g.call_seconds(hw);
    g.sass_kernel = instantiation;
    const BlockGemmPrice p = fp8_block_gemm_price(*hw.gpu, *kernel, (double)m, (double)n, (double)k, g.bytes,
                                                  out == GemmOutput::F32_Accumulate);
    // KernelCost prices max(work / rate, bytes) + launches: the compute side is the slower of the SASS
    // price's compute and the ceiling
    g.rate = g.work / p.compute_s();
    g.stream_bandwidth = 0;
    g.compute_bound = p.compute_bound();
    g.ceiling = p.ceiling;
    return g;
}

// The tile quantizer (before issue 28) on x [rows][cols]: codes and the transposed codes with their
// scales; of a BF16 activation, or of an FP32 master weight (after two memsets of the scale grids).
inline KernelCost tile_quantizer_cost(const PerfHardware& hw, std::string name, int64_t rows, int64_t cols, bool weight) {
    const double elements = (double)rows * cols;
    KernelCost k{std::move(name), KernelClass::Quantize, StepPhase::Forward, false, 1, weight ? 3 : 1, elements,
                 1 / hw.tile_quantizer_s_per_element, elements * ((weight ? 4 : 2) + 2 * perf_detail::kFP8)};
    k.rows = rows, k.cols = cols, k.weight = weight;
    return k;
}

// The micro-batch and the engine constant the head's cost depends on.
struct StepShape {
    ModelConfig model;
    int64_t tokens = 0, seq_len = 0;  // T tokens in sequences of seq_len (the last one shorter if need be)
    int head_vocab_chunk = 2048;      // loss.cuh's HEAD_VOCAB_CHUNK (the GPU benchmarks pass theirs)
    int head_token_block = 16384;     // ... and HEAD_TOKEN_BLOCK (1,024: the L2-resident tile)
    // the training step's head: fused (LogprobHeadGpu::forward_backward in blocks of
    // HEAD_FUSED_TOKEN_BLOCK tokens: logits once), as the trainers run it; false: forward's tiles,
    // then backward's, the logits computed again
    bool fused_head = true;
    int head_fused_token_block = 1024;
    // micro-batches per optimizer step (gradients accumulated, --micro_batch_tokens): the
    // optimizer's kernels count 1 / micro_batches of their calls
    int micro_batches = 1;
    // a training step's forward: in fp8 the producers of the weight gradients' activations also
    // write their transposed FP8 operands, kept for the backward (engine_gpu.cuh's kept_transposes);
    // false: a prefill's forward (grpo_perf_model.h), which keeps nothing
    bool training = true;
    // an fp8 training step's projection GEMMs on fp8rl's own block GEMM (issue 59); false: cuBLASLt's
    bool own_fp8_gemm = true;
};

namespace perf_detail {

// Appends the kernels of one step; scope() says which phase the next ones belong to and whether
// every layer runs them.
class StepBuilder {
  public:
    StepBuilder(const PerfHardware& hw, const StepShape& s, Precision p) : hw(hw), s(s), p(p) {}
    const PerfHardware& hw;
    const StepShape& s;
    const Precision p;
    std::vector<KernelCost> kernels;

    void scope(StepPhase phase, bool per_layer) { phase_ = phase, per_layer_ = per_layer; }
    void add(KernelCost k, double repeat = 1) {
        k.phase = phase_, k.per_layer = per_layer_;
        k.calls = repeat * (per_layer_ ? (double)s.model.num_layers : 1) / (phase_ == StepPhase::Optimizer ? s.micro_batches : 1);
        kernels.push_back(std::move(k));
    }
    void gemm(const char* name, int64_t m, int64_t n, int64_t k, GemmOutput out, double repeat = 1) {
        add(gemm_cost(hw, name, KernelClass::LayerGemm, m, n, k, p, out), repeat);
    }
    // A projection GEMM of the training step: in an fp8 training step on the own FP8 block GEMM (the
    // trainer's GemmRunner routes there; a prefill's forward keeps cuBLASLt), else as gemm(); `weight`:
    // A is the weight (fprop, dgrad), not x^T (wgrad)
    void trainer_gemm(const char* name, int64_t m, int64_t n, int64_t k, GemmOutput out, bool weight) {
        if (p == Precision::FP8 && s.training && s.own_fp8_gemm) add(fp8_block_gemm_cost(hw, name, m, n, k, out, weight));
        else gemm(name, m, n, k, out);
    }
    void head_gemm(const char* name, int64_t m, int64_t n, int64_t k, GemmOutput out, double repeat) {  // BF16 in both precisions
        add(gemm_cost(hw, name, KernelClass::HeadGemm, m, n, k, Precision::BF16, out), repeat);
    }
    // A memory-bound kernel; `sass`: its kernel's name in sass_counts.h (a prefix), whose streaming loop
    // caps the bytes/s its loads in flight allow (streaming_bandwidth), on a GPU
    void pass(const char* name, KernelClass cls, double bytes, int launches = 1, double repeat = 1, const char* sass = nullptr) {
        KernelCost k{name, cls, phase_, per_layer_, 1, launches, 0, 0, bytes};
        streaming(k, sass);
        add(std::move(k), repeat);
    }
    void streaming(KernelCost& k, const char* sass, bool from_l2 = false) const {
        const SassKernel* found = hw.gpu && sass ? find_sass_kernel(sass) : nullptr;
        if (found) k.stream_bandwidth = streaming_bandwidth(*hw.gpu, *found, from_l2);
    }
    // A memory-bound kernel of the LM head's tiles: hbm bytes, and l2 bytes that hit L2 (its loads then
    // wait an L2 round trip, not an HBM one)
    void tile_pass(const char* name, double hbm, double l2, double repeat, const char* sass) {
        KernelCost k{name, KernelClass::HeadSoftmax, phase_, per_layer_, 1, 1, 0, 0, hbm};
        k.l2_bytes = l2;
        streaming(k, sass, l2 > 0);
        add(std::move(k), repeat);
    }
    // An activation's FP8 operand [rows][cols], in fp8 only, at bandwidth (issue 28): BF16 in, the
    // rowwise codes (outputs 1: quantize_rows_gpu), the transposed (2) or both (3: the tile quantizer)
    // with their scales out; or by the tile quantizer before issue 28.
    void quantize(const char* name, int64_t rows, int64_t cols, int outputs) {
        if (p != Precision::FP8) return;
        const double elements = (double)rows * cols;
        KernelCost k{name, KernelClass::Quantize, phase_, per_layer_, 1, 1, 0, 0,
                     elements * (kBF16 + (outputs == 3 ? 2 : 1) * kFP8)};
        k.rows = rows, k.cols = cols, k.outputs = outputs;
        streaming(k, outputs == 1 ? "quantize_rows_kernel" : "quantize_rowwise_kernel<TensorTile<__nv_bfloat16>");
        add(std::move(k));
    }
    void tile_quantize(const char* name, int64_t rows, int64_t cols, double repeat = 1) {
        if (p == Precision::FP8) add(tile_quantizer_cost(hw, name, rows, cols, false), repeat);
    }
    // fp8_out (forward): the kernel also writes its output's FP8 1x128 operand (codes and scales of
    // the GEMM's padded rows), attention.cuh's attention_writes_fp8
    void attention(bool backward, bool fp8_out = false) {
        const ModelConfig& c = s.model;
        const double H = c.num_heads, D = c.head_dim, T = s.tokens, Nqkv = c.q_dim() + 2 * c.kv_dim();
        // causal: 2 products of S^2/2 x D per head forward (QK^T, PV); the backward's kernels make 7
        // (dq: QK^T, dO V^T, dS K; dk/dv: K Q^T, V dO^T, P^T dO, dS^T Q) where FA2's fused one makes 5
        const double products = backward ? 7 : 2;
        double flops = 0, seconds = 0, ceiling_s = 0;
        std::vector<double> lens;
        for (int64_t done = 0; done < s.tokens; done += s.seq_len) {
            const double len = (double)std::min(s.seq_len, s.tokens - done);
            const double f = products * D * H * len * len;
            flops += f;
            seconds += f / (attention_tflops(hw, len, backward) * 1e12);
            // FA3's FLOPs count the backward as 5 products (2.5 forwards), not the 7 ours execute
            ceiling_s += (backward ? 5 : 2) * D * H * len * len / (fa3_tflops(len, backward) * 1e12);
            lens.push_back(len);
        }
        // FA3's timed backward includes its preprocess kernel (hopper/flash_bwd_preprocess_kernel.h:
        // rowsum(dO * O), our attention_delta's pass), so dq and dk/dv's share of the ceiling is FA3's
        // time less that pass's bytes at bandwidth (the least it can take: the ceiling stays high)
        if (backward) ceiling_s = std::max(0.0, ceiling_s - (T * c.q_dim() * 2 * kBF16 + T * H * kF32) / hw.bandwidth());
        const char* bound = "issue";
        if (hw.gpu) {  // what the kernels issue (the launches and bytes are priced below, as for the rest),
                       // never faster than FA3's published rates (the "fa3" bound)
            const KernelPrice price = training_attention_price(*hw.gpu, backward, lens, (int)c.num_heads, (int)c.head_dim, 0, 0);
            seconds = std::max(price.compute_s(), ceiling_s), bound = ceiling_s > price.compute_s() ? "fa3" : price.bound();
        }
        const double bytes = backward ? T * (Nqkv + c.q_dim()) * kBF16 + T * H * 3 * kF32 + T * Nqkv * kBF16
                                      : T * Nqkv * kBF16 + T * c.q_dim() * kBF16 + T * H * kF32 +
                                            (fp8_out ? (double)round_up(s.tokens, 128) * c.q_dim() * kFP8 : 0);
        KernelCost k{backward ? "attention backward (dq, dk/dv)" : "attention forward", KernelClass::Attention, phase_,
                     per_layer_, 1, backward ? 2 : 1, flops, flops / seconds, bytes};
        k.compute_bound = bound;
        add(std::move(k));
    }
    // The attention backward's delta kernel (rowsum(dO * O): dO and O read, delta written), a launch of
    // its own before dq and dk/dv, so its time adds to theirs. att_t (fp8, block scaling): it also
    // writes O's transposed FP8 operand for the O wgrad (attention_delta_fp8_kernel: codes and VEC128
    // scales of the GEMM's padded rows), which no standalone pass over O writes then.
    void attention_delta(bool att_t) {
        const ModelConfig& c = s.model;
        const double T = s.tokens, Tp = (double)round_up(s.tokens, 128), Q = c.q_dim();
        const double bytes = T * Q * 2 * kBF16 + T * c.num_heads * kF32 + (att_t ? Tp * Q * kFP8 : 0);
        const std::string sass = (att_t ? "attention_delta_fp8_kernel<" : "attention_delta_kernel<") +
                                 std::to_string(c.head_dim) + ">";
        pass(att_t ? "attention delta -> FP8 att^T" : "attention delta", KernelClass::Attention, bytes, 1, 1, sass.c_str());
    }
    // rmsnorm_backward as it is: dx (added to what dx holds, or written), then the weight gradient's
    // column sums re-reading dy and x (two launches).
    void norm_backward(const char* name, double rows, double n, bool accumulate) {
        pass(name, KernelClass::Elementwise, rows * n * (kBF16 * (accumulate ? 4 : 3) + 2 * kBF16) + rows * kF32, 3, 1,
             "rmsnorm_backward_dx_kernel<");
    }

  private:
    StepPhase phase_ = StepPhase::Forward;
    bool per_layer_ = false;
};

// The LM head (loss.cuh; BF16 in both precisions), tile by tile: vocabulary chunks outside, token
// blocks inside. A tile's logits GEMM (FP32 out) and softmax statistics; in backward its logits
// again, dlogits (BF16), the dX and dW GEMMs. The tile's workspace (logits, dlogits) is priced at L2
// where the tile's working set fits in what L2 keeps resident (l2_resident_bytes): the chunk's W rows,
// the block's X rows, the workspace and in backward the block's dX rows (read and written by each
// chunk's dX GEMM); else at HBM. Resident, the chunk's W rows come from HBM once a chunk (their bytes
// spread over its tiles), and so do its dW rows where they fit besides.
inline void head(StepBuilder& b, bool backward) {
    const ModelConfig& c = b.s.model;
    const int64_t T = b.s.tokens, C = c.hidden_size, V = c.vocab_size, chunk = b.s.head_vocab_chunk;
    const int64_t block = b.s.head_token_block;
    const int64_t widths[2] = {chunk, V % chunk}, rows[2] = {std::min(T, block), T % block};
    const double counts[2] = {(double)(V / chunk), V % chunk ? 1.0 : 0.0};
    const double row_counts[2] = {(double)(T / block), T % block ? 1.0 : 0.0};  // full blocks, a last one
    const double keep = b.hw.l2_resident_bytes();
    for (int i = 0; i < 2; i++)
        for (int r = 0; r < 2; r++) {
            if (counts[i] == 0 || row_counts[r] == 0) continue;
            const int64_t ld = round_up(widths[i], 8), tb = rows[r], tb8 = round_up(tb, 8);
            const double repeat = counts[i] * row_counts[r], share = (double)tb / T;  // of a chunk's tiles
            const double w_rows = (double)ld * C * kBF16, x_rows = (double)tb * C * kBF16, dx_rows = (double)tb * C * kF32;
            const double logits = (double)tb * ld * kF32, dlogits = (double)tb8 * ld * kBF16, dw_rows = (double)ld * C * kF32;
            const double work_set = w_rows + x_rows + logits + (backward ? dlogits + dx_rows : 0);
            const bool resident = work_set <= keep, dw_resident = resident && work_set + dw_rows <= keep;
            const double w_hbm = resident ? w_rows * share : w_rows;
            auto tile_gemm = [&](const char* name, int64_t m, int64_t n, int64_t k, GemmOutput out, double hbm, double l2) {
                KernelCost g = gemm_cost(b.hw, name, KernelClass::HeadGemm, m, n, k, Precision::BF16, out);
                g.bytes = hbm, g.l2_bytes = l2;
                b.add(std::move(g), repeat);
            };
            // the workspace's bytes: to L2 when resident, else to HBM
            const double ws_l2 = resident ? 1 : 0, ws_hbm = 1 - ws_l2;
            tile_gemm(backward ? "head logits (again)" : "head logits", ld, tb, C, GemmOutput::F32,
                      x_rows + w_hbm + ws_hbm * logits, ws_l2 * (logits + w_rows - w_hbm));
            if (!backward) {
                b.tile_pass("head softmax statistics", (double)tb * 28 + ws_hbm * logits, ws_l2 * logits, repeat,
                            "head_chunk_stats_kernel");
                continue;
            }
            b.tile_pass("head dlogits", (double)tb * 20 + ws_hbm * (logits + dlogits), ws_l2 * (logits + dlogits), repeat,
                        "head_dlogits_kernel");
            tile_gemm("head dX", C, tb, ld, GemmOutput::F32_Accumulate, w_hbm + 2 * dx_rows + ws_hbm * dlogits,
                      ws_l2 * (w_rows - w_hbm + dlogits));
            const double dw_hbm = dw_resident ? 2 * dw_rows * share : 2 * dw_rows;
            tile_gemm("head dW", C, ld, tb8, GemmOutput::F32_Accumulate, (double)tb8 * C * kBF16 + dw_hbm + ws_hbm * dlogits,
                      ws_l2 * dlogits + (2 * dw_rows - dw_hbm));
        }
    if (!backward) b.pass("head finish", KernelClass::HeadSoftmax, (double)T * 40, 1, 1, "head_finish_kernel");
}

// The fused head (LogprobHeadGpu::forward_backward), the training step's: per block of
// head_fused_token_block tokens the logits of the whole vocabulary, once (a GEMM over the full chunks'
// columns, one over a narrower last chunk's), and the rows' statistics in one launch (forward); then
// the block's dlogits in one launch (BF16, in place over the logits), the dX GEMM and the dW GEMM
// over the whole vocabulary (each: the full chunks' columns, then the last chunk's) (backward). The
// block's logits (FP32, 1,024 x 151,936: 622 MB) and dlogits (311 MB) pass through HBM: the logits
// written by the GEMM, read by the statistics and by dlogits; the dlogits written once, read by the
// dX GEMMs and by the dW GEMMs. The statistics are priced by head_row_stats_kernel<false>'s SASS: temperature 1,
// the trainers' default (--temperature), where the logits are not divided.
inline void fused_head(StepBuilder& b, bool backward) {
    const ModelConfig& c = b.s.model;
    const int64_t T = b.s.tokens, C = c.hidden_size, V = c.vocab_size, chunk = b.s.head_vocab_chunk;
    const int64_t block = b.s.head_fused_token_block, tail = V % chunk, main_cols = V - tail, tail_ld = round_up(tail, 8);
    const int64_t rows[2] = {std::min(T, block), T % block};
    const double row_counts[2] = {(double)(T / block), T % block ? 1.0 : 0.0};  // full blocks, a last one
    const double keep = b.hw.l2_resident_bytes();
    for (int r = 0; r < 2; r++) {
        if (row_counts[r] == 0) continue;
        const int64_t tb = rows[r], tb8 = round_up(tb, 8);
        const double x_rows = (double)tb * C * kBF16, dx_rows = (double)tb * C * kF32;
        const double logits = (double)tb * (main_cols + tail_ld) * kF32, dlogits = (double)tb8 * (main_cols + tail_ld) * kBF16;
        auto gemm = [&](const char* name, int64_t m, int64_t n, int64_t k, GemmOutput out, double hbm, double l2, double repeat) {
            KernelCost g = gemm_cost(b.hw, name, KernelClass::HeadGemm, m, n, k, Precision::BF16, out);
            g.bytes = hbm, g.l2_bytes = l2;
            b.add(std::move(g), repeat);
        };
        if (!backward) {
            for (int64_t cols : {main_cols, tail_ld})
                if (cols) gemm("head logits", cols, tb, C, GemmOutput::F32, (double)cols * C * kBF16 + x_rows + (double)tb * cols * kF32, 0,
                               row_counts[r]);
            b.tile_pass("head softmax statistics", (double)tb * 28 + logits, 0, row_counts[r], "head_row_stats_kernel<false>");
            continue;
        }
        b.tile_pass("head dlogits", (double)tb * 20 + logits + dlogits, 0, row_counts[r], "head_dlogits_kernel");
        // dX [tb][C] += dlogits [tb][cols] . W [cols][C]: the full chunks' columns, then the last
        // chunk's, reading the dX rows the first wrote from L2 when they fit beside its W rows and dlogits
        for (int64_t cols : {main_cols, tail_ld}) {
            if (!cols) continue;
            const double part_dlogits = (double)tb8 * cols * kBF16, w_rows = (double)cols * C * kBF16;
            const bool from_l2 = cols == tail_ld && main_cols && part_dlogits + w_rows + dx_rows <= keep;
            gemm("head dX", C, tb, cols, GemmOutput::F32_Accumulate, w_rows + part_dlogits + (from_l2 ? 0 : 2 * dx_rows),
                 from_l2 ? 2 * dx_rows : 0, row_counts[r]);
        }
        for (int64_t cols : {main_cols, tail_ld})  // dW [cols][C] += dlogits [tb8][cols]^T . X [tb8][C]
            if (cols)
                gemm("head dW", C, cols, tb8, GemmOutput::F32_Accumulate, 2.0 * cols * C * kF32 + (double)tb8 * C * kBF16 +
                     (double)tb8 * cols * kBF16, 0, row_counts[r]);
    }
}

// The fused structure's decoder layer, forward (issue 28: 10 launches and GEMM calls in fp8, 9 in bf16;
// a training step's fp8 forward 12, its norms' tiles writing the kept transposes, issue 59).
inline void fused_layer_forward(StepBuilder& b) {
    const ModelConfig& c = b.s.model;
    const bool fp8 = b.p == Precision::FP8;
    const double T = b.s.tokens, C = c.hidden_size, I = c.intermediate_size, Q = c.q_dim(), K = c.kv_dim(), N = Q + 2 * K;
    const int64_t Tp = round_up(b.s.tokens, 128);
    const bool kept = fp8 && b.s.training;  // the producers write the wgrads' transposed FP8 operands
    // the residual and the branch output in; the new residual and rstd out, and the normed output: BF16
    // (bf16), its FP8 operand (an fp8 prefill), or in an fp8 training step nothing here: the
    // statistics pass, then tiles (RmsnormTile) that read the new residual and write the operand and
    // its transpose (the wgrad's)
    const double add_norm = T * C * 3 * kBF16 + T * kF32 + (kept ? 0 : fp8 ? T * C * kFP8 : T * C * kBF16);
    auto norm = [&](const char* name, const char* tiles) {
        b.pass(name, KernelClass::Elementwise, add_norm, 1, 1, kNormForward);
        if (kept)
            b.pass(tiles, KernelClass::Elementwise, T * C * kBF16 + T * kF32 + 2 * (double)Tp * C * kFP8, 1, 1,
                   "quantize_rowwise_kernel<RmsnormTile>");
    };
    const double qk_norm = c.qk_norm ? T * (Q + K) * kBF16 + T * (c.num_heads + c.num_kv_heads) * kF32 : 0;  // qp, kp, rstd
    norm("add + RMSNorm (attention input)", "RMSNorm -> FP8 xn1, xn1^T");
    b.trainer_gemm("QKV fprop", (int64_t)N, Tp, c.hidden_size, GemmOutput::BF16, true);
    b.pass("q/k RMSNorm + RoPE + split", KernelClass::Elementwise, 2 * T * N * kBF16 + qk_norm, 1, 1,
           "qkv_rope_forward_kernel<__nv_bfloat16>");
    // the O projection's FP8 operand: written by the attention forward where a head's row is one 1x128
    // group (attention.cuh's attention_writes_fp8: D = 128), else one pass over the BF16 output
    const bool att_fp8 = fp8 && c.head_dim == 128;
    b.attention(false, att_fp8);
    if (!att_fp8) b.quantize("quantize attention output", Tp, c.q_dim(), 1);
    b.trainer_gemm("O fprop", c.hidden_size, Tp, c.q_dim(), GemmOutput::BF16, true);
    norm("add + RMSNorm (MLP input)", "RMSNorm -> FP8 xn2, xn2^T");
    b.trainer_gemm("gate|up fprop", 2 * c.intermediate_size, Tp, c.hidden_size, GemmOutput::BF16, true);
    if (kept)  // swiglu_forward_fp8: a's rowwise and transposed operands from one tile, no BF16 a
        b.pass("SwiGLU -> FP8 a, a^T", KernelClass::Elementwise, T * 2 * I * kBF16 + 2 * (double)Tp * I * kFP8, 1, 1,
               "quantize_rowwise_kernel<SwigluTile>");
    else  // BF16 a in bf16; in an fp8 prefill its FP8 operand only
        b.pass("SwiGLU", KernelClass::Elementwise, T * 2 * I * kBF16 + (fp8 ? T * I * kFP8 : T * I * kBF16), 1, 1,
               "swiglu_forward_kernel<");
    b.trainer_gemm("down fprop", c.hidden_size, Tp, c.intermediate_size, GemmOutput::BF16, true);
}

// Its backward: every dgrad writes BF16; each FP8 GEMM operand quantized once: by a standalone pass
// for dh (rowwise + transposed), by their producers for d[gate|up], d[q|k|v] and the attention output
// (transposed, for the O wgrad: the attention backward's delta kernel); the other activations'
// transposes the forward kept (issue 59).
inline void fused_layer_backward(StepBuilder& b) {
    const ModelConfig& c = b.s.model;
    const double T = b.s.tokens, C = c.hidden_size, I = c.intermediate_size, Q = c.q_dim(), K = c.kv_dim();
    const int64_t Tp = round_up(b.s.tokens, 128), Cn = c.hidden_size, In = c.intermediate_size, Qn = c.q_dim();
    const int64_t Nn = c.q_dim() + 2 * c.kv_dim();
    b.quantize("quantize dh (down)", Tp, Cn, 3);  // a^T: kept by the forward's SwiGLU
    b.trainer_gemm("down dgrad", In, Tp, Cn, GemmOutput::BF16, true);
    b.trainer_gemm("down wgrad", In, Cn, Tp, GemmOutput::F32_Accumulate, false);
    // bf16: d[gate|up] written in BF16; fp8: its rowwise and transposed FP8 operands written instead
    // (swiglu_backward_fp8, the SwiGLU backward as the tile quantizer's source)
    const bool fp8 = b.p == Precision::FP8;
    b.pass(fp8 ? "SwiGLU backward -> FP8 d[gate|up]" : "SwiGLU backward", KernelClass::Elementwise,
           T * I * kBF16 + T * 2 * I * kBF16 + (fp8 ? 2 * T * 2 * I * kFP8 : T * 2 * I * kBF16), 1, 1,
           fp8 ? "quantize_rowwise_kernel<SwigluGradTile>" : "swiglu_backward_kernel<");
    // xn2^T: kept by the forward's norm tiles
    b.trainer_gemm("gate|up dgrad", Cn, Tp, 2 * In, GemmOutput::BF16, true);
    b.trainer_gemm("gate|up wgrad", Cn, 2 * In, Tp, GemmOutput::F32_Accumulate, false);
    b.norm_backward("RMSNorm backward (MLP input)", T, C, true);
    b.quantize("quantize dh (O)", Tp, Cn, 3);
    b.trainer_gemm("O dgrad", Qn, Tp, Cn, GemmOutput::BF16, true);
    // fp8: att^T, the O wgrad's operand, from the delta kernel (the wgrad runs after it)
    b.attention_delta(fp8);
    b.attention(true);
    b.trainer_gemm("O wgrad", Qn, Cn, Tp, GemmOutput::F32_Accumulate, false);
    // dq, dk and the forward's qp, kp in, d[q|k] out (dv is written in place by the attention
    // backward); the q/k-norm weights' column sums as partials of the same pass. In fp8 (no bias,
    // heads that divide a tile: qkv_rope_backward_fp8) dqkv's FP8 operands, rowwise and transposed,
    // from the same tiles instead of a BF16 dqkv and a quantize pass over it
    const double qk_rows = 3 * T * (Q + K) * kBF16 + T * (c.num_heads + c.num_kv_heads) * kF32;
    if (fp8 && !c.qkv_bias && 128 % c.head_dim == 0 && c.head_dim % 8 == 0) {
        b.pass("q/k RMSNorm + RoPE backward -> FP8 d[q|k|v]", KernelClass::Elementwise,
               qk_rows + T * K * kBF16 + 2 * (double)Tp * Nn * kFP8, 1, 1, "quantize_rowwise_kernel<QkvRopeGradTile>");
    } else {
        b.pass("q/k RMSNorm + RoPE backward", KernelClass::Elementwise, qk_rows, 1, 1, "qkv_rope_backward_kernel");
        b.quantize("quantize d[q|k|v]", Tp, Nn, 3);
    }
    // xn1^T: kept by the forward's norm tiles
    b.trainer_gemm("QKV dgrad", Cn, Tp, Nn, GemmOutput::BF16, true);
    b.trainer_gemm("QKV wgrad", Cn, Nn, Tp, GemmOutput::F32_Accumulate, false);
    b.norm_backward("RMSNorm backward (attention input)", T, C, true);
}

// The unfused structure's decoder layer, forward, as engine_gpu.cuh's layer_forward before issue 28
// (24 launches and GEMM calls in fp8, 17 in bf16).
inline void unfused_layer_forward(StepBuilder& b) {
    const ModelConfig& c = b.s.model;
    const double T = b.s.tokens, C = c.hidden_size, I = c.intermediate_size, Q = c.q_dim(), K = c.kv_dim();
    const int64_t Tp = round_up(b.s.tokens, 128), Cn = c.hidden_size, In = c.intermediate_size, Qn = c.q_dim(), Kn = c.kv_dim();
    const double norm = T * C * 2 * kBF16 + T * kF32;
    b.pass("RMSNorm (attention input)", KernelClass::Elementwise, norm);
    b.tile_quantize("quantize xn1 (for q, k and v)", Tp, Cn, 3);
    b.gemm("q fprop", Qn, Tp, Cn, GemmOutput::BF16);
    b.gemm("k, v fprop", Kn, Tp, Cn, GemmOutput::BF16, 2);
    if (c.qk_norm) {
        b.pass("q RMSNorm", KernelClass::Elementwise, T * Q * 2 * kBF16 + T * c.num_heads * kF32);
        b.pass("k RMSNorm", KernelClass::Elementwise, T * K * 2 * kBF16 + T * c.num_kv_heads * kF32);
    }
    b.pass("RoPE q", KernelClass::Elementwise, T * Q * 2 * kBF16);
    b.pass("RoPE k", KernelClass::Elementwise, T * K * 2 * kBF16);
    b.attention(false);
    b.tile_quantize("quantize attention output", Tp, Qn);
    b.gemm("o fprop", Cn, Tp, Qn, GemmOutput::BF16);
    b.pass("residual add (attention)", KernelClass::Elementwise, T * C * 3 * kBF16);
    b.pass("RMSNorm (MLP input)", KernelClass::Elementwise, norm);
    b.tile_quantize("quantize xn2 (for gate and up)", Tp, Cn, 2);
    b.gemm("gate, up fprop", In, Tp, Cn, GemmOutput::BF16, 2);
    b.pass("SwiGLU", KernelClass::Elementwise, T * I * 3 * kBF16);
    b.tile_quantize("quantize a", Tp, In);
    b.gemm("down fprop", Cn, Tp, In, GemmOutput::BF16);
    b.pass("residual add (MLP)", KernelClass::Elementwise, T * C * 3 * kBF16);
}

// Its backward (layer_backward): FP32 dgrad outputs and casts; every GEMM quantizes both its operands.
inline void unfused_layer_backward(StepBuilder& b) {
    const ModelConfig& c = b.s.model;
    const double T = b.s.tokens, C = c.hidden_size, I = c.intermediate_size, Q = c.q_dim(), K = c.kv_dim();
    const int64_t Tp = round_up(b.s.tokens, 128), Cn = c.hidden_size, In = c.intermediate_size, Qn = c.q_dim(), Kn = c.kv_dim();
    const double cast = kF32 + kBF16;
    b.tile_quantize("quantize dh (down)", Tp, Cn);
    b.tile_quantize("quantize a", Tp, In);
    b.gemm("down dgrad", In, Tp, Cn, GemmOutput::F32);
    b.gemm("down wgrad", In, Cn, Tp, GemmOutput::F32_Accumulate);
    b.pass("cast da", KernelClass::Elementwise, T * I * cast);
    b.pass("SwiGLU backward", KernelClass::Elementwise, T * I * 5 * kBF16);
    b.tile_quantize("quantize dg, du", Tp, In, 2);
    b.tile_quantize("quantize xn2 (for gate and up)", Tp, Cn, 2);
    b.gemm("gate dgrad", Cn, Tp, In, GemmOutput::F32);
    b.gemm("up dgrad", Cn, Tp, In, GemmOutput::F32_Accumulate);
    b.gemm("gate, up wgrad", Cn, In, Tp, GemmOutput::F32_Accumulate, 2);
    b.pass("cast dxn (MLP)", KernelClass::Elementwise, T * C * cast);
    b.norm_backward("RMSNorm backward (MLP input)", T, C, true);
    b.tile_quantize("quantize dh (o)", Tp, Cn);
    b.tile_quantize("quantize att", Tp, Qn);
    b.gemm("o dgrad", Qn, Tp, Cn, GemmOutput::F32);
    b.gemm("o wgrad", Qn, Cn, Tp, GemmOutput::F32_Accumulate);
    b.pass("cast datt", KernelClass::Elementwise, T * Q * cast);
    b.attention_delta(false);
    b.attention(true);
    b.pass("RoPE backward q", KernelClass::Elementwise, T * Q * 2 * kBF16);
    b.pass("RoPE backward k", KernelClass::Elementwise, T * K * 2 * kBF16);
    if (c.qk_norm) {
        b.norm_backward("q RMSNorm backward", T * c.num_heads, c.head_dim, false);
        b.norm_backward("k RMSNorm backward", T * c.num_kv_heads, c.head_dim, false);
    }
    b.tile_quantize("quantize dq", Tp, Qn);
    b.tile_quantize("quantize dk, dv", Tp, Kn, 2);
    b.tile_quantize("quantize xn1 (for q, k and v)", Tp, Cn, 3);
    b.gemm("q dgrad", Cn, Tp, Qn, GemmOutput::F32);
    b.gemm("k, v dgrad", Cn, Tp, Kn, GemmOutput::F32_Accumulate, 2);
    b.gemm("q wgrad", Cn, Qn, Tp, GemmOutput::F32_Accumulate);
    b.gemm("k, v wgrad", Cn, Kn, Tp, GemmOutput::F32_Accumulate, 2);
    b.pass("cast dxn (attention)", KernelClass::Elementwise, T * C * cast);
    b.norm_backward("RMSNorm backward (attention input)", T, C, true);
}

}  // namespace perf_detail

// The parameters the optimizer walks (weights.h's buffer, padding included) and those of the seven
// projections, which have FP8 copies.
inline double projection_params(const ModelConfig& c) {
    const double C = c.hidden_size, I = c.intermediate_size;
    return c.num_layers * (C * (c.q_dim() + 2 * c.kv_dim()) + c.q_dim() * C + 3 * C * I);
}

// Every kernel of one training step in this structure and precision.
inline std::vector<KernelCost> step_kernels(const PerfHardware& hw, const StepShape& s, Precision p, StepStructure st) {
    using namespace perf_detail;
    if (p != Precision::BF16 && p != Precision::FP8) fail("step_kernels: the GPU engine trains in bf16 or fp8");
    if (s.tokens <= 0 || s.seq_len <= 0 || s.micro_batches <= 0 || s.head_vocab_chunk <= 0 || s.head_vocab_chunk % 8 ||
        s.head_token_block <= 0 || s.head_token_block % 8 || s.head_fused_token_block <= 0 || s.head_fused_token_block % 8)
        fail("step_kernels: %lld tokens in sequences of %lld, %d micro-batches per update, head tiles of %d tokens x %d "
             "columns", (long long)s.tokens, (long long)s.seq_len, s.micro_batches, s.head_token_block, s.head_vocab_chunk);
    const ModelConfig& c = s.model;
    const bool fused = st == StepStructure::Fused;
    const double T = s.tokens, Tp = (double)round_up(s.tokens, 128), C = c.hidden_size, I = c.intermediate_size;
    const double Q = c.q_dim(), K = c.kv_dim(), L = c.num_layers;
    size_t params = 0;
    tensor_layout(c, &params);
    const double P = (double)params;
    StepBuilder b(hw, s, p);

    b.scope(StepPhase::Forward, false);
    if (!fused) {  // prepare_batch zeroes every BF16 activation of the batch and the FP32 statistics
        const double inner = Tp * (3 * C + (c.qk_norm ? Q + K : 0) + 2 * Q + 2 * K + 3 * I);
        const double stats = L * T * (2 + 2 * c.num_heads + c.num_kv_heads) + 5 * T + Tp * std::max(std::max(C, I), Q);
        b.pass("zero activations", KernelClass::Zeroing, (L * Tp * C + L * inner + 2 * Tp * C) * kBF16 + stats * kF32, 2);
    }
    b.pass("embedding", KernelClass::Elementwise, T * C * 2 * kBF16 + T * 4, 1, 1, "embedding_forward_kernel<");
    b.scope(StepPhase::Forward, true);
    (fused ? fused_layer_forward : unfused_layer_forward)(b);
    b.scope(StepPhase::Forward, false);
    // the last layer's output joins the residual here when the adds are fused into the norms
    b.pass(fused ? "add + final RMSNorm" : "final RMSNorm", KernelClass::Elementwise,
           T * C * (fused ? 4 : 2) * kBF16 + T * kF32, 1, 1, kNormForward);
    (s.fused_head ? fused_head : head)(b, false);

    b.scope(StepPhase::Backward, false);
    if (!fused)
        b.pass("zero activation gradients", KernelClass::Zeroing,
               Tp * (3 * C + 3 * I + 3 * Q + 3 * K) * kBF16 + (Tp * (C + I + Q) + T * c.num_heads + 2 * T) * kF32, 2);
    (s.fused_head ? fused_head : head)(b, true);
    b.pass("cast head dX", KernelClass::Elementwise, T * C * (kF32 + kBF16));
    b.norm_backward("final RMSNorm backward", T, C, false);
    b.scope(StepPhase::Backward, true);
    (fused ? fused_layer_backward : unfused_layer_backward)(b);
    b.scope(StepPhase::Backward, false);
    b.pass("embedding backward", KernelClass::Elementwise, T * C * (kBF16 + 2 * kF32), 1, 1, "embedding_backward_kernel<");  // FP32 rows added to

    b.scope(StepPhase::Optimizer, false);
    b.pass("zero gradients", KernelClass::Zeroing, P * kF32);
    b.pass("gradient norm", KernelClass::Optimizer, P * kF32, 2, 1, "grad_norm_partial_kernel");
    b.pass("gradient clip (when the norm exceeds the bound)", KernelClass::Optimizer, P * 2 * kF32, 1, 1, "clip_grad_kernel");
    // master, gradient, m, v in; master, m, v and the BF16 copy out
    const double adamw = P * (7 * kF32 + kBF16);
    if (fused) {  // fp8: and the FP8 codes of each projection weight and of its transpose, one launch per weight
        const bool fp8 = p == Precision::FP8;
        b.pass(fp8 ? "AdamW + BF16 and FP8 copies" : "AdamW + BF16 copy", KernelClass::Optimizer,
               adamw + (fp8 ? projection_params(c) * 2 * kFP8 : 0), fp8 ? 4 * (int)c.num_layers + 1 : 1, 1,
               fp8 ? "adamw_projection_tiles_kernel" : "adamw_kernel");
        return b.kernels;
    }
    b.pass("AdamW + BF16 copy", KernelClass::Optimizer, adamw);
    // the engine re-quantizes the FP8 copies after every update, whatever the training precision
    b.scope(StepPhase::Optimizer, true);
    const int64_t Cn = c.hidden_size, In = c.intermediate_size;
    b.add(tile_quantizer_cost(hw, "re-quantize q weight", c.q_dim(), Cn, true));
    b.add(tile_quantizer_cost(hw, "re-quantize k, v weights", c.kv_dim(), Cn, true), 2);
    b.add(tile_quantizer_cost(hw, "re-quantize o weight", Cn, c.q_dim(), true));
    b.add(tile_quantizer_cost(hw, "re-quantize gate, up weights", In, Cn, true), 2);
    b.add(tile_quantizer_cost(hw, "re-quantize down weight", Cn, In, true));
    return b.kernels;
}

// A kernel's figures summed over its calls (a phase of a GRPO step, for --json), with the seconds each
// bound accounts for: bound() is the one that holds the most.
struct PricedKernel {
    std::string name;
    double calls = 0, seconds = 0, bytes = 0, flops = 0;
    double cublaslt_seconds = 0;  // the own FP8 block GEMM's calls: cuBLASLt's price of them, beside
    std::map<std::string, double> bound_seconds;
    const char* bound() const {
        const std::pair<const std::string, double>* best = nullptr;
        for (const auto& b : bound_seconds)
            if (!best || b.second > best->second) best = &b;
        return best ? best->first.c_str() : "launch";
    }
};

// Kernels tallied by name, in the order first seen.
class KernelTally {
  public:
    void add(const std::string& name, double calls, double seconds, double bytes, double flops, const char* bound,
             double cublaslt_seconds = 0) {
        auto at = index_.find(name);
        if (at == index_.end()) at = index_.emplace(name, kernels_.size()).first, kernels_.push_back(PricedKernel{name, 0, 0, 0, 0, 0, {}});
        PricedKernel& k = kernels_[at->second];
        k.calls += calls, k.seconds += seconds, k.bytes += bytes, k.flops += flops, k.bound_seconds[bound] += seconds;
        k.cublaslt_seconds += cublaslt_seconds;
    }
    // `times` of every call of k, its name prefixed
    void add(const std::string& prefix, const KernelCost& k, const PerfHardware& hw, double times = 1) {
        add(prefix + k.name, times * k.calls, times * k.seconds(hw), times * k.calls * k.bytes,
            k.rate > 0 ? times * k.calls * k.work : 0, k.bound(hw), times * k.calls * k.cublaslt_call_s);
    }
    // a tallied kernel again (its bound: the one holding most of its time), its name prefixed
    void add(const std::string& prefix, const PricedKernel& k) {
        add(prefix + k.name, k.calls, k.seconds, k.bytes, k.flops, k.bound(), k.cublaslt_seconds);
    }
    const std::vector<PricedKernel>& kernels() const { return kernels_; }

  private:
    std::vector<PricedKernel> kernels_;
    std::map<std::string, size_t> index_;
};

inline double total_seconds(const std::vector<KernelCost>& ks, const PerfHardware& hw) {
    double t = 0;
    for (const KernelCost& k : ks) t += k.seconds(hw);
    return t;
}

inline double class_seconds(const std::vector<KernelCost>& ks, const PerfHardware& hw, KernelClass cls) {
    double t = 0;
    for (const KernelCost& k : ks) t += k.cls == cls ? k.seconds(hw) : 0;
    return t;
}

inline double total_launches(const std::vector<KernelCost>& ks) {
    double n = 0;
    for (const KernelCost& k : ks) n += k.calls * k.launches;
    return n;
}

inline double step_seconds(const PerfHardware& hw, const StepShape& s, Precision p, StepStructure st) {
    return total_seconds(step_kernels(hw, s, p, st), hw);
}

// The predicted bf16 time over fp8 time of the step.
inline double step_speedup(const PerfHardware& hw, const StepShape& s, StepStructure st) {
    return step_seconds(hw, s, Precision::BF16, st) / step_seconds(hw, s, Precision::FP8, st);
}

}  // namespace fp8rl
