// Tests of cuda/perf/perf_model.h against cases worked by hand: each expected value is written out here
// from the shapes (a GEMM's 2mnk and operand bytes, a memory-bound kernel's bytes, the step's 6 N T
// GEMM FLOPs, the FA2 figures), never read back from the model; the per-layer launch counts are
// issue 28's (24 and 17 counted in emulation before it, 10 and 9 its target; an fp8 training
// forward's 12 since issue 59).
#include <algorithm>
#include <filesystem>

#include "cuda/perf/calibrate.h"
#include "cuda/perf/grpo_perf_model.h"
#include "cuda/perf/perf_model.h"
#include "cuda/perf/update_perf_model.h"
#include "test/harness.h"
#include "test/temp_dir.h"

using namespace fp8rl;

namespace {

// A small Qwen3 (q/k norms), every size a multiple of 64, so weights.h's buffer has no padding.
ModelConfig small_qwen3() {
    ModelConfig c;
    c.vocab_size = 5000, c.hidden_size = 256, c.intermediate_size = 768, c.num_layers = 3;
    c.num_heads = 4, c.num_kv_heads = 2, c.head_dim = 64, c.qk_norm = true, c.tie_word_embeddings = true;
    return c;
}

StepShape small_step() {
    StepShape s;
    s.model = small_qwen3();
    s.tokens = 1024, s.seq_len = 384;  // sequences of 384, 384 and 256
    return s;
}

const KernelCost& find_kernel(const std::vector<KernelCost>& ks, const std::string& name) {
    for (const KernelCost& k : ks)
        if (k.name == name) return k;
    fail("no kernel named \"%s\"", name.c_str());
}

double sum_work(const std::vector<KernelCost>& ks, KernelClass cls) {
    double w = 0;
    for (const KernelCost& k : ks) w += k.cls == cls ? k.calls * k.work : 0;
    return w;
}

// One micro-batch of 16,384 tokens in sequences of 1,024 with Qwen3-1.7B's head (C = 2,048, V = 151,936).
StepShape qwen3_1p7b_head_step() {
    StepShape s;
    s.model = small_qwen3();
    s.model.vocab_size = 151936, s.model.hidden_size = 2048;
    s.tokens = 16384, s.seq_len = 1024;
    return s;
}

}  // namespace

TEST(perf_model_gemm_flops_bytes_and_time) {
    const PerfHardware hw;
    // compute-bound: 17.2 GFLOP at 0.75 x 989 TFLOP/s (23 us) over 29 MB at 0.85 x 4.8 TB/s (7 us)
    const KernelCost g = gemm_cost(hw, "g", KernelClass::LayerGemm, 4096, 2048, 1024, Precision::BF16, GemmOutput::BF16);
    CHECK_EQ(g.work, 17179869184.0);
    CHECK_EQ(g.bytes, (4096.0 * 1024 + 2048.0 * 1024) * 2 + 4096.0 * 2048 * 2);
    CHECK_NEAR(g.call_seconds(hw), 17179869184.0 / (989e12 * 0.75) + 3e-6, 1e-12, 0);
    // FP8: one byte per operand element plus an FP32 scale per 128, 1.5x the BF16 rate (15.4 us)
    const KernelCost f = gemm_cost(hw, "f", KernelClass::LayerGemm, 4096, 2048, 1024, Precision::FP8, GemmOutput::BF16);
    CHECK_EQ(f.bytes, (4096.0 * 1024 + 2048.0 * 1024) * (1 + 4.0 / 128) + 4096.0 * 2048 * 2);
    CHECK_NEAR(f.call_seconds(hw), 17179869184.0 / (989e12 * 0.75 * 1.5) + 3e-6, 1e-12, 0);
    // ... accumulating into FP32 D (read and written): 73.6 MB, 18.0 us, so memory-bound
    const KernelCost a = gemm_cost(hw, "a", KernelClass::LayerGemm, 4096, 2048, 1024, Precision::FP8, GemmOutput::F32_Accumulate);
    CHECK_EQ(a.bytes, (4096.0 * 1024 + 2048.0 * 1024) * (1 + 4.0 / 128) + 4096.0 * 2048 * 8);
    CHECK_NEAR(a.call_seconds(hw), a.bytes / (4.8e12 * 0.85) + 3e-6, 1e-12, 0);
    // memory-bound: 8 tokens, 268 MFLOP (0.4 us) over 33.6 MB (8.2 us)
    const KernelCost m = gemm_cost(hw, "m", KernelClass::LayerGemm, 4096, 8, 4096, Precision::BF16, GemmOutput::BF16);
    const double bytes = (4096.0 + 8) * 4096 * 2 + 4096.0 * 8 * 2;
    CHECK_EQ(m.bytes, bytes);
    CHECK_NEAR(m.call_seconds(hw), bytes / (4.8e12 * 0.85) + 3e-6, 1e-12, 0);
}

TEST(perf_model_memory_bound_kernels_bytes) {
    const PerfHardware hw;
    const StepShape s = small_step();
    const double T = 1024, I = 768, L = 3;
    // SwiGLU reads [T][2I] BF16 and writes a in BF16; in an fp8 training step a's codes with a scale
    // per 128, rowwise and transposed, and no BF16 a; in an fp8 prefill the rowwise codes only
    const KernelCost fp8 = find_kernel(step_kernels(hw, s, Precision::FP8, StepStructure::Fused), "SwiGLU -> FP8 a, a^T");
    const KernelCost bf16 = find_kernel(step_kernels(hw, s, Precision::BF16, StepStructure::Fused), "SwiGLU");
    StepShape prefill = s;
    prefill.training = false;
    const KernelCost fp8_prefill = find_kernel(step_kernels(hw, prefill, Precision::FP8, StepStructure::Fused), "SwiGLU");
    CHECK_EQ(fp8.bytes, T * 2 * I * 2 + 2 * T * I * (1 + 4.0 / 128));
    CHECK_EQ(fp8_prefill.bytes, T * 2 * I * 2 + T * I * (1 + 4.0 / 128));
    CHECK_EQ(bf16.bytes, T * 2 * I * 2 + T * I * 2);
    CHECK_EQ(fp8.calls, L);
    CHECK_NEAR(fp8.seconds(hw), L * (fp8.bytes / (4.8e12 * 0.85) + 3e-6), 1e-12, 0);
    // the tile quantizer before issue 28: 7 ps per element of a [T][I] (more than its 4 bytes per element take)
    const KernelCost q = find_kernel(step_kernels(hw, s, Precision::FP8, StepStructure::Unfused), "quantize a");
    CHECK_EQ(q.calls, L);
    CHECK_NEAR(q.call_seconds(hw), T * I * 7e-12 + 3e-6, 1e-12, 0);
    // bf16 quantizes no activation
    for (const KernelCost& k : step_kernels(hw, s, Precision::BF16, StepStructure::Fused)) CHECK(k.cls != KernelClass::Quantize);
}

TEST(perf_model_counts_issue_28_launches_per_layer) {
    const PerfHardware hw;
    const StepShape s = small_step();
    // [unfused, fused][bf16, fp8]; fused fp8 training: the two norms' tiles writing the kept transposes (issue 59)
    const double want[2][2] = {{17, 24}, {9, 12}};
    for (StepStructure st : {StepStructure::Unfused, StepStructure::Fused})
        for (Precision p : {Precision::BF16, Precision::FP8}) {
            double launches = 0;
            for (const KernelCost& k : step_kernels(hw, s, p, st))
                if (k.per_layer && k.phase == StepPhase::Forward) launches += k.calls * k.launches;
            CHECK_EQ(launches / 3, want[st == StepStructure::Fused][p == Precision::FP8]);
        }
    StepShape prefill = s;  // a prefill's fp8 forward keeps no transposes: issue 28's 10
    prefill.training = false;
    double launches = 0;
    for (const KernelCost& k : step_kernels(hw, prefill, Precision::FP8, StepStructure::Fused))
        if (k.per_layer && k.phase == StepPhase::Forward) launches += k.calls * k.launches;
    CHECK_EQ(launches / 3, 10);
}

