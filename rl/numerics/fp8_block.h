// fp8_block.h: E4M3 quantization at the three scaling granularities of --fp8_scaling (spec-fp8.md
// §4-§7), with outputs laid out exactly as cuBLASLt's scale modes read them. A row-major [rows][cols]
// tensor whose cols are the GEMM's reduction dim K gets one scale per group:
//   block   1x128 groups for activations and gradients (VEC128_32F layout) and 128x128 tiles for
//           weights (BLK128x128_32F layout): the DeepSeek-V3 / InfiR2 recipe, the default;
//   row     one scale per row over all of K: a token row of X or dY, an output channel of W, an
//           input channel of W^T (cuBLASLt's OUTER_VEC_32F: a vector of `rows` scales);
//   tensor  one scale for the whole tensor from its current amax (SCALAR_32F).
// A group's scale is E4M3_MAX / amax (optionally rounded down to a power of two); the codes are
// float_to_e4m3(x * scale) and what is stored, and what the GEMM multiplies by, is scale_inv =
// 1 / scale. The scalar pieces (scale rule, index formulas) are FP8RL_HD so the CUDA quantize
// kernels (fp8_gemm.cuh) compute the very same bytes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include <string>

#include "rl/common.h"
#include "rl/numerics/fp8.h"

namespace fp8rl {

constexpr int FP8_BLOCK = 128;

// --fp8_scaling: how finely the FP8 GEMMs' operands are scaled (above).
enum class Fp8Scaling { Block, Row, Tensor };

inline const char* fp8_scaling_name(Fp8Scaling s) {
    return s == Fp8Scaling::Block ? "block" : s == Fp8Scaling::Row ? "row" : "tensor";
}

// `what` names the flag or field in the error.
inline Fp8Scaling parse_fp8_scaling(const std::string& s, const char* what) {
    if (s == "block") return Fp8Scaling::Block;
    if (s == "row") return Fp8Scaling::Row;
    if (s == "tensor") return Fp8Scaling::Tensor;
    fail("%s %s: must be one of block, row, tensor", what, s.c_str());
}

// Where a quantized tensor's scales are and what they cover.
enum class Fp8Layout {
    Vec128,      // [ceil(cols/128)][rows]: row r, column block kb at vec128_scale_index
    Blk128x128,  // [ceil(rows/128)][round_up4(ceil(cols/128))]: blk128_scale_index
    Row,         // [rows]: one per row over all cols
    Tensor,      // [1]
};

// The layout of an activation or gradient operand (a 1x128-group or coarser tensor along K).
FP8RL_HD Fp8Layout fp8_rows_layout(Fp8Scaling s) {
    return s == Fp8Scaling::Block ? Fp8Layout::Vec128 : s == Fp8Scaling::Row ? Fp8Layout::Row : Fp8Layout::Tensor;
}

FP8RL_HD int fp8_num_blocks(int n) { return (n + FP8_BLOCK - 1) / FP8_BLOCK; }
FP8RL_HD int round_up4(int n) { return (n + 3) & ~3; }

FP8RL_HD float abs_bits(float x) { return bits_float(float_bits(x) & 0x7FFFFFFFu); }

// Running amax that ignores NaN (as CUDA's fmaxf does), so a NaN element cannot poison its block's
// scale; the NaN itself still encodes to the E4M3 NaN code.
FP8RL_HD float amax_update(float amax, float x) {
    float a = abs_bits(x);
    return a > amax ? a : amax;
}

// Quantization multiplier of a block (TransformerEngine's compute_scale_from_amax): amax 0, Inf
// or NaN gives 1 (never a NaN or Inf scale); a tiny amax whose 448 / amax overflows gives FLT_MAX.
// pow2 keeps only sign and exponent, rounding the scale down so |x * scale| <= 448 still holds.
FP8RL_HD float fp8_scale_from_amax(float amax, bool pow2) {
    float scale = 1.0f;
    if (amax > 0.0f && float_bits(amax) < 0x7F800000u) {
        scale = E4M3_MAX / amax;
        if (float_bits(scale) == 0x7F800000u) scale = bits_float(0x7F7FFFFFu);  // FLT_MAX
    }
    return pow2 ? bits_float(float_bits(scale) & 0xFF800000u) : scale;
}

// VEC128_32F: scale of (row r, column block kb) of a [rows][cols] operand, rows contiguous.
FP8RL_HD size_t vec128_scale_index(int r, int kb, int rows) { return (size_t)kb * rows + r; }
FP8RL_HD size_t vec128_scale_count(int rows, int cols) { return (size_t)fp8_num_blocks(cols) * rows; }

// BLK128x128_32F: scale of (row block rb, column block kb); column blocks contiguous, each row of
// the grid padded to a multiple of 4 entries (the padding is written as 0).
FP8RL_HD size_t blk128_scale_index(int rb, int kb, int cols) {
    return (size_t)rb * round_up4(fp8_num_blocks(cols)) + kb;
}
FP8RL_HD size_t blk128_scale_count(int rows, int cols) {
    return (size_t)fp8_num_blocks(rows) * round_up4(fp8_num_blocks(cols));
}

// The layout of a projection weight's FP8 copies at a granularity: 128x128 blocks, one scale per
// output channel (W) and input channel (W^T), or one scale.
FP8RL_HD Fp8Layout fp8_weight_layout(Fp8Scaling s) { return s == Fp8Scaling::Block ? Fp8Layout::Blk128x128 : fp8_rows_layout(s); }

// The uint32 words of amax scratch the GPU's two-pass (row or tensor) quantization of a [rows][cols]
// tensor and its transpose needs (fp8_gemm.cuh's amax_tiles_kernel): one per row and column, or one.
FP8RL_HD size_t fp8_amax_words(Fp8Scaling scaling, int rows, int cols) {
    return scaling == Fp8Scaling::Block ? 0 : scaling == Fp8Scaling::Row ? (size_t)rows + cols : 1;
}

// Floats of the scale tensor of a [rows][cols] tensor in `layout`.
FP8RL_HD size_t fp8_scale_count(Fp8Layout layout, int rows, int cols) {
    return layout == Fp8Layout::Vec128       ? vec128_scale_count(rows, cols)
           : layout == Fp8Layout::Blk128x128 ? blk128_scale_count(rows, cols)
           : layout == Fp8Layout::Row        ? (size_t)rows
                                             : 1;
}

// Columns of K one scale covers: 128 for the block layouts, all of them for row and tensor.
FP8RL_HD int fp8_k_group(Fp8Layout layout, int cols) {
    return layout == Fp8Layout::Vec128 || layout == Fp8Layout::Blk128x128 ? FP8_BLOCK : cols;
}

// E4M3 tensor [rows][cols] with its scales in `layout`.
struct Fp8Tensor {
    int rows = 0, cols = 0;
    Fp8Layout layout = Fp8Layout::Vec128;
    std::vector<uint8_t> data;     // [rows][cols] E4M3 codes
    std::vector<float> scale_inv;  // fp8_scale_count(layout, rows, cols)
    // The multiplier of row r's K group kb (of fp8_k_group columns).
    float scale_inv_at(int r, int kb) const {
        switch (layout) {
            case Fp8Layout::Vec128: return scale_inv[vec128_scale_index(r, kb, rows)];
            case Fp8Layout::Blk128x128: return scale_inv[blk128_scale_index(r / FP8_BLOCK, kb, cols)];
            case Fp8Layout::Row: return scale_inv[r];
            default: return scale_inv[0];
        }
    }
};

inline void check_fp8_shape(const char* what, int rows, int cols) {
    if (rows <= 0 || cols <= 0) fail("%s: shape [%d][%d] must be positive", what, rows, cols);
}

// Groups along the rows of x [rows][cols] (activations X for fprop, dY for dgrad; a weight's rows in
// row and tensor scaling): 1x128 (block), whole rows (row) or the whole tensor (tensor).
inline Fp8Tensor fp8_quantize_rowwise(const float* x, int rows, int cols, bool pow2,
                                      Fp8Scaling scaling = Fp8Scaling::Block) {
    check_fp8_shape("fp8_quantize_rowwise", rows, cols);
    Fp8Tensor q;
    q.rows = rows, q.cols = cols, q.layout = fp8_rows_layout(scaling);
    q.data.resize((size_t)rows * cols);
    q.scale_inv.resize(fp8_scale_count(q.layout, rows, cols));
    const int group = fp8_k_group(q.layout, cols), groups = (cols + group - 1) / group;
    float tensor_scale = 0.0f;
    if (scaling == Fp8Scaling::Tensor) {
        float amax = 0.0f;
        for (size_t i = 0; i < (size_t)rows * cols; i++) amax = amax_update(amax, x[i]);
        tensor_scale = fp8_scale_from_amax(amax, pow2);
        q.scale_inv[0] = 1.0f / tensor_scale;
    }
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++)
        for (int kb = 0; kb < groups; kb++) {
            const float* in = x + (size_t)r * cols + (size_t)kb * group;
            uint8_t* out = q.data.data() + (size_t)r * cols + (size_t)kb * group;
            int width = cols - kb * group < group ? cols - kb * group : group;
            float scale = tensor_scale;
            if (scaling != Fp8Scaling::Tensor) {
                float amax = 0.0f;
                for (int c = 0; c < width; c++) amax = amax_update(amax, in[c]);
                scale = fp8_scale_from_amax(amax, pow2);
                q.scale_inv[scaling == Fp8Scaling::Row ? (size_t)r : vec128_scale_index(r, kb, rows)] = 1.0f / scale;
            }
            for (int c = 0; c < width; c++) out[c] = float_to_e4m3(in[c] * scale);
        }
    return q;
}

