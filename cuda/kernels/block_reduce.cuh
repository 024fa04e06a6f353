// block_reduce.cuh: deterministic reductions over the threads of a block (a butterfly within each
// warp, then the warps' results combined in warp order), so a sum's rounding depends on the block
// size and the data only, never on the schedule; every thread gets the same result.
#ifndef FP8RL_CUDA_BLOCK_REDUCE_CUH
#define FP8RL_CUDA_BLOCK_REDUCE_CUH
#include "cuda/common.cuh"

namespace fp8rl {

struct SumOp {
    template <class T>
    __device__ T operator()(T a, T b) const { return a + b; }
};
// The larger of a and b, written as the CPU engine's max loops write it.
struct MaxOp {
    template <class T>
    __device__ T operator()(T a, T b) const { return b > a ? b : a; }
};

// Every lane of a full warp gets op over the warp's 32 values (op commutative: partners compute
// op(a, b) and op(b, a), which round the same).
template <class T, class Op>
__device__ inline T warp_reduce(T value, Op op) {
    for (int offset = 16; offset > 0; offset /= 2) value = op(value, __shfl_xor_sync(0xFFFFFFFFu, value, offset));
    return value;
}

// Every thread of the block gets op over the block's values; blockDim.x must be a multiple of 32
// (the launchers' block sizes are). Calls may follow each other: the second barrier keeps the
// next call from overwriting warp_values before every thread has read them (on a GPU a warp can run
// ahead through its shuffles; the emulation resumes every released thread before any shuffle
// completes, so no emulated test fails without it).
template <class T, class Op>
__device__ inline T block_reduce(T value, Op op) {
    STATIC_SHARED(T, warp_values, [32]);
    int warps = blockDim.x / 32;
    value = warp_reduce(value, op);
    if (threadIdx.x % 32 == 0) warp_values[threadIdx.x / 32] = value;
    __syncthreads();
    value = warp_values[0];
    for (int w = 1; w < warps; w++) value = op(value, warp_values[w]);
    __syncthreads();
    return value;
}

}  // namespace fp8rl

#endif  // FP8RL_CUDA_BLOCK_REDUCE_CUH