TEST(perf_model_step_gemm_flops_are_6_params_tokens_plus_3_head_gemms) {
    const PerfHardware hw;
    const StepShape s = small_step();
    const double T = 1024, C = 256, I = 768, L = 3, Q = 4 * 64, K = 2 * 64, V = 5000;
    const double projections = L * (C * (Q + 2 * K) + Q * C + 3 * C * I);
    for (StepStructure st : {StepStructure::Unfused, StepStructure::Fused})
        for (Precision p : {Precision::BF16, Precision::FP8}) {
            const std::vector<KernelCost> ks = step_kernels(hw, s, p, st);
            CHECK_NEAR(sum_work(ks, KernelClass::LayerGemm), 6 * T * projections, 1e-12, 0);
            // the fused head: logits, dX, dW over the vocabulary (5000 = 2 x 2048 + 904, chunks already multiples of 8)
            CHECK_NEAR(sum_work(ks, KernelClass::HeadGemm), 3 * 2 * T * C * V, 1e-12, 0);
            // causal attention: 2 products of len^2 / 2 x D per head forward, 7 in the backward's two kernels
            const double pairs = 2 * 384.0 * 384 / 2 + 256.0 * 256 / 2;
            CHECK_NEAR(sum_work(ks, KernelClass::Attention), L * 4 * 64 * (2 + 7) * 2 * pairs, 1e-12, 0);
        }
}

TEST(perf_model_attention_rates_follow_fa2) {
    PerfHardware hw;
    CHECK_NEAR(attention_tflops(hw, 1024, false), 260, 1e-12, 0);
    CHECK_NEAR(attention_tflops(hw, 2048, false), 298, 1e-12, 0);
    CHECK_NEAR(attention_tflops(hw, 1024 * std::sqrt(2.0), false), (260 + 298) / 2.0, 1e-12, 0);
    CHECK_NEAR(attention_tflops(hw, 100, false), 191, 1e-12, 0);    // below 512: the 512 figure
    CHECK_NEAR(attention_tflops(hw, 65536, false), 319, 1e-12, 0);  // above 4k: the 4k figure
    CHECK_NEAR(attention_tflops(hw, 4096, true), 319 * 310.0 / 368, 1e-12, 0);
    hw.attention_fwd_tflops = 85;
    CHECK_NEAR(attention_tflops(hw, 512, true), 85 * 214.0 / 309, 1e-12, 0);
}

// Priced by its SASS, the training attention is never faster than FlashAttention-3's published rates
// (gpu_spec.h: forward 423, backward 424 TFLOP/s at 1k tokens, head dim 128), FA3 counting 2 and 5
// products of len^2 / 2 x D per head where our backward executes 7; the backward with its delta pass.
TEST(perf_model_training_attention_no_faster_than_fa3) {
    CHECK_NEAR(fa3_tflops(1024, false), 423, 1e-12, 0);
    CHECK_NEAR(fa3_tflops(1024 * std::sqrt(2.0), true), (424 + 501) / 2.0, 1e-12, 0);
    CHECK_NEAR(fa3_tflops(100, false), 292, 1e-12, 0);
    CHECK_NEAR(fa3_tflops(65536, true), 542, 1e-12, 0);
    const GpuSpec g = h100();
    const PerfHardware hw = sass_hardware(g);
    StepShape s = qwen3_1p7b_head_step();
    s.model.head_dim = 128, s.model.num_heads = 16, s.model.num_kv_heads = 8;
    const std::vector<KernelCost> ks = step_kernels(hw, s, Precision::FP8, StepStructure::Fused);
    const double layers = s.model.num_layers, per_head = 128 * 16 * 1024.0 * 1024 * (16384 / 1024);
    const KernelCost& fwd = find_kernel(ks, "attention forward");
    const KernelCost& bwd = find_kernel(ks, "attention backward (dq, dk/dv)");
    const KernelCost& delta = find_kernel(ks, "attention delta -> FP8 att^T");  // FA3's timed backward includes it
    CHECK(fwd.calls * fwd.work / fwd.rate >= layers * 2 * per_head / 423e12 * (1 - 1e-12));
    CHECK(bwd.calls * bwd.work / bwd.rate + delta.seconds(hw) >= layers * 5 * per_head / 424e12 * (1 - 1e-12));
}

TEST(perf_model_optimizer_bytes_at_qwen3_1_7b) {
    const PerfHardware hw;
    StepShape s;
    s.model = small_qwen3();
    s.model.vocab_size = 151936, s.model.hidden_size = 2048, s.model.intermediate_size = 6144, s.model.num_layers = 28;
    s.model.num_heads = 16, s.model.num_kv_heads = 8, s.model.head_dim = 128;
    s.tokens = 16384, s.seq_len = 1024;
    // 151936 x 2048 embedding + 28 x (q 2048^2, k and v 1024 x 2048, o 2048^2, gate, up, down 6144 x 2048,
    // two norms of 2048, q/k norms of 128) + the final norm: 1.72 B, 1.41 B of them in projections
    const double P = 1720574976, projections = 1409286144;
    const KernelCost fp8 = find_kernel(step_kernels(hw, s, Precision::FP8, StepStructure::Fused), "AdamW + BF16 and FP8 copies");
    const KernelCost bf16 = find_kernel(step_kernels(hw, s, Precision::BF16, StepStructure::Fused), "AdamW + BF16 copy");
    // master, gradient, m, v read; master, m, v written (FP32); the BF16 copy; in fp8 the codes of
    // each projection weight and of its transpose
    CHECK_EQ(bf16.bytes, P * (7 * 4 + 2));
    CHECK_NEAR(fp8.bytes, P * (7 * 4 + 2) + projections * 2 * (1 + 4.0 / 128), 1e-12, 0);
    CHECK_EQ(fp8.launches, 4 * 28 + 1);
    // one update per 4 micro-batches: a quarter of each optimizer kernel per micro-batch
    s.micro_batches = 4;
    CHECK_EQ(find_kernel(step_kernels(hw, s, Precision::FP8, StepStructure::Fused), "AdamW + BF16 and FP8 copies").calls, 0.25);
}

