// rmsnorm.cuh: RMSNorm over rows of n values (spec-model.md §2.3), forward and backward, as
// cpu/model_layers.h's rmsnorm_forward / rmsnorm_backward:
//   y = w * (x * rstd), rstd = 1 / sqrt(mean(x^2) + eps) per row;
//   dx (+)= rstd * (w * dy) - x * rstd^3 / n * sum(w * dy * x), dw += sum over rows of dy * x * rstd.
// Also Qwen3's per-head q/k norm: q [T][H][D] is T*H rows of D with one weight vector of D.
// A BF16 output rounds as HF (and the CPU's bf16 flag): x * rstd to BF16, times w, to BF16 again.
// One block per row; the row's sum of squares and the backward's dot product are block reductions in
// a fixed order (cuda/kernels/block_reduce.cuh), the CPU engine's (rl/numerics/reduction_order.h's block_sum).
// The weight gradient is a deterministic column sum (cuda/kernels/column_sum.cuh), no atomics.
#ifndef FP8RL_CUDA_RMSNORM_CUH
#define FP8RL_CUDA_RMSNORM_CUH
#include "cuda/kernels/block_reduce.cuh"
#include "cuda/kernels/column_sum.cuh"
#include "cuda/kernels/fp8_rows.cuh"
#include "rl/numerics/bf16.h"
#include "rl/numerics/hostdevice.h"
#include "rl/numerics/reduction_order.h"

#include <algorithm>
#include <climits>

