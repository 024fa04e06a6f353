// bench_memory: the memory figures behind the batch-64 generation target (docs/cpu-speed.md, "CPU model
// speed"): whether a core reads faster with software prefetch, how two cores share the memory,
// and how much a buffer read a second time gains from the L3 (data prefetched ahead of a read is
// only of use if the caches keep it until then).
// Usage: ./build/bench_memory   (threads: OMP_NUM_THREADS for the second table, default all cores)
#include <cstdio>
#include <vector>

#include "bench/bench_util.h"

// GB/s of the best of 3 reads of buf[0..n) with `threads` threads.
template <int Locality = 3>
static double read_gbs(const std::vector<float>& buf, long n, int threads, long ahead = 0) {
    const double s = best_seconds(3, [&] { read_seconds<Locality>(buf.data(), n, threads, ahead); });
    return (double)n * sizeof(float) / s * 1e-9;
}

int main() {
    const int threads = omp_get_max_threads();
    const long n = read_buffer_floats(256, threads);
    const std::vector<float> buf(n, 1.0f);
    printf("read bandwidth of a 256 MiB buffer, GB/s (best of 3):\n");
    printf("%-28s %9s %9s\n", "software prefetch", "1 thread", "threads");
    printf("%-28s %9.1f %9.1f\n", "none", read_gbs(buf, n, 1), read_gbs(buf, n, threads));
    for (long ahead : {256L, 1024L, 4096L, 16384L}) {
        char label[64];
        snprintf(label, sizeof label, "%ld KiB ahead, into L1", ahead * 4 / 1024);
        printf("%-28s %9.1f %9.1f\n", label, read_gbs<3>(buf, n, 1, ahead), read_gbs<3>(buf, n, threads, ahead));
        snprintf(label, sizeof label, "%ld KiB ahead, into L2", ahead * 4 / 1024);
        printf("%-28s %9.1f %9.1f\n", label, read_gbs<2>(buf, n, 1, ahead), read_gbs<2>(buf, n, threads, ahead));
        snprintf(label, sizeof label, "%ld KiB ahead, non-temporal", ahead * 4 / 1024);
        printf("%-28s %9.1f %9.1f\n", label, read_gbs<0>(buf, n, 1, ahead), read_gbs<0>(buf, n, threads, ahead));
    }

    // A buffer read right after the 256 MiB one evicted it, then read again at once: the second
    // read comes from the L3 as far as the L3 keeps it.
    printf("\nreading a buffer twice, %d threads, GB/s (best of 5):\n%8s %9s %9s\n", threads, "MiB", "first", "second");
    for (long mib : {4L, 8L, 12L, 16L, 24L, 48L}) {
        const long m = read_buffer_floats(mib, threads);
        const std::vector<float> b(m, 1.0f);
        double first = 0, second = 0;
        for (int r = 0; r < 5; r++) {
            read_seconds(buf.data(), n, threads);
            first = std::max(first, m * sizeof(float) / read_seconds(b.data(), m, threads) * 1e-9);
            second = std::max(second, m * sizeof(float) / read_seconds(b.data(), m, threads) * 1e-9);
        }
        printf("%8ld %9.1f %9.1f\n", mib, first, second);
    }
    return 0;
}