// The LM head in tiles at Qwen3-1.7B (16,384 tokens, C = 2,048, V = 151,936 = 74 x 2,048 + 384). In
// one 16,384-token block the statistics read every logit from HBM; in 1,024-token tiles the same
// FLOPs and the same logit bytes, from L2 (a tile's working set: W rows 8 MiB, X rows 4 MiB, logits
// 8 MiB, within 0.75 of 50 MiB), 16 times the launches, and HBM only the per-token statistics.
TEST(perf_model_head_tiles_read_logits_from_l2) {
    PerfHardware hw;
    const GpuSpec g = h100();
    hw.gpu = &g;
    StepShape s = qwen3_1p7b_head_step();
    const double T = 16384, logits = T * (74 * 2048 + 384) * 4;
    s.fused_head = false;  // the passes without a gradient's tiles, forward then backward
    auto head = [&](int block, const char* name, double& hbm, double& l2, double& calls, double& flops) {
        s.head_token_block = block;
        hbm = l2 = calls = flops = 0;
        for (const KernelCost& k : step_kernels(hw, s, Precision::BF16, StepStructure::Fused))
            if (k.name == name) hbm += k.calls * k.bytes, l2 += k.calls * k.l2_bytes, calls += k.calls, flops += k.calls * k.work;
    };
    double hbm[2], l2[2], calls[2], flops[2];
    head(16384, "head softmax statistics", hbm[0], l2[0], calls[0], flops[0]);
    head(1024, "head softmax statistics", hbm[1], l2[1], calls[1], flops[1]);
    CHECK_NEAR(hbm[0], logits + 75 * T * 28, 1e-12, 0);
    CHECK_EQ(l2[0], 0.0);
    CHECK_NEAR(l2[1], logits, 1e-12, 0);
    CHECK_NEAR(hbm[1], 75 * T * 28, 1e-12, 0);
    CHECK_EQ(calls[1], 16 * calls[0]);
    double gemm_flops[2], unused;
    head(16384, "head logits", unused, unused, unused, gemm_flops[0]);
    head(1024, "head logits", unused, unused, unused, gemm_flops[1]);
    CHECK_NEAR(gemm_flops[1], gemm_flops[0], 1e-12, 0);
    CHECK_NEAR(gemm_flops[0], 2 * T * 2048 * (74 * 2048 + 384), 1e-12, 0);
}

// The fused head (forward_backward) at Qwen3-1.7B, 16,384 tokens in blocks of 1,024: the logits
// GEMMs once (2 T C V FLOPs, against twice in the tiles), the statistics reading each logit once and
// dlogits once more from HBM (the block's 1,024 x 151,936 FP32 logits do not fit in L2), writing the
// block's BF16 dlogits in one launch a block; dX and dW two GEMMs a block each (the 74 full chunks'
// columns, the last 384; dX one GEMM a chunk before issue 59's 75 x 16), the same FLOPs as the
// tiles'; dX reading W and the dlogits once a block from HBM and its rows [1,024][C] once (the last
// chunk's GEMM finds them in L2); and in all 3 of the tiles' 4 GEMMs' FLOPs.
TEST(perf_model_fused_head_computes_logits_once) {
    PerfHardware hw;
    const GpuSpec g = h100();
    hw.gpu = &g;
    StepShape s = qwen3_1p7b_head_step();
    const double T = 16384, C = 2048, V = 151936, logits = T * V * 4, gemm = 2 * T * C * V;
    auto sum = [&](bool fused, const char* name, double* hbm, double* calls, double* flops) {
        s.fused_head = fused;
        *hbm = *calls = *flops = 0;
        for (const KernelCost& k : step_kernels(hw, s, Precision::BF16, StepStructure::Fused))
            if (k.name == name) *hbm += k.calls * k.bytes, *calls += k.calls, *flops += k.calls * k.work;
    };
    double hbm, calls, flops, tiles_flops, unused;
    sum(true, "head logits", &hbm, &calls, &flops);
    CHECK_NEAR(flops, gemm, 1e-12, 0);
    CHECK_EQ(calls, 2 * 16.0);  // the 74 full chunks' columns and the last 384 in two GEMMs a block
    sum(true, "head softmax statistics", &hbm, &calls, &flops);
    CHECK_NEAR(hbm, logits + T * 28, 1e-12, 0);
    CHECK_EQ(calls, 16.0);
    sum(true, "head dlogits", &hbm, &calls, &flops);
    CHECK_NEAR(hbm, logits + T * V * 2 + T * 20, 1e-12, 0);
    CHECK_EQ(calls, 16.0);
    for (const char* name : {"head dX", "head dW"}) {
        sum(true, name, &hbm, &calls, &flops);
        sum(false, name, &unused, &unused, &tiles_flops);
        CHECK_EQ(calls, 2 * 16.0);
        CHECK_NEAR(flops, tiles_flops, 1e-12, 0);
        if (std::string(name) == "head dX") CHECK_NEAR(hbm, 16 * V * C * 2 + T * V * 2 + 2 * T * C * 4, 1e-12, 0);
    }
    sum(true, "head logits (again)", &hbm, &calls, &flops);
    CHECK_EQ(calls, 0.0);
    double head_flops[2] = {0, 0};
    for (int fused = 0; fused < 2; fused++) {
        s.fused_head = fused;
        for (const KernelCost& k : step_kernels(hw, s, Precision::BF16, StepStructure::Fused))
            if (k.cls == KernelClass::HeadGemm) head_flops[fused] += k.calls * k.work;
    }
    CHECK_NEAR(head_flops[1], 0.75 * head_flops[0], 1e-12, 0);
}

TEST(perf_model_fusion_only_removes_work) {
    const PerfHardware hw;
    const StepShape s = small_step();
    for (Precision p : {Precision::BF16, Precision::FP8})
        CHECK(step_seconds(hw, s, p, StepStructure::Fused) < step_seconds(hw, s, p, StepStructure::Unfused));
    CHECK_THROWS(step_kernels(hw, s, Precision::FP32, StepStructure::Fused), "bf16 or fp8");
}

// kernel_perf_model.h: the issue model worked by hand. A warp issuing 8 FFMAs and 4 I2Fs with 64 warps
// resident: issue 12 / IPC(64), the FMA pipe 8 / 4 = 2, the XU pipe 4 / 0.5 = 8: 8 clocks a warp. The
// sustained IPC 4 w / (w + 0.6) at the reading's two ends (perf-anchors.md): 2.5 with one warp a
// scheduler (4 a SM), 3.6 with six (24).
TEST(kernel_perf_model_issue_rates_by_hand) {
    const GpuSpec g = h100();
    CHECK_NEAR(g.sustained_ipc(4), 2.5, 1e-12, 0);
    CHECK_NEAR(g.sustained_ipc(24), 4 * 6 / 6.6, 1e-12, 0);
    CHECK(g.sustained_ipc(64) < 4);
    SassCounts c;
    c.c[Sass_fp32] = 8, c.c[Sass_conversion] = 4, c.c[Sass_total] = 12;
    CHECK_NEAR(sm_cycles(g, c, 1, 64).issue, 8, 1e-12, 0);
    CHECK_NEAR(sm_cycles(g, c, 4, 64).issue, 32, 1e-12, 0);
    // 40 integer instructions with one warp resident: issue 40 / 2.5 = 16 clocks, the ALU 20
    SassCounts i;
    i.c[Sass_integer] = 40, i.c[Sass_total] = 40;
    CHECK_NEAR(sm_cycles(g, i, 1, 4).issue, 20, 1e-12, 0);
    i.c[Sass_integer] = 20;  // ... 20 integer of 40: the ALU 10, issue 16
    CHECK_NEAR(sm_cycles(g, i, 1, 4).issue, 16, 1e-12, 0);
    // 16 LDS.128 per thread: 16 x 16 x 32 bytes at 0.9 x 128 a clock; 3 MMAs: 3 clocks of the tensor pipe
    SassCounts s;
    s.c[Sass_lds_bytes] = 16 * 16, s.c[Sass_total] = 16, s.c[Sass_mma] = 3;
    CHECK_NEAR(sm_cycles(g, s, 1, 64).smem, 16 * 16 * 32 / (0.9 * 128), 1e-12, 0);
    CHECK_NEAR(sm_cycles(g, s, 1, 64).tensor, 3, 1e-12, 0);
    // the H100's BF16 peak from the datasheet clock: 132 x 1.83 GHz x 4096 = 989.4 TFLOP/s
    CHECK_NEAR(h100().bf16_peak(), 989.4e12, 1e-3, 0);
    CHECK_EQ(h200().hbm, 4.8e12);
    // residency: 128-thread CTAs of 35 KB: 228 KB / 36 KB = 6; of 1 KB: 2048 / 128 = 16 threads' worth
    CHECK_EQ(g.resident_ctas(128, 35 * 1024), 6);
    CHECK_EQ(g.resident_ctas(128, 1024), 16);
}

