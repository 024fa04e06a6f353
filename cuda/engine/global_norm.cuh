// global_norm.cuh: the global L2 norm of the FP32 gradients and clipping by it (llm.c's
// global_norm.cuh in spirit). Deterministic: each block sums its grid-stride share of g^2 in
// double and reduces it in a fixed tree (cuda/kernels/block_reduce.cuh), then one block adds the blocks'
// partial sums in the same way; the grid depends on n only. The squares are exact in double (24-bit
// significands), so the result differs from rl/objective/adamw.h's grad_norm (one double sum in index order)
// only by the summation order: |S_gpu - S_cpu| <= (n + 2 log2 n) 2^-53 S for S = sum g^2.
// Clipping applies rl/objective/adamw.h's clip_grad_norm rule (torch's clip_grad_norm_) on the device,
// reading the sum of squares from device memory, so no host round trip is needed (and a
// data-parallel engine can all-reduce the sums of squares in between).
#ifndef FP8RL_CUDA_GLOBAL_NORM_CUH
#define FP8RL_CUDA_GLOBAL_NORM_CUH
#include <cmath>
#include <cstddef>

#include "cuda/kernels/block_reduce.cuh"

namespace fp8rl {

constexpr int GRAD_NORM_THREADS = 256;
constexpr int GRAD_NORM_MAX_BLOCKS = 2 * 132;  // two blocks per SM of an H200

inline int grad_norm_blocks(size_t n) {
    size_t blocks = (n + GRAD_NORM_THREADS - 1) / GRAD_NORM_THREADS;
    return blocks < (size_t)GRAD_NORM_MAX_BLOCKS ? (int)(blocks > 0 ? blocks : 1) : GRAD_NORM_MAX_BLOCKS;
}

// partial [gridDim.x]: block b's sum of g[i]^2 over i = b * blockDim.x + thread (+ k * grid size).
static __global__ void __launch_bounds__(GRAD_NORM_THREADS) grad_norm_partial_kernel(const float* g, size_t n, double* partial) {
    double sum = 0.0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        sum += (double)g[i] * (double)g[i];
    sum = block_reduce(sum, SumOp());
    if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

// One block: sum_sq = the sum of partial [blocks].
static __global__ void __launch_bounds__(GRAD_NORM_THREADS) grad_norm_total_kernel(const double* partial, int blocks, double* sum_sq) {
    double sum = 0.0;
    for (int i = threadIdx.x; i < blocks; i += blockDim.x) sum += partial[i];
    sum = block_reduce(sum, SumOp());
    if (threadIdx.x == 0) *sum_sq = sum;
}

// sum_sq (one device double) = sum of g[i]^2 over g [n]; partial: device scratch of
// GRAD_NORM_MAX_BLOCKS doubles.
inline void grad_norm_squared_gpu(const float* g, size_t n, double* partial, double* sum_sq, cudaStream_t stream) {
    if (n == 0) fail("grad_norm_squared_gpu: the gradient has no elements");
    int blocks = grad_norm_blocks(n);
    LAUNCH_KERNEL(grad_norm_partial_kernel, blocks, GRAD_NORM_THREADS, 0, stream, g, n, partial);
    LAUNCH_KERNEL(grad_norm_total_kernel, 1, GRAD_NORM_THREADS, 0, stream, (const double*)partial, blocks, sum_sq);
}

// rl/objective/adamw.h's clip_grad_norm given the norm: the factor max_norm / (norm + 1e-6), applied (in
// double, rounded to float) only when it is below 1; norm_out (when not null) gets the norm.
static __global__ void clip_grad_kernel(float* g, size_t n, const double* sum_sq, double max_norm, double* norm_out) {
    double norm = sqrt(*sum_sq);
    if (norm_out && blockIdx.x == 0 && threadIdx.x == 0) *norm_out = norm;
    if (!(max_norm > 0.0) || !std::isfinite(norm)) return;
    double factor = max_norm / (norm + 1e-6);
    if (!(factor < 1.0)) return;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        g[i] = (float)((double)g[i] * factor);
}

// Scales g [n] so that its norm, sqrt(*sum_sq) (device memory, from grad_norm_squared_gpu or an
// all-reduce of it), is at most max_norm; writes the norm before clipping to norm_out if given.
inline void clip_grad_norm_gpu(float* g, size_t n, const double* sum_sq, double max_norm, double* norm_out,
                               cudaStream_t stream) {
    if (n == 0) fail("clip_grad_norm_gpu: the gradient has no elements");
    LAUNCH_KERNEL(clip_grad_kernel, grad_norm_blocks(n), GRAD_NORM_THREADS, 0, stream, g, n, sum_sq, max_norm, norm_out);
}

}  // namespace fp8rl

#endif  // FP8RL_CUDA_GLOBAL_NORM_CUH
