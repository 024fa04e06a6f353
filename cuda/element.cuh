// element.cuh: the element types of GPU tensors, FP32 and BF16, read as FP32 and written from FP32,
// so one kernel template serves both. A BF16 store rounds to nearest, ties to even: the same bits
// as round_bf16 (rl/numerics/bf16.h), which is where the CPU engine rounds what the GPU stores as BF16.
// Also the E4M3 pair/quad encoders every FP8 quantize kernel writes its codes with.
#ifndef FP8RL_CUDA_ELEMENT_CUH
#define FP8RL_CUDA_ELEMENT_CUH
#include "cuda/common.cuh"
#include "rl/numerics/fp8.h"

#include <type_traits>

namespace fp8rl {

__device__ __forceinline__ float as_float(float x) { return x; }
__device__ __forceinline__ float as_float(__nv_bfloat16 x) { return __bfloat162float(x); }

__device__ __forceinline__ void store_float(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_float(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

// E4M3 (satfinite) codes of two or four floats, packed low byte first: byte i of the result is the
// code of the i-th argument. The device build (sm_89+) converts two values per instruction,
// cvt.rn.satfinite.e4m3x2.f32 through cuda_fp8.h's __nv_cvt_float2_to_fp8x2; host code and the
// emulation run the software encoder float_to_e4m3 (rl/numerics/fp8.h) per value. The two give the
// same byte for every float: __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) on the device is
// that very instruction (with 0 in the other half), and float_to_e4m3 equals it over all 2^32 inputs
// (test_gpu's gpu_fp8_device_encoder_matches_cuda_all_floats; test_cpu's exhaustive check against
// cuda_fp8.h's host path). Satfinite semantics, identical in both: |x| that rounds above 448 and +-Inf
// give +-448 (0x7E / 0xFE); any NaN gives 0x7F (the sign dropped); tiny values round to a signed zero.
// The quantize kernels feed x * scale with a finite scale and |x * scale| <= 448 up to rounding, so
// NaN reaches the encoder only from a NaN element and Inf only from an Inf element (scale 1).
FP8RL_HD uint16_t encode_e4m3x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    return (uint16_t)__nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3);
#else
    return (uint16_t)(float_to_e4m3(lo) | (uint16_t)float_to_e4m3(hi) << 8);
#endif
}
FP8RL_HD uint32_t encode_e4m3x4(float a0, float a1, float a2, float a3) {
    return (uint32_t)encode_e4m3x2(a0, a1) | (uint32_t)encode_e4m3x2(a2, a3) << 16;
}

// FP8RL_UNROLL before a loop of constant trip count: nvcc unrolls it (so loads it issues are all in
// flight before the first is used); g++ (emulation) has no such pragma.
// FP8RL_NO_UNROLL before a loop whose trip count a thread cannot know: nvcc keeps it one loop (its
// SASS one loop of the source's body, which cuda/perf/kernel_perf_model.h's recipes count by passes).
#ifdef __CUDACC__
#define FP8RL_UNROLL _Pragma("unroll")
#define FP8RL_NO_UNROLL _Pragma("unroll 1")
#else
#define FP8RL_UNROLL
#define FP8RL_NO_UNROLL
#endif

// One global access of a vector type V (uint4, uint2, uint32_t: 16, 8 or 4 bytes) at p, which must
// be a multiple of sizeof(V): a GPU faults on a misaligned vector access (cudaErrorMisalignedAddress)
// and so does the emulation (emu::misaligned_access), so a kernel checks the address first or knows
// it. load_vector reads data the kernel never writes (the read-only path, ld.global.nc).
template <class V>
__device__ __forceinline__ V load_vector(const void* p) {
#ifdef FP8RL_EMU
    if ((uintptr_t)p % sizeof(V)) ::emu::misaligned_access(p, sizeof(V), "vector load");
    V v;
    memcpy(static_cast<void*>(&v), p, sizeof(V));
    return v;
#else
    return __ldg(reinterpret_cast<const V*>(p));
#endif
}
// load_vector of data the kernel itself writes (an output it accumulates into): the coherent path.
template <class V>
__device__ __forceinline__ V load_vector_written(const void* p) {
#ifdef FP8RL_EMU
    if ((uintptr_t)p % sizeof(V)) ::emu::misaligned_access(p, sizeof(V), "vector load");
    V v;
    memcpy(static_cast<void*>(&v), p, sizeof(V));
    return v;
#else
    return *reinterpret_cast<const V*>(p);
#endif
}
template <class V>
__device__ __forceinline__ void store_vector(void* p, const V& v) {
#ifdef FP8RL_EMU
    if ((uintptr_t)p % sizeof(V)) ::emu::misaligned_access(p, sizeof(V), "vector store");
    memcpy(p, static_cast<const void*>(&v), sizeof(V));
#else
    *reinterpret_cast<V*>(p) = v;
#endif
}

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