// A launch worked by hand: 1,000 CTAs of 128 threads and 35 KB (6 a SM, 24 warps: IPC 3.64), each
// issuing 400 instructions a thread and waiting 5,000 clocks on its critical path. Issue: 1,000 x 4
// warps x 400 / 3.64 / 132 SMs; latency: each CTA lives 5,000 + 4 x 400 / 2.5 (its warps alone) clocks,
// 1,000 lifetimes over 132 x 6 slots; then 100 us of HBM bytes.
TEST(kernel_perf_model_launch_by_hand) {
    const GpuSpec g = h100();
    CtaClass c;
    c.count = 1000, c.chain = 5000, c.per_thread.c[Sass_total] = 400;
    const double hz = 1.755e9, ipc = 4 * 6 / 6.6;
    KernelPrice p = price_launch(g, 128, 35 * 1024, {c}, 0, 1);
    CHECK_NEAR(p.issue_s, 1000 * 4 * 400 / ipc / 132 / hz, 1e-9, 0);
    CHECK_NEAR(p.latency_s, 1000 * (5000 + 4 * 400 / 2.5) / (132 * 6) / hz, 1e-9, 0);
    CHECK(p.latency_s > p.issue_s);
    CHECK_EQ(std::string(p.bound()), std::string("latency"));
    CHECK_NEAR(p.seconds(), p.latency_s + 3e-6, 1e-9, 0);
    // a grid of one wave: the longest CTA, not the slots' share
    c.count = 100;
    CHECK_NEAR(price_launch(g, 128, 35 * 1024, {c}, 0).latency_s, (5000 + 4 * 400 / 2.5) / hz, 1e-9, 0);
    // bytes: HBM at 0.9 of 3.35 TB/s
    c.count = 1000;
    p = price_launch(g, 128, 35 * 1024, {c}, 100e-6 * 3.35e12 * 0.9, 1);
    CHECK_EQ(std::string(p.bound()), std::string("hbm"));
    CHECK_NEAR(p.seconds(), 100e-6 + 3e-6, 1e-9, 0);
}

// A made-up decode kernel with the recipe's loops: per tile of 32 keys for 2 queries (4 warps, D 128,
// FP8), the tile loop once (the scores in it), the page ids 1 / 4, the copies (32 bytes a pass)
// 2 x 32 x 128 / 128 / 32 = 2 passes, the clear (16 bytes a pass) of 8 value rows of 128 bytes once per
// 8 tiles 8 x 128 / 128 / 16 / 8 = 1 / 16, the softmax 2 / 4, P V (1 query tile x 4 items of 32
// columns over 4 warps: 1 a warp) 32 / 16 = 2. BF16: copies 4, the clear's rows 256 bytes: 1 / 8. A
// second P V loop (an item a warp may own, QT 2): each loop half the passes for 1 query tile, all of
// them for 2.
TEST(kernel_perf_model_decode_recipe_by_hand) {
    auto loop = [](int parent, float total, std::initializer_list<std::pair<SassClass, float>> more) {
        SassLoop l{0, 0, parent, {}};
        l.counts[Sass_total] = total;
        for (auto m : more) l.counts[m.first] = m.second;
        return l;
    };
    const SassLoop loops[] = {
        loop(-1, 100, {{Sass_barrier, 3}, {Sass_mma, 8}}),   // 0: tiles, the scores in it
        loop(0, 7, {{Sass_ldg_bytes, 4}}),                  // 1: page ids
        loop(0, 10, {{Sass_ldgsts_bytes, 32}}),             // 2: copies
        loop(0, 12, {{Sass_sts_bytes, 16}}),                // 3: clear
        loop(0, 120, {{Sass_shuffle, 10}}),                 // 4: softmax
        loop(0, 60, {{Sass_mma, 8}, {Sass_lds_bytes, 36}}),  // 5: P V, a 16-key step
        loop(0, 60, {{Sass_mma, 8}, {Sass_lds_bytes, 36}}),  // 6: P V, a second item's
    };
    const SassKernel k{"made-up", {}, 6, loops};
    SassCounts c;
    DecodeKernelShape s;
    CHECK(decode_tile_recipe(k, s, 2, &c));
    CHECK_NEAR(c.c[Sass_total], 100 + 7 / 4.0 + 2 * 10 + 12 / 16.0 + 0.5 * 120 + 2 * 60, 1e-9, 0);
    CHECK_NEAR(c.c[Sass_mma], 8 + 2 * 8, 1e-9, 0);
    s.elem_bytes = 2;
    CHECK(decode_tile_recipe(k, s, 2, &c));
    CHECK_NEAR(c.c[Sass_total], 100 + 7 / 4.0 + 4 * 10 + 12 / 8.0 + 0.5 * 120 + 2 * 60, 1e-9, 0);
    s.elem_bytes = 1;
    const SassKernel k2{"made-up, two P V loops", {}, 7, loops};
    CHECK(decode_tile_recipe(k2, s, 2, &c));
    CHECK_NEAR(c.c[Sass_total], 100 + 7 / 4.0 + 2 * 10 + 12 / 16.0 + 0.5 * 120 + 2 * 60, 1e-9, 0);
    CHECK(decode_tile_recipe(k2, s, 32, &c));  // 2 query tiles: 2 items a warp
    CHECK_NEAR(c.c[Sass_total], 100 + 7 / 4.0 + 2 * 10 + 12 / 16.0 + 8 * 120 + 4 * 60, 1e-9, 0);
    // no loop of page ids (the slots looked up in the tile loop's own code): the rest as before
    const SassLoop no_pages[] = {loops[0], loops[2], loops[3], loops[4], loops[5]};
    CHECK(decode_tile_recipe(SassKernel{"no page ids", {}, 5, no_pages}, s, 2, &c));
    CHECK_NEAR(c.c[Sass_total], 100 + 2 * 10 + 12 / 16.0 + 0.5 * 120 + 2 * 60, 1e-9, 0);
    // the clear missing, or a P V loop with a nested loop: not the recipe
    const SassLoop no_clear[] = {loops[0], loops[1], loops[2], loops[4], loops[5]};
    CHECK(!decode_tile_recipe(SassKernel{"no clear", {}, 5, no_clear}, s, 2, &c));
    SassLoop nested[7];
    std::copy(std::begin(loops), std::end(loops), nested);
    nested[6].parent = 5;
    CHECK(!decode_tile_recipe(SassKernel{"nested", {}, 7, nested}, s, 2, &c));
    // a kernel whose loops are not the recipe's (no barrier): the generic price per multiply-add of its
    // innermost math loops
    SassLoop flat[] = {loops[4], loops[5]};
    for (SassLoop& l : flat) l.parent = -1;
    flat[0].counts[Sass_macs] = 512, flat[1].counts[Sass_macs] = 256;
    const SassKernel g{"flat", {}, 2, flat};
    CHECK(!decode_tile_recipe(g, s, 2, &c));
    CHECK_NEAR(generic_cost_per_mac(g).c[Sass_total], 180.0 / 768, 1e-9, 0);
    // registers bind residency: 95 a thread (96 allocated) x 128 threads leave 5 CTAs of 64K registers,
    // where 27,840 bytes of shared memory (+ 1 KB reserved) alone allow 8 of 228 KB
    const GpuSpec h = h100();
    CHECK_EQ(h.resident_ctas(128, 27840, 95), 5);
    CHECK_EQ(h.resident_ctas(128, 27840), 8);
}

