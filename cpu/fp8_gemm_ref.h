// fp8_gemm_ref.h: the FP8 scaled GEMMs of a linear layer, emulated on the CPU. This is the math
// cuBLASLt's scale modes perform (spec-fp8.md §6.3; cuBLAS docs, "Scaling"):
//   block (VEC128 / BLK128x128):
//     D[i][j] = sum over 128-wide K blocks kb of  sA(i,kb) * sB(j,kb) * sum_{k in kb} A[i][k] * B[j][k]
//   row (OUTER_VEC) and tensor (SCALAR): one group spanning all of K,
//     D[i][j] = sA(i) * sB(j) * sum_k A[i][k] * B[j][k]
// with A, B the decoded E4M3 values (exact in FP32; each product is exact too), the inner sums in
// FP32 (cpu/gemm.h's gemm_nt, one call per K group), and the scaled partial sums added in FP32 group
// by group, each with one fused multiply-add: total = fma(sA sB, partial, total). cuBLASLt does not
// document how it promotes a block's sum; DeepGEMM, the recipe's reference kernel (DeepSeek-V3),
// promotes with one FFMA a value (`final_accum += scale * accum`, nvcc's default contraction), and
// so does the project's own kernel (cuda/kernels/fp8_block_gemm.cuh). One group (row and tensor
// scaling): fma(s, partial, 0) is s * partial rounded once, as before. Every operand is K-contiguous, as cuBLASLt's TN layout requires, so one NT kernel serves
// fprop, dgrad and wgrad. The CPU engine's "fp8" precision uses the fp8_linear_* functions below.
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

#include "rl/numerics/fp8_block.h"
#include "cpu/gemm.h"

