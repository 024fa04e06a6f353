// bench_fp8_gemm.cu: cuBLASLt block-scaled FP8 vs BF16 GEMM throughput over the linear layers of
// Qwen3-0.6B, 1.7B (also its fused QKV and gate|up, W1's training GEMMs) and 8B at 4k and 16k tokens
// (fp8_gemm.cuh); --tiny: one small shape, for make test. Per layer and token count: the BF16 GEMM and
// the three FP8 GEMMs (fprop BLK128x128 x VEC128, dgrad BLK x VEC, wgrad VEC128 x VEC128) at the same
// m, n, k, all TN with BF16 output, FP8 fast accumulation off, each FP8 GEMM on cuBLASLt and on
// fp8rl's own block GEMM (cuda/kernels/fp8_block_gemm.cuh, the trainer's: Fp8GemmKernel::Own), beside
// the model's price of each (perf_model.h's gemm_cost and fp8_block_gemm_cost); plus the quantize
// kernels (X 1x128 with its transposed copy in one pass; W 128x128 with its transposed copy).
// Times: CUDA events, median of 10 samples of 5 calls after 3 warm-ups (bench_util.cuh), on random data
// (never zeros). Each shape runs independently: an error is printed and the next shape runs. Beside
// each measured speedup and quantize time, cuda/perf/perf_model.h's prediction at the same shape, so the
// first GPU run checks the model's GEMM anchors and the tile quantizer's 7 ps per element.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "cuda/perf/perf_model.h"
#include "test/gpu/bench_util.cuh"

using namespace fp8rl;