// The training attention recipe by hand (D 128, 128 threads, a tile pair's payload 2 x 64 x 128 x 2 /
// 128 = 256 bytes a thread). Before issue 59: copy loops inside the tile loop (16 bytes a pass) make
// 256 / 16 = 16 passes; after: 240 of the bytes copied by the tile loop itself leave 16 / 16 = 1 pass
// to the loop of the rest. A kernel that peels a tile pair's MMAs out of its loop (the pipelined
// forward) runs its loop one pair fewer per CTA: the MMAs outside loops over the tile loop's.
TEST(kernel_perf_model_attention_recipe_by_hand) {
    auto loop = [](int parent, float total, std::initializer_list<std::pair<SassClass, float>> more) {
        SassLoop l{0, 0, parent, {}};
        l.counts[Sass_total] = total;
        for (auto m : more) l.counts[m.first] = m.second;
        return l;
    };
    const double macs = 2.0 * 64 * 64 * 128 / 128;  // forward: QK^T and PV
    const SassLoop looped[] = {loop(-1, 1000, {{Sass_mma, 128}, {Sass_macs, macs}}), loop(0, 44, {{Sass_ldgsts_bytes, 16}})};
    const SassKernel before{"looped copies", {}, 2, looped};
    const AttentionKernelShape fwd{"f", 2, 0};
    SassCounts c;
    CHECK(attention_tile_recipe(before, fwd, 128, 128, &c));
    CHECK_NEAR(c.c[Sass_total], 1000 + 16 * 44, 1e-9, 0);
    CHECK_NEAR(peeled_pairs(before), 0, 0, 0);
    const SassLoop inline_copies[] = {loop(-1, 800, {{Sass_mma, 128}, {Sass_macs, macs}, {Sass_ldgsts_bytes, 240}}),
                                      loop(0, 30, {{Sass_ldgsts_bytes, 16}})};
    SassKernel after{"inline copies", {}, 2, inline_copies};
    after.outside[Sass_mma] = 128;
    CHECK(attention_tile_recipe(after, fwd, 128, 128, &c));
    CHECK_NEAR(c.c[Sass_total], 800 + 1 * 30, 1e-9, 0);
    CHECK_NEAR(peeled_pairs(after), 1, 0, 0);
}

// The decode plan's critical path by hand (kv_cache.cuh's kv_decode_plan_kernel, 256 threads): 512 rows
// are 2 a thread, walked twice at an L2 round trip (300 clocks) a row: 1,200, plus a block scan of 15
// dependent steps of 4 clocks: 60; 256 cascade groups are 1 a thread: the count's load (300), 2 walks of
// 3 dependent L2 loads (1,800), a scan (60). The combine (kv_decode_combine_kernel) of 512 rows of 16
// heads of 128 with 2 chunks each: 8 pairs of 128-column groups over 4 warps = 2 CTAs a row; its HBM
// bytes the partials (129 FP32 a row, head and chunk) plus 2 + 1 bytes an output (BF16 and its FP8
// operand); a lane's chain is its row's length (L2), one batch of LSEs (L2), one batch of LSEs and
// partials (HBM): 1,600 clocks and its instructions, 1,024 CTAs in one wave (132 SMs x 16 CTAs of 128
// threads).
TEST(kernel_perf_model_decode_plan_and_combine_by_hand) {
    const GpuSpec g = h100();
    CHECK_NEAR(decode_plan_clocks(g, 512, 0), 2 * 2 * 300 + 15 * 4.0, 1e-9, 0);
    CHECK_NEAR(decode_plan_clocks(g, 512, 256), 2 * 2 * 300 + 15 * 4.0 + 300 + 2 * 3 * 300 + 15 * 4.0, 1e-9, 0);
    DecodeAttentionShape s;
    s.H = 16, s.KV = 8, s.D = 128, s.grid_rows = 512, s.live_rows = 512, s.own_keys = 100, s.prefix = 256, s.max_len = 1280;
    const DecodeAttentionPrice a = decode_attention_price(g, s);
    CHECK_NEAR(a.combine.hbm_s * g.bandwidth(), 512 * 16 * 2 * 129 * 4.0 + 512 * 2048 * 3.0, 1e-3, 0);
    CHECK_NEAR(a.partial_bytes, 512 * 2 * 16 * 129 * 4.0, 1e-6, 0);
    CHECK_NEAR(a.plan.latency_s, decode_plan_clocks(g, 512, 0) / g.clock, 1e-15, 0);
    if (a.combine_priced) CHECK(a.combine.latency_s >= 1600 / g.clock);  // and the lanes' instructions
    else CHECK_NEAR(a.combine.latency_s, 1600 / g.clock, 1e-15, 0);
    CHECK_MSG(a.combine_priced, "sass_counts.h's kv_decode_combine_kernel<128> no longer matches its recipe");
    // the combine's lane recipe on a made-up kernel: 20 chunks are 2 passes of a maximum loop of 16
    // loads, 3 of a weighted loop of 24 loads (8 chunks), a loop of neither once, the outside once
    auto loop = [](float total, float ldg_ops, float macs) {
        SassLoop l{0, 0, -1, {}};
        l.counts[Sass_total] = total, l.counts[Sass_ldg_ops] = ldg_ops, l.counts[Sass_macs] = macs;
        return l;
    };
    const SassLoop lane_loops[] = {loop(86, 16, 0), loop(420, 24, 160), loop(60, 4, 0)};
    SassKernel lane{"made-up combine", {}, 3, lane_loops};
    lane.outside[Sass_total] = 833;
    SassCounts per_lane;
    CHECK(combine_lane_recipe(lane, 20, &per_lane));
    CHECK_EQ(per_lane.c[Sass_total], 833 + 2 * 86 + 3 * 420 + 60.0);
    const SassKernel no_weights{"no multiply-adds", {}, 1, lane_loops};
    CHECK(!combine_lane_recipe(no_weights, 20, &per_lane));
    // an idle row and 128 padding rows: combine CTAs that write zeros, bytes of output alone
    s.grid_rows = 513, s.pad_rows = 127;
    CHECK_NEAR(decode_attention_price(g, s).combine.hbm_s * g.bandwidth(), 512 * 16 * 2 * 129 * 4.0 + 640 * 2048 * 3.0, 1e-3, 0);
}

