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
#include "cuda/kernels/fp8_rows.cuh"
#include "fp8_gemm.cuh"
#include "rl/numerics/fast_exp.h"
#include "rl/numerics/hostdevice.h"

#include <algorithm>
#include <climits>

namespace fp8rl {

inline constexpr int kSwigluThreads = 256;

// a = silu(g) * u at one element, rounded to BF16 when bf16 (the stored activation's rounding).
__device__ __forceinline__ float swiglu_value(float g, float u, bool bf16) {
    const float v = g / __fadd_rn(1.0f, fast_exp(-g)) * u;
    return bf16 ? round_bf16(v) : v;
}

// Over the fused [gate|up] projection's output gu [rows][2I] (row t: g = gu[t][0, I), u = gu[t][I, 2I)).
// Block (r, j) computes the 1x128 groups 16 j .. 16 j + 15 of row r of a [rows][I], 8 values a lane
// (cuda/kernels/fp8_rows.cuh's layout): a to `a` when given, and with q the down projection's FP8 operand of
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
    for (int e = 0; e < 8; e++) v[e] = swiglu_value(g[e], u[e], is_bf16<Out>);  // zeros past count stay 0
    if (a && c < I) store8(a + (size_t)r * I + c, min(8, I - c), v);  // zeros in padding rows
    if (q) quantize_group8(v, r, kb, I, q);
}

// The gradients of a = silu(g) * u at one element.
__device__ __forceinline__ void swiglu_grad(float da, float g, float u, float* dg, float* du) {
    const float sig = 1.0f / __fadd_rn(1.0f, fast_exp(-g));
    *dg = da * u * sig * (1.0f + mul_rn(g, 1.0f - sig));
    *du = da * g * sig;
}

// dgu [rows][2I] (laid out as gu) from da [rows][I]: a thread per 8 consecutive features of a row
// (16-byte loads of da, g and u, 16-byte stores of dg and du when I is a multiple of 8).
template <class In, class Out>
__global__ void __launch_bounds__(kSwigluThreads)
    swiglu_backward_kernel(Out* dgu, const In* da, const In* gu, long rows, int I) {
    const int groups = (I + 7) / 8;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < rows * groups; i += (long)gridDim.x * blockDim.x) {
        const long r = i / groups;
        const int c = (int)(i % groups) * 8, count = min(8, I - c);
        const size_t g_at = (size_t)r * 2 * I + c, u_at = g_at + I;
        float d[8], g[8], u[8], dg[8], du[8];
        load8(da + (size_t)r * I + c, count, d);
        load8(gu + g_at, count, g);
        load8(gu + u_at, count, u);
        for (int e = 0; e < 8; e++) swiglu_grad(d[e], g[e], u[e], &dg[e], &du[e]);
        store8(dgu + g_at, count, dg);
        store8(dgu + u_at, count, du);
    }
}

// In fp8 training the forward's a [padded][I] goes to the GEMMs only: fp8_gemm.cuh's tile quantizer
// computes each tile of it here, rounded to BF16 as the bf16 kernel stores it, and writes the down
// fprop's rowwise operand and the down wgrad's transposed one (Fp8Transposed, kept for the backward)
// from the same tile, with no BF16 a between. Rows from `valid` are zeros.
struct SwigluTile {
    const __nv_bfloat16* gu;
    int I, valid;
    __device__ void stage(int rows, int cols, int r0, int c0, float* tile) const {
        stage_computed_tile(rows, cols, valid, r0, c0, tile, [&](int r, int c, int count, float out[8]) {
            float g[8], u[8];
            load8(gu + (size_t)r * 2 * I + c, count, g);
            load8(gu + (size_t)r * 2 * I + I + c, count, u);
            for (int e = 0; e < count; e++) out[e] = swiglu_value(g[e], u[e], true);
        });
    }
};

