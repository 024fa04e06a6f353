// bench_util.h: what every benchmark program needs: best-of-N wall time and the machine's FP32
// FMA peak, measured in the same run so that figures can be read as a fraction of it.
#pragma once
#include <omp.h>

#include <algorithm>
#ifdef __AVX2__
#include <immintrin.h>
#endif

// Best wall time in seconds of `reps` runs of fn, after one warm-up run.
template <class F>
inline double best_seconds(int reps, F fn) {
    fn();
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        const double t0 = omp_get_wtime();
        fn();
        best = std::min(best, omp_get_wtime() - t0);
    }
    return best;
}

// Peak FP32 FMA throughput in GFLOP/s with `threads` threads: 12 independent vector FMA chains
// per thread, enough to cover the FMA latency on two pipes.
inline double fma_peak_gflops(int threads) {
    const long iters = 20000000;
    float sink[64] = {};
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
            sink[omp_get_thread_num() % 64] += out[0];
#else
            float acc[12 * 8];
            for (int i = 0; i < 12 * 8; i++) acc[i] = 0.001f * i;
            for (long it = 0; it < iters; it++)
                for (int i = 0; i < 12 * 8; i++) acc[i] = acc[i] * 0.999999f + 1e-7f;
            sink[omp_get_thread_num() % 64] += acc[5];
#endif
        }
    });
    volatile float keep = sink[0];  // the loops' results are used
    (void)keep;
    return (double)threads * iters * 12 * 8 * 2 / s * 1e-9;
}
