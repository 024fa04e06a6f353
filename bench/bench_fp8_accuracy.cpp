// bench_fp8_accuracy.cpp: accuracy of the FP8 recipe on LLM-like GEMMs Y = X W^T (the fprop of a
// linear layer). Prints, as a Markdown table, the relative Frobenius error ||Y - Y64|| / ||Y64|| vs
// an FP64 product of the FP32 inputs, for: BF16 operands (FP32 accumulation), and FP8 E4M3 at each
// --fp8_scaling granularity of cpu/fp8_gemm_ref.h (tensor: one scale per operand; row: one per token
// row of X and output channel of W; block: X 1x128, W 128x128), each with FP32 or power-of-two
// scales. Data: Gaussian, and Gaussian with 4 outlier channels of X (x1e3 or x1e4,
// as the massive activations of real LLMs) whose weight columns are scaled down by the same
// factor, so every channel contributes comparably to Y (otherwise the outliers' own, accurately
// quantized terms dominate ||Y|| and hide what per-tensor scaling does to the other channels:
// with E4M3's 2^17 dynamic range, x1e3 barely hurts; x1e4 pushes the ordinary channels into the
// subnormal range).
// Also the time (best of 3) of the emulated blockwise fprop (quantize X, decode, one FP32 GEMM per 128-wide K
// block, scale and add; the weight is quantized beforehand, as once per optimizer update) relative
// to the plain FP32 GEMM of the same shape (both cpu/gemm.h).
//
// Shapes: 512 tokens x K in {1024, 4096} x N = 512 outputs. The relative error does not
// depend on the token count (each output element is its own dot product over K), so fewer tokens
// than a real 4096-token batch keep the run well under a minute on 2 cores.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "rl/numerics/bf16.h"
#include "cpu/fp8_gemm_ref.h"

using namespace fp8rl;

static double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Shortest of 3 runs (the first also pays for first-touch allocations).
template <class Fn>
static double best_of_3(Fn fn) {
    double best = 1e30;
    for (int i = 0; i < 3; i++) {
        auto t0 = std::chrono::steady_clock::now();
        fn();
        best = std::min(best, seconds_since(t0));
    }
    return best;
}

// Y64 [T][N] = X [T][K] . W [N][K]^T in FP64.
static std::vector<double> gemm_fp64(const std::vector<float>& x, const std::vector<float>& w, int T, int N, int K) {
    std::vector<double> y((size_t)T * N);
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            double acc = 0;
            for (int k = 0; k < K; k++) acc += (double)x[(size_t)t * K + k] * w[(size_t)n * K + k];
            y[(size_t)t * N + n] = acc;
        }
    return y;
}

static double rel_error(const std::vector<float>& y, const std::vector<double>& ref) {
    double e = 0, r = 0;
    for (size_t i = 0; i < y.size(); i++) e += (y[i] - ref[i]) * (y[i] - ref[i]), r += ref[i] * ref[i];
    return std::sqrt(e / r);
}

// FP32 GEMM of operands passed through `round` (BF16 rounding).
template <class Round>
static std::vector<float> gemm_rounded(const std::vector<float>& x, const std::vector<float>& w, int T, int N, int K,
                                       Round round_x, Round round_w) {
    std::vector<float> xr(x.size()), wr(w.size()), y((size_t)T * N);
    for (size_t i = 0; i < x.size(); i++) xr[i] = round_x(x[i]);
    for (size_t i = 0; i < w.size(); i++) wr[i] = round_w(w[i]);
    gemm_nt(T, N, K, xr.data(), K, wr.data(), K, y.data(), N, false);
    return y;
}

int main() {
    const int T = 512, N = 512;
    printf("FP8 recipe accuracy: relative Frobenius error of Y = X W^T vs FP64 (T = %d tokens, N = %d outputs)\n\n", T, N);
    printf("| data | K | BF16 | FP8 tensor | tensor pow2 | FP8 row | row pow2 | FP8 block (1x128 x 128x128) | block pow2 | "
           "block time / FP32 GEMM |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    auto start = std::chrono::steady_clock::now();
    for (float outlier : {0.0f, 1e3f, 1e4f})
        for (int K : {1024, 4096}) {
            std::mt19937 rng(1234 + K);
            std::normal_distribution<float> gauss(0.0f, 1.0f);
            std::vector<float> x((size_t)T * K), w((size_t)N * K);
            for (float& v : x) v = gauss(rng);
            for (float& v : w) v = 0.02f * gauss(rng);
            if (outlier > 0)  // 4 channels of X, in 4 different 128-blocks, scaled up; their weights scaled down
                for (int c : {7, 300, 555, 900}) {
                    for (int t = 0; t < T; t++) x[(size_t)t * K + c] *= outlier;
                    for (int n = 0; n < N; n++) w[(size_t)n * K + c] /= outlier;
                }
            std::vector<double> ref = gemm_fp64(x, w, T, N, K);

            auto bf16 = [](float v) { return round_bf16(v); };
            std::vector<float> y((size_t)T * N);
            const double e_bf16 = rel_error(gemm_rounded(x, w, T, N, K, bf16, bf16), ref);
            const double t_fp32 = best_of_3([&] { gemm_nt(T, N, K, x.data(), K, w.data(), K, y.data(), N, false); });
            double error[3][2], ratio = 0;  // [tensor, row, block][pow2]
            const Fp8Scaling scalings[3] = {Fp8Scaling::Tensor, Fp8Scaling::Row, Fp8Scaling::Block};
            for (int g = 0; g < 3; g++)
                for (bool pow2 : {false, true}) {
                    const Fp8Weight w8 = fp8_quantize_weight(w.data(), N, K, pow2, scalings[g]);  // once per update: not timed
                    const double t = best_of_3([&] { fp8_linear_fprop(x.data(), T, w8, y.data(), false); });
                    error[g][pow2] = rel_error(y, ref);
                    if (scalings[g] == Fp8Scaling::Block && !pow2) ratio = t / t_fp32;
                }
            std::string data = outlier > 0 ? strfmt("4 outlier channels x%.0e", outlier) : "gaussian";
            printf("| %s | %d | %.2e | %.2e | %.2e | %.2e | %.2e | %.2e | %.2e | %.2f |\n", data.c_str(), K, e_bf16,
                   error[0][0], error[0][1], error[1][0], error[1][1], error[2][0], error[2][1], ratio);
            fflush(stdout);
        }
    printf("\ntotal %.1f s\n", seconds_since(start));
    return 0;
}
