// gpu_util.cuh: small helpers for the GPU tests and benchmarks: an owning device buffer, random
// fills, and the "is there a usable GPU" check that turns into a visible SKIP.
#ifndef FP8RL_TEST_GPU_UTIL_CUH
#define FP8RL_TEST_GPU_UTIL_CUH
#include <cstdio>
#include <string>
#include <vector>

#include "fp8_gemm.cuh"
#include "rl/driver/dist.h"
#include "rl/numerics/bf16.h"
#include "rl/numerics/fp8_block.h"
#include "test/harness.h"

namespace fp8rl {

// True in the emulation build (tests shrink sweeps that would take hours on the CPU, never skip them).
#ifdef FP8RL_EMU
constexpr bool emulated = true;
#else
constexpr bool emulated = false;
#endif

template <class T>
struct DeviceBuffer {
    T* ptr = nullptr;
    size_t count = 0;
    explicit DeviceBuffer(size_t n) : count(n) {
        CUDA_CHECK(cudaMalloc(&ptr, n * sizeof(T) + 16));
    }
    explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
    ~DeviceBuffer() { cudaFree(ptr); }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    void upload(const std::vector<T>& host) {
        CUDA_CHECK(cudaMemcpy(ptr, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    }
    std::vector<T> download() const {
        std::vector<T> host(count);
        CUDA_CHECK(cudaDeviceSynchronize());  // kernel execution, checked before the download
        CUDA_CHECK(cudaMemcpy(host.data(), ptr, count * sizeof(T), cudaMemcpyDeviceToHost));
        return host;
    }
    // Fills with a byte pattern, so an element the code under test never writes is visible.
    void poison() { CUDA_CHECK(cudaMemset(ptr, 0xA5, count * sizeof(T))); }
};

// How many codes and scales of a device FP8 operand differ, bit for bit, from the CPU quantizer's `want`.
inline int fp8_operand_differences(const DeviceBuffer<uint8_t>& codes, const DeviceBuffer<float>& scales,
                                   const Fp8Tensor& want) {
    const std::vector<uint8_t> got_codes = codes.download();
    const std::vector<float> got_scales = scales.download();
    int bad = 0;
    for (size_t i = 0; i < want.data.size(); i++) bad += got_codes[i] != want.data[i];
    for (size_t i = 0; i < want.scale_inv.size(); i++) bad += float_bits(got_scales[i]) != float_bits(want.scale_inv[i]);
    return bad;
}

// "" when a CUDA device is present, else why not.
inline std::string no_gpu_reason() {
    int n = 0;
    cudaError_t st = cudaGetDeviceCount(&n);
    if (st != cudaSuccess) return strfmt("no usable CUDA device (%s)", cudaGetErrorString(st));
    if (n == 0) return "no CUDA device";
    st = cudaFree(nullptr);  // a context: a device the driver lists may still be unusable
    if (st != cudaSuccess) return strfmt("the CUDA device cannot be used (%s)", cudaGetErrorString(st));
    return "";
}

#ifndef FP8RL_EMU
// ./test_gpu without a usable GPU stops before any test with one line (test/run_tests.cpp), so a
// machine without one never reports its skips as a pass (REQUIRE_GPU below then never skips there).
inline const bool gpu_precondition_set = (harness::precondition() = no_gpu_reason, true);
#endif

// Skips the calling test, visibly, where ./test_gpu finds no usable GPU (never in emulation,
// whose device always exists).
#define REQUIRE_GPU()                                 \
    do {                                              \
        std::string why_not = no_gpu_reason();        \
        if (!why_not.empty()) SKIP(why_not.c_str());  \
    } while (0)

// The emulation's refusal tests: launch(mode) runs a kernel with one misuse per mode; for each mode
// in [first, last] the error it raises must name rules[mode]. The device is reset after each.
template <class Launch>
void check_refusals(const char* const* rules, int first, int last, const Launch& launch) {
    for (int mode = first; mode <= last; mode++) {
        std::string err;
        try {
            launch(mode);
            CUDA_CHECK(cudaDeviceSynchronize());
        } catch (const Error& e) {
            err = e.what();
        }
        CHECK_MSG(err.find(rules[mode]) != std::string::npos, "mode %d: %s", mode, err.c_str());
        printf("    mode %d: %s\n", mode, err.c_str());
        cudaDeviceReset();
    }
}

// Deterministic pseudo-random numbers (xorshift-multiply hash of the index), uniform in [-1, 1).
__host__ __device__ inline float hash_uniform(uint64_t i, uint32_t seed) {
    uint64_t z = i * 0x9E3779B97F4A7C15ull + seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 8388608.0f) - 1.0f;
}

template <class T>  // a template, so several test files can include this header
__global__ void fill_uniform_kernel(T* x, size_t n, uint32_t seed, float amplitude) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = (T)(amplitude * hash_uniform(i, seed));
}

template <class T>
void fill_uniform(T* x, size_t n, uint32_t seed, float amplitude) {
    LAUNCH_KERNEL(fill_uniform_kernel<T>, 1024, 256, 0, 0, x, n, seed, amplitude);
}

// n BF16-valued floats, uniform in [-amplitude, amplitude) (hash_uniform, rounded to BF16).
inline std::vector<float> bf16_values(size_t n, uint32_t seed, float amplitude) {
    std::vector<float> x(n);
    for (size_t i = 0; i < n; i++) x[i] = round_bf16(amplitude * hash_uniform(i, seed));
    return x;
}

inline std::vector<__nv_bfloat16> to_bf16(const std::vector<float>& x) {
    std::vector<__nv_bfloat16> out(x.size());
    for (size_t i = 0; i < x.size(); i++) out[i] = __float2bfloat16_rn(x[i]);
    return out;
}

inline std::vector<float> to_float(const std::vector<__nv_bfloat16>& x) {
    std::vector<float> out(x.size());
    for (size_t i = 0; i < x.size(); i++) out[i] = __bfloat162float(x[i]);
    return out;
}

// The engine tests' communicator: one process, no MPI.
inline const Dist& one_rank() {
    static Dist dist;
    return dist;
}

}  // namespace fp8rl

#endif  // FP8RL_TEST_GPU_UTIL_CUH