// Decode attention over the grid it launches (kernel_perf_model.h): the grid follows the rows' current
// lengths (rounded up to 256 keys), not the rollout's max_len; longer rows cost more; BF16 K/V reads
// twice FP8's bytes; a cascade reads the prompt once a group and writes each member's partials; the
// table's kernels match the recipes.
TEST(kernel_perf_model_decode_grid_follows_lengths) {
    const GpuSpec g = h100();
    DecodeAttentionShape s;
    s.H = 16, s.KV = 8, s.D = 128, s.grid_rows = 512, s.live_rows = 512, s.own_keys = 100, s.prefix = 256, s.max_len = 512;
    const DecodeAttentionPrice short_max = decode_attention_price(g, s);
    CHECK_MSG(short_max.per_row.recipe, "sass_counts.h's kv_decode_split_kernel<128, unsigned char, 1> no longer matches the "
              "decode recipes (cuda/perf/kernel_perf_model.h): it would be priced by the generic lower bound");
    s.max_len = 4096;  // the same rows, a larger configured maximum: the same grid, the same price
    const DecodeAttentionPrice long_max = decode_attention_price(g, s);
    CHECK_EQ(long_max.per_row.seconds(), short_max.per_row.seconds());
    CHECK_EQ(long_max.combine.seconds(), short_max.combine.seconds());
    CHECK_EQ(long_max.bytes, 512 * (100.0 + 256) * 2 * 8 * 128);  // no cascade: every row reads its prompt
    s.own_keys = 1000;  // longer rows: more keys, more chunks
    CHECK(decode_attention_price(g, s).per_row.seconds() > long_max.per_row.seconds());
    s.own_keys = 100, s.fp8_kv = false;
    CHECK_NEAR(decode_attention_price(g, s).bytes, 2 * long_max.bytes, 1e-12, 0);
    CHECK(decode_attention_price(g, s).per_row.recipe);
    // 64 cascade groups of 8 rows: the prompt read once a group; a group's partials for its 8 rows
    s.fp8_kv = true, s.cascade_groups = 64, s.group_members = 8, s.cascade_grid = 256;
    const DecodeAttentionPrice cascade = decode_attention_price(g, s);
    CHECK_EQ(cascade.bytes, (512 * 100.0 + 64 * 256) * 2 * 8 * 128);
    CHECK_NEAR(cascade.partial_bytes, (512 + 64 * 8) * 16 * 129 * 4.0, 1e-6, 0);
    CHECK(cascade.cascade.recipe && cascade.cascade.seconds() > 0);
}

// GEMM shape classes (perf_model.h's gemm_cost on a GPU): a training GEMM at cuBLASLt's FP8 rate
// times its wave efficiency (16 x 128 = 2,048 tiles of 128 x 128 in 16 waves of 132: 2048 / 2112), a
// decode GEMM (128 padded rows) streamed by its 16 CTAs at 112 GB/s each, not at the HBM bandwidth.
TEST(perf_model_gemm_shape_classes) {
    const GpuSpec g = h100();
    const PerfHardware hw = sass_hardware(g);
    const KernelCost big = gemm_cost(hw, "big", KernelClass::LayerGemm, 2048, 16384, 2048, Precision::FP8, GemmOutput::BF16);
    CHECK_NEAR(big.rate, 1.0e15 * 2048 / 2112, 1e-12, 0);
    CHECK_EQ(std::string(big.bound(hw)), std::string("tensor"));
    const KernelCost bf16 = gemm_cost(hw, "bf16", KernelClass::LayerGemm, 2048, 16384, 2048, Precision::BF16, GemmOutput::BF16);
    CHECK_NEAR(bf16.rate, 0.70e15 * 2048 / 2112, 1e-12, 0);
    const KernelCost decode = gemm_cost(hw, "decode", KernelClass::LayerGemm, 2048, 128, 6144, Precision::BF16, GemmOutput::BF16);
    CHECK_EQ(decode.stream_bandwidth, 16 * 112e9);
    CHECK_NEAR(decode.memory_seconds(hw), decode.bytes / (16 * 112e9), 1e-12, 0);
    // 16 tiles on 132 SMs: the compute side at 16 / 132 of the rate
    CHECK_NEAR(decode.rate, 0.70e15 * 16 / 132, 1e-12, 0);
    // 64 tokens and 2,112 rows: 17 tiles of 128 x 128, filled 2112 x 64 / (17 x 128 x 128)
    const KernelCost part = gemm_cost(hw, "part", KernelClass::LayerGemm, 2112, 64, 7168, Precision::FP8, GemmOutput::BF16);
    CHECK_NEAR(part.rate, 1.0e15 * 17 / 132 * (2112.0 * 64 / (17 * 128 * 128)), 1e-12, 0);
    CHECK_EQ(part.stream_bandwidth, 17 * 112e9);
    // without a GPU (the anchors): no shape classes
    const KernelCost anchors = gemm_cost(PerfHardware(), "a", KernelClass::LayerGemm, 2112, 64, 7168, Precision::FP8, GemmOutput::BF16);
    CHECK_EQ(anchors.stream_bandwidth, 0.0);
}

// Little's law for memory-bound kernels (kernel_perf_model.h's streaming_bandwidth): a loop of three
// 2-byte loads and a 4-byte store a pass (10 bytes), 121 instructions: 2,048 threads a SM move 20 KB a
// pass, a pass lasting max(1,000 clocks of HBM latency, 64 warps x 121 / IPC(64)).
TEST(kernel_perf_model_streaming_bandwidth_by_hand) {
    const GpuSpec g = h100();
    SassLoop l{0, 0, -1, {}};
    l.counts[Sass_ldg_bytes] = 6, l.counts[Sass_stg_bytes] = 4, l.counts[Sass_total] = 121;
    const SassKernel k{"made-up glue", {}, 1, &l};
    const double clocks = std::max(1000.0, 64 * 121 / g.sustained_ipc(64));
    CHECK_NEAR(streaming_bandwidth(g, k), 132 * 2048 * 10 / clocks * 1.755e9, 1e-12, 0);
    CHECK(streaming_bandwidth(g, k) < g.bandwidth());
    l.counts[Sass_ldg_bytes] = 48, l.counts[Sass_stg_bytes] = 32;  // 16-byte accesses: the bandwidth binds
    CHECK_EQ(streaming_bandwidth(g, k), g.bandwidth());
}

// The GRPO step adds its phases and its kernels; every kernel has a bound of the issue's list; data
// parallel adds the FP32 gradients' all-reduce: 2 (n - 1) / n of their bytes at the NCCL bus bandwidth.
TEST(kernel_perf_model_grpo_step_adds_its_phases) {
    const GpuSpec g = h100();
    ModelConfig c = small_qwen3();
    c.head_dim = 128, c.num_heads = 4, c.num_kv_heads = 2;
    GrpoShape s;
    s.prompts = 2, s.group = 2, s.prompt_len = 16, s.response_min = 4, s.response_max = 8;
    const GrpoPrediction r = predict_grpo_step(g, c, Precision::FP8, Precision::FP8, s);
    double sum = 0, kernels = 0;
    for (const auto* phases : {&r.rollout, &r.train})
        for (const auto& p : *phases) {
            CHECK(p.second > 0 || p.first == "FP8 quantization" || p.first == "zeroing");
            sum += p.second;
        }
    CHECK_NEAR(r.step_s(), sum, 1e-12, 0);
    CHECK(r.rollout.count("decode attention") && r.train.count("attention"));
    const std::vector<std::string> bounds = {"issue", "smem", "hbm", "l2", "tensor", "latency", "launch", "ceiling"};
    for (const PricedKernel& k : r.kernels) {
        kernels += k.seconds;
        CHECK_MSG(std::find(bounds.begin(), bounds.end(), k.bound()) != bounds.end(), "%s: bound %s", k.name.c_str(), k.bound());
    }
    CHECK_NEAR(kernels, r.step_s(), 1e-9, 0);
    CHECK(!r.train.count("gradient all-reduce"));
    s.gpus = 2, s.prompts = 4;
    size_t params = 0;
    tensor_layout(c, &params);
    const GrpoPrediction two = predict_grpo_step(g, c, Precision::FP8, Precision::FP8, s);
    CHECK_NEAR(two.train.at("gradient all-reduce"), params * 4.0 * 2 * (2 - 1) / 2 / 370e9, 1e-12, 0);
}