// x [rows][cols] -> x^T [cols][rows] quantized along the original rows (tokens): the wgrad operands
// X^T and dY^T, and in row scaling a weight's dgrad copy W^T (one scale per input channel), quantized
// from the high-precision source (a 1x128- or row-quantized tensor cannot be transposed in place).
inline Fp8Tensor fp8_quantize_rowwise_transposed(const float* x, int rows, int cols, bool pow2,
                                                 Fp8Scaling scaling = Fp8Scaling::Block) {
    check_fp8_shape("fp8_quantize_rowwise_transposed", rows, cols);
    std::vector<float> xt((size_t)rows * cols);  // [cols][rows]
#pragma omp parallel for schedule(static)
    for (int c = 0; c < cols; c++)
        for (int r = 0; r < rows; r++) xt[(size_t)c * rows + r] = x[(size_t)r * cols + c];
    return fp8_quantize_rowwise(xt.data(), cols, rows, pow2, scaling);
}

// 128x128 blocks of x [rows][cols] (weights W [N][K]).
inline Fp8Tensor fp8_quantize_blockwise(const float* x, int rows, int cols, bool pow2) {
    check_fp8_shape("fp8_quantize_blockwise", rows, cols);
    Fp8Tensor q;
    q.rows = rows, q.cols = cols, q.layout = Fp8Layout::Blk128x128;
    q.data.resize((size_t)rows * cols);
    q.scale_inv.assign(blk128_scale_count(rows, cols), 0.0f);
    int row_blocks = fp8_num_blocks(rows), col_blocks = fp8_num_blocks(cols);
#pragma omp parallel for collapse(2) schedule(static)
    for (int rb = 0; rb < row_blocks; rb++)
        for (int kb = 0; kb < col_blocks; kb++) {
            int r0 = rb * FP8_BLOCK, r1 = r0 + FP8_BLOCK < rows ? r0 + FP8_BLOCK : rows;
            int c0 = kb * FP8_BLOCK, c1 = c0 + FP8_BLOCK < cols ? c0 + FP8_BLOCK : cols;
            float amax = 0.0f;
            for (int r = r0; r < r1; r++)
                for (int c = c0; c < c1; c++) amax = amax_update(amax, x[(size_t)r * cols + c]);
            float scale = fp8_scale_from_amax(amax, pow2);
            for (int r = r0; r < r1; r++)
                for (int c = c0; c < c1; c++) q.data[(size_t)r * cols + c] = float_to_e4m3(x[(size_t)r * cols + c] * scale);
            q.scale_inv[blk128_scale_index(rb, kb, cols)] = 1.0f / scale;
        }
    return q;
}

// The dgrad copy of a 128x128-quantized weight: transposed bytes and transposed scale grid, which is
// exact because the blocks are square.
inline Fp8Tensor fp8_transpose(const Fp8Tensor& w) {
    if (w.layout != Fp8Layout::Blk128x128) fail("fp8_transpose: only a 128x128-block tensor transposes exactly");
    Fp8Tensor t;
    t.rows = w.cols, t.cols = w.rows, t.layout = Fp8Layout::Blk128x128;
    t.data.resize(w.data.size());
    t.scale_inv.assign(blk128_scale_count(t.rows, t.cols), 0.0f);
#pragma omp parallel for schedule(static)
    for (int r = 0; r < t.rows; r++)
        for (int c = 0; c < t.cols; c++) t.data[(size_t)r * t.cols + c] = w.data[(size_t)c * w.cols + r];
    for (int rb = 0; rb < fp8_num_blocks(t.rows); rb++)
        for (int kb = 0; kb < fp8_num_blocks(t.cols); kb++)
            t.scale_inv[blk128_scale_index(rb, kb, t.cols)] = w.scale_inv[blk128_scale_index(kb, rb, w.cols)];
    return t;
}

}  // namespace fp8rl