namespace {

struct Shape {
    const char* model;
    const char* layer;
    int N, K;  // out, in
};

// spec-model.md: Qwen3-0.6B C=1024, I=3072, 16 q / 8 kv heads of 128; Qwen3-1.7B C=2048, I=6144,
// 16 / 8; Qwen3-8B C=4096, I=12288, 32 / 8.
const Shape kShapes[] = {
    {"Qwen3-0.6B", "q", 2048, 1024},       {"Qwen3-0.6B", "k,v", 1024, 1024},   {"Qwen3-0.6B", "o", 1024, 2048},
    {"Qwen3-0.6B", "gate,up", 3072, 1024}, {"Qwen3-0.6B", "down", 1024, 3072},  {"Qwen3-1.7B", "q,o", 2048, 2048},
    {"Qwen3-1.7B", "k,v", 1024, 2048},     {"Qwen3-1.7B", "gate,up", 6144, 2048}, {"Qwen3-1.7B", "down", 2048, 6144},
    {"Qwen3-1.7B", "qkv", 4096, 2048},     {"Qwen3-1.7B", "gate|up", 12288, 2048},
    {"Qwen3-8B", "q,o", 4096, 4096},       {"Qwen3-8B", "k,v", 1024, 4096},     {"Qwen3-8B", "gate,up", 12288, 4096},
    {"Qwen3-8B", "down", 4096, 12288},
};
const Shape kTinyShape = {"tiny", "q", 256, 128};

double gemm_tflops(int m, int n, int k, double ms) { return tflops(2.0 * m * n * k, ms); }

void bench_shape(GemmRunner& runner, const Shape& s, int T) {
    int N = s.N, K = s.K;
    size_t big = (size_t)std::max(K, N) * std::max(T, std::max(K, N));  // elements of the largest operand
    DeviceBuffer<__nv_bfloat16> x((size_t)T * K), w((size_t)N * K), dy((size_t)T * N), a_bf16(big), b_bf16(big);
    DeviceBuffer<__nv_bfloat16> out(big);
    fill_uniform(x.ptr, x.count, 1, 2.0f), fill_uniform(w.ptr, w.count, 2, 0.05f);
    fill_uniform(dy.ptr, dy.count, 3, 1e-3f), fill_uniform(a_bf16.ptr, big, 4, 1.0f), fill_uniform(b_bf16.ptr, big, 5, 1.0f);
    DeviceBuffer<uint8_t> xq((size_t)T * K), xtq((size_t)T * K), wq((size_t)N * K), wtq((size_t)N * K);
    DeviceBuffer<uint8_t> dyq((size_t)T * N), dytq((size_t)T * N);
    DeviceBuffer<float> sx(vec128_scale_count(T, K)), sxt(vec128_scale_count(K, T)), sw(blk128_scale_count(N, K)),
        swt(blk128_scale_count(K, N)), sdy(vec128_scale_count(T, N)), sdyt(vec128_scale_count(N, T));

    double q_x = median_ms([&] {
        fp8_quantize_rowwise_gpu(x.ptr, T, K, false, xq.ptr, sx.ptr, xtq.ptr, sxt.ptr, 0);
    });
    double q_w = median_ms([&] {
        fp8_quantize_blockwise_gpu(w.ptr, N, K, false, wq.ptr, sw.ptr, wtq.ptr, swt.ptr, 0);
    });
    fp8_quantize_rowwise_gpu(dy.ptr, T, N, false, dyq.ptr, sdy.ptr, dytq.ptr, sdyt.ptr, 0);

    struct Gemm {
        const char* name;
        int m, n, k;
        const uint8_t *a, *b;
        const float *sa, *sb;
        Fp8ScaleMode ma, mb;
    } gemms[] = {
        {"fprop", N, T, K, wq.ptr, xq.ptr, sw.ptr, sx.ptr, Fp8ScaleMode::BLK128x128, Fp8ScaleMode::VEC128},
        {"dgrad", K, T, N, wtq.ptr, dyq.ptr, swt.ptr, sdy.ptr, Fp8ScaleMode::BLK128x128, Fp8ScaleMode::VEC128},
        {"wgrad", K, N, T, xtq.ptr, dytq.ptr, sxt.ptr, sdyt.ptr, Fp8ScaleMode::VEC128, Fp8ScaleMode::VEC128},
    };
    for (const Gemm& g : gemms) {
        double bf16_ms = median_ms([&] { runner.bf16(g.name, g.m, g.n, g.k, a_bf16.ptr, b_bf16.ptr, out.ptr, GemmOut::BF16, 0); });
        double fp8_ms = median_ms([&] {
            runner.fp8(g.name, g.m, g.n, g.k, g.a, g.sa, g.ma, g.b, g.sb, g.mb, out.ptr, GemmOut::BF16, 0);
        });
        const bool own_fits = GemmRunner::own_kernel_fits(g.m, g.n, g.k, g.ma, g.mb);
        double own_ms = own_fits ? median_ms([&] {
            runner.fp8(g.name, g.m, g.n, g.k, g.a, g.sa, g.ma, g.b, g.sb, g.mb, out.ptr, GemmOut::BF16, 0, false, Fp8GemmKernel::Own);
        })
                                 : 0;
        const PerfHardware& hw = bench_hardware();
        const auto predicted_s = [&](Precision p) {
            return gemm_cost(hw, g.name, KernelClass::LayerGemm, g.m, g.n, g.k, p, GemmOutput::BF16).call_seconds(hw);
        };
        const auto quantizer_us = [&](int rows, int cols, bool weight) {
            return tile_quantizer_cost(hw, "", rows, cols, weight).call_seconds(hw) * 1e6;
        };
        for (Precision p : {Precision::BF16, Precision::FP8}) {
            const KernelCost k = gemm_cost(hw, g.name, KernelClass::LayerGemm, g.m, g.n, g.k, p, GemmOutput::BF16);
            record_calibration("bench_fp8_gemm", strfmt("%s %s T=%d %s %s", s.model, s.layer, T, g.name, precision_name(p)),
                               (p == Precision::FP8 ? fp8_ms : bf16_ms) * 1e-3, k.call_seconds(hw), k.bound(hw), p == Precision::FP8);
        }
        // the own kernel's price (cuBLASLt's where sass_counts.h has no row of it: the bound then says "tensor")
        const KernelCost own = fp8_block_gemm_cost(hw, g.name, g.m, g.n, g.k, GemmOutput::BF16, g.ma == Fp8ScaleMode::BLK128x128);
        if (own_fits)
            record_calibration("bench_fp8_gemm", strfmt("%s %s T=%d %s fp8 own", s.model, s.layer, T, g.name), own_ms * 1e-3,
                               own.call_seconds(hw), own.bound(hw), true);
        const std::string own_cols =
            own_fits ? strfmt("%.0f | %.2f | %.0f (%s) | %.0f", gemm_tflops(g.m, g.n, g.k, own_ms), fp8_ms / own_ms,
                              gemm_tflops(g.m, g.n, g.k, own.call_seconds(hw) * 1e3), own.bound(hw),
                              gemm_tflops(g.m, g.n, g.k, predicted_s(Precision::FP8) * 1e3))
                     : std::string("does not fit | | |");
        bool first = g.name == gemms[0].name;
        // W is BF16 here, the model's weight FP32 (the engine's master): at 7 ps per element the two
        // bytes more per element take no time
        std::string quant = first ? strfmt("%.1f | %.1f | %.1f | %.1f", q_x * 1e3, quantizer_us(T, K, false), q_w * 1e3,
                                           quantizer_us(N, K, true))
                                  : " | | | ";
        printf("| %s | %s | %d | %s | %d | %d | %d | %.0f | %.0f | %.2f | %.2f | %s | %s |\n", s.model, s.layer, T, g.name, g.m,
               g.n, g.k, gemm_tflops(g.m, g.n, g.k, bf16_ms), gemm_tflops(g.m, g.n, g.k, fp8_ms), bf16_ms / fp8_ms,
               predicted_s(Precision::BF16) / predicted_s(Precision::FP8), own_cols.c_str(), quant.c_str());
        fflush(stdout);
    }
}

}  // namespace