namespace fp8rl {

// An FP8 GEMM operand as the GEMM sees it: decoded (unscaled) values and the dequantization
// multiplier of every (row, K group of the reduction dim).
struct Fp8GemmOperand {
    int rows = 0, cols = 0;        // cols: the reduction dim K
    int k_group = FP8_BLOCK;       // columns one scale covers: 128, or cols (row and tensor scaling)
    std::vector<float> values;     // [rows][cols] decoded E4M3
    std::vector<float> scale_inv;  // [rows][ceil(cols/k_group)]
};

inline Fp8GemmOperand fp8_gemm_operand(const Fp8Tensor& q) {
    Fp8GemmOperand op;
    op.rows = q.rows, op.cols = q.cols, op.k_group = fp8_k_group(q.layout, q.cols);
    op.values.resize(q.data.size());
    float decoded[256];  // all E4M3 codes
    for (int code = 0; code < 256; code++) decoded[code] = e4m3_to_float((uint8_t)code);
    for (size_t i = 0; i < q.data.size(); i++) op.values[i] = decoded[q.data[i]];
    const int blocks = (q.cols + op.k_group - 1) / op.k_group;
    op.scale_inv.resize((size_t)q.rows * blocks);
    for (int r = 0; r < q.rows; r++)
        for (int kb = 0; kb < blocks; kb++) op.scale_inv[(size_t)r * blocks + kb] = q.scale_inv_at(r, kb);
    return op;
}

// out [a.rows][b.rows] (+)= the scaled product of a [M][K] and b [N][K]^T. The output is cut into
// tiles of 64 x 256, one OpenMP task each, so a tile's per-group and running sums stay in cache
// across the K groups (gemm_nt, called inside the parallel region, runs on the task's thread). Each
// output element is reduced by one task in a fixed order: results do not depend on the thread count.
inline void fp8_gemm_nt_ref(const Fp8GemmOperand& a, const Fp8GemmOperand& b, float* out, bool accumulate) {
    if (a.cols != b.cols)
        fail("fp8_gemm_nt_ref: reduction dims differ (A [%d][%d], B [%d][%d])", a.rows, a.cols, b.rows, b.cols);
    if (a.k_group != b.k_group)  // cuBLASLt pairs block modes with block modes, outer vectors and scalars alike
        fail("fp8_gemm_nt_ref: the operands' K groups differ (%d and %d): mixed scaling granularities", a.k_group,
             b.k_group);
    const int M = a.rows, N = b.rows, K = a.cols, G = a.k_group, blocks = (K + G - 1) / G;
    const int TILE_M = 64, TILE_N = 256;
    const int tiles_m = (M + TILE_M - 1) / TILE_M, tiles_n = (N + TILE_N - 1) / TILE_N;
#pragma omp parallel for schedule(dynamic)
    for (int task = 0; task < tiles_m * tiles_n; task++) {
        const int i0 = task / tiles_n * TILE_M, j0 = task % tiles_n * TILE_N;
        const int rows = std::min(TILE_M, M - i0), cols = std::min(TILE_N, N - j0);
        std::vector<float> partial((size_t)rows * cols);      // [rows][cols] one K block's unscaled sums
        std::vector<float> total((size_t)rows * cols, 0.0f);  // [rows][cols] sum of the scaled block sums
        for (int kb = 0; kb < blocks; kb++) {
            const int k0 = kb * G, width = std::min(G, K - k0);
            gemm_nt(rows, cols, width, a.values.data() + (size_t)i0 * K + k0, K, b.values.data() + (size_t)j0 * K + k0,
                    K, partial.data(), cols, false);
            for (int i = 0; i < rows; i++) {
                const float sa = a.scale_inv[(size_t)(i0 + i) * blocks + kb];
                for (int j = 0; j < cols; j++)
                    total[(size_t)i * cols + j] = std::fma((sa * b.scale_inv[(size_t)(j0 + j) * blocks + kb]),
                                                           partial[(size_t)i * cols + j], total[(size_t)i * cols + j]);
            }
        }
        for (int i = 0; i < rows; i++)
            for (int j = 0; j < cols; j++) {
                float& o = out[(size_t)(i0 + i) * N + j0 + j];
                o = accumulate ? o + total[(size_t)i * cols + j] : total[(size_t)i * cols + j];
            }
    }
}

// A linear layer's weight W [N][K] in FP8, quantized once per optimizer update, plus the transposed
// copy dgrad reads: block, 128x128 tiles (the copy: the same codes and grid, transposed); row, one
// scale per output channel (W) and per input channel (W^T, quantized again from the master: its
// groups are W's columns); tensor, one scale (the copy: the same codes, transposed).
struct Fp8Weight {
    Fp8Tensor w;   // [N][K]  fprop operand
    Fp8Tensor wt;  // [K][N]  dgrad operand
    bool pow2_scales = false;
    Fp8Scaling scaling = Fp8Scaling::Block;
};

inline Fp8Weight fp8_quantize_weight(const float* w, int N, int K, bool pow2_scales,
                                     Fp8Scaling scaling = Fp8Scaling::Block) {
    Fp8Weight q;
    if (scaling == Fp8Scaling::Block) {
        q.w = fp8_quantize_blockwise(w, N, K, pow2_scales);
        q.wt = fp8_transpose(q.w);
    } else {
        q.w = fp8_quantize_rowwise(w, N, K, pow2_scales, scaling);
        q.wt = fp8_quantize_rowwise_transposed(w, N, K, pow2_scales, scaling);
    }
    q.pow2_scales = pow2_scales;
    q.scaling = scaling;
    return q;
}

// Y [T][N] (+)= X [T][K] . W^T, X quantized along K at the weight's granularity.
inline void fp8_linear_fprop(const float* x, int T, const Fp8Weight& w, float* y, bool accumulate) {
    fp8_gemm_nt_ref(fp8_gemm_operand(fp8_quantize_rowwise(x, T, w.w.cols, w.pow2_scales, w.scaling)),
                    fp8_gemm_operand(w.w), y, accumulate);
}

// dX [T][K] (+)= dY [T][N] . W, dY quantized along N.
inline void fp8_linear_dgrad(const float* dy, int T, const Fp8Weight& w, float* dx, bool accumulate) {
    fp8_gemm_nt_ref(fp8_gemm_operand(fp8_quantize_rowwise(dy, T, w.w.rows, w.pow2_scales, w.scaling)),
                    fp8_gemm_operand(w.wt), dx, accumulate);
}

// dW [N][K] (+)= dY^T . X, with dY [T][N] and X [T][K] both quantized along tokens.
inline void fp8_linear_wgrad(const float* dy, const float* x, int T, int N, int K, bool pow2_scales, Fp8Scaling scaling,
                             float* dw, bool accumulate) {
    fp8_gemm_nt_ref(fp8_gemm_operand(fp8_quantize_rowwise_transposed(dy, T, N, pow2_scales, scaling)),
                    fp8_gemm_operand(fp8_quantize_rowwise_transposed(x, T, K, pow2_scales, scaling)), dw, accumulate);
}

}  // namespace fp8rl