// An SFT step (update_perf_model.h) at Qwen2.5-7B's shape (test/fixtures/configs), 8 rows of 8,192
// tokens: its projection GEMMs do 6 N T FLOPs (N = the layers' projection weights, counted here from
// the shape, T = 65,536 tokens) at cuBLASLt's rates (gpu_spec.h: BF16 700, FP8 1,000 TFLOP/s) within
// 5% (wave efficiency, launches and the operands' traffic are the rest); in fp8 the trainer's own FP8
// GEMM runs them, never faster than DeepGEMM's best published rate (1,426 TFLOP/s), with cuBLASLt's
// price of the same calls kept beside; FP8 quantization is fp8's alone. Attention is BF16 in both,
// but in fp8 the backward's delta kernel also writes O's transposed FP8 operand (the O wgrad's): its
// codes and scales (1 + 4/128 bytes a value, T x 28 x 128 values a layer and micro-batch) at HBM's
// bandwidth more.
TEST(perf_model_sft_step_projection_flops) {
    const ModelConfig c = load_model_config("test/fixtures/configs/qwen2_5_7b");
    const double C = 3584, I = 18944, L = 28, KVD = 4 * 128, T = 8.0 * 8192;
    const double N = L * (2 * C * C + 2 * C * KVD + 3 * C * I);
    for (const GpuSpec& g : {h100(), h200()}) {
        const UpdatePrediction bf16 = predict_sft_step(g, c, Precision::BF16, SftShape()),
                               fp8 = predict_sft_step(g, c, Precision::FP8, SftShape());
        CHECK_EQ(bf16.micro_batches, 8);
        CHECK_NEAR(bf16.phases.at("projection GEMMs"), 6 * N * T / 0.70e15, 0.05, 0);
        CHECK(bf16.phases.at("projection GEMMs") >= 6 * N * T / 0.70e15);
        const PerfHardware hw = sass_hardware(g);
        double cublaslt = 0;  // one micro-batch's projection GEMMs on cuBLASLt, times the micro-batches
        for (const KernelCost& k : fp8.step)
            if (k.cls == KernelClass::LayerGemm)
                cublaslt += fp8.micro_batches * k.calls * (k.cublaslt_call_s > 0 ? k.cublaslt_call_s : k.call_seconds(hw));
        CHECK_NEAR(cublaslt, 6 * N * T / 1.0e15, 0.05, 0);
        CHECK(fp8.phases.at("projection GEMMs") >= 6 * N * T / 1.426e15);
        CHECK(fp8.phases.count("FP8 quantization") && fp8.phases.at("FP8 quantization") > 0);
        CHECK(!bf16.phases.count("FP8 quantization") || bf16.phases.at("FP8 quantization") == 0);
        CHECK_NEAR(fp8.phases.at("attention") - bf16.phases.at("attention"),
                   L * T * (28 * 128) * (1 + 4.0 / 128) / hw.bandwidth(), 1e-9, 0);
    }
}

// --calibrate on a synthetic directory (cuda/perf/calibrate.h): per constant the geometric mean of the
// ratios of the measurements that rest on it, contradicted outside [0.8, 1.25]; a malformed line, a ratio
// that is not measured / predicted, an unknown constant or an empty directory: an error naming it.
TEST(perf_model_calibrate_reports_contradicted_constants) {
    harness::TempDir dir;
    std::filesystem::create_directories(dir / "calibration");
    harness::write_text(dir / "calibration/bench_a.tsv",
                        "# kernel\tmeasured_s\tpredicted_s\tratio\tbound\tconstants\n"
                        "gemm 8192\t0.0011\t0.001\t1.1\ttensor\tgemm_fp8_block_flops\n"
                        "gemm 4096\t0.00045\t0.0005\t0.9\ttensor\tgemm_fp8_block_flops\n");
    harness::write_text(dir / "calibration/bench_b.tsv",
                        "decode attention\t0.004\t0.001\t4\tlatency\tl2_latency_clocks,hbm_latency_clocks\n"
                        "decode attention 2\t0.001\t0.001\t1\tlatency\tl2_latency_clocks\n");
    const std::vector<ConstantVerdict> v = judge_constants(read_calibration(dir.path));
    CHECK_EQ(v.size(), (size_t)3);
    for (const ConstantVerdict& c : v) {
        if (c.name == "gemm_fp8_block_flops") CHECK(!c.contradicted && c.measurements == 2 && std::fabs(c.mean_ratio - std::sqrt(1.1 * 0.9)) < 1e-12);
        if (c.name == "l2_latency_clocks") CHECK(c.contradicted && std::fabs(c.mean_ratio - 2) < 1e-12 && c.max_ratio == 4);
        if (c.name == "hbm_latency_clocks") CHECK(c.contradicted && c.mean_ratio == 4);
    }
    FILE* sink = fopen("/dev/null", "w");
    CHECK_EQ(print_calibration(dir.path, sink), 2);
    fclose(sink);
    harness::write_text(dir / "calibration/bench_c.tsv", "gemm\t0.002\t0.001\t1.5\ttensor\tgemm_fp8_block_flops\n");
    CHECK_THROWS(read_calibration(dir.path), "bench_c.tsv:1");
    harness::write_text(dir / "calibration/bench_c.tsv", "gemm\t0.002\t0.001\t2\ttensor\tno_such_constant\n");
    CHECK_THROWS(read_calibration(dir.path), "unknown constant");
    harness::TempDir empty;
    CHECK_THROWS(read_calibration(empty.path), "no directory");
    std::filesystem::create_directories(empty / "calibration");
    CHECK_THROWS(read_calibration(empty.path), "no .tsv file");
}

