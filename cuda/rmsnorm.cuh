// rmsnorm.cuh: RMSNorm over rows of n values (spec-model.md §2.3), forward and backward, as
// cpu/model_layers.h's rmsnorm_forward / rmsnorm_backward:
//   y = w * (x * rstd), rstd = 1 / sqrt(mean(x^2) + eps) per row;
//   dx (+)= rstd * (w * dy) - x * rstd^3 / n * sum(w * dy * x), dw += sum over rows of dy * x * rstd.
// Also Qwen3's per-head q/k norm: q [T][H][D] is T*H rows of D with one weight vector of D.
// A BF16 output rounds as HF (and the CPU's bf16 flag): x * rstd to BF16, times w, to BF16 again.
// One block per row; the row's sum of squares and the backward's dot product are block reductions in
// a fixed order (cuda/block_reduce.cuh), the CPU engine's (rl/numerics/reduction_order.h's block_sum).
// The weight gradient is a deterministic column sum (cuda/column_sum.cuh), no atomics.
#ifndef FP8RL_CUDA_RMSNORM_CUH
#define FP8RL_CUDA_RMSNORM_CUH
#include "cuda/block_reduce.cuh"
#include "cuda/column_sum.cuh"
#include "rl/numerics/bf16.h"
#include "rl/numerics/hostdevice.h"
#include "rl/numerics/reduction_order.h"

#include <climits>

namespace fp8rl {

// One block per row. x, y [rows][n]; rstd [rows].
template <class In, class W, class Out>
__global__ void rmsnorm_forward_kernel(Out* y, float* rstd, const In* x, const W* w, int n, float eps) {
    const In* xr = x + (size_t)blockIdx.x * n;
    Out* yr = y + (size_t)blockIdx.x * n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += mul_rn(as_float(xr[i]), as_float(xr[i]));
    ss = block_reduce(ss, SumOp());
    const float s = 1.0f / sqrtf(ss / (float)n + eps);
    if (threadIdx.x == 0) rstd[blockIdx.x] = s;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = as_float(xr[i]) * s, wi = as_float(w[i]);
        store_float(yr + i, is_bf16<Out> ? round_bf16(wi * round_bf16(v)) : wi * v);
    }
}

// One block per row: dx [rows][n] (+)= the row's input gradient (before any rounding of the sum).
template <class In, class W, class Dx>
__global__ void rmsnorm_backward_dx_kernel(Dx* dx, const In* dy, const In* x, const W* w, const float* rstd, int n,
                                           bool accumulate) {
    const size_t row = (size_t)blockIdx.x * n;
    float dot = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        dot += mul_rn(mul_rn(as_float(w[i]), as_float(dy[row + i])), as_float(x[row + i]));
    dot = block_reduce(dot, SumOp());
    const float s = rstd[blockIdx.x], c = dot * s * s * s / (float)n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float g = mul_rn(mul_rn(s, as_float(w[i])), as_float(dy[row + i])) - mul_rn(as_float(x[row + i]), c);
        store_float(dx + row + i, accumulate ? as_float(dx[row + i]) + g : g);
    }
}

// dw's term: dy[r][c] * x[r][c] * rstd[r], the CPU's product order.
template <class In>
struct RmsnormWeightGradTerm {
    const In* dy;
    const In* x;
    const float* rstd;
    int n;
    __device__ float operator()(long r, int c) const {
        return mul_rn(mul_rn(as_float(dy[(size_t)r * n + c]), as_float(x[(size_t)r * n + c])), rstd[r]);
    }
};

inline void check_rmsnorm_shape(const char* who, long rows, int n) {
    if (rows < 0 || rows > INT_MAX) fail("%s: row count %ld outside [0, 2^31)", who, rows);
    if (n <= 0) fail("%s: row length n = %d must be positive", who, n);
}

// y [rows][n] = RMSNorm(x [rows][n]) with weight w [n]; rstd [rows] kept for the backward pass.
template <class In, class W, class Out>
void rmsnorm_forward(Out* y, float* rstd, const In* x, const W* w, long rows, int n, float eps, cudaStream_t stream) {
    check_rmsnorm_shape("rmsnorm_forward", rows, n);
    if (!(eps > 0.0f)) fail("rmsnorm_forward: eps = %g must be positive", (double)eps);
    if (rows == 0) return;
    LAUNCH_KERNEL((rmsnorm_forward_kernel<In, W, Out>), dim3((unsigned)rows), norm_threads(n), 0, stream, y, rstd, x,
                  w, n, eps);
}

// FP32 scratch rmsnorm_backward needs for rows x n.
inline long rmsnorm_backward_scratch_floats(long rows, int n) { return column_sum_scratch_floats(rows, n); }

// dx [rows][n] (+)= dL/dx, dw [n] += dL/dw from dy [rows][n], the forward's x, w and rstd.
template <class In, class W, class Dx>
void rmsnorm_backward(Dx* dx, float* dw, const In* dy, const In* x, const W* w, const float* rstd, long rows, int n,
                      bool accumulate_dx, float* scratch, long scratch_floats, cudaStream_t stream) {
    check_rmsnorm_shape("rmsnorm_backward", rows, n);
    const char* dw_who = "rmsnorm_backward (weight gradient)";
    check_column_sum(dw_who, rows, n, scratch_floats);  // before anything runs
    if (rows == 0) return;
    LAUNCH_KERNEL((rmsnorm_backward_dx_kernel<In, W, Dx>), dim3((unsigned)rows), norm_threads(n), 0, stream, dx, dy,
                  x, w, rstd, n, accumulate_dx);
    column_sum_add(dw_who, dw, RmsnormWeightGradTerm<In>{dy, x, rstd, n}, rows, n, scratch,
                   scratch_floats, stream);
}

}  // namespace fp8rl

#endif  // FP8RL_CUDA_RMSNORM_CUH
