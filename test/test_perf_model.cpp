// Tests of cuda/perf/perf_model.h against cases worked by hand: each expected value is written out here
// from the shapes (a GEMM's 2mnk and operand bytes, a memory-bound kernel's bytes, the step's 6 N T
// GEMM FLOPs, the FA2 figures), never read back from the model; the per-layer launch counts are
// issue 28's (24 and 17 counted in emulation before it, 10 and 9 its target).
#include "cuda/perf/grpo_perf_model.h"
#include "cuda/perf/perf_model.h"
#include "cuda/perf/update_perf_model.h"
#include "test/harness.h"

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
    // SwiGLU reads [T][2I] BF16 and writes a in BF16, in fp8 also its codes with a scale per 128
    const KernelCost fp8 = find_kernel(step_kernels(hw, s, Precision::FP8, StepStructure::Fused), "SwiGLU");
    const KernelCost bf16 = find_kernel(step_kernels(hw, s, Precision::BF16, StepStructure::Fused), "SwiGLU");
    CHECK_EQ(fp8.bytes, T * 2 * I * 2 + T * I * 2 + T * I * (1 + 4.0 / 128));
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
    const double want[2][2] = {{17, 24}, {9, 10}};  // [unfused, fused][bf16, fp8]
    for (StepStructure st : {StepStructure::Unfused, StepStructure::Fused})
        for (Precision p : {Precision::BF16, Precision::FP8}) {
            double launches = 0;
            for (const KernelCost& k : step_kernels(hw, s, p, st))
                if (k.per_layer && k.phase == StepPhase::Forward) launches += k.calls * k.launches;
            CHECK_EQ(launches / 3, want[st == StepStructure::Fused][p == Precision::FP8]);
        }
}

