// column_sum.cuh: out [n] += sum over rows r of term(r, c), deterministic and without float atomics:
// the weight gradient of RMSNorm and the bias gradient are such column sums over tokens.
//   stage 1  partials [chunks][n]: each chunk of kColumnSumChunkRows rows summed per column, from 0, in
//            row order (a thread per chunk and 8 consecutive columns, 16-byte loads; consecutive
//            threads take consecutive column groups of a chunk);
//   stage 2  out[c] += the chunks' partials added in chunk order (a thread per 8 columns).
// The CPU engine sums its rmsnorm weight gradient and bias gradient in this order
// (rl/numerics/reduction_order.h's column_sum_add_range), so the two are bit-exact.
#ifndef FP8RL_CUDA_COLUMN_SUM_CUH
#define FP8RL_CUDA_COLUMN_SUM_CUH
#include "cuda/element.cuh"
#include "cuda/kernels/fp8_rows.cuh"  // load8, store8
#include "rl/numerics/reduction_order.h"  // kColumnSumChunkRows, and the order as host code for the CPU engine

namespace fp8rl {

inline constexpr int kColumnSumThreads = 128;

// FP32 scratch the column sum of rows x n needs (the partials).
inline long column_sum_scratch_floats(long rows, int n) {
    return (rows + kColumnSumChunkRows - 1) / kColumnSumChunkRows * (long)n;
}

FP8RL_HD int column_groups(int n) { return (n + 7) / 8; }  // of 8 columns

// Term: a device functor, void operator()(long r, int c, int count, float out[8]): the terms of row
// r at columns c .. c + count - 1 (count <= 8), zeros past count.
template <class Term>
__global__ void __launch_bounds__(kColumnSumThreads)
    column_sum_partials_kernel(float* partials, Term term, long rows, int n, long items) {  // partials [chunks][n]
    const long item = blockIdx.x * (long)kColumnSumThreads + threadIdx.x;
    if (item >= items) return;
    const long chunk = item / column_groups(n);
    const int c = (int)(item % column_groups(n)) * 8, count = min(8, n - c);
    const long r0 = chunk * kColumnSumChunkRows, r1 = min(r0 + kColumnSumChunkRows, rows);
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (long r = r0; r < r1; r++) {
        float t[8];
        term(r, c, count, t);
        for (int e = 0; e < 8; e++) acc[e] += t[e];
    }
    store8(partials + (size_t)chunk * n + c, count, acc);
}

// Called from the column_sum_add template only: a file that includes this header without
// instantiating it must not warn about the unused kernel.
[[maybe_unused]] static __global__ void __launch_bounds__(kColumnSumThreads)
    column_sum_finish_kernel(float* out, const float* partials, int chunks, int n) {
    const int c = (blockIdx.x * kColumnSumThreads + threadIdx.x) * 8;
    if (c >= n) return;
    const int count = min(8, n - c);
    float sum[8], part[8], o[8];
    load8(partials + c, count, sum);
    for (int k = 1; k < chunks; k++) {
        load8(partials + (size_t)k * n + c, count, part);
        for (int e = 0; e < 8; e++) sum[e] += part[e];
    }
    load8_written(out + c, count, o);
    for (int e = 0; e < 8; e++) o[e] += sum[e];
    store8(out + c, count, o);
}

// Fails, naming `who`, unless a column sum of rows x n fits the grid and the scratch.
inline void check_column_sum(const char* who, long rows, int n, long scratch_floats) {
    if (rows < 0 || n <= 0) fail("%s: column sum over %ld rows of %d columns", who, rows, n);
    if ((rows + kColumnSumChunkRows - 1) / kColumnSumChunkRows > 65535)
        fail("%s: %ld rows exceed the column sum's %ld (65535 chunks of %d)", who, rows, 65535L * kColumnSumChunkRows,
             kColumnSumChunkRows);
    if (scratch_floats < column_sum_scratch_floats(rows, n))
        fail("%s: scratch of %ld floats, the column sum of %ld x %d needs %ld", who, scratch_floats, rows, n,
             column_sum_scratch_floats(rows, n));
}

// out [n] += column sums of term over rows; scratch holds scratch_floats >= column_sum_scratch_floats.
template <class Term>
void column_sum_add(const char* who, float* out, const Term& term, long rows, int n, float* scratch, long scratch_floats,
                    cudaStream_t stream) {
    check_column_sum(who, rows, n, scratch_floats);
    if (rows == 0) return;
    const long chunks = (rows + kColumnSumChunkRows - 1) / kColumnSumChunkRows;
    const long items = chunks * column_groups(n);
    LAUNCH_KERNEL(column_sum_partials_kernel<Term>, dim3((unsigned)((items + kColumnSumThreads - 1) / kColumnSumThreads)),
                  kColumnSumThreads, 0, stream, scratch, term, rows, n, items);
    LAUNCH_KERNEL(column_sum_finish_kernel, dim3((unsigned)((column_groups(n) + kColumnSumThreads - 1) / kColumnSumThreads)),
                  kColumnSumThreads, 0, stream, out, scratch, (int)chunks, n);
}

}  // namespace fp8rl

#endif  // FP8RL_CUDA_COLUMN_SUM_CUH
