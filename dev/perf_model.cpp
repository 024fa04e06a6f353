// perf_model.cpp: prints cuda/perf/perf_model.h's prediction of one training step on an H200, bf16 and
// fp8, for the engine before issue 28 (unfused) and after (fused): step time, the fp8 speedup, the
// time per kernel class, and how the fused speedup moves with the two anchors it depends on most.
//   build/perf_model [--model qwen3-1.7b|qwen3-8b|all|HF_DIR] [--tokens 16384] [--seq 1280]
//                    [--micro_batches 1] [--fp8_gemm_speedup 1.5] [--kernels] [--json] [--sft]
// --micro_batches N: one optimizer update per N micro-batches (gradients accumulated), so a
// micro-batch carries 1/N of the update's kernels; --kernels adds every kernel of the fused step
// (bf16 and fp8) with its calls, FLOPs, bytes and time.
//   build/perf_model --json: the GRPO step of perf-anchors.md (cuda/perf/grpo_perf_model.h: kernels priced
// by what their SASS executes) for Qwen3-1.7B on one GPU and Qwen3-8B per GPU of 8 (its config from
// test/fixtures/configs/qwen3_8b), H100 and H200, fp8 and bf16, each KV cache precision, as JSON.
//   build/perf_model --sft: an SFT step at 8k tokens (cuda/perf/update_perf_model.h, priced like --json's
// training phase) for Qwen2.5-1.5B and Qwen2.5-7B (test/fixtures/configs), H100 and H200, bf16 and fp8:
// the numbers docs/results.md sets beside InfiR2's table.
//   build/perf_model --published: the model fed kernels whose H100 times are published, beside them.
//   build/perf_model --calibrate DIR: reads the measured / predicted lines dev/gpu_check.sh's benchmarks
// wrote under DIR/calibration/ (cuda/perf/calibrate.h) and reports which of the model's constants
// (cuda/perf/gpu_spec.h) they contradict; it refits nothing.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/perf/calibrate.h"
#include "cuda/perf/grpo_perf_model.h"
#include "cuda/perf/perf_model.h"
#include "cuda/perf/update_perf_model.h"

using namespace fp8rl;

