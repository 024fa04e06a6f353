// element.cuh: the element types of GPU tensors, FP32 and BF16, read as FP32 and written from FP32,
// so one kernel template serves both. A BF16 store rounds to nearest, ties to even: the same bits
// as round_bf16 (rl/numerics/bf16.h), which is where the CPU engine rounds what the GPU stores as BF16.
#ifndef FP8RL_CUDA_ELEMENT_CUH
#define FP8RL_CUDA_ELEMENT_CUH
#include "cuda/common.cuh"

#include <type_traits>

namespace fp8rl {

__device__ __forceinline__ float as_float(float x) { return x; }
__device__ __forceinline__ float as_float(__nv_bfloat16 x) { return __bfloat162float(x); }

__device__ __forceinline__ void store_float(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_float(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

// True for BF16 tensors: kernels round where the CPU engine's `bf16` flag rounds.
template <class T>
constexpr bool is_bf16 = std::is_same<T, __nv_bfloat16>::value;

// Blocks for a grid-stride loop over n elements: enough to fill the device, never more than needed.
inline unsigned elementwise_blocks(long n, int threads) {
    const long wanted = (n + threads - 1) / threads, cap = 132L * 16;  // 16 blocks per SM of an H200
    return (unsigned)(wanted < cap ? wanted : cap);
}

}  // namespace fp8rl

#endif  // FP8RL_CUDA_ELEMENT_CUH
