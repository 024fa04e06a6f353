// hostdevice.h: FP8RL_HD marks per-token math that compiles both as host code (g++, the CPU
// engine and its tests) and as CUDA device code (nvcc), so the GPU kernels call the very
// functions the CPU tests exercise.
#pragma once
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define FP8RL_HD __host__ __device__ __forceinline__
#else
#define FP8RL_HD inline
#endif

// Host code compiled by g++ with AVX2 may take vector paths that compute the same bits as the
// scalar code beside them; nvcc's host and device passes always take the scalar code.
#if defined(__AVX2__) && !defined(__CUDACC__)
#define FP8RL_HOST_AVX2 1
#else
#define FP8RL_HOST_AVX2 0
#endif

namespace fp8rl {

// The bits of a float and the float with these bits (memcpy of 4 bytes is a register move on the
// host and on the device).
FP8RL_HD uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

FP8RL_HD float bits_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

// a * b rounded to float and never fused into a following add: nvcc contracts a * b + c into one
// FMA by default, the host build does not (-ffp-contract=off), and shared code must round the same
// on both.
FP8RL_HD float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

}  // namespace fp8rl