namespace {

// spec-model.md: Qwen3-1.7B ties its embeddings, Qwen3-8B does not.
ModelConfig qwen3(int64_t C, int64_t I, int64_t L, int64_t H, bool tied) {
    ModelConfig c;
    c.arch = Arch::Qwen3, c.vocab_size = 151936, c.hidden_size = C, c.intermediate_size = I, c.num_layers = L;
    c.num_heads = H, c.num_kv_heads = 8, c.head_dim = 128, c.qk_norm = true, c.tie_word_embeddings = tied;
    return c;
}

struct Named {
    std::string name;
    ModelConfig config;
};

const Precision kPrecisions[2] = {Precision::BF16, Precision::FP8};
const StepStructure kStructures[2] = {StepStructure::Unfused, StepStructure::Fused};

void print_kernels(const std::vector<KernelCost>& ks, const PerfHardware& hw, Precision p) {
    const char* phases[] = {"forward", "backward", "optimizer"};
    printf("\nfused (#28) %s, every kernel (per layer: calls = layers x per layer):\n\n", precision_name(p));
    printf("| phase | kernel | class | calls | GFLOP per call | MB per call | ms | bound |\n|---|---|---|---|---|---|---|---|\n");
    for (const KernelCost& k : ks) {
        const double compute = k.rate > 0 ? k.work / k.rate : 0, memory = k.bytes / hw.bandwidth();
        printf("| %s | %s | %s | %.0f | %.1f | %.1f | %.2f | %s |\n", phases[(int)k.phase], k.name.c_str(),
               kernel_class_name(k.cls), k.calls, k.rate > 0 ? k.work / 1e9 : 0.0, k.bytes / 1e6, k.seconds(hw) * 1e3,
               compute > memory ? "compute" : "memory");
    }
}

void report(const Named& m, const StepShape& s, const PerfHardware& hw, bool kernels) {
    size_t params = 0;
    tensor_layout(m.config, &params);
    printf("## %s: %lld tokens in sequences of %lld, %.4gM parameters, one update per %d micro-batch%s\n\n", m.name.c_str(),
           (long long)s.tokens, (long long)s.seq_len, params / 1e6, s.micro_batches, s.micro_batches > 1 ? "es" : "");
    printf("| structure | precision | step ms | tokens/s | launches + GEMM calls | fp8 speedup (bf16 ms / fp8 ms) |\n");
    printf("|---|---|---|---|---|---|\n");
    std::vector<KernelCost> ks[2][2];
    for (int st = 0; st < 2; st++)
        for (int pi = 0; pi < 2; pi++) {
            ks[st][pi] = step_kernels(hw, s, kPrecisions[pi], kStructures[st]);
            const double t = total_seconds(ks[st][pi], hw), bf16 = total_seconds(ks[st][0], hw);
            printf("| %s | %s | %.1f | %.0f | %.0f | %.3f |\n", structure_name(kStructures[st]), precision_name(kPrecisions[pi]),
                   t * 1e3, s.tokens / t, total_launches(ks[st][pi]), bf16 / t);
        }
    printf("\n| ms per step | unfused bf16 | unfused fp8 | fused bf16 | fused fp8 |\n|---|---|---|---|---|\n");
    for (int c = 0; c <= kKernelClasses; c++) {
        printf("| %s |", c < kKernelClasses ? kernel_class_name((KernelClass)c) : "total");
        for (int st = 0; st < 2; st++)
            for (int pi = 0; pi < 2; pi++)
                printf(" %.1f |", (c < kKernelClasses ? class_seconds(ks[st][pi], hw, (KernelClass)c) : total_seconds(ks[st][pi], hw)) * 1e3);
        printf("\n");
    }
    printf("\nfused fp8 speedup as the two anchors move (FP8 GEMM speedup over BF16: cuBLAS 12.9's range, and 2x, "
           "the figure with which this model gives issue 28's review's 0.8x and 1.0x for the unfused engine; attention: "
           "FA2's figures, or perf-anchors.md's estimate of the engine's attention kernels):\n\n");
    printf("| attention forward | FP8 GEMMs 1.25x BF16 | 1.50x | 1.75x | 2.00x |\n|---|---|---|---|---|\n");
    for (double attention : {0.0, 85.0}) {
        printf("| %s |", attention > 0 ? "85 TFLOP/s (perf-anchors.md's estimate)" : "FA2 (191-319 TFLOP/s)");
        for (double speedup : {1.25, 1.5, 1.75, 2.0}) {
            PerfHardware h = hw;
            h.attention_fwd_tflops = attention, h.fp8_gemm_speedup = speedup;
            printf(" %.3f |", step_speedup(h, s, StepStructure::Fused));
        }
        printf("\n");
    }
    if (kernels)
        for (int pi = 0; pi < 2; pi++) print_kernels(ks[1][pi], hw, kPrecisions[pi]);
    printf("\n");
}

// A JSON string's characters (the kernel names hold no control characters).
std::string json_escape(const std::string& s) {
    std::string out;
    for (char c : s) out += c == '"' || c == '\\' ? std::string("\\") + c : std::string(1, c);
    return out;
}

// {"workloads": [{"model", "gpu", "gpus", "kv_cache", "precision", "rollout_s", "train_s", "step_s",
//   "decode_attention_hbm_s" (its K/V bytes at the achievable bandwidth: what decode attention would take at HBM speed), "phases",
//   "kernels": [{"name", "calls", "time_s", "bound", "bytes", "flops", "cublaslt_time_s" (the own FP8 GEMM's rows: cuBLASLt's price)}],
//   "train_gemms": [{"name", "m", "n", "k", "time_s", "tflops", "bound", and on the own FP8 block GEMM "kernel" (the
//   instantiation priced, sass_counts.h's name), "ceiling_tflops",
//   "ceiling_shape", "cublaslt_time_s", "cublaslt_tflops"}] (one training micro-batch's projection GEMMs, per call),
//   "assumptions": {NAME: {"value", "unit", "source"}}}]}
void print_json(const ModelConfig& small, const ModelConfig& large) {
    struct Workload {
        const char* name;
        const ModelConfig* config;
        int gpus;
    } workloads[] = {{"Qwen3-1.7B", &small, 1}, {"Qwen3-8B", &large, 8}};
    const GpuSpec gpus[] = {h100(), h200()};
    printf("{\"workloads\": [");
    bool first = true;
    for (const Workload& w : workloads)
        for (const GpuSpec& g : gpus)
            for (Precision p : {Precision::FP8, Precision::BF16})
                for (Precision kv : {Precision::FP8, Precision::BF16}) {
                    GrpoShape s;
                    s.gpus = w.gpus;
                    const GrpoPrediction r = predict_grpo_step(g, *w.config, p, kv, s);
                    printf("%s\n  {\"model\": \"%s\", \"gpu\": \"%s\", \"gpus\": %d, \"kv_cache\": \"%s\", \"precision\": \"%s\", "
                           "\"rollout_s\": %.3f, \"train_s\": %.3f, \"step_s\": %.3f, \"decode_attention_hbm_s\": %.3f, "
                           "\"phases\": {",
                           first ? "" : ",", w.name, g.name, w.gpus, precision_name(kv), precision_name(p), r.rollout_s(),
                           r.train_s(), r.step_s(), r.decode_attention_bytes / g.bandwidth());
                    first = false;
                    bool first_item = true;
                    for (const auto* phases : {&r.rollout, &r.train})
                        for (const auto& ph : *phases) {
                            printf("%s\"%s%s\": %.3f", first_item ? "" : ", ", phases == &r.rollout ? "rollout: " : "train: ",
                                   ph.first.c_str(), ph.second);
                            first_item = false;
                        }
                    printf("},\n   \"kernels\": [");
                    first_item = true;
                    for (const PricedKernel& k : r.kernels) {
                        printf("%s\n    {\"name\": \"%s\", \"calls\": %.6g, \"time_s\": %.6g, \"bound\": \"%s\", \"bytes\": %.6g, "
                               "\"flops\": %.6g",
                               first_item ? "" : ",", json_escape(k.name).c_str(), k.calls, k.seconds, k.bound(), k.bytes, k.flops);
                        if (k.cublaslt_seconds > 0) printf(", \"cublaslt_time_s\": %.6g", k.cublaslt_seconds);
                        printf("}");
                        first_item = false;
                    }
                    // one training micro-batch's projection GEMMs, per call: the own FP8 block GEMM beside cuBLASLt
                    printf("],\n   \"train_gemms\": [");
                    first_item = true;
                    const PerfHardware hw = sass_hardware(g);
                    for (const KernelCost& k : r.train_gemms) {
                        const double s = k.call_seconds(hw);
                        printf("%s\n    {\"name\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, \"time_s\": %.6g, \"tflops\": %.1f, "
                               "\"bound\": \"%s\"",
                               first_item ? "" : ",", json_escape(k.name).c_str(), (long long)k.gemm_m, (long long)k.gemm_n,
                               (long long)k.gemm_k, s, k.work / s / 1e12, k.bound(hw));
                        if (k.ceiling)
                            printf(", \"kernel\": \"%s\", \"ceiling_tflops\": %.0f, \"ceiling_shape\": \"DeepGEMM N %.0f K %.0f\", "
                                   "\"cublaslt_time_s\": %.6g, \"cublaslt_tflops\": %.1f",
                                   json_escape(k.sass_kernel).c_str(), k.ceiling->tflops, k.ceiling->n, k.ceiling->k, k.cublaslt_call_s,
                                   k.work / k.cublaslt_call_s / 1e12);
                        printf("}");
                        first_item = false;
                    }
                    printf("],\n   \"assumptions\": {");
                    first_item = true;
                    for (const Assumption& a : assumptions(g)) {
                        printf("%s\"%s\": {\"value\": %.6g, \"unit\": \"%s\", \"source\": \"%s\"}", first_item ? "" : ", ",
                               a.name.c_str(), a.value, a.unit, json_escape(a.source).c_str());
                        first_item = false;
                    }
                    printf("}}");
                }
    printf("\n]}\n");
}

// The model fed kernels whose H100 (or H800: the same SMs and HBM) times are published, each beside
// the published figure (docs/perf-model.md, "Checked against what is published"). Which rows check a
// constant independently and which only restate the figure a constant came from: that page says.
void print_published() {
    const GpuSpec g = h100();
    const PerfHardware hw = sass_hardware(g);
    printf("| case | shape | published | predicted | published / predicted | source |\n|---|---|---|---|---|---|\n");
    auto gemm = [&](const char* what, int64_t m, int64_t n, int64_t k, Precision p, double published_tflops, const char* source) {
        const KernelCost c = gemm_cost(hw, what, KernelClass::LayerGemm, m, n, k, p, GemmOutput::BF16);
        const double tflops = 2.0 * m * n * k / c.call_seconds(hw) / 1e12;
        printf("| %s | weight %lld x %lld, %lld tokens | %.0f TFLOP/s | %.0f TFLOP/s (%s) | %.2f | %s |\n", what, (long long)m,
               (long long)k, (long long)n, published_tflops, tflops, c.bound(hw), published_tflops / tflops, source);
    };
    gemm("FP8 block-scaled GEMM, large", 8192, 8192, 8192, Precision::FP8, 870, "FBGEMM PR #2546 (H100, blockwise, GEMM alone)");
    gemm("BF16 GEMM, large", 8192, 8192, 8192, Precision::BF16, 784, "measured 769-798 here (H200, .library/device/KINDS.md)");
    // DeepGEMM's README (H800): its own kernel's rate and its speedup over a tuned CUTLASS 3.6, whose
    // implied rate (rate / speedup) is the unsplit 128 x 128 kind cuBLASLt runs
    const struct {
        int64_t tokens, n, k;
        double tflops, speedup;
    } deepgemm[] = {{64, 2112, 7168, 206, 2.7}, {128, 2112, 7168, 352, 2.4}, {128, 4096, 7168, 533, 2.0}, {128, 7168, 2048, 510, 1.7}};
    for (const auto& d : deepgemm)
        gemm("FP8 block GEMM, decode (CUTLASS 3.6 implied)", d.n, d.tokens, d.k, Precision::FP8, d.tflops / d.speedup,
             strfmt("DeepGEMM README, H800: %.0f TFLOP/s at %.1fx CUTLASS", d.tflops, d.speedup).c_str());
    // our training attention's forward (causal, D 128, 16 heads, one sequence) against FA2's and FA3's
    for (double len : {1024.0, 2048.0}) {
        const KernelPrice a = training_attention_price(g, false, {len}, 16, 128, 0, 1);
        const double flops = 2 * 2.0 * 128 * 16 * len * len / 2, tflops = flops / a.seconds() / 1e12;
        printf("| training attention forward (ours; FA2, FA3) | causal, %d tokens, 16 heads of 128 | %s TFLOP/s | %.0f TFLOP/s "
               "(%s) | %.2f (FA2) | FA2/FA3 (H100; perf-anchors.md) |\n",
               (int)len, len == 1024 ? "260; 423" : "298; 521", tflops, a.bound(), (len == 1024 ? 260 : 298) / tflops);
    }
    // our decode attention, one Qwen3-1.7B layer (split and combine), 512 rows of 1,024 keys (no cascade),
    // against a kernel at the achievable HBM bandwidth (FlashInfer's decode: near it)
    DecodeAttentionShape d;
    d.H = 16, d.KV = 8, d.D = 128, d.grid_rows = d.live_rows = 512, d.own_keys = 1024, d.max_len = 1280;
    for (bool fp8 : {true, false}) {
        d.fp8_kv = fp8;
        const DecodeAttentionPrice a = decode_attention_price(g, d);
        printf("| decode attention (ours), %s KV | 512 rows x 1,024 keys, 16 / 8 heads of 128 | %.0f GB/s (bytes at %.2f of HBM) | "
               "%.0f GB/s (%s) | %.2f | FlashInfer: near HBM bandwidth (perf-anchors.md) |\n",
               fp8 ? "FP8" : "BF16", g.bandwidth() / 1e9, g.hbm_efficiency, a.bytes / a.layer_seconds() / 1e9, a.per_row.bound(),
               g.bandwidth() / (a.bytes / a.layer_seconds()));
    }
    // NCCL all-reduce of 1 GiB over 8 GPUs: the model's 2 (n - 1) / n bytes at the bus bandwidth
    const double bytes = 1073741824.0, seconds = bytes * 2 * 7 / 8 / g.nccl_bus_bandwidth;
    printf("| NCCL all-reduce, 8 GPUs | 1 GiB | 480 GB/s bus (NVLink SHARP), 370 (ring) | %.0f GB/s bus (%.2f ms) | %.2f (SHARP) | "
           "nccl-tests issue #212 (NCCL's maintainer, H100) |\n",
           bytes * 2 * 7 / 8 / seconds / 1e9, seconds * 1e3, 480 / (bytes * 2 * 7 / 8 / seconds / 1e9));
}

// One GPU's SFT step (SftShape: 8 packed sequences of 8,192 tokens, one a micro-batch, one update), as a table.
void print_sft() {
    const SftShape s;
    printf("SFT step on one GPU (cuda/perf/update_perf_model.h): %lld sequences of %lld tokens, one a micro-batch, one AdamW "
           "update; on the model of cuda/perf/gpu_spec.h (cuBLASLt's rates by shape class, the trainer's FP8 GEMMs on the "
           "own kernel from its SASS, attention from its SASS, memory-bound kernels at the achievable bandwidth or their "
           "loads in flight); no gradient all-reduce\n\n",
           (long long)s.seqs, (long long)s.seq_len);
    printf("| model | GPU | precision | step s | tokens/s | fp8 / bf16 step time | projection GEMMs s | attention s | "
           "LM head s | FP8 quantization s | optimizer s |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (const char* name : {"qwen2_5_1_5b", "qwen2_5_7b"}) {
        const ModelConfig c = load_model_config(std::string("test/fixtures/configs/") + name);
        for (const GpuSpec& g : {h100(), h200()}) {
            const UpdatePrediction bf16 = predict_sft_step(g, c, Precision::BF16, s);
            for (Precision p : {Precision::BF16, Precision::FP8}) {
                const UpdatePrediction r = p == Precision::BF16 ? bf16 : predict_sft_step(g, c, p, s);
                auto at = [&](const char* k) { return r.phases.count(k) ? r.phases.at(k) : 0.0; };
                printf("| %s | %s | %s | %.3f | %.0f | %s | %.3f | %.3f | %.3f | %.3f | %.3f |\n", name, g.name, precision_name(p),
                       r.seconds(), (double)(s.seqs * s.seq_len) / r.seconds(),
                       p == Precision::BF16 ? "1" : strfmt("%.3f", r.seconds() / bf16.seconds()).c_str(), at("projection GEMMs"),
                       at("attention"), at("LM head GEMMs") + at("LM head softmax"), at("FP8 quantization"), at("optimizer"));
            }
        }
    }
}

[[noreturn]] void usage(const char* why) {
    fprintf(stderr,
            "perf_model: %s\nusage: perf_model [--model qwen3-1.7b|qwen3-8b|all|HF_DIR] [--tokens N] [--seq S] "
            "[--micro_batches N] [--fp8_gemm_speedup X] [--kernels] [--json] [--sft] [--published] [--calibrate DIR]\n",
            why);
    exit(2);
}

}  // namespace