// In fp8, the backward's d[gate|up] [padded][2I] goes to the GEMMs only: the tile quantizer computes
// each tile of it here, rounded to BF16 as the bf16 kernel stores it, and writes its FP8 operands
// (rowwise and transposed) without a BF16 tensor between. A thread stages 8 columns (I is a multiple
// of 16 for FP8, so 8 never straddle g and u); rows from `valid` are zeros.
struct SwigluGradTile {
    const __nv_bfloat16 *da, *gu;
    int I, valid;
    __device__ void stage(int rows, int cols, int r0, int c0, float* tile) const {
        stage_computed_tile(rows, cols, valid, r0, c0, tile, [&](int r, int c, int count, float out[8]) {
            const int j = c < I ? c : c - I;
            float d[8], g[8], u[8];
            load8(da + (size_t)r * I + j, count, d);
            load8(gu + (size_t)r * 2 * I + j, count, g);
            load8(gu + (size_t)r * 2 * I + I + j, count, u);
            for (int e = 0; e < count; e++) {
                float dg, du;
                swiglu_grad(d[e], g[e], u[e], &dg, &du);
                out[e] = round_bf16(c < I ? dg : du);
            }
        });
    }
};

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

// A training forward's a = SwiGLU(gu [rows][2I]) (rows from `rows` to padded_rows: zeros) as its two
// FP8 operands, 1x128 blocks only: the rowwise `q` (q.rows = padded_rows) for the down fprop and the
// transposed `a_t` for the down wgrad (fp8_rows.cuh's Fp8Transposed). I: a multiple of 16.
inline void swiglu_forward_fp8(const __nv_bfloat16* gu, long rows, long padded_rows, int I, const Fp8RowsOut& q,
                               const Fp8Transposed& a_t, cudaStream_t stream) {
    if (rows < 0 || rows > padded_rows || padded_rows > INT_MAX || I <= 0 || I % 16)
        fail("swiglu_forward_fp8: %ld of %ld rows of %d features (FP8 needs a multiple of 16)", rows, padded_rows, I);
    if (!q || !a_t) fail("swiglu_forward_fp8: needs both FP8 targets, the rowwise and the transposed");
    check_fp8_rows_out("swiglu_forward_fp8", rows, I, q);
    if (q.rows != padded_rows) fail("swiglu_forward_fp8: an FP8 operand of %d rows for %ld padded rows", q.rows, padded_rows);
    fp8_quantize_tiles_gpu("swiglu_forward_fp8", SwigluTile{gu, I, (int)rows}, (int)padded_rows, I, q.pow2, q.codes,
                           q.scale_inv, a_t.codes, a_t.scale_inv, stream);
}

// d[gate|up]'s FP8 operands for the gate|up GEMMs' backward, from da [rows][I] and gu (rows from
// `rows` to padded_rows: zeros): codes [padded][2I] + scale_inv 1x128 along 2I, codes_t [2I][padded]
// + scale_inv_t 1x128 along the rows (block scaling), or one scale per row and per column (row), or
// one (tensor: amax_scratch, fp8_gemm.cuh's fp8_amax_words, holds the amax pass's result).
inline void swiglu_backward_fp8(const __nv_bfloat16* da, const __nv_bfloat16* gu, long rows, long padded_rows, int I,
                                bool pow2, uint8_t* codes, float* scale_inv, uint8_t* codes_t, float* scale_inv_t,
                                cudaStream_t stream, Fp8Scaling scaling = Fp8Scaling::Block,
                                uint32_t* amax_scratch = nullptr) {
    if (rows < 0 || rows > padded_rows || padded_rows > INT_MAX || I <= 0 || I % 16)
        fail("swiglu_backward_fp8: %ld of %ld rows of %d features (FP8 needs a multiple of 16)", rows, padded_rows, I);
    fp8_quantize_tiles_gpu("swiglu_backward_fp8", SwigluGradTile{da, gu, I, (int)rows}, (int)padded_rows, 2 * I, pow2,
                           codes, scale_inv, codes_t, scale_inv_t, stream, scaling, amax_scratch);
}

template <class In, class Out>
void swiglu_backward(Out* dgu, const In* da, const In* gu, long rows, int I, cudaStream_t stream) {
    if (rows < 0 || I <= 0) fail("swiglu_backward: %ld rows of %d features", rows, I);
    if (rows == 0) return;
    LAUNCH_KERNEL((swiglu_backward_kernel<In, Out>), elementwise_blocks(rows * ((I + 7) / 8), kSwigluThreads),
                  kSwigluThreads, 0, stream, dgu, da, gu, rows, I);
}

}  // namespace fp8rl

#endif  // FP8RL_CUDA_SWIGLU_CUH
