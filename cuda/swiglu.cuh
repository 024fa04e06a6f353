// swiglu.cuh: the SwiGLU activation (spec-model.md §2.6), forward and backward, as
// cpu/model_layers.h's swiglu_forward / swiglu_backward, bit for bit: the same operations in the
// same order, exp from rl/numerics/fast_exp.h (the function the CPU calls), products unfused (mul_rn) and the
// 1 + exp(-g) addition unfused (__fadd_rn: nvcc may fuse fast_exp's final product y * 2^n into it,
// which differs when that product is subnormal).
//   a = silu(g) * u, silu(z) = z / (1 + exp(-z));
//   sig = sigmoid(g): dg = da * u * sig * (1 + g * (1 - sig)), du = da * g * sig.
// A BF16 output rounds once, where the CPU rounds (its bf16 flag; round_bf16_if after the backward).
#ifndef FP8RL_CUDA_SWIGLU_CUH
#define FP8RL_CUDA_SWIGLU_CUH
#include "cuda/element.cuh"
#include "cuda/fp8_rows.cuh"
#include "rl/numerics/fast_exp.h"
#include "rl/numerics/hostdevice.h"

#include <algorithm>
#include <climits>

namespace fp8rl {

inline constexpr int kSwigluThreads = 256;

// Over the fused [gate|up] projection's output gu [rows][2I] (row t: g = gu[t][0, I), u = gu[t][I, 2I)).
// Block (r, j) computes the 1x128 groups 16 j .. 16 j + 15 of row r of a [rows][I], 8 values a lane
// (cuda/fp8_rows.cuh's layout): a to `a` when given, and with q the down projection's FP8 operand of
// a, from the values as stored. Rows from `valid` to the grid's (a GEMM's padding rows) get zeros in
// a and zero codes in q, so the buffers need no zeroing before.
template <class In, class Out>
__global__ void __launch_bounds__(kSwigluThreads)
    swiglu_forward_kernel(Out* a, const In* gu, int I, Fp8RowsOut q, int valid) {
    const int r = blockIdx.x, pair = blockIdx.y * (kSwigluThreads / 32) + threadIdx.x / 32;
    if (pair >= group_pairs(I)) return;  // the whole warp
    const int kb = pair * 2 + (threadIdx.x % 32) / kGroupLanes, c = kb * FP8_BLOCK + threadIdx.x % kGroupLanes * 8;
    const int count = r < valid && c < I ? min(8, I - c) : 0;
    float g[8], u[8], v[8];
    load8(gu + (size_t)r * 2 * I + c, count, g);
    load8(gu + (size_t)r * 2 * I + I + c, count, u);
    for (int e = 0; e < 8; e++) {
        v[e] = g[e] / __fadd_rn(1.0f, fast_exp(-g[e])) * u[e];  // zeros past count stay 0
        if (is_bf16<Out>) v[e] = round_bf16(v[e]);
    }
    if (a && c < I) store8(a + (size_t)r * I + c, min(8, I - c), v);  // zeros in padding rows
    if (q) quantize_group8(v, r, kb, I, q);
}

// dgu [rows][2I] (laid out as gu) from da [rows][I].
template <class In, class Out>
__global__ void swiglu_backward_kernel(Out* dgu, const In* da, const In* gu, long rows, int I) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < rows * I; i += (long)gridDim.x * blockDim.x) {
        const size_t g_at = (size_t)(i / I) * 2 * I + i % I, u_at = g_at + I;
        const float gi = as_float(gu[g_at]), ui = as_float(gu[u_at]), dai = as_float(da[i]);
        const float sig = 1.0f / __fadd_rn(1.0f, fast_exp(-gi));
        store_float(dgu + g_at, dai * ui * sig * (1.0f + mul_rn(gi, 1.0f - sig)));
        store_float(dgu + u_at, dai * gi * sig);
    }
}

// a [rows][I] = SwiGLU of gu [rows][2I]; with q also a's FP8 operand (a may then be null). Rows
// from `rows` to padded_rows (q.rows with q): zeros.
template <class In, class Out>
void swiglu_forward(Out* a, const In* gu, long rows, int I, cudaStream_t stream, const Fp8RowsOut& q = {},
                    long padded_rows = 0) {
    if (rows < 0 || I <= 0) fail("swiglu_forward: %ld rows of %d features", rows, I);
    const long blocks = std::max(rows, padded_rows);
    if (q) check_fp8_rows_out("swiglu_forward", rows, I, q);
    if (q && q.rows != blocks) fail("swiglu_forward: an FP8 operand of %d rows for %ld padded rows", q.rows, blocks);
    if (blocks == 0) return;
    if (blocks > INT_MAX) fail("swiglu_forward: %ld rows is too many for one launch", blocks);
    const dim3 grid((unsigned)blocks, (unsigned)((group_pairs(I) + kSwigluThreads / 32 - 1) / (kSwigluThreads / 32)));
    LAUNCH_KERNEL((swiglu_forward_kernel<In, Out>), grid, kSwigluThreads, 0, stream, a, gu, I, q, (int)rows);
}

template <class In, class Out>
void swiglu_backward(Out* dgu, const In* da, const In* gu, long rows, int I, cudaStream_t stream) {
    if (rows < 0 || I <= 0) fail("swiglu_backward: %ld rows of %d features", rows, I);
    if (rows == 0) return;
    LAUNCH_KERNEL((swiglu_backward_kernel<In, Out>), elementwise_blocks(rows * I, kSwigluThreads), kSwigluThreads, 0,
                  stream, dgu, da, gu, rows, I);
}

}  // namespace fp8rl

#endif  // FP8RL_CUDA_SWIGLU_CUH
