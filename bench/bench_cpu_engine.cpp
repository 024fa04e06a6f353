// bench_cpu_engine: speed of the CPU engine against baselines measured in the same run.
//   1. the machine's FP32 FMA peak (an FMA-throughput loop), 1 and 2 threads;
//   2. rl/gemm.h against the naive triple loop it replaced, on LLM-like shapes, as GFLOP/s and as
//      a fraction of the measured peak.
// Usage: ./build/bench_cpu_engine   (threads: OMP_NUM_THREADS, default all cores)
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "rl/gemm.h"

using namespace fp8rl;

// Best wall time of `reps` runs of fn (after one warm-up run).
template <class F>
static double best_seconds(int reps, F fn) {
    fn();
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        const double t0 = omp_get_wtime();
        fn();
        best = std::min(best, omp_get_wtime() - t0);
    }
    return best;
}

// Peak FP32 FMA throughput: 12 independent vector FMA chains per thread (enough to cover the FMA
// latency on two pipes), GFLOP/s with `threads` threads.
static double fma_peak_gflops(int threads) {
    const long iters = 20000000;
    volatile float sink = 0.0f;
    const double s = best_seconds(3, [&] {
#pragma omp parallel num_threads(threads)
        {
#ifdef __AVX2__
            __m256 acc[12];
            for (int i = 0; i < 12; i++) acc[i] = _mm256_set1_ps(0.001f * (i + omp_get_thread_num()));
            const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
            for (long it = 0; it < iters; it++)
                for (int i = 0; i < 12; i++) acc[i] = _mm256_fmadd_ps(acc[i], x, y);
            __m256 t = acc[0];
            for (int i = 1; i < 12; i++) t = _mm256_add_ps(t, acc[i]);
            float out[8];
            _mm256_storeu_ps(out, t);
            sink = sink + out[0];
#else
            float acc[12 * 8];
            for (int i = 0; i < 12 * 8; i++) acc[i] = 0.001f * i;
            for (long it = 0; it < iters; it++)
                for (int i = 0; i < 12 * 8; i++) acc[i] = acc[i] * 0.999999f + 1e-7f;
            sink = sink + acc[5];
#endif
        }
    });
    return (double)threads * iters * 12 * 8 * 2 / s * 1e-9;
}

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
    char op;  // 't' = gemm_nt, 'n' = gemm_nn, 'w' = gemm_tn
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
    };
    printf("%-20s %6s %6s %6s %10s %10s %8s %8s\n", "GEMM", "M", "N", "K", "naive", "gemm.h", "speedup", "of peak");
    std::mt19937 gen(1);
    std::uniform_real_distribution<float> dist(-1, 1);
    for (const GemmCase& c : cases) {
        const long a_size = (long)c.M * c.K, b_size = (long)c.N * c.K;
        std::vector<float> A(a_size), B(b_size), C((long)c.M * c.N);
        for (float& x : A) x = dist(gen);
        for (float& x : B) x = dist(gen);
        const double flops = 2.0 * c.M * c.N * c.K;
        const int reps = std::max(2, std::min(50, (int)(2e9 / flops)));
        const double t_naive = best_seconds(1, [&] { naive_nt(c.M, c.N, c.K, A.data(), c.K, B.data(), c.K, C.data(), c.N); });
        const double t_fast = best_seconds(reps, [&] {
            if (c.op == 't') gemm_nt(c.M, c.N, c.K, A.data(), c.K, B.data(), c.K, C.data(), c.N, false);
            if (c.op == 'n') gemm_nn(c.M, c.N, c.K, A.data(), c.K, B.data(), c.N, C.data(), c.N, false);
            if (c.op == 'w') gemm_tn(c.M, c.N, c.K, A.data(), c.M, B.data(), c.N, C.data(), c.N, false);
        });
        printf("%-20s %6d %6d %6d %10.1f %10.1f %7.1fx %7.0f%%\n", c.what, c.M, c.N, c.K, flops / t_naive * 1e-9,
               flops / t_fast * 1e-9, t_naive / t_fast, 100.0 * flops / t_fast * 1e-9 / peak);
    }
    printf("(GFLOP/s; naive = the triple loop gemm.h replaced, gemm_nt indexing)\n");
    return 0;
}
