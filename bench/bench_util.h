// bench_util.h: what every benchmark program needs: best-of-N wall time, and the machine's FP32
// FMA peak and memory read bandwidth, measured in the same run so that figures can be read as a
// fraction of them.
#pragma once
#include <omp.h>

#include <algorithm>
#include <vector>
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

// Floats in a buffer of about `mib` MiB that read_seconds splits evenly over `threads` threads.
inline long read_buffer_floats(long mib, int threads) { return (mib << 18) / (32 * threads) * (32 * threads); }

// Seconds for `threads` threads to read floats buf[0..n), each its own contiguous part, summing
// them in vector registers (n a multiple of 32 * threads). With ahead > 0 each thread also
// prefetches the line `ahead` floats in front of the one it reads, with __builtin_prefetch's
// locality `Locality` (3: all levels, 2: L2 and below, 0: non-temporal).
template <int Locality = 3>
inline double read_seconds(const float* buf, long n, int threads, long ahead = 0) {
    const long part = n / threads;
    float sink[64] = {};
    const double t0 = omp_get_wtime();
#pragma omp parallel num_threads(threads)
    {
        const long begin = part * omp_get_thread_num(), end = begin + part;
#ifdef __AVX2__
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (long i = begin; i < end; i += 32) {
            if (ahead > 0 && i + ahead < end) {
                __builtin_prefetch(buf + i + ahead, 0, Locality);
                __builtin_prefetch(buf + i + ahead + 16, 0, Locality);
            }
            for (int v = 0; v < 4; v++) acc[v] = _mm256_add_ps(acc[v], _mm256_loadu_ps(buf + i + 8 * v));
        }
        float out[8];
        _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
        sink[omp_get_thread_num() % 64] += out[0];
#else
        float acc[16] = {};
        for (long i = begin; i < end; i += 16) {
            if (ahead > 0 && i + ahead < end) __builtin_prefetch(buf + i + ahead, 0, Locality);
            for (int v = 0; v < 16; v++) acc[v] += buf[i + v];
        }
        sink[omp_get_thread_num() % 64] += acc[3];
#endif
    }
    const double s = omp_get_wtime() - t0;
    volatile float keep = sink[0];  // the loops' results are used
    (void)keep;
    return s;
}

// Read bandwidth from memory in GB/s with `threads` threads, over a 256 MiB buffer (far larger
// than the caches).
inline double read_bandwidth_gbs(int threads) {
    const long n = read_buffer_floats(256, threads);
    const std::vector<float> buf(n, 1.0f);
    return (double)n * sizeof(float) / best_seconds(3, [&] { read_seconds(buf.data(), n, threads); }) * 1e-9;
}