namespace fp8rl {

// One block per row. x, y [rows][n]; rstd [rows]. Fused around the norm (issue 28):
//   branch  the residual add of the sublayer before: the row is sum = x + branch rounded to BF16,
//           written to `sum` (the residual stream), as cpu/model_layers.h's residual_add;
//   q       the FP8 1x128 operand of y for the next GEMM (cuda/kernels/fp8_rows.cuh), the row staged in
//           shared memory for the groups' amax.
// Rows from `valid` to the grid's (a GEMM's padding rows) get zeros in y and zero codes in q, so the
// buffers need no zeroing before. y may be null when only the FP8 operand is read.
template <class In, class W, class Out>
__global__ void rmsnorm_forward_kernel(Out* y, float* rstd, const In* x, const In* branch, In* sum, const W* w, int n,
                                       float eps, Fp8RowsOut q, int valid) {
    DYNAMIC_SHARED(float, staged);  // [n] with q: the row's outputs
    const int r = blockIdx.x;
    const size_t row = (size_t)r * n;
    const bool real = r < valid;
    if (!real && y)
        for (int i = threadIdx.x; i < n; i += blockDim.x) store_float(y + row + i, 0.0f);
    if (real) {
        float ss = 0.0f;
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            float xi = as_float(x[row + i]);
            if (branch) {
                xi = round_bf16(xi + as_float(branch[row + i]));
                store_float(sum + row + i, xi);
            }
            ss += mul_rn(xi, xi);
        }
        ss = block_reduce(ss, SumOp());
        const float s = 1.0f / sqrtf(ss / (float)n + eps);
        if (threadIdx.x == 0) rstd[r] = s;
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const float xi = as_float(branch ? sum[row + i] : x[row + i]);  // this thread stored sum[row + i]
            const float v = xi * s, wi = as_float(w[i]);
            const float yi = is_bf16<Out> ? round_bf16(wi * round_bf16(v)) : wi * v;
            if (y) store_float(y + row + i, yi);
            if (q) staged[i] = yi;
        }
    }
    if (!q) return;
    __syncthreads();
    const int warps = blockDim.x / 32, half = (threadIdx.x % 32) / kGroupLanes, lane16 = threadIdx.x % kGroupLanes;
    for (int pair = threadIdx.x / 32; pair < group_pairs(n); pair += warps) {
        const int kb = pair * 2 + half, c = kb * FP8_BLOCK + lane16 * 8;
        float v[8];
        for (int e = 0; e < 8; e++) v[e] = real && c + e < n ? staged[c + e] : 0.0f;
        quantize_group8(v, r, kb, n, q);
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

// rows: the real rows; padded_rows (>= rows, q.rows with q): the rows written.
template <class In, class W, class Out>
void launch_rmsnorm_forward(const char* who, Out* y, float* rstd, const In* x, const In* branch, In* sum, const W* w,
                            long rows, long padded_rows, int n, float eps, const Fp8RowsOut& q, cudaStream_t stream) {
    check_rmsnorm_shape(who, rows, n);
    if (!(eps > 0.0f)) fail("%s: eps = %g must be positive", who, (double)eps);
    const long blocks = std::max(rows, padded_rows);
    if (q) check_fp8_rows_out(who, rows, n, q);
    if (q && q.rows != blocks) fail("%s: an FP8 operand of %d rows for %ld padded rows", who, q.rows, blocks);
    if (blocks == 0) return;
    if (blocks > INT_MAX) fail("%s: %ld rows is too many for one launch", who, blocks);
    const size_t smem = q ? sizeof(float) * (size_t)n : 0;
    allow_dynamic_smem(rmsnorm_forward_kernel<In, W, Out>, smem);
    LAUNCH_KERNEL((rmsnorm_forward_kernel<In, W, Out>), dim3((unsigned)blocks), norm_threads(n), smem, stream, y, rstd, x,
                  branch, sum, w, n, eps, q, (int)rows);
}

// y [rows][n] = RMSNorm(x [rows][n]) with weight w [n]; rstd [rows] kept for the backward pass;
// with q, also y's FP8 operand (y may then be null). Rows from `rows` to padded_rows: zeros.
template <class In, class W, class Out>
void rmsnorm_forward(Out* y, float* rstd, const In* x, const W* w, long rows, int n, float eps, cudaStream_t stream,
                     const Fp8RowsOut& q = {}, long padded_rows = 0) {
    launch_rmsnorm_forward<In, W, Out>("rmsnorm_forward", y, rstd, x, nullptr, nullptr, w, rows, padded_rows, n, eps, q,
                                       stream);
}

// sum = x + branch (the residual stream, BF16 rounding), then y = RMSNorm(sum) as rmsnorm_forward.
template <class In, class W, class Out>
void residual_rmsnorm_forward(Out* y, float* rstd, In* sum, const In* x, const In* branch, const W* w, long rows, int n,
                              float eps, cudaStream_t stream, const Fp8RowsOut& q = {}, long padded_rows = 0) {
    if (!branch || !sum) fail("residual_rmsnorm_forward: needs the branch and the sum's buffer");
    launch_rmsnorm_forward<In, W, Out>("residual_rmsnorm_forward", y, rstd, x, branch, sum, w, rows, padded_rows, n, eps,
                                       q, stream);
}

// FP32 scratch rmsnorm_backward needs for rows x n.
inline long rmsnorm_backward_scratch_floats(long rows, int n) { return column_sum_scratch_floats(rows, n); }

// dw [n] += dL/dw, the column sums of dy * x * rstd over the rows.
template <class In>
void rmsnorm_weight_grad(float* dw, const In* dy, const In* x, const float* rstd, long rows, int n, float* scratch,
                         long scratch_floats, cudaStream_t stream) {
    column_sum_add("rmsnorm_backward (weight gradient)", dw, RmsnormWeightGradTerm<In>{dy, x, rstd, n}, rows, n, scratch,
                   scratch_floats, stream);
}

// dx [rows][n] (+)= dL/dx, dw [n] += dL/dw from dy [rows][n], the forward's x, w and rstd.
template <class In, class W, class Dx>
void rmsnorm_backward(Dx* dx, float* dw, const In* dy, const In* x, const W* w, const float* rstd, long rows, int n,
                      bool accumulate_dx, float* scratch, long scratch_floats, cudaStream_t stream) {
    check_rmsnorm_shape("rmsnorm_backward", rows, n);
    check_column_sum("rmsnorm_backward (weight gradient)", rows, n, scratch_floats);  // before anything runs
    if (rows == 0) return;
    LAUNCH_KERNEL((rmsnorm_backward_dx_kernel<In, W, Dx>), dim3((unsigned)rows), norm_threads(n), 0, stream, dx, dy,
                  x, w, rstd, n, accumulate_dx);
    rmsnorm_weight_grad(dw, dy, x, rstd, rows, n, scratch, scratch_floats, stream);
}

}  // namespace fp8rl

#endif  // FP8RL_CUDA_RMSNORM_CUH
