// block_reduce.cuh: deterministic reductions over the threads of a block (a butterfly within each
// warp, then the warps' results combined in warp order), so a sum's rounding depends on the block
// size and the data only, never on the schedule; every thread gets the same result.
#ifndef FP8RL_CUDA_BLOCK_REDUCE_CUH
#define FP8RL_CUDA_BLOCK_REDUCE_CUH
#include "cuda/common.cuh"
#include "cuda/element.cuh"

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

// warp_reduce of N values at once (N a power of 2, at most 32) in N - 1 + 5 - log2 N shuffles and
// ops where warp_reduce of each takes 5 N: at a step the partners keep one half of the values and
// send each other the other half (lane bit 16 picks the half at the first step, then bit 8, ...), so
// lane L ends with value L / (32 / N), which it returns, after the same operations, op(own, partner),
// as warp_reduce's lane L. So where op(a, b) and op(b, a) are the same bits (SumOp: IEEE addition is
// commutative, NaN payloads aside; not MaxOp, for -0 against +0 and NaN), every lane has warp_reduce's
// result of its value.
template <int N, class T, class Op>
__device__ inline T warp_reduce_spread(T (&values)[N], Op op) {
    static_assert(N >= 1 && N <= 32 && (N & (N - 1)) == 0, "a power of 2 values, at most one a lane");
    int offset = 16;
    FP8RL_UNROLL
    for (int half = N / 2; half >= 1; half /= 2, offset /= 2) {
        const bool upper = (threadIdx.x & offset) != 0;
        FP8RL_UNROLL
        for (int i = 0; i < half; i++) {
            const T keep = upper ? values[i + half] : values[i];
            const T send = upper ? values[i] : values[i + half];
            values[i] = op(keep, __shfl_xor_sync(0xFFFFFFFFu, send, offset));
        }
    }
    T value = values[0];
    for (; offset > 0; offset /= 2) value = op(value, __shfl_xor_sync(0xFFFFFFFFu, value, offset));
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