int main(int argc, char** argv) {
    const bool tiny = bench_tiny(argc, argv, "bench_fp8_gemm");
    std::string why_not = bench_unavailable_reason();
    if (!why_not.empty()) {
        printf("bench_fp8_gemm: SKIPPED: %s\n", why_not.c_str());
        return 0;
    }
    print_bench_header("bench_fp8_gemm", tiny);
    printf("TFLOP/s = 2mnk / median time; speedup = BF16 time / FP8 time; own: fp8rl's FP8 block GEMM (the trainer's), "
           "own / cuBLASLt = cuBLASLt's FP8 time / the own kernel's, predicted own: fp8_block_gemm_cost's TFLOP/s and bound "
           "(ceiling: DeepGEMM's published rate for the shape class), predicted cuBLASLt: "
           "gemm_cost's; quantize columns (us, on fprop rows): "
           "X [T][K] 1x128 + transposed copy in one pass, W [N][K] 128x128 + transposed copy; predicted: "
           "cuda/perf/perf_model.h at the same shape on this GPU (sass_hardware: GEMMs at the dense BF16 / FP8 peaks, bytes "
           "at the datasheet bandwidth, the tile quantizer at 7 ps per element)\n\n");
    printf("| model | layer | T | GEMM | m | n | k | BF16 TF/s | FP8 TF/s | speedup | predicted | own FP8 TF/s | own / cuBLASLt | "
           "predicted own | predicted cuBLASLt | quant X us | predicted | quant W us | predicted |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    GemmRunner runner;
    int failures = 0;
    std::vector<Shape> shapes(std::begin(kShapes), std::end(kShapes));
    std::vector<int> token_counts = {4096, 16384};
    if (tiny) shapes = {kTinyShape}, token_counts = {128};
    for (int T : token_counts)
        for (const Shape& s : shapes) {
            try {
                bench_shape(runner, s, T);
            } catch (const Error& e) {
                printf("| %s | %s | %d | ERROR: %s |\n", s.model, s.layer, T, e.what());
                failures++;
                cudaGetLastError();  // clear a sticky launch error so the next shape can run
            }
        }
    printf("\nbench_fp8_gemm: %d shape(s) failed\n", failures);
    return failures ? 1 : 0;
}
