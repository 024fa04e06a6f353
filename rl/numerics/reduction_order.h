// reduction_order.h: the order in which the GPU kernels add up a row or a column, as host code, so
// the CPU engine (the oracle) rounds its sums where the kernels round theirs.
//   block_sum     cuda/kernels/block_reduce.cuh's block reduction over `threads` threads: thread t adds
//                 terms t, t + threads, ... from 0 in order; each warp's 32 sums combine by the xor
//                 butterfly (offsets 16, 8, 4, 2, 1); the warps' results add in warp order;
//   column sums   cuda/kernels/column_sum.cuh: chunks of kColumnSumChunkRows rows each summed from 0 in row
//                 order, the chunks' sums added in chunk order, then added to the output.
#pragma once
#include "rl/numerics/hostdevice.h"

namespace fp8rl {

constexpr int kWarpSize = 32;
constexpr int kMaxBlockThreads = 1024;
constexpr int kColumnSumChunkRows = 256;  // rows of one partial column sum
constexpr int kNormMaxThreads = 256;      // threads of a norm's block (cuda/kernels/rmsnorm.cuh)

// Threads of the block that reduces a row of n values: n rounded up to whole warps, at most
// kNormMaxThreads.
FP8RL_HD int norm_threads(int n) {
    const int warps = (n + kWarpSize - 1) / kWarpSize;
    return warps * kWarpSize < kNormMaxThreads ? warps * kWarpSize : kNormMaxThreads;
}

// The sum of a warp's 32 values lane[0..32) as the xor butterfly (offsets 16, 8, 4, 2, 1) leaves it
// in lane 0; lane is clobbered.
inline float warp_butterfly_sum(float* lane) {
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
        for (int l = 0; l < offset; l++) lane[l] += lane[l + offset];  // lanes l and l ^ offset agree
    return lane[0];
}

// The sum of term(i) for i < n in a block reduction's order over `threads` (a multiple of 32, at
// most kMaxBlockThreads) threads.
template <class Term>
inline float block_sum(int n, int threads, const Term& term) {
    float part[kMaxBlockThreads];
    for (int t = 0; t < threads; t++) part[t] = 0.0f;
    for (int i0 = 0; i0 < n; i0 += threads)
        for (int t = 0; t < threads && i0 + t < n; t++) part[t] += term(i0 + t);
    float total = 0.0f;
    for (int w = 0; w < threads / kWarpSize; w++) {
        const float warp = warp_butterfly_sum(part + w * kWarpSize);
        total = w == 0 ? warp : total + warp;
    }
    return total;
}

// out[c] += the sum over rows r < rows of term(r, c), for c in [c0, c1) (c1 - c0 <= 64), in the
// column sum's order.
template <class Term>
inline void column_sum_add_range(float* out, long rows, int c0, int c1, const Term& term) {
    float total[64], chunk[64];
    for (int c = c0; c < c1; c++) total[c - c0] = 0.0f;
    for (long r0 = 0; r0 < rows; r0 += kColumnSumChunkRows) {
        const long r1 = r0 + kColumnSumChunkRows < rows ? r0 + kColumnSumChunkRows : rows;
        for (int c = c0; c < c1; c++) chunk[c - c0] = 0.0f;
        for (long r = r0; r < r1; r++)
            for (int c = c0; c < c1; c++) chunk[c - c0] += term(r, c);
        for (int c = c0; c < c1; c++) total[c - c0] = r0 == 0 ? chunk[c - c0] : total[c - c0] + chunk[c - c0];
    }
    if (rows > 0)
        for (int c = c0; c < c1; c++) out[c] += total[c - c0];
}

}  // namespace fp8rl
