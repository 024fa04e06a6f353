// hostdevice.h: FP8RL_HD marks per-token math that compiles both as host code (g++, the CPU
// engine and its tests) and as CUDA device code (nvcc), so the GPU kernels call the very
// functions the CPU tests exercise.
#pragma once
#ifdef __CUDACC__
#define FP8RL_HD __host__ __device__ __forceinline__
#else
#define FP8RL_HD inline
#endif
