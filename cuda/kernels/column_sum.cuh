// column_sum.cuh: out [n] += sum over rows r of term(r, c), deterministic and without float atomics:
// the weight gradient of RMSNorm and the bias gradient are such column sums over tokens.
//   stage 1  partials [chunks][n]: each chunk of kColumnSumChunkRows rows summed per column, from 0, in
//            row order (one thread per column; a warp reads consecutive columns of a row);
//   stage 2  out[c] += the chunks' partials added in chunk order.
// The CPU engine sums its rmsnorm weight gradient and bias gradient in this order
// (rl/numerics/reduction_order.h's column_sum_add_range), so the two are bit-exact.
#ifndef FP8RL_CUDA_COLUMN_SUM_CUH
#define FP8RL_CUDA_COLUMN_SUM_CUH
#include "cuda/element.cuh"
#include "rl/numerics/reduction_order.h"  // kColumnSumChunkRows, and the order as host code for the CPU engine

namespace fp8rl {

inline constexpr int kColumnSumThreads = 128;

// FP32 scratch the column sum of rows x n needs (the partials).
inline long column_sum_scratch_floats(long rows, int n) {
    return (rows + kColumnSumChunkRows - 1) / kColumnSumChunkRows * (long)n;
}

// Term: a device functor, float operator()(long r, int c).
template <class Term>
__global__ void column_sum_partials_kernel(float* partials, Term term, long rows, int n) {  // partials [chunks][n]
    const int c = blockIdx.x * kColumnSumThreads + threadIdx.x;
    if (c >= n) return;
    const long r0 = (long)blockIdx.y * kColumnSumChunkRows, r1 = min(r0 + kColumnSumChunkRows, rows);
    float acc = 0.0f;
    for (long r = r0; r < r1; r++) acc += term(r, c);
    partials[(size_t)blockIdx.y * n + c] = acc;
}

// Called from the column_sum_add template only: a file that includes this header without
// instantiating it must not warn about the unused kernel.
[[maybe_unused]] static __global__ void column_sum_finish_kernel(float* out, const float* partials, int chunks, int n) {
    const int c = blockIdx.x * kColumnSumThreads + threadIdx.x;
    if (c >= n) return;
    float sum = partials[c];
    for (int k = 1; k < chunks; k++) sum += partials[(size_t)k * n + c];
    out[c] += sum;
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
    const unsigned column_blocks = (unsigned)((n + kColumnSumThreads - 1) / kColumnSumThreads);
    LAUNCH_KERNEL(column_sum_partials_kernel<Term>, dim3(column_blocks, (unsigned)chunks), kColumnSumThreads, 0, stream,
                  scratch, term, rows, n);
    LAUNCH_KERNEL(column_sum_finish_kernel, column_blocks, kColumnSumThreads, 0, stream, out, scratch, (int)chunks, n);
}

}  // namespace fp8rl

#endif  // FP8RL_CUDA_COLUMN_SUM_CUH
