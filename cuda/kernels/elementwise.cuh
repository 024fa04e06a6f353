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

// y, a, b [n] (y may be a or b).
template <class In, class Out>
__global__ void residual_add_kernel(Out* y, const In* a, const In* b, long n) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        store_float(y + i, as_float(a[i]) + as_float(b[i]));
}

template <class In, class Out>
__global__ void cast_kernel(Out* y, const In* x, long n) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        store_float(y + i, as_float(x[i]));
}

// y, x [rows][n] (y may be x); bias [n].
template <class In, class Bias, class Out>
__global__ void bias_add_kernel(Out* y, const In* x, const Bias* bias, long rows, int n) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < rows * n; i += (long)gridDim.x * blockDim.x)
        store_float(y + i, as_float(x[i]) + as_float(bias[i % n]));
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
    LAUNCH_KERNEL((residual_add_kernel<In, Out>), elementwise_blocks(n, kElementwiseThreads), kElementwiseThreads, 0,
                  stream, y, a, b, n);
}

template <class In, class Out>
void cast(Out* y, const In* x, long n, cudaStream_t stream) {
    check_element_count("cast", n);
    if (n == 0) return;
    LAUNCH_KERNEL((cast_kernel<In, Out>), elementwise_blocks(n, kElementwiseThreads), kElementwiseThreads, 0, stream, y,
                  x, n);
}

template <class In, class Bias, class Out>
void bias_add(Out* y, const In* x, const Bias* bias, long rows, int n, cudaStream_t stream) {
    if (rows < 0 || n <= 0) fail("bias_add: %ld rows of %d features", rows, n);
    if (rows == 0) return;
    LAUNCH_KERNEL((bias_add_kernel<In, Bias, Out>), elementwise_blocks(rows * n, kElementwiseThreads),
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