// The own FP8 block GEMM (kernel_perf_model.h's fp8_block_gemm_price) on a made-up SASS row like
// fp8_block_gemm_kernel<true>'s at 2a49a36: a k-block loop of two blocks a pass (496 instructions, 260
// FP32, 256 MMA units: 248 a block), 1,000 instructions outside loops holding two blocks' MMAs (the
// first block and the tail: 2 peeled), and a 1-instruction loop (once a CTA). 256 threads, 203,776
// bytes of shared memory (6 x (32,768 + 1,024) + 1,024) and 255 registers: 1 CTA an SM.
// D [1408][1536] over k = 1024: 12 x 11 = 132 tiles, one wave, 8 k blocks. A k block: 2 x 128^3 FLOP /
// 8,192 a clock = 512 clocks of tensor against its 8 warps' 248 instructions at IPC(8) = 8 / 2.6:
// 644.8, which binds. A CTA: its 1,001 other instructions (1,001 x 2.6), an HBM round trip (1,000), the 2
// peeled blocks' tensor time, 6 blocks at 644.8: 8,495.4 clocks at 1.755 GHz. The ceiling: the nearest
// DeepGEMM shape by |log2 (m n / (4096 N))| + |log2 (k / K)| is N 7168 K 2048 (3.76 + 1 = 4.76; next
// 2112 x 7168: 2 + 2.81), 1,168 TFLOP/s: 2 x 1536 x 1408 x 1024 / 1.168e15 s, faster than the SASS
// price, which binds ("issue"). A loop of 32 instructions a block and nothing outside makes the CTA
// 1,000 + 8 x 512 clocks ("tensor"), faster than DeepGEMM's rate: the ceiling binds.
TEST(kernel_perf_model_fp8_block_gemm_by_hand) {
    const GpuSpec g = h100();
    const double hz = 1.755e9;
    SassLoop loops[2] = {{0, 0, -1, {}}, {0, 0, -1, {}}};
    loops[0].counts[Sass_total] = 496, loops[0].counts[Sass_fp32] = 260, loops[0].counts[Sass_mma] = 256;
    loops[1].counts[Sass_total] = 1, loops[1].counts[Sass_control] = 1;
    SassKernel k{"made-up block GEMM", {}, 2, loops};
    k.outside[Sass_total] = 1000, k.outside[Sass_mma] = 256;
    CHECK_EQ(g.resident_ctas(256, 6 * (32768.0 + 1024) + 1024, 255), 1);
    const double m = 1536, n = 1408, K = 1024, flops = 2 * m * n * K;
    BlockGemmPrice p = fp8_block_gemm_price(g, k, m, n, K, 0, false);
    CHECK(p.sass.recipe);
    const double cta = 1001 * 2.6 + 1000 + 2 * 512 + 6 * (248 * 2.6);
    CHECK_NEAR(cta, 8495.4, 1e-9, 0);
    CHECK_NEAR(p.sass.issue_s, cta / hz, 1e-12, 0);
    CHECK_EQ(p.sass.tensor_s, 0.0);
    CHECK_EQ(p.ceiling->n, 7168.0);
    CHECK_EQ(p.ceiling->k, 2048.0);
    CHECK_NEAR(p.ceiling_s, flops / 1168e12, 1e-12, 0);
    CHECK_EQ(std::string(p.compute_bound()), std::string("issue"));
    CHECK_NEAR(p.seconds(), cta / hz + 3e-6, 1e-12, 0);
    // accumulating: one more HBM round trip a CTA (D read before the epilogue's stores)
    CHECK_NEAR(fp8_block_gemm_price(g, k, m, n, K, 0, true).sass.issue_s, (cta + 1000) / hz, 1e-12, 0);
    // twice the tiles: two waves of the same CTA
    CHECK_NEAR(fp8_block_gemm_price(g, k, 2 * m, n, K, 0, false).sass.issue_s, 2 * cta / hz, 1e-12, 0);
    // a lean loop: the tensor time binds a block, the ceiling the GEMM
    loops[0].counts[Sass_total] = 64, loops[0].counts[Sass_fp32] = 0;
    k.loops = 1, k.outside[Sass_total] = 0, k.outside[Sass_mma] = 0;
    p = fp8_block_gemm_price(g, k, m, n, K, 0, false);
    CHECK_NEAR(p.sass.tensor_s, (1000 + 8 * 512) / hz, 1e-12, 0);
    CHECK_EQ(std::string(p.bound()), std::string("ceiling"));
    CHECK_NEAR(p.seconds(), flops / 1168e12 + 3e-6, 1e-12, 0);
    // a row without an MMA loop: its tensor time alone, recipe false
    SassLoop plain{0, 0, -1, {}};
    plain.counts[Sass_total] = 10;
    const BlockGemmPrice lower = fp8_block_gemm_price(g, SassKernel{"no MMA loop", {}, 1, &plain}, m, n, K, 0, false);
    CHECK(!lower.sass.recipe);
    CHECK_NEAR(lower.sass.tensor_s, (1000 + 8 * 512) / hz, 1e-12, 0);
    // HBM: 1 GB at 0.9 x 3.35 TB/s binds
    CHECK_EQ(std::string(fp8_block_gemm_price(g, k, m, n, K, 1e9, false).bound()), std::string("hbm"));
    // the published classes by shape: wgrad-like (k = 16,384, 2048 x 12288 out) -> N 7168 K 16384;
    // 2048 x 2048 out over 16,384 -> N 2112 K 7168 (1.04 + 1.19 against 2.81 + 0)
    CHECK_EQ(deepgemm_nearest(2048, 12288, 16384).tflops, 1426.0);
    CHECK_EQ(deepgemm_nearest(2048, 2048, 16384).tflops, 1009.0);
}

// The training step's projection GEMMs on the own kernel (sass_counts.h holds its rows once ./train_rl
// runs it): in an fp8 training step each fitting GEMM is priced by fp8_block_gemm_price at its
// compute (rate = FLOPs / the slower of the SASS price and the ceiling), cuBLASLt's price of the call
// kept beside it; a prefill's forward, --fp8_gemm_kernel cublaslt (own_fp8_gemm false) and bf16 keep cuBLASLt.
// Each call is priced by the SASS row of the instantiation its launcher runs (A's scale mode, D's mode,
// k's parity: fp8_block_gemm.cuh's fp8_block_gemm).
TEST(perf_model_trainer_gemms_on_the_own_fp8_kernel) {
    const GpuSpec g = h100();
    const PerfHardware hw = sass_hardware(g);
    const char* fprop = "fp8_block_gemm_kernel<true, __nv_bfloat16, false, false>";  // k = 2048: 16 blocks
    const char* wgrad = "fp8_block_gemm_kernel<false, float, true, false>";          // k = 16384 tokens: 128
    const SassKernel* blk = find_sass_kernel(fprop);
    CHECK(blk && find_sass_kernel(wgrad));
    if (!blk) return;
    CHECK_EQ(fp8_block_gemm_kernel_name(true, GemmOutput::BF16, 2048), std::string(fprop));
    CHECK_EQ(fp8_block_gemm_kernel_name(false, GemmOutput::F32_Accumulate, 16256), std::string("fp8_block_gemm_kernel<false, float, true, true>"));
    CHECK_EQ(fp8_block_gemm_kernel_name(true, GemmOutput::F32, 384), std::string("fp8_block_gemm_kernel<true, float, false, true>"));
    StepShape s = qwen3_1p7b_head_step();
    s.model.intermediate_size = 6144, s.model.num_heads = 16, s.model.num_kv_heads = 8, s.model.head_dim = 128;
    const KernelCost own = find_kernel(step_kernels(hw, s, Precision::FP8, StepStructure::Fused), "O fprop");
    CHECK_EQ(own.sass_kernel, std::string(fprop));
    CHECK_EQ(find_kernel(step_kernels(hw, s, Precision::FP8, StepStructure::Fused), "O wgrad").sass_kernel, std::string(wgrad));
    const KernelCost cublaslt = gemm_cost(hw, "O fprop", KernelClass::LayerGemm, 2048, 16384, 2048, Precision::FP8, GemmOutput::BF16);
    const BlockGemmPrice p = fp8_block_gemm_price(g, *blk, 2048, 16384, 2048, cublaslt.bytes, false);
    CHECK_NEAR(own.rate, 2.0 * 2048 * 16384 * 2048 / std::max(p.sass.compute_s(), p.ceiling_s), 1e-12, 0);
    CHECK_NEAR(own.cublaslt_call_s, cublaslt.call_seconds(hw), 1e-15, 0);
    CHECK(own.ceiling == p.ceiling);
    CHECK_EQ(std::string(own.compute_bound), std::string(p.compute_bound()));
    s.own_fp8_gemm = false;
    CHECK_EQ(find_kernel(step_kernels(hw, s, Precision::FP8, StepStructure::Fused), "O fprop").rate, cublaslt.rate);
    s.own_fp8_gemm = true, s.training = false;
    CHECK_EQ(find_kernel(step_kernels(hw, s, Precision::FP8, StepStructure::Fused), "O fprop").rate, cublaslt.rate);
    s.training = true;
    CHECK_EQ(find_kernel(step_kernels(hw, s, Precision::BF16, StepStructure::Fused), "O fprop").cublaslt_call_s, 0.0);
}
