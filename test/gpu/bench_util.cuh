// bench_util.cuh: what the GPU benchmarks (test/gpu/bench_*.cu) share: the size switch (--tiny:
// shapes the emulation runs in seconds, for make test), event timing, TFLOP/s, the header line
// naming the device and its library (and saying that emulated times are not figures), and the
// benchmark's exit status.
#ifndef FP8RL_TEST_GPU_BENCH_UTIL_CUH
#define FP8RL_TEST_GPU_BENCH_UTIL_CUH
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "cuda/perf/calibrate.h"
#include "cuda/perf/perf_model.h"
#include "test/gpu/gpu_util.cuh"

namespace fp8rl {

// The GPU the benchmarks run on as cuda/perf/kernel_perf_model.h prices it (an H200 above 100 GiB of
// device memory, else an H100; in emulation the emulated device's memory decides), and the hardware of
// the model that prices what the kernels execute (sass_hardware): the predictions each benchmark prints.
inline const GpuSpec& bench_gpu() {
    static const GpuSpec g = [] {
        size_t free_bytes = 0, total = 0;
        CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
        return total > (size_t(100) << 30) ? h200() : h100();
    }();
    return g;
}
inline const PerfHardware& bench_hardware() {
    static const PerfHardware hw = sass_hardware(bench_gpu());
    return hw;
}

// --tiny: the smoke-test shapes (make test-bench-emu); anything else is an error naming the usage.
inline bool bench_tiny(int argc, char** argv, const char* name) {
    bool tiny = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tiny")) tiny = true;
        else {
            fprintf(stderr, "usage: %s [--tiny]   (--tiny: smoke-test shapes, as make test runs it in emulation)\n", name);
            exit(2);
        }
    }
    return tiny;
}

// Median milliseconds of one fn() over `samples` samples after `warmups` calls; each sample times
// `calls` calls back to back, so the host's per-call work (descriptor lookup, launch) overlaps the
// GPU's instead of adding to it. In emulation: one warm-up, one sample of one call.
template <class Fn>
double median_ms(Fn fn, int samples = 10, int calls = 5, int warmups = 3) {
    if (emulated) samples = 1, calls = 1, warmups = 1;
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    for (int i = 0; i < warmups; i++) fn();
    std::vector<float> ms((size_t)samples);
    for (float& t : ms) {
        CUDA_CHECK(cudaEventRecord(start));
        for (int i = 0; i < calls; i++) fn();
        CUDA_CHECK(cudaEventRecord(stop));
        CUDA_CHECK(cudaEventSynchronize(stop));
        CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
        t /= (float)calls;
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    std::sort(ms.begin(), ms.end());
    return 0.5 * (ms[(samples - 1) / 2] + ms[samples / 2]);
}

inline double tflops(double flop, double ms) { return flop / (ms * 1e-3) / 1e12; }

// Prints "NAME on DEVICE (SMs), LIBRARY" and, in emulation, that the times are the CPU's.
inline void print_bench_header(const char* name, bool tiny) {
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
#ifdef FP8RL_EMU
    const std::string library = "cuBLASLt emulated (cuda/emu/emu_cublaslt.cpp)";
#else
    const std::string library = strfmt("cuBLASLt %zu", cublasLtGetVersion());
#endif
    printf("%s on %s (%d SMs), %s%s\n", name, prop.name, prop.multiProcessorCount, library.c_str(),
           tiny ? ", tiny shapes (--tiny)" : "");
    if (emulated)
        printf("EMULATED: kernels run on the CPU (cuda/emu/emu.h); the times below are the emulation's, not GPU figures\n");
}

// "" when the benchmark can run here (a GPU with FP8 block-scaled GEMMs, or the emulation), else why not.
inline std::string bench_unavailable_reason() {
    std::string why = no_gpu_reason();
    return why.empty() ? fp8_block_gemm_unsupported_reason(0) : why;
}

// One kernel's (or step's) measured time beside the model's prediction, where dev/gpu_check.sh sets
// FP8RL_CALIBRATION_DIR: a line of DIR/BENCH.tsv (the tables on stdout stay tables), which
// `build/perf_model --calibrate` reads (cuda/perf/calibrate.h: kernel, measured_s, predicted_s, ratio,
// bound, the constants the prediction rests on). In emulation the times are the CPU's: the line is
// written all the same, so the emulated run checks the format, never the figures.
inline void record_calibration(const char* bench, const std::string& kernel, double measured_s, double predicted_s,
                               const std::string& bound, bool fp8 = false) {
    const std::string constants = constants_of_bound(bound, fp8);
    const char* dir = getenv("FP8RL_CALIBRATION_DIR");
    if (!dir || !*dir || !(measured_s > 0) || !(predicted_s > 0)) return;
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    const std::string path = std::string(dir) + "/" + bench + ".tsv";
    const bool fresh = !std::filesystem::exists(path, ec);
    FILE* f = fopen(path.c_str(), "a");
    if (!f) fail("record_calibration: cannot append to %s", path.c_str());
    if (fresh) fprintf(f, "# kernel\tmeasured_s\tpredicted_s\tratio\tbound\tconstants (cuda/perf/calibrate.h)\n");
    std::string name = kernel;
    std::replace(name.begin(), name.end(), '\t', ' ');
    fprintf(f, "%s\t%.6g\t%.6g\t%.6g\t%s\t%s\n", name.c_str(), measured_s, predicted_s, measured_s / predicted_s, bound.c_str(),
            constants.c_str());
    fclose(f);
}

// Bytes of device memory in use by all processes (cudaMemGetInfo), to compare with the engine's own
// count (device_bytes_live / device_bytes_peak, cuda/engine/device_array.cuh).
inline size_t cuda_mem_used() {
    size_t free_bytes = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    return total - free_bytes;
}

}  // namespace fp8rl

#endif  // FP8RL_TEST_GPU_BENCH_UTIL_CUH