int main(int argc, char** argv) {
    std::string model = "all";
    StepShape s;
    s.tokens = 16384, s.seq_len = 1280;
    PerfHardware hw;
    bool kernels = false, json = false, sft = false, published = false;
    std::string calibrate;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        if (a == "--kernels" || a == "--json" || a == "--sft" || a == "--published") {
            (a == "--json" ? json : a == "--sft" ? sft : a == "--published" ? published : kernels) = true;
            continue;
        }
        if (a != "--model" && a != "--tokens" && a != "--seq" && a != "--micro_batches" && a != "--fp8_gemm_speedup" &&
            a != "--calibrate")
            usage(("unknown flag " + a).c_str());
        if (i + 1 >= argc) usage(("missing value after " + a).c_str());
        const char* v = argv[++i];
        char* end = nullptr;
        if (a == "--model") model = v;
        else if (a == "--calibrate") calibrate = v;
        else if (a == "--tokens") s.tokens = strtoll(v, &end, 10);
        else if (a == "--seq") s.seq_len = strtoll(v, &end, 10);
        else if (a == "--micro_batches") s.micro_batches = (int)strtol(v, &end, 10);
        else hw.fp8_gemm_speedup = strtod(v, &end);
        if (end && (*end || end == v)) usage(("bad value " + std::string(v) + " for " + a).c_str());
    }
    if (s.tokens <= 0 || s.seq_len <= 0 || s.micro_batches <= 0 || !(hw.fp8_gemm_speedup > 0))
        usage("--tokens, --seq, --micro_batches and --fp8_gemm_speedup must be positive");
    try {
        if (!calibrate.empty()) {
            print_calibration(calibrate, stdout);
            return 0;
        }
        if (published) {
            print_published();
            return 0;
        }
        if (sft) {
            print_sft();
            return 0;
        }
        if (json) {
            print_json(qwen3(2048, 6144, 28, 16, true), load_model_config("test/fixtures/configs/qwen3_8b"));
            return 0;
        }
        std::vector<Named> models;
        if (model == "all" || model == "qwen3-1.7b") models.push_back({"Qwen3-1.7B", qwen3(2048, 6144, 28, 16, true)});
        if (model == "all" || model == "qwen3-8b") models.push_back({"Qwen3-8B", qwen3(4096, 12288, 36, 32, false)});
        if (models.empty()) models.push_back({model, load_model_config(model)});
        printf("perf_model (cuda/perf/perf_model.h): one training step (forward, backward, gradient norm and clip, AdamW) on one "
               "H200; BF16 GEMMs at %.0f TFLOP/s (%.2f of %.0f), FP8 block-scaled GEMMs %.2fx that (%.0f TFLOP/s), "
               "attention at FlashAttention-2's rates, memory-bound kernels at %.2f TB/s (%.2f of %.1f), %.0f us per "
               "launch, the tile quantizer before issue 28 at %.0f ps per element\n\n",
               hw.gemm_rate(Precision::BF16) / 1e12, hw.bf16_gemm_eff, hw.bf16_peak / 1e12, hw.fp8_gemm_speedup,
               hw.gemm_rate(Precision::FP8) / 1e12, hw.bandwidth() / 1e12, hw.hbm_eff, hw.hbm / 1e12, hw.launch_s * 1e6,
               hw.tile_quantizer_s_per_element * 1e12);
        for (const Named& m : models) {
            s.model = m.config;
            report(m, s, hw, kernels);
        }
    } catch (const Error& e) {
        fprintf(stderr, "perf_model: %s\n", e.what());
        return 1;
    }
    return 0;
}
