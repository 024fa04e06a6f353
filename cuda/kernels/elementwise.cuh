// elementwise.cuh: the residual add, FP32 <-> BF16 casts and Qwen2's q/k/v bias (forward and its
// gradient), as the CPU engine computes them (cpu/model_layers.h's residual_add, cpu/linear.h's bias):
//   residual  y = a + b, one rounding when y is BF16 (bit-exact with residual_add);
//   cast      y = x: BF16 -> FP32 exact, FP32 -> BF16 round to nearest even (round_bf16's bits);
//   bias      y [T][N] = x [T][N] + b [N] on the GEMM's FP32 output, then one rounding when y is BF16:
//             the CPU's order (bias added to the FP32 product, then round_bf16_if), so bit-exact;
//   bias grad db [N] += column sums of dy [T][N], deterministic (cuda/kernels/column_sum.cuh: bit-exact with
//             cpu/linear.h for T <= kColumnSumChunkRows, otherwise a different summation order).
#ifndef FP8RL_CUDA_ELEMENTWISE_CUH
#define FP8RL_CUDA_ELEMENTWISE_CUH
#include "cuda/kernels/column_sum.cuh"
#include "cuda/element.cuh"

namespace fp8rl {

inline constexpr int kElementwiseThreads = 256;

// A thread per 8 consecutive elements (16-byte loads and stores of BF16 when aligned), grid-stride.
// y, a, b [n] (y may be a or b: a and b load through the coherent path).
template <class In, class Out>
__global__ void residual_add_kernel(Out* y, const In* a, const In* b, long n) {
    for (long i = (blockIdx.x * (long)blockDim.x + threadIdx.x) * 8; i < n; i += (long)gridDim.x * blockDim.x * 8) {
        const int count = (int)min(8L, n - i);
        float va[8], vb[8];
        load8_written(a + i, count, va);
        load8_written(b + i, count, vb);
        for (int e = 0; e < 8; e++) va[e] += vb[e];
        store8(y + i, count, va);
    }
}

template <class In, class Out>
__global__ void cast_kernel(Out* y, const In* x, long n) {
    for (long i = (blockIdx.x * (long)blockDim.x + threadIdx.x) * 8; i < n; i += (long)gridDim.x * blockDim.x * 8) {
        const int count = (int)min(8L, n - i);
        float v[8];
        load8(x + i, count, v);
        store8(y + i, count, v);
    }
}

// y, x [rows][n] (y may be x: x loads through the coherent path); bias [n]. A thread per 8 columns of a row.
template <class In, class Bias, class Out>
__global__ void bias_add_kernel(Out* y, const In* x, const Bias* bias, long rows, int n) {
    const int groups = (n + 7) / 8;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < rows * groups; i += (long)gridDim.x * blockDim.x) {
        const long r = i / groups;
        const int c = (int)(i % groups) * 8, count = min(8, n - c);
        float v[8], b[8];
        load8_written(x + r * n + c, count, v);
        load8(bias + c, count, b);
        for (int e = 0; e < 8; e++) v[e] += b[e];
        store8(y + r * n + c, count, v);
    }
}

template <class Grad>
struct BiasGradTerm {
    const Grad* dy;
    int n;
    __device__ void operator()(long r, int c, int count, float out[8]) const { load8(dy + (size_t)r * n + c, count, out); }
};

inline void check_element_count(const char* who, long n) {
    if (n < 0) fail("%s: element count %ld is negative", who, n);
}

template <class In, class Out>
void residual_add(Out* y, const In* a, const In* b, long n, cudaStream_t stream) {
    check_element_count("residual_add", n);
    if (n == 0) return;
    LAUNCH_KERNEL((residual_add_kernel<In, Out>), elementwise_blocks((n + 7) / 8, kElementwiseThreads), kElementwiseThreads,
                  0, stream, y, a, b, n);
}

template <class In, class Out>
void cast(Out* y, const In* x, long n, cudaStream_t stream) {
    check_element_count("cast", n);
    if (n == 0) return;
    LAUNCH_KERNEL((cast_kernel<In, Out>), elementwise_blocks((n + 7) / 8, kElementwiseThreads), kElementwiseThreads, 0,
                  stream, y, x, n);
}

template <class In, class Bias, class Out>
void bias_add(Out* y, const In* x, const Bias* bias, long rows, int n, cudaStream_t stream) {
    if (rows < 0 || n <= 0) fail("bias_add: %ld rows of %d features", rows, n);
    if (rows == 0) return;
    LAUNCH_KERNEL((bias_add_kernel<In, Bias, Out>), elementwise_blocks(rows * ((n + 7) / 8), kElementwiseThreads),
                  kElementwiseThreads, 0, stream, y, x, bias, rows, n);
}

// FP32 scratch bias_backward needs for rows x n.
inline long bias_backward_scratch_floats(long rows, int n) { return column_sum_scratch_floats(rows, n); }

// db [n] += sum over rows of dy [rows][n].
template <class Grad>
void bias_backward(float* db, const Grad* dy, long rows, int n, float* scratch, long scratch_floats, cudaStream_t stream) {
    column_sum_add("bias_backward", db, BiasGradTerm<Grad>{dy, n}, rows, n, scratch, scratch_floats, stream);
}

}  // namespace fp8rl

#endif  // FP8RL_CUDA_ELEMENTWISE_CUH
