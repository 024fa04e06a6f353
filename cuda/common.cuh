// common.cuh: what every GPU source includes first. It builds the same code two ways:
//   nvcc             the CUDA headers; kernels run on the GPU (sm_90);
//   g++ -DFP8RL_EMU  cuda/emu/emu.h; kernels run on the CPU as fibers (spec-gpu.md §2), in CI.
// Every CUDA runtime call goes through CUDA_CHECK, every kernel launch through LAUNCH_KERNEL,
// and shared memory is declared with STATIC_SHARED and DYNAMIC_SHARED, so neither build needs
// its own copy.
#ifndef FP8RL_CUDA_COMMON_CUH
#define FP8RL_CUDA_COMMON_CUH
#ifdef FP8RL_EMU
#include "cuda/emu/emu.h"
#else
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_pipeline_primitives.h>  // cp.async (__pipeline_memcpy_async); emu.h has its twin
#include <cuda_runtime.h>
#endif

#include <mutex>
#include <map>
#include <string>
#include <utility>

#include "rl/common.h"

namespace fp8rl {

// One line naming the call, where it is and what CUDA said; the caller's main() prints it.
inline void cuda_check(cudaError_t status, const char* call, const char* file, int line) {
    if (status != cudaSuccess)
        fail("CUDA error at %s:%d in %s: %s (%s)", file, line, call, cudaGetErrorString(status), cudaGetErrorName(status));
}
#define CUDA_CHECK(call) ::fp8rl::cuda_check((call), #call, __FILE__, __LINE__)

// Launches kernel<<<grid, block, smem, stream>>>(args...) and checks the launch. In emulation the
// arguments are copied into the closure, as CUDA copies kernel parameters at launch (a captured
// graph replays them).
template <class... Params, class... Args>
void launch_kernel(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   const char* file, int line, Args&&... args) {
#ifdef FP8RL_EMU
    emu::launch(name, (const void*)kernel, grid, block, smem, stream, {emu::pointer_arg(args)...}, [=] { kernel(args...); });
#else
    kernel<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
#endif
    cuda_check(cudaGetLastError(), name, file, line);
}
#define LAUNCH_KERNEL(kernel, grid, block, smem, stream, ...) \
    ::fp8rl::launch_kernel(#kernel, kernel, grid, block, smem, stream, __FILE__, __LINE__, __VA_ARGS__)

// Allows `kernel` `bytes` of dynamic shared memory on the current device. The attribute is the
// most a launch may ask for and stays set for the process, so it only ever grows (a kernel launched
// with several sizes keeps the largest) and is set when a launch needs more than it allows: launchers
// call this before every launch, thousands of times a step and inside captured decode steps.
template <class Kernel>
void allow_dynamic_smem(Kernel kernel, size_t bytes) {
    static std::mutex mutex;
    static std::map<std::pair<const void*, int>, size_t> allowed;
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    std::lock_guard<std::mutex> lock(mutex);
    size_t& most = allowed[std::make_pair((const void*)kernel, device)];
    if (bytes <= most) return;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    most = bytes;
}

}  // namespace fp8rl

// DYNAMIC_SHARED(float, tile); declares `tile`, the launch's dynamic shared memory, as float[].
// STATIC_SHARED(float, partial, [256]); declares `__shared__ float partial[256]` (at block scope);
// in emulation it also tells the runtime its size, which counts against the launch's limits.
#ifdef FP8RL_EMU
#define DYNAMIC_SHARED(type, name) FP8RL_EMU_DYNAMIC_SHARED(type, name)
#define STATIC_SHARED(type, name, ...) FP8RL_EMU_STATIC_SHARED(type, name, __VA_ARGS__)
#else
#define DYNAMIC_SHARED(type, name) extern __shared__ __align__(16) type name[]
#define STATIC_SHARED(type, name, ...) __shared__ type name __VA_ARGS__
#endif

#endif  // FP8RL_CUDA_COMMON_CUH