TEST(perf_model_step_gemm_flops_are_6_params_tokens_plus_4_head_gemms) {
    const PerfHardware hw;
    const StepShape s = small_step();
    const double T = 1024, C = 256, I = 768, L = 3, Q = 4 * 64, K = 2 * 64, V = 5000;
    const double projections = L * (C * (Q + 2 * K) + Q * C + 3 * C * I);
    for (StepStructure st : {StepStructure::Unfused, StepStructure::Fused})
        for (Precision p : {Precision::BF16, Precision::FP8}) {
            const std::vector<KernelCost> ks = step_kernels(hw, s, p, st);
            CHECK_NEAR(sum_work(ks, KernelClass::LayerGemm), 6 * T * projections, 1e-12, 0);
            // logits, logits again, dX, dW over the vocabulary (5000 = 2 x 2048 + 904, chunks already multiples of 8)
            CHECK_NEAR(sum_work(ks, KernelClass::HeadGemm), 4 * 2 * T * C * V, 1e-12, 0);
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

TEST(perf_model_fusion_only_removes_work) {
    const PerfHardware hw;
    const StepShape s = small_step();
    for (Precision p : {Precision::BF16, Precision::FP8})
        CHECK(step_seconds(hw, s, p, StepStructure::Fused) < step_seconds(hw, s, p, StepStructure::Unfused));
    CHECK_THROWS(step_kernels(hw, s, Precision::FP32, StepStructure::Fused), "bf16 or fp8");
}

// kernel_perf_model.h: the issue model worked by hand. A warp issuing 8 FFMAs and 4 I2Fs: issue 12 / 4 = 3
// clocks, the FMA pipe 8 / 4 = 2, the XU pipe 4 / 0.5 = 8: 8 clocks a warp.
TEST(kernel_perf_model_issue_rates_by_hand) {
    SassCounts c;
    c.c[Sass_fp32] = 8, c.c[Sass_conversion] = 4, c.c[Sass_total] = 12;
    CHECK_NEAR(sm_cycles(c, 1), 8, 1e-12, 0);
    CHECK_NEAR(sm_cycles(c, 4), 32, 1e-12, 0);
    // 40 integer instructions: issue 10, ALU 20 clocks; 16 LDS.128 per thread: 16 x 16 x 32 bytes at 128 a clock = 64
    SassCounts i;
    i.c[Sass_integer] = 40, i.c[Sass_total] = 40;
    CHECK_NEAR(sm_cycles(i, 1), 20, 1e-12, 0);
    SassCounts s;
    s.c[Sass_lds_bytes] = 16 * 16, s.c[Sass_total] = 16;
    CHECK_NEAR(sm_cycles(s, 1), 64, 1e-12, 0);
    // the H100's BF16 peak from the clock: 132 x 1.83 GHz x 4096 = 989.4 TFLOP/s
    CHECK_NEAR(h100().bf16_peak(), 989.4e12, 1e-3, 0);
    CHECK_EQ(h200().hbm, 4.8e12);
}

// A made-up decode kernel with the recipe's loops: per tile of 32 keys for 2 queries (4 warps, D 128,
// FP8), the tile loop once, the page ids 1 / 4, the copies (32 bytes a pass) 2 x 32 x 128 / 128 / 32 = 2
// passes, the conversion of V (32 codes a pass) 32 x 128 / 128 / 32 = 1, the scores 1 x 4 / 4 = 1, the
// softmax 2 / 4, P V 1 x 8 / 4 = 2 and its nested loop 2 x 32 / 16 = 4. BF16: no conversion; the clear
// (16 rows x 64 words of the last tile, once per 8 tiles) 16 x 64 / 128 / 8 = 1 pass.
TEST(kernel_perf_model_decode_recipe_by_hand) {
    auto loop = [](int parent, float total, std::initializer_list<std::pair<SassClass, float>> more) {
        SassLoop l{0, 0, parent, {}};
        l.counts[Sass_total] = total;
        for (auto m : more) l.counts[m.first] = m.second;
        return l;
    };
    const SassLoop loops[] = {
        loop(-1, 100, {{Sass_barrier, 3}}),                                 // 0: tiles
        loop(0, 7, {{Sass_ldg_bytes, 4}}),                                  // 1: page ids
        loop(0, 10, {{Sass_ldgsts_bytes, 32}}),                             // 2: copies
        loop(0, 50, {{Sass_conversion, 16}, {Sass_lds_bytes, 32}, {Sass_sts_bytes, 64}}),  // 3: convert
        loop(0, 60, {{Sass_mma, 8}, {Sass_lds_bytes, 192}}),                // 4: scores
        loop(0, 120, {{Sass_shuffle, 10}}),                                 // 5: softmax
        loop(0, 40, {{Sass_lds_bytes, 64}}),                                // 6: P V
        loop(6, 20, {{Sass_mma, 4}}),                                       // 7: its 16-key steps
    };
    const SassKernel k{"made-up", {}, 8, loops};
    SassCounts c;
    DecodeKernelShape s;
    CHECK(decode_tile_recipe(k, s, 2, &c));
    CHECK_NEAR(c.c[Sass_total], 100 + 7 / 4.0 + 2 * 10 + 1 * 50 + 60 + 0.5 * 120 + 2 * 40 + 4 * 20, 1e-9, 0);
    CHECK_NEAR(c.c[Sass_mma], 8 + 4 * 4, 1e-9, 0);
    // BF16: the conversion loop must not be there, the clear must
    s.elem_bytes = 2;
    CHECK(!decode_tile_recipe(k, s, 2, &c));
    SassLoop bf16[8];
    std::copy(std::begin(loops), std::end(loops), bf16);
    bf16[3] = loop(0, 12, {{Sass_sts_bytes, 8}});  // 3: clear
    const SassKernel kb{"made-up bf16", {}, 8, bf16};
    CHECK(decode_tile_recipe(kb, s, 2, &c));
    CHECK_NEAR(c.c[Sass_total], 100 + 7 / 4.0 + 4 * 10 + 1 * 12 + 60 + 0.5 * 120 + 2 * 40 + 4 * 20, 1e-9, 0);
    // a kernel whose loops are not the recipe's (no barrier): the generic price per multiply-add of its
    // innermost math loops
    SassLoop flat[] = {loops[4], loops[7]};
    for (SassLoop& l : flat) l.parent = -1;
    flat[0].counts[Sass_macs] = 512, flat[1].counts[Sass_macs] = 256;
    const SassKernel g{"flat", {}, 2, flat};
    s.elem_bytes = 1;
    CHECK(!decode_tile_recipe(g, s, 2, &c));
    CHECK_NEAR(generic_cost_per_mac(g).c[Sass_total], 80.0 / 768, 1e-9, 0);
}

// The GRPO step adds its phases; decode attention reads the bytes it is given at the bandwidth.
TEST(kernel_perf_model_grpo_step_adds_its_phases) {
    const GpuSpec g = h100();
    ModelConfig c = small_qwen3();
    c.head_dim = 128, c.num_heads = 4, c.num_kv_heads = 2;
    GrpoShape s;
    s.prompts = 2, s.group = 2, s.prompt_len = 16, s.response_min = 4, s.response_max = 8;
    const GrpoPrediction r = predict_grpo_step(g, c, Precision::FP8, Precision::FP8, s);
    double sum = 0;
    for (const auto* phases : {&r.rollout, &r.train})
        for (const auto& p : *phases) {
            CHECK(p.second > 0 || p.first == "FP8 quantization" || p.first == "zeroing");
            sum += p.second;
        }
    CHECK_NEAR(r.step_s(), sum, 1e-12, 0);
    CHECK(r.rollout.count("decode attention") && r.train.count("attention"));
    // the decode attention of 4 rows at 100 keys: 1 byte per FP8 element, 2 per BF16, so BF16 reads twice
    const KernelPrice f = decode_attention_price(g, true, 4, 100, 4, 2, 128, 1e6, 2), b = decode_attention_price(g, false, 4, 100, 4, 2, 128, 2e6, 2);
    CHECK_NEAR(b.memory_s, 2 * f.memory_s, 1e-15, 0);
    CHECK_NEAR(f.launch_s, 2 * 3e-6, 1e-15, 0);
    CHECK(f.compute_s > 0 && b.compute_s > 0);
    CHECK_MSG(f.recipe && b.recipe, "sass_counts.h's kv_decode_split_kernel<128, *> no longer matches the decode recipe "
              "(cuda/perf/kernel_perf_model.h): it would be priced by the generic lower bound");
}

// An SFT step (update_perf_model.h) at Qwen2.5-7B's shape (test/fixtures/configs), 8 rows of 8,192
// tokens: its projection GEMMs do 6 N T FLOPs (N = the layers' projection weights, counted here from
// the shape, T = 65,536 tokens) at the datasheet's dense peak, BF16 989 TFLOP/s and FP8 twice that, within
// 1% (launches and the GEMMs' operand traffic are the rest); FP8 quantization is fp8's alone.
TEST(perf_model_sft_step_projection_flops) {
    const ModelConfig c = load_model_config("test/fixtures/configs/qwen2_5_7b");
    const double C = 3584, I = 18944, L = 28, KVD = 4 * 128, T = 8.0 * 8192;
    const double N = L * (2 * C * C + 2 * C * KVD + 3 * C * I);
    for (const GpuSpec& g : {h100(), h200()}) {
        const UpdatePrediction bf16 = predict_sft_step(g, c, Precision::BF16, SftShape()),
                               fp8 = predict_sft_step(g, c, Precision::FP8, SftShape());
        CHECK_EQ(bf16.micro_batches, 8);
        CHECK_NEAR(bf16.phases.at("projection GEMMs"), 6 * N * T / 989e12, 0.01, 0);
        CHECK_NEAR(fp8.phases.at("projection GEMMs"), 6 * N * T / 1979e12, 0.01, 0);
        CHECK(fp8.phases.count("FP8 quantization") && fp8.phases.at("FP8 quantization") > 0);
        CHECK(!bf16.phases.count("FP8 quantization") || bf16.phases.at("FP8 quantization") == 0);
        CHECK_NEAR(fp8.phases.at("attention"), bf16.phases.at("attention"), 1e-12, 0);  // BF16 in both
    }
}
