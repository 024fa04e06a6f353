// bench_cpu_engine: speed of cpu/gemm.h against baselines measured in the same run: the machine's
// FP32 FMA peak (an FMA-throughput loop, 1 and N threads) and the naive triple loop gemm.h
// replaced, on LLM-like shapes (GFLOP/s, speedup, fraction of the measured peak).
// Usage: ./build/bench_cpu_engine   (threads: OMP_NUM_THREADS, default all cores)
#include <cstdio>
#include <random>
#include <vector>

#include "bench/bench_util.h"
#include "cpu/gemm.h"

using namespace fp8rl;

// The naive loops gemm.h replaced: the baseline (gemm_nt form; the others differ only in indexing).
static void naive_nt(int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C, int ldc) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++) acc += A[(long)i * lda + k] * B[(long)j * ldb + k];
            C[(long)i * ldc + j] = acc;
        }
}

struct GemmCase {
    const char* what;
    char op;  // 't' = gemm_nt, 'n' = gemm_nn, 'w' = gemm_tn, 'p' = gemm_nt_packed (B packed beforehand)
    int M, N, K;
};

int main() {
    const int threads = omp_get_max_threads();
    printf("threads: %d (OMP_NUM_THREADS)\n", threads);
    const double peak1 = fma_peak_gflops(1);
    const double peak = fma_peak_gflops(threads);
    printf("FP32 FMA peak: %.1f GFLOP/s (1 thread), %.1f GFLOP/s (%d threads)\n\n", peak1, peak, threads);

    const GemmCase cases[] = {
        {"fprop qkv   X W^T", 't', 2048, 1536, 512},  {"fprop mlp   X W^T", 't', 2048, 1408, 512},
        {"dgrad mlp   dY W", 'n', 2048, 512, 1408},   {"wgrad mlp   dY^T X", 'w', 1408, 512, 2048},
        {"lm_head     X W^T", 't', 512, 32000, 288},   {"decode b64  X W^T", 't', 64, 768, 288},
        {"decode b1   x W^T", 't', 1, 768, 288},       {"decode b1 lm_head", 't', 1, 32000, 288},
        // the model's forward: weights packed once per update (ModelParams), read in place
        {"fprop qkv   packed", 'p', 2048, 1536, 512},  {"decode b64  packed", 'p', 64, 768, 288},
        {"decode b1   packed", 'p', 1, 768, 288},      {"decode b1 lm_head pk", 'p', 1, 32000, 288},
    };
    printf("%-22s %6s %6s %6s %10s %10s %8s %8s\n", "GEMM", "M", "N", "K", "naive", "gemm.h", "speedup", "of peak");
    std::mt19937 gen(1);
    std::uniform_real_distribution<float> dist(-1, 1);
    for (const GemmCase& c : cases) {
        const long a_size = (long)c.M * c.K, b_size = (long)c.N * c.K;
        std::vector<float> A(a_size), B(b_size), C((long)c.M * c.N);
        for (float& x : A) x = dist(gen);
        for (float& x : B) x = dist(gen);
        std::vector<float> packed(c.op == 'p' ? packed_weight_floats(c.N, c.K) : 0);
        if (c.op == 'p') pack_weight(B.data(), c.N, c.K, packed.data());
        const double flops = 2.0 * c.M * c.N * c.K;
        const int reps = std::max(2, std::min(50, (int)(2e9 / flops)));
        const double t_naive = best_seconds(1, [&] { naive_nt(c.M, c.N, c.K, A.data(), c.K, B.data(), c.K, C.data(), c.N); });
        const double t_fast = best_seconds(reps, [&] {
            if (c.op == 't') gemm_nt(c.M, c.N, c.K, A.data(), c.K, B.data(), c.K, C.data(), c.N, false);
            if (c.op == 'n') gemm_nn(c.M, c.N, c.K, A.data(), c.K, B.data(), c.N, C.data(), c.N, false);
            if (c.op == 'w') gemm_tn(c.M, c.N, c.K, A.data(), c.M, B.data(), c.N, C.data(), c.N, false);
            if (c.op == 'p') gemm_nt_packed(c.M, c.N, c.K, A.data(), c.K, packed.data(), C.data(), c.N, false);
        });
        printf("%-22s %6d %6d %6d %10.1f %10.1f %7.1fx %7.0f%%\n", c.what, c.M, c.N, c.K, flops / t_naive * 1e-9,
               flops / t_fast * 1e-9, t_naive / t_fast, 100.0 * flops / t_fast * 1e-9 / peak);
    }
    printf("(GFLOP/s; naive = the triple loop gemm.h replaced, gemm_nt indexing; 'packed': gemm_nt_packed on W\n"
           " packed beforehand, which gives the same bits as gemm_nt on W)\n");
    return 0;
}
