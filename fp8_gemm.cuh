// fp8_gemm.cuh: FP8 quantization kernels and cuBLASLt GEMM wrappers for the GPU engine (Hopper,
// sm_90). The kernels call the shared scalar code of rl/numerics/fp8.h and rl/numerics/fp8_block.h (encoder, scale
// rule, index formulas), so their bytes equal the CPU quantizers' bit for bit; the block-scaled GEMMs
// are the ones cpu/fp8_gemm_ref.h emulates. Layouts and the fprop/dgrad/wgrad mapping: spec-fp8.md §6-§7.
//
// Every tensor is row-major. In cuBLAS's column-major terms all GEMMs here are "TN":
//   D [n][m] = B [n][k] . A [m][k]^T      (row-major view; D is m x n column-major)
// so both operands are K-contiguous. For a linear layer (T tokens, K in, N out):
//   fprop  Y  [T][N] = X [T][K] . W^T     A = W  [N][K] BLK128x128, B = X  [T][K] VEC128   (m=N, n=T, k=K)
//   dgrad  dX [T][K] = dY [T][N] . W      A = Wt [K][N] BLK128x128, B = dY [T][N] VEC128   (m=K, n=T, k=N)
//   wgrad  dW [N][K] = dY^T . X           A = Xt [K][T] VEC128,     B = dYt [N][T] VEC128  (m=K, n=N, k=T)
// Block-scaled GEMMs need m and n multiples of 4 and k a multiple of 16 (fp8rl pads the token
// count to a multiple of 128); violations are errors naming the GEMM and its shape.
// (an include guard, not #pragma once: make cuda-check compiles this header as a main file)
#ifndef FP8RL_FP8_GEMM_CUH
#define FP8RL_FP8_GEMM_CUH
#include "cuda/common.cuh"
#include "cuda/engine/device_array.cuh"
#include "cuda/element.cuh"
#include "cuda/kernels/fp8_block_gemm.cuh"
#include <cublasLt.h>  // in emulation: the same declarations, implemented by cuda/emu/emu_cublaslt.cpp

#include <algorithm>
#include <cstdint>
#include <map>
#include <tuple>

#include "rl/common.h"
#include "rl/numerics/fp8_block.h"

namespace fp8rl {

inline void cublas_check(cublasStatus_t status, const std::string& what) {
#ifdef FP8RL_EMU
    const std::string rule = status != CUBLAS_STATUS_SUCCESS ? ": " + emu::cublaslt_last_error() : "";  // the rule it broke
#else
    const std::string rule;
#endif
    if (status != CUBLAS_STATUS_SUCCESS)
        fail("cuBLASLt error in %s: %s (%d)%s", what.c_str(), cublasLtGetStatusString(status), (int)status, rule.c_str());
}

// ---------------------------------------------------------------------------------------------
// Quantization kernels. One thread block quantizes one 128x128 tile, staged in shared memory as
// FP32 (exact for BF16 and FP32 inputs; 64 KB, so dynamic shared memory above the 48 KB default);
// 256 threads = 8 warps. Each pass moves 16 bytes per access where it can:
//   load       16-byte global loads (8 BF16 or 4 FP32 values), 8 in flight per thread before the
//              first is used; a load whose address is not 16-byte aligned, or that would cross the
//              tensor's last column, falls back to one element at a time (ragged or odd shapes);
//   rowwise    a warp per tile row, a lane per 4 consecutive values: amax by warp shuffles, codes
//              by encode_e4m3x4, one 4-byte store per lane (128 contiguous bytes per warp);
//   transposed a warp per strip of 4 tile columns, lane l holding rows 4l .. 4l+3 of them: the
//              codes of 4 consecutive rows of x^T per 4-byte store.
// A store whose address is not 4-byte aligned, or that would pass the tensor's end, writes bytes.
// The tile is stored as float4 chunks with an XOR swizzle, chunk q (columns 4q .. 4q+3) of tile row
// r at chunk q ^ ((r / 4) % 8) of that row, so that the 16-byte shared-memory accesses of every pass
// hit distinct banks in each 8-lane phase: along a row (load, rowwise) the chunks differ, and down a
// strip (transposed: rows 4l + i for lanes l) the swizzle differs.

constexpr int QUANT_THREADS = 256;
constexpr int TILE_CHUNKS = FP8_BLOCK / 4;  // float4 chunks in a tile row
inline constexpr size_t TILE_BYTES = sizeof(float) * FP8_BLOCK * FP8_BLOCK;
constexpr int QUANT_LOADS_IN_FLIGHT = 8;  // 16-byte loads a thread issues before it uses the first

__device__ __forceinline__ float4* tile_chunk(float* tile, int r, int q) {
    return reinterpret_cast<float4*>(tile) + r * TILE_CHUNKS + (q ^ ((r >> 2) & 7));
}

__device__ __forceinline__ float warp_amax(float amax) {
    for (int offset = 16; offset > 0; offset /= 2) {
        float other = __shfl_xor_sync(0xFFFFFFFFu, amax, offset);
        amax = other > amax ? other : amax;  // operands are never NaN here (amax_update drops NaN)
    }
    return amax;
}

__device__ __forceinline__ float amax4(float amax, const float4& v) {
    return amax_update(amax_update(amax_update(amax_update(amax, v.x), v.y), v.z), v.w);
}

// How load_tile reads x: VEC = 16 / sizeof(In) elements at p (row r, columns c .. c + VEC - 1) in
// one 16-byte load when p is 16-byte aligned and the VEC columns lie inside the row, and the raw
// bits of such a load as floats.
template <class In>
struct TileLoad {
    static constexpr int VEC = 16 / (int)sizeof(In);
    static_assert(VEC == 4 || VEC == 8, "FP32 or BF16 input");
    static __device__ __forceinline__ bool vector_ok(const In* p, int c, int cols) {
        return c + VEC <= cols && (uintptr_t)p % 16 == 0;
    }
    static __device__ __forceinline__ void unpack(const uint4& raw, float* out) {
        const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
        if constexpr (VEC == 8) {  // BF16 pairs, the lower-addressed value in the low half (as_float's bits)
            for (int i = 0; i < 4; i++) out[2 * i] = bits_float(w[i] << 16), out[2 * i + 1] = bits_float(w[i] & 0xFFFF0000u);
        } else {
            for (int i = 0; i < 4; i++) out[i] = bits_float(w[i]);
        }
    }
};

// Loads tile (r0, c0) of x [rows][cols] into the swizzled smem tile; elements outside x are stored
// as 0, which never changes an amax. Returns the amax of what this thread loaded (the blockwise
// quantizer's first step).
template <class In>
__device__ inline float load_tile(const In* x, int rows, int cols, int r0, int c0, float* tile) {
    using L = TileLoad<In>;
    constexpr int VEC = L::VEC, PER_ROW = FP8_BLOCK / VEC, LOADS = FP8_BLOCK * PER_ROW / QUANT_THREADS;
    static_assert(LOADS % QUANT_LOADS_IN_FLIGHT == 0, "whole batches of loads");
    float amax = 0.0f;
    for (int b = 0; b < LOADS; b += QUANT_LOADS_IN_FLIGHT) {
        uint4 raw[QUANT_LOADS_IN_FLIGHT];
        bool wide[QUANT_LOADS_IN_FLIGHT];
        FP8RL_UNROLL
        for (int k = 0; k < QUANT_LOADS_IN_FLIGHT; k++) {  // every load issued before any value is used
            const int v = threadIdx.x + (b + k) * QUANT_THREADS, r = r0 + v / PER_ROW, c = c0 + v % PER_ROW * VEC;
            const In* p = x + (size_t)r * cols + c;
            wide[k] = r < rows && L::vector_ok(p, c, cols);
            raw[k] = wide[k] ? load_vector<uint4>(p) : make_uint4(0u, 0u, 0u, 0u);
        }
        FP8RL_UNROLL
        for (int k = 0; k < QUANT_LOADS_IN_FLIGHT; k++) {
            const int v = threadIdx.x + (b + k) * QUANT_THREADS, tr = v / PER_ROW, tc = v % PER_ROW * VEC;
            const int r = r0 + tr, c = c0 + tc;
            float f[VEC];
            if (wide[k]) {
                L::unpack(raw[k], f);
            } else {  // narrow: an unaligned row start, the tensor's last columns, or rows past its end
                const In* p = x + (size_t)r * cols + c;
                for (int e = 0; e < VEC; e++) f[e] = r < rows && c + e < cols ? as_float(p[e]) : 0.0f;
            }
            for (int e = 0; e < VEC; e++) amax = amax_update(amax, f[e]);
            const float4 lo = make_float4(f[0], f[1], f[2], f[3]);
            if constexpr (VEC == 8) {  // two chunks, in the order that keeps each 8-lane phase's stores on distinct banks
                const float4 hi = make_float4(f[4], f[5], f[6], f[7]);
                const bool swap = (v >> 2) & 1;
                *tile_chunk(tile, tr, tc / 4 + swap) = swap ? hi : lo;
                *tile_chunk(tile, tr, tc / 4 + !swap) = swap ? lo : hi;
            } else {
                *tile_chunk(tile, tr, tc / 4) = lo;
            }
        }
    }
    __syncthreads();
    return amax;
}

// Four codes of consecutive bytes at p, low byte first; `valid` of them lie inside the tensor.
__device__ __forceinline__ void store_codes4(uint8_t* p, uint32_t packed, int valid) {
    if (valid >= 4 && (uintptr_t)p % 4 == 0) {
        store_vector<uint32_t>(p, packed);
        return;
    }
    for (int e = 0; e < 4 && e < valid; e++) p[e] = (uint8_t)(packed >> (8 * e));
}

// Tile row i (n_cols of its columns inside the tensor) as codes at out (the tensor's row, from the
// tile's first column), by the warp: scale from the row's amax (scale <= 0) or the given one.
// Returns the scale used.
__device__ __forceinline__ float quantize_tile_row(float* tile, int i, int n_cols, float scale, bool pow2, uint8_t* out) {
    const int lane = threadIdx.x % 32;
    const float4 v = *tile_chunk(tile, i, lane);
    if (scale <= 0.0f) scale = fp8_scale_from_amax(warp_amax(amax4(0.0f, v)), pow2);
    store_codes4(out + 4 * lane, encode_e4m3x4(v.x * scale, v.y * scale, v.z * scale, v.w * scale), n_cols - 4 * lane);
    return scale;
}

// Tile columns 4q .. 4q+3 as rows of x^T, by the warp (lane l: tile rows 4l .. 4l+3): column k's
// codes go to out + k * ld (ld = the tensor's rows, x^T's row length), n_rows of them inside the
// tensor; scale from each column's amax within the tile (given[k] <= 0) or given[k], into scales[k].
__device__ __forceinline__ void quantize_tile_columns(float* tile, int q, int n_rows, const float given[4], bool pow2,
                                                      uint8_t* out, size_t ld, int n_out, float* scales) {
    const int lane = threadIdx.x % 32;
    float4 v[4];
    for (int i = 0; i < 4; i++) v[i] = *tile_chunk(tile, 4 * lane + i, q);
    const float col[4][4] = {{v[0].x, v[1].x, v[2].x, v[3].x},
                             {v[0].y, v[1].y, v[2].y, v[3].y},
                             {v[0].z, v[1].z, v[2].z, v[3].z},
                             {v[0].w, v[1].w, v[2].w, v[3].w}};
    for (int k = 0; k < 4; k++) {
        float s = given[k];
        if (s <= 0.0f) {
            float amax = 0.0f;
            for (int i = 0; i < 4; i++) amax = amax_update(amax, col[k][i]);
            s = fp8_scale_from_amax(warp_amax(amax), pow2);
        }
        scales[k] = s;
        if (k < n_out)
            store_codes4(out + k * ld + 4 * lane, encode_e4m3x4(col[k][0] * s, col[k][1] * s, col[k][2] * s, col[k][3] * s),
                         n_rows - 4 * lane);
    }
}

// The tile source of quantize_rowwise_kernel that reads a tensor x [rows][cols] (load_tile). A
// source's stage() fills the swizzled tile (r0, c0) of the [rows][cols] values to quantize, zeros
// outside them, and ends with __syncthreads(); a producer that computes the values (the SwiGLU
// backward, cuda/kernels/swiglu.cuh) is another source, so its FP8 operands need no BF16 round trip.
template <class In>
struct TensorTile {
    const In* x;
    __device__ void stage(int rows, int cols, int r0, int c0, float* tile) const { load_tile(x, rows, cols, r0, c0, tile); }
};

// Row and tensor scaling need the amax of a whole row (of x, and of x^T: a column of x) or of the
// whole tensor before the first code is written, so they take two passes, as Transformer Engine's
// per-tensor current scaling does (an amax kernel, then the cast): this one stages each tile as the
// quantizer does and max-es the amaxes into row_amax [rows] and col_amax [cols] (row), or into
// row_amax[0] (tensor; col_amax unused), as float bits: non-negative floats order like their bits and
// a max is order-free, so the result is exact whatever the schedule. Either pointer may be null.
template <class Source>
__global__ void __launch_bounds__(QUANT_THREADS)
    amax_tiles_kernel(Source source, int rows, int cols, bool tensor, uint32_t* row_amax, uint32_t* col_amax) {
    DYNAMIC_SHARED(float, tile);  // [128][128], swizzled (tile_chunk)
    STATIC_SHARED(float, warp_max, [QUANT_THREADS / 32]);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int r0 = blockIdx.y * FP8_BLOCK, c0 = blockIdx.x * FP8_BLOCK;
    const int n_rows = min(FP8_BLOCK, rows - r0), n_cols = min(FP8_BLOCK, cols - c0);
    source.stage(rows, cols, r0, c0, tile);
    float tile_amax = 0.0f;
    for (int i = warp; i < n_rows; i += QUANT_THREADS / 32) {  // outside the tensor the tile holds zeros
        const float a = warp_amax(amax4(0.0f, *tile_chunk(tile, i, lane)));
        tile_amax = amax_update(tile_amax, a);
        if (!tensor && row_amax && lane == 0) atomicMax(&row_amax[r0 + i], float_bits(a));
    }
    if (tensor) {  // one atomic per tile
        if (lane == 0) warp_max[warp] = tile_amax;
        __syncthreads();
        if (threadIdx.x == 0) {
            float a = 0.0f;
            for (int w = 0; w < QUANT_THREADS / 32; w++) a = amax_update(a, warp_max[w]);
            atomicMax(&row_amax[0], float_bits(a));
        }
        return;
    }
    if (col_amax)
        for (int c = threadIdx.x; c < n_cols; c += QUANT_THREADS) {
            float a = 0.0f;
            for (int r = 0; r < n_rows; r++) a = amax_update(a, reinterpret_cast<const float*>(tile_chunk(tile, r, c / 4))[c % 4]);
            atomicMax(&col_amax[c0 + c], float_bits(a));
        }
}

// The amaxes a row- or tensor-scaled quantization reads (amax_tiles_kernel's output): null for block.
struct Fp8Amax {
    Fp8Scaling scaling = Fp8Scaling::Block;
    const uint32_t* rows = nullptr;  // [rows] (row) or [1] (tensor)
    const uint32_t* cols = nullptr;  // [cols] (row); unused for tensor
    __device__ float row_scale(int r, bool pow2) const {
        return fp8_scale_from_amax(bits_float(rows[scaling == Fp8Scaling::Tensor ? 0 : r]), pow2);
    }
    __device__ float col_scale(int c, bool pow2) const {
        return fp8_scale_from_amax(bits_float(scaling == Fp8Scaling::Tensor ? rows[0] : cols[c]), pow2);
    }
};

// Tile (tile_r, tile_c) of x [rows][cols], staged in `tile` (swizzled), as rows of x^T: codes_t
// [cols][rows] from row tile_r * 128 and their scales (block: VEC128 [ceil(rows/128)][cols], 1x128
// along rows; row and tensor: amax's). A warp per strip of 4 tile columns, the block's `warps` warps
// in turn. quantize_rowwise_kernel's transposed output, and that of producers that stage a tile of
// their own (attention.cuh's delta kernel).
__device__ inline void quantize_tile_transposed(float* tile, int warps, int tile_r, int tile_c, int rows, int cols,
                                                bool pow2, const Fp8Amax& amax, uint8_t* codes_t, float* scale_inv_t) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int r0 = tile_r * FP8_BLOCK, c0 = tile_c * FP8_BLOCK;
    const int n_rows = min(FP8_BLOCK, rows - r0), n_cols = min(FP8_BLOCK, cols - c0);
    const bool block = amax.scaling == Fp8Scaling::Block, tensor = amax.scaling == Fp8Scaling::Tensor;
    for (int q = warp; q * 4 < n_cols; q += warps) {  // columns c0 + 4q .. = rows of x^T, from r0
        float given[4], s[4];
        for (int k = 0; k < 4; k++) given[k] = block || 4 * q + k >= n_cols ? 0.0f : amax.col_scale(c0 + 4 * q + k, pow2);
        quantize_tile_columns(tile, q, n_rows, given, pow2, codes_t + (size_t)(c0 + 4 * q) * rows + r0, (size_t)rows,
                              n_cols - 4 * q, s);
        if (lane == 0)
            for (int k = 0; k < 4 && 4 * q + k < n_cols; k++) {
                const int c = c0 + 4 * q + k;
                if (block) scale_inv_t[vec128_scale_index(c, tile_r, cols)] = 1.0f / s[k];
                else if (tile_r == 0 && (!tensor || c == 0)) scale_inv_t[tensor ? 0 : c] = 1.0f / s[k];
            }
    }
}

// The values [rows][cols] of `source` -> codes [rows][cols] + scale_inv, and their transpose
// [cols][rows] (the wgrad copy; a row-scaled weight's dgrad copy) into codes_t + scale_inv_t, from
// the same tile in the same pass. Block: 1x128 along cols (VEC128 [ceil(cols/128)][rows]) and along
// rows for the transpose (VEC128 [ceil(rows/128)][cols]); row: one scale per row [rows] and per
// column [cols]; tensor: one scale [1] for both (amax: the scales' amaxes, row and tensor). Either
// output may be null (codes_t: rowwise only, for fprop and dgrad; codes: transposed only, for a
// wgrad operand).
template <class Source>
__global__ void __launch_bounds__(QUANT_THREADS)
    quantize_rowwise_kernel(Source source, int rows, int cols, bool pow2, Fp8Amax amax, uint8_t* codes, float* scale_inv,
                            uint8_t* codes_t, float* scale_inv_t) {
    DYNAMIC_SHARED(float, tile);  // [128][128], swizzled (tile_chunk)
    const int tile_c = blockIdx.x, tile_r = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int r0 = tile_r * FP8_BLOCK, c0 = tile_c * FP8_BLOCK;
    const int n_rows = min(FP8_BLOCK, rows - r0), n_cols = min(FP8_BLOCK, cols - c0);
    const bool block = amax.scaling == Fp8Scaling::Block, tensor = amax.scaling == Fp8Scaling::Tensor;
    source.stage(rows, cols, r0, c0, tile);
    if (codes != nullptr)
        for (int i = warp; i < n_rows; i += QUANT_THREADS / 32) {  // row r0 + i, columns c0 ..
            const float given = block ? 0.0f : amax.row_scale(r0 + i, pow2);
            float s = quantize_tile_row(tile, i, n_cols, given, pow2, codes + (size_t)(r0 + i) * cols + c0);
            if (lane == 0 && block) scale_inv[vec128_scale_index(r0 + i, tile_c, rows)] = 1.0f / s;
            if (lane == 0 && !block && tile_c == 0 && (!tensor || r0 + i == 0)) scale_inv[tensor ? 0 : r0 + i] = 1.0f / s;
        }
    if (codes_t != nullptr)
        quantize_tile_transposed(tile, QUANT_THREADS / 32, tile_r, tile_c, rows, cols, pow2, amax, codes_t, scale_inv_t);
}

// Tile (tile_r, tile_c) of a weight w [rows][cols], staged in `tile` (swizzled; this thread's amax
// of what it staged in `amax`), as 128x128-block codes + BLK128x128 scale_inv and the transposed copy
// codes_t [cols][rows] + its transposed grid (the dgrad operand; codes_t and scale_inv_t null: none,
// fp8_transpose_block_copy_gpu makes it when needed). The grids' padding entries (each
// grid row padded to a multiple of 4) are written as 0 by the last tile of each row of tiles.
// warp_max: QUANT_THREADS / 32 floats of shared memory.
__device__ inline void quantize_weight_tile(float* tile, float amax, float* warp_max, int tile_r, int tile_c, int rows,
                                            int cols, bool pow2, uint8_t* codes, float* scale_inv, uint8_t* codes_t,
                                            float* scale_inv_t) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int r0 = tile_r * FP8_BLOCK, c0 = tile_c * FP8_BLOCK;
    const int n_rows = min(FP8_BLOCK, rows - r0), n_cols = min(FP8_BLOCK, cols - c0);
    amax = warp_amax(amax);
    if (lane == 0) warp_max[warp] = amax;
    __syncthreads();
    amax = 0.0f;
    for (int i = 0; i < QUANT_THREADS / 32; i++) amax = amax_update(amax, warp_max[i]);
    const float scale = fp8_scale_from_amax(amax, pow2);  // > 0: a positive finite scale, or FLT_MAX
    for (int i = warp; i < n_rows; i += QUANT_THREADS / 32)
        quantize_tile_row(tile, i, n_cols, scale, pow2, codes + (size_t)(r0 + i) * cols + c0);
    const float given[4] = {scale, scale, scale, scale};
    for (int q = warp; codes_t && q * 4 < n_cols; q += QUANT_THREADS / 32) {
        float unused[4];
        quantize_tile_columns(tile, q, n_rows, given, pow2, codes_t + (size_t)(c0 + 4 * q) * rows + r0, (size_t)rows,
                              n_cols - 4 * q, unused);
    }
    if (threadIdx.x == 0) {
        scale_inv[blk128_scale_index(tile_r, tile_c, cols)] = 1.0f / scale;
        const int col_blocks = fp8_num_blocks(cols), row_blocks = fp8_num_blocks(rows);
        if (tile_c == col_blocks - 1)  // padding of this row of scale_inv
            for (int kb = col_blocks; kb < round_up4(col_blocks); kb++) scale_inv[blk128_scale_index(tile_r, kb, cols)] = 0.0f;
        if (scale_inv_t) scale_inv_t[blk128_scale_index(tile_c, tile_r, rows)] = 1.0f / scale;
        if (scale_inv_t && tile_r == row_blocks - 1)  // padding of row tile_c of scale_inv_t
            for (int kb = row_blocks; kb < round_up4(row_blocks); kb++) scale_inv_t[blk128_scale_index(tile_c, kb, rows)] = 0.0f;
    }
}

// w [rows][cols] -> its 128x128-block copy and transposed copy (quantize_weight_tile), a block per tile.
template <class In>
__global__ void __launch_bounds__(QUANT_THREADS)
    quantize_blockwise_kernel(const In* w, int rows, int cols, bool pow2, uint8_t* codes, float* scale_inv,
                              uint8_t* codes_t, float* scale_inv_t) {
    DYNAMIC_SHARED(float, tile);  // [128][128], swizzled (tile_chunk)
    STATIC_SHARED(float, warp_max, [QUANT_THREADS / 32]);
    const int tile_c = blockIdx.x, tile_r = blockIdx.y;
    const float amax = load_tile(w, rows, cols, tile_r * FP8_BLOCK, tile_c * FP8_BLOCK, tile);
    quantize_weight_tile(tile, amax, warp_max, tile_r, tile_c, rows, cols, pow2, codes, scale_inv, codes_t, scale_inv_t);
}

// The dgrad copy of a 128x128-block weight copy, from the copy itself (a block per tile): codes_t
// [cols][rows] = codes^T and the transposed scale grid (padding 0), which is exactly what
// quantize_weight_tile writes, since a square block's one scale quantizes W and W^T alike
// (rl/numerics/fp8_block.h's fp8_transpose). rows and cols are multiples of 4 (a projection's are
// of 16), so every word of 4 codes lies in one row of either side.
static __global__ void __launch_bounds__(QUANT_THREADS)
    transpose_block_copy_kernel(const uint8_t* codes, const float* scale_inv, int rows, int cols, uint8_t* codes_t,
                                float* scale_inv_t) {
    STATIC_SHARED(uint8_t, tile, [FP8_BLOCK][FP8_BLOCK + 1]);  // +1: a warp's column reads, 4 rows apart, hit 32 banks
    const int tile_c = blockIdx.x, tile_r = blockIdx.y, r0 = tile_r * FP8_BLOCK, c0 = tile_c * FP8_BLOCK;
    const int n_rows = min(FP8_BLOCK, rows - r0), n_cols = min(FP8_BLOCK, cols - c0);
    for (int e = threadIdx.x; e < n_rows * (n_cols / 4); e += blockDim.x) {  // word e: row e / (n_cols/4)
        const int r = e / (n_cols / 4), c = 4 * (e % (n_cols / 4));
        const uint32_t w = *reinterpret_cast<const uint32_t*>(codes + (size_t)(r0 + r) * cols + c0 + c);
        for (int k = 0; k < 4; k++) tile[r][c + k] = (uint8_t)(w >> (8 * k));
    }
    __syncthreads();
    for (int e = threadIdx.x; e < n_cols * (n_rows / 4); e += blockDim.x) {  // word e of codes_t's rows c0 ..
        const int c = e / (n_rows / 4), r = 4 * (e % (n_rows / 4));
        uint32_t w = 0;
        for (int k = 0; k < 4; k++) w |= (uint32_t)tile[r + k][c] << (8 * k);
        *reinterpret_cast<uint32_t*>(codes_t + (size_t)(c0 + c) * rows + r0 + r) = w;
    }
    if (threadIdx.x == 0) {
        scale_inv_t[blk128_scale_index(tile_c, tile_r, rows)] = scale_inv[blk128_scale_index(tile_r, tile_c, cols)];
        const int row_blocks = fp8_num_blocks(rows);
        if (tile_r == row_blocks - 1)  // padding of row tile_c of scale_inv_t
            for (int kb = row_blocks; kb < round_up4(row_blocks); kb++) scale_inv_t[blk128_scale_index(tile_c, kb, rows)] = 0.0f;
    }
}

// codes [rows][cols] + BLK128x128 scale_inv (a 128x128-block weight copy, device) -> its transposed
// copy codes_t [cols][rows] + scale_inv_t (blk128_scale_count(cols, rows) floats): the dgrad operand
// made just before the dgrad GEMM when the engine keeps one FP8 copy (cuda/engine/engine_gpu.cuh).
inline void fp8_transpose_block_copy_gpu(const uint8_t* codes, const float* scale_inv, int rows, int cols, uint8_t* codes_t,
                                         float* scale_inv_t, cudaStream_t stream) {
    check_fp8_shape("fp8_transpose_block_copy_gpu", rows, cols);
    if (rows % 4 || cols % 4 || (uintptr_t)codes % 4 || (uintptr_t)codes_t % 4)
        fail("fp8_transpose_block_copy_gpu: a [%d][%d] copy; it moves words of 4 codes, so both sides must be multiples "
             "of 4 and the codes 4-byte aligned", rows, cols);
    dim3 grid(fp8_num_blocks(cols), fp8_num_blocks(rows));
    LAUNCH_KERNEL(transpose_block_copy_kernel, grid, QUANT_THREADS, 0, stream, codes, scale_inv, rows, cols, codes_t,
                  scale_inv_t);
}

// Allows a kernel the dynamic shared memory of one tile (set once per kernel and device).
template <class Kernel>
void allow_tile_smem(Kernel kernel) {
    allow_dynamic_smem(kernel, TILE_BYTES);
}

// Host launchers. Device pointers; sizes as in the kernels' comments (fp8_scale_count of the
// layout). Any alignment works: 16-byte loads and 4-byte stores are taken where the addresses
// allow, narrower accesses elsewhere, with the same bytes out.
// Rowwise: codes / scale_inv may be null (transposed only), or codes_t / scale_inv_t (rowwise only),
// not both.

// The launch of quantize_rowwise_kernel over the [rows][cols] values of `source` at `scaling`; row
// and tensor first run amax_tiles_kernel into amax_scratch (fp8_amax_words of it).
template <class Source>
void fp8_quantize_tiles_gpu(const char* who, const Source& source, int rows, int cols, bool pow2, uint8_t* codes,
                            float* scale_inv, uint8_t* codes_t, float* scale_inv_t, cudaStream_t stream,
                            Fp8Scaling scaling = Fp8Scaling::Block, uint32_t* amax_scratch = nullptr) {
    check_fp8_shape(who, rows, cols);
    if ((codes == nullptr) != (scale_inv == nullptr) || (codes_t == nullptr) != (scale_inv_t == nullptr))
        fail("%s: codes and scale_inv (and codes_t and scale_inv_t) are given together or not at all", who);
    if (codes == nullptr && codes_t == nullptr) fail("%s: neither the rowwise nor the transposed output is given", who);
    dim3 grid(fp8_num_blocks(cols), fp8_num_blocks(rows));
    Fp8Amax amax;
    amax.scaling = scaling;
    if (scaling != Fp8Scaling::Block) {
        if (!amax_scratch) fail("%s: %s scaling needs amax scratch", who, fp8_scaling_name(scaling));
        const bool tensor = scaling == Fp8Scaling::Tensor;
        uint32_t* row_amax = amax_scratch;
        uint32_t* col_amax = tensor ? nullptr : amax_scratch + rows;
        CUDA_CHECK(cudaMemsetAsync(amax_scratch, 0, fp8_amax_words(scaling, rows, cols) * sizeof(uint32_t), stream));
        allow_tile_smem(amax_tiles_kernel<Source>);
        LAUNCH_KERNEL(amax_tiles_kernel<Source>, grid, QUANT_THREADS, TILE_BYTES, stream, source, rows, cols, tensor,
                      codes || tensor ? row_amax : nullptr, codes_t ? col_amax : nullptr);
        amax.rows = row_amax, amax.cols = col_amax;
    }
    allow_tile_smem(quantize_rowwise_kernel<Source>);
    LAUNCH_KERNEL(quantize_rowwise_kernel<Source>, grid, QUANT_THREADS, TILE_BYTES, stream, source, rows, cols, pow2, amax,
                  codes, scale_inv, codes_t, scale_inv_t);
}

template <class In>
void fp8_quantize_rowwise_gpu(const In* x, int rows, int cols, bool pow2, uint8_t* codes, float* scale_inv,
                              uint8_t* codes_t, float* scale_inv_t, cudaStream_t stream,
                              Fp8Scaling scaling = Fp8Scaling::Block, uint32_t* amax_scratch = nullptr) {
    fp8_quantize_tiles_gpu("fp8_quantize_rowwise_gpu", TensorTile<In>{x}, rows, cols, pow2, codes, scale_inv, codes_t,
                           scale_inv_t, stream, scaling, amax_scratch);
}

template <class In>
void fp8_quantize_blockwise_gpu(const In* w, int rows, int cols, bool pow2, uint8_t* codes, float* scale_inv,
                                uint8_t* codes_t, float* scale_inv_t, cudaStream_t stream) {
    check_fp8_shape("fp8_quantize_blockwise_gpu", rows, cols);
    allow_tile_smem(quantize_blockwise_kernel<In>);
    dim3 grid(fp8_num_blocks(cols), fp8_num_blocks(rows));
    LAUNCH_KERNEL(quantize_blockwise_kernel<In>, grid, QUANT_THREADS, TILE_BYTES, stream, w, rows, cols, pow2, codes,
                  scale_inv, codes_t, scale_inv_t);
}

// The FP8 copy of a projection weight W [rows][cols] (device memory) at `scaling`: codes and scales
// for fprop, the transposed codes [cols][rows] and scales for dgrad (sizes: fp8_scale_count of
// fp8_weight_layout(scaling) for (rows, cols) and (cols, rows) floats), as cpu/fp8_gemm_ref.h's
// fp8_quantize_weight.
struct Fp8WeightCopy {
    uint8_t* codes;
    float* scale_inv;
    uint8_t* codes_t;
    float* scale_inv_t;
    bool pow2_scales;
    Fp8Scaling scaling;
};

// The FP8 copies of w [rows][cols] (FP32 master, device) quantized again, after an update: block
// through the blockwise kernel, row and tensor through the rowwise one (its transposed output is W^T
// with one scale per input channel, or W's one scale). amax_scratch: fp8_amax_words(scaling, rows, cols).
inline void fp8_requantize_weight_gpu(const float* w, int rows, int cols, const Fp8WeightCopy& fp8, uint32_t* amax_scratch,
                                      cudaStream_t stream) {
    if (fp8.scaling == Fp8Scaling::Block)
        return fp8_quantize_blockwise_gpu(w, rows, cols, fp8.pow2_scales, fp8.codes, fp8.scale_inv, fp8.codes_t,
                                          fp8.scale_inv_t, stream);
    fp8_quantize_rowwise_gpu(w, rows, cols, fp8.pow2_scales, fp8.codes, fp8.scale_inv, fp8.codes_t, fp8.scale_inv_t, stream,
                             fp8.scaling, amax_scratch);
}

// ---------------------------------------------------------------------------------------------
// cuBLASLt GEMMs.

// cuBLASLt's scale modes (cublasLtMatmulMatrixScale_t) fp8rl uses, one per granularity: block pairs
// VEC128 with VEC128 or BLK128x128, row pairs OUTER_VEC with OUTER_VEC (cuBLAS docs: both A and B
// must be OUTER_VEC_32F, scale_A [m], scale_B [n]), tensor pairs SCALAR with SCALAR. All four run on
// compute capability 9.0 (spec-fp8.md §6.1).
enum class Fp8ScaleMode { VEC128, BLK128x128, OUTER_VEC, SCALAR };
enum class GemmOut { BF16, F32 };

// Which kernel runs a block-scaled FP8 GEMM the runner is asked for (--fp8_gemm_kernel): fp8rl's own
// (cuda/kernels/fp8_block_gemm.cuh) where the shape and modes fit it, else cuBLASLt; or cuBLASLt
// always. Only the trainer's GEMMs ask for Own: the rollout's prefill and decode GEMMs stay on
// cuBLASLt, whose two size classes' kernels gemm_runner_rows_do_not_depend_on_n holds a GPU to.
enum class Fp8GemmKernel { Cublaslt, Own };

inline const char* scale_mode_name(Fp8ScaleMode m) {
    const char* names[] = {"VEC128", "BLK128x128", "OUTER_VEC", "SCALAR"};
    return names[(int)m];
}
inline bool is_block_mode(Fp8ScaleMode m) { return m == Fp8ScaleMode::VEC128 || m == Fp8ScaleMode::BLK128x128; }

// The scale modes of an activation or gradient operand and of a weight at a granularity.
inline Fp8ScaleMode rows_scale_mode(Fp8Scaling s) {
    return s == Fp8Scaling::Block ? Fp8ScaleMode::VEC128 : s == Fp8Scaling::Row ? Fp8ScaleMode::OUTER_VEC : Fp8ScaleMode::SCALAR;
}
inline Fp8ScaleMode weight_scale_mode(Fp8Scaling s) {
    return s == Fp8Scaling::Block ? Fp8ScaleMode::BLK128x128 : rows_scale_mode(s);
}

// Operand layouts of a GEMM, row-major, D [n][m] in every case:
//   TN  D = B [n][k] . A [m][k]^T     (cuBLAS TRANSA=T, TRANSB=N; the only one FP8 block scaling allows)
//   NN  D = B [n][k] . A [k][m]       (TRANSA=N, TRANSB=N: a linear layer's BF16 dgrad, dX = dY W)
//   NT  D = B [k][n]^T . A [k][m]     (TRANSA=N, TRANSB=T: a linear layer's BF16 wgrad, dW = dY^T X)
enum class GemmOps { TN, NN, NT };

// The arguments of one cublasLtMatmul in cuBLAS's column-major terms (spec-fp8.md §6.4): D (m x n,
// ldd = m) = op(A) . op(B) (+ D when accumulate: beta = 1), FP32 compute, alpha = 1. With fp8, A and
// B are E4M3 with FP32 dequantization scale tensors in the given modes (layouts: spec-fp8.md §6.5)
// and ops is TN; else they are BF16. ldb: B's leading dimension (its row stride in elements; 0: the
// rows packed, k or n for NT), so a GEMM can read a column slice of a wider B.
struct GemmCall {
    int m, n, k;
    bool fp8;
    const void *a, *b;
    const float *a_scale, *b_scale;
    Fp8ScaleMode a_mode, b_mode;
    void* d;
    GemmOut out;
    GemmOps ops;
    bool accumulate;
    int ldb = 0;
};

// Block-scaled FP8 GEMMs need cuBLASLt >= 12.9 and compute capability 9.x (spec-fp8.md §6.1).
// Returns "" when supported, else the reason.
inline std::string fp8_block_gemm_unsupported_reason(int device) {
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    size_t version = cublasLtGetVersion();
    if (version < 120900) return strfmt("cuBLASLt %zu is older than 12.9 (no VEC128/BLK128x128 scaling)", version);
    if (prop.major != 9)
        return strfmt("%s is compute capability %d.%d; cuBLASLt's 128-block FP8 scaling runs only on 9.x (Hopper)",
                      prop.name, prop.major, prop.minor);
    return "";
}

// Owns the cuBLASLt handle, the workspace and one cached plan (descriptors + chosen algorithm) per
// GEMM configuration (shape, modes, types and the operands' pointer alignments), so the heuristic
// query runs once per configuration. The same code runs in emulation (cuda/emu/emu_cublaslt.cpp).
// Batch invariance: a row of D must not depend on how many rows (n, the tokens) are computed with
// it, so a completion decodes the same whatever it is batched with. Two things would break it: a
// split-K algorithm (its parts and their sums follow the shape), excluded by the preference's
// reduction scheme mask; and kernels that sum an element's k in another order. A kernel that does
// not split k sums each element in k order whatever its tile, so the runner pins one per weight
// (m, k and its modes) and size class (cublasLtMatmulAlgoCheck; the heuristic's own choice for n
// takes over only where cuBLASLt refuses the pinned one): decode-sized n (at most DECODE_ROWS) runs
// the heuristic's first choice at such an n, a kernel for a skinny output, and larger n (a prefill,
// a training micro-batch) theirs, so a decode step never runs the tile chosen for a 16k-token
// prefill. That the two classes' kernels round alike is what gemm_runner_rows_do_not_depend_on_n
// holds a GPU to.
// One per device; not thread-safe.
class GemmRunner {
  public:
    static constexpr size_t WORKSPACE_BYTES = 32u << 20;  // what cuBLAS and TE use on Hopper
    static constexpr int DECODE_ROWS = 256;  // the largest n of the decode-sized class (above)

    GemmRunner() {
        cublas_check(cublasLtCreate(&handle_), "cublasLtCreate");
        workspace_.resize(WORKSPACE_BYTES, "cuBLASLt workspace");
    }
    ~GemmRunner() {
        for (auto& kv : plans_) destroy(kv.second);
        cublasLtDestroy(handle_);
    }
    GemmRunner(const GemmRunner&) = delete;
    GemmRunner& operator=(const GemmRunner&) = delete;

    // D [n][m] (+)= B [n][k] . A [m][k]^T with E4M3 operands and FP32 dequantization scales (device
    // pointers, 16-byte aligned) in the given modes; `name` labels error messages. accumulate adds
    // into D (FP32 output only). kernel Own: fp8_block_gemm where own_kernel_fits (the same sums in the
    // same order: bit for bit in emulation; on a GPU the tensor cores' internal order may differ).
    void fp8(const char* name, int m, int n, int k, const uint8_t* a, const float* a_scale, Fp8ScaleMode a_mode,
             const uint8_t* b, const float* b_scale, Fp8ScaleMode b_mode, void* d, GemmOut out, cudaStream_t stream,
             bool accumulate = false, Fp8GemmKernel kernel = Fp8GemmKernel::Cublaslt) {
        std::string what = strfmt("FP8 GEMM %s (m=%d n=%d k=%d, A %s, B %s)", name, m, n, k, scale_mode_name(a_mode),
                                  scale_mode_name(b_mode));
        if (m % 4 || n % 4 || k % 16)
            fail("%s: scaled FP8 GEMMs need m and n multiples of 4 and k a multiple of 16; pad the token count "
                 "to a multiple of 128",
                 what.c_str());
        if (a_mode == Fp8ScaleMode::BLK128x128 && b_mode == Fp8ScaleMode::BLK128x128)
            fail("%s: cuBLASLt has no BLK128x128 x BLK128x128 mode", what.c_str());
        if (is_block_mode(a_mode) != is_block_mode(b_mode) || (!is_block_mode(a_mode) && a_mode != b_mode))
            fail("%s: cuBLASLt pairs a block mode with a block mode, OUTER_VEC with OUTER_VEC and SCALAR with SCALAR",
                 what.c_str());
        if ((uintptr_t)a_scale % 16 || (uintptr_t)b_scale % 16)
            fail("%s: scale tensors must start on a 16-byte boundary", what.c_str());
        if ((uintptr_t)a % 16 || (uintptr_t)b % 16 || (uintptr_t)d % 16)
            fail("%s: FP8 GEMMs need A, B and D on 16-byte boundaries (A %p, B %p, D %p)", what.c_str(), (const void*)a,
                 (const void*)b, d);
        // D's rows (m elements) must be 16-byte multiples: 8 BF16 values (spec-fp8.md §6.4)
        if (out == GemmOut::BF16 && m % 8)
            fail("%s: an FP8 GEMM with BF16 output needs m a multiple of 8 (16-byte rows of D)", what.c_str());
        check_accumulate(what, out, accumulate);
        if (kernel == Fp8GemmKernel::Own && own_kernel_fits(m, n, k, a_mode, b_mode))
            return fp8_block_gemm(m, n, k, a, a_scale, a_mode == Fp8ScaleMode::BLK128x128, b, b_scale, d,
                                  out == GemmOut::F32, accumulate, stream);
        run(what, GemmCall{m, n, k, true, a, b, a_scale, b_scale, a_mode, b_mode, d, out, GemmOps::TN, accumulate}, stream);
    }

    // D [n][m] (+)= the product of BF16 operands in the layout `ops` (see GemmOps), FP32 accumulation.
    // ldb: B's row stride in elements when its rows are slices of wider ones (0: packed, k or n for NT).
    void bf16(const char* name, int m, int n, int k, const __nv_bfloat16* a, const __nv_bfloat16* b, void* d,
              GemmOut out, cudaStream_t stream, GemmOps ops = GemmOps::TN, bool accumulate = false, int ldb = 0) {
        const char* op_names[] = {"TN", "NN", "NT"};
        std::string what = strfmt("BF16 GEMM %s (%s, m=%d n=%d k=%d)", name, op_names[(int)ops], m, n, k);
        // every leading dimension a multiple of 8 elements (16-byte rows): lda = k (TN) or m; ldb = k or n (NT)
        if (m % 8 || k % 8 || (ops == GemmOps::NT && n % 8))
            fail("%s: m, k%s must be multiples of 8 (16-byte rows)", what.c_str(), ops == GemmOps::NT ? " and n" : "");
        const int b_row = ops == GemmOps::NT ? n : k;  // B's stored rows hold this many elements
        if (ldb && (ldb % 8 || ldb < b_row))
            fail("%s: B's leading dimension %d must be a multiple of 8 and at least %d", what.c_str(), ldb, b_row);
        check_accumulate(what, out, accumulate);
        run(what,
            GemmCall{m, n, k, false, a, b, nullptr, nullptr, Fp8ScaleMode::VEC128, Fp8ScaleMode::VEC128, d, out, ops,
                     accumulate, ldb},
            stream);
    }

    // Whether fp8_block_gemm runs a GEMM that fp8() accepts (so its pointers are 16-byte aligned): whole
    // 128 x 128 tiles and k blocks, A's scales BLK128x128 (a weight) or VEC128, B's VEC128.
    static bool own_kernel_fits(int m, int n, int k, Fp8ScaleMode a_mode, Fp8ScaleMode b_mode) {
        return fp8_block_gemm_fits(m, n, k) && b_mode == Fp8ScaleMode::VEC128 && is_block_mode(a_mode);
    }

  private:
    DeviceArray<uint8_t> workspace_;

    static void check_accumulate(const std::string& what, GemmOut out, bool accumulate) {
        if (accumulate && out != GemmOut::F32) fail("%s: accumulating into D needs an FP32 output", what.c_str());
    }

    // m, n, k, fp8, a mode, b mode, out, ops, the alignments of A, B, D the algorithms were chosen for, ldb
    using Key = std::tuple<int, int, int, bool, int, int, int, int, uint32_t, uint32_t, uint32_t, int>;
    static constexpr int MAX_ALGOS = 4;  // the heuristic's best few, tried in order when one is refused
    struct Plan {
        cublasLtMatmulDesc_t desc = nullptr;
        cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
        cublasLtMatmulHeuristicResult_t algos[MAX_ALGOS];
        int num_algos = 0;
    };

    // The largest power of two (up to 256, cuBLASLt's default assumption) that divides p.
    static uint32_t alignment_of(const void* p) {
        uint32_t a = 256;
        while (a > 1 && (uintptr_t)p % a) a /= 2;
        return a;
    }

    cublasLtHandle_t handle_ = nullptr;
    std::map<Key, Plan> plans_;
    // m, k, fp8, a mode, b mode, out, ops, A's alignment, n's size class: a weight, whatever n in the class
    using PinKey = std::tuple<int, int, bool, int, int, int, int, uint32_t, bool>;
    std::map<PinKey, cublasLtMatmulAlgo_t> pinned_;

    static void destroy(Plan& p) {
        if (p.d) cublasLtMatrixLayoutDestroy(p.d);
        if (p.b) cublasLtMatrixLayoutDestroy(p.b);
        if (p.a) cublasLtMatrixLayoutDestroy(p.a);
        if (p.desc) cublasLtMatmulDescDestroy(p.desc);
    }

    static void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, int32_t value,
                         const std::string& what) {
        cublas_check(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)), what);
    }

    Plan& get_plan(const std::string& what, const GemmCall& c) {
        const uint32_t align[3] = {alignment_of(c.a), alignment_of(c.b), alignment_of(c.d)};  // A, B, C = D
        Key key{c.m, c.n, c.k, c.fp8, (int)c.a_mode, (int)c.b_mode, (int)c.out, (int)c.ops, align[0], align[1], align[2], c.ldb};
        auto it = plans_.find(key);
        if (it != plans_.end()) return it->second;
        cudaDataType_t in_type = c.fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
        cudaDataType_t out_type = c.out == GemmOut::BF16 ? CUDA_R_16BF : CUDA_R_32F;
        Plan p;
        try {
            cublas_check(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), what + ": descriptor");
            const bool a_t = c.ops == GemmOps::TN, b_t = c.ops == GemmOps::NT;
            set_desc(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, a_t ? CUBLAS_OP_T : CUBLAS_OP_N, what + ": TRANSA");
            set_desc(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, b_t ? CUBLAS_OP_T : CUBLAS_OP_N, what + ": TRANSB");
            if (c.fp8) {
                auto mode = [](Fp8ScaleMode m) {
                    const cublasLtMatmulMatrixScale_t modes[] = {
                        CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                        CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F};
                    return (int32_t)modes[(int)m];
                };
                set_desc(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, mode(c.a_mode), what + ": A scale mode");
                set_desc(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, mode(c.b_mode), what + ": B scale mode");
                int8_t fast_accum = 0;  // keep tensor-core partial sums promoted to FP32 (spec-fp8.md §6.7)
                cublas_check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum,
                                                            sizeof(fast_accum)),
                             what + ": FAST_ACCUM");
                // the heuristic refuses block modes without scale pointers (NVIDIA's LtBlk128x128Fp8Matmul
                // sets them first); these are the call's own, and run() sets each call's again
                set_scale_pointers(what, p, c);
            }
            // the stored matrices, column-major: A k x m (T) or m x k (N); B k x n (N) or n x k (T)
            if (a_t)
                cublas_check(cublasLtMatrixLayoutCreate(&p.a, in_type, c.k, c.m, c.k), what + ": A layout");
            else
                cublas_check(cublasLtMatrixLayoutCreate(&p.a, in_type, c.m, c.k, c.m), what + ": A layout");
            if (b_t)
                cublas_check(cublasLtMatrixLayoutCreate(&p.b, in_type, c.n, c.k, c.ldb ? c.ldb : c.n), what + ": B layout");
            else
                cublas_check(cublasLtMatrixLayoutCreate(&p.b, in_type, c.k, c.n, c.ldb ? c.ldb : c.k), what + ": B layout");
            cublas_check(cublasLtMatrixLayoutCreate(&p.d, out_type, c.m, c.n, c.m), what + ": D layout");
            cublasLtMatmulPreference_t pref;
            cublas_check(cublasLtMatmulPreferenceCreate(&pref), what + ": preference");
            size_t ws = WORKSPACE_BYTES;
            cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                                     &ws, sizeof(ws));
            // the heuristic assumes 256-byte-aligned operands unless told otherwise; BF16 weight slices are less
            const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
                CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
            for (int i = 0; i < 4 && st == CUBLAS_STATUS_SUCCESS; i++)
                st = cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &align[i < 3 ? i : 2], sizeof(uint32_t));
            const uint32_t no_split_k = CUBLASLT_REDUCTION_SCHEME_NONE;  // batch invariance (above)
            if (st == CUBLAS_STATUS_SUCCESS)
                st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &no_split_k,
                                                          sizeof(no_split_k));
            if (st == CUBLAS_STATUS_SUCCESS)
                st = cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.d, p.d, pref, MAX_ALGOS, p.algos,
                                                    &p.num_algos);
            cublasLtMatmulPreferenceDestroy(pref);
            cublas_check(st, what + ": algorithm heuristic");
            if (p.num_algos == 0) fail("%s: cuBLASLt found no algorithm for this configuration", what.c_str());
            pin_algorithm(PinKey{c.m, c.k, c.fp8, (int)c.a_mode, (int)c.b_mode, (int)c.out, (int)c.ops, align[0],
                                 c.n <= DECODE_ROWS},
                          p);
        } catch (...) {
            destroy(p);
            throw;
        }
        return plans_.emplace(key, p).first->second;
    }

    // The weight's pinned algorithm for the size class goes first in the plan where cuBLASLt accepts
    // it for this shape; a weight's first plan in a class pins its best algorithm.
    void pin_algorithm(const PinKey& key, Plan& p) {
        auto it = pinned_.find(key);
        if (it == pinned_.end()) {
            pinned_.emplace(key, p.algos[0].algo);
            return;
        }
        cublasLtMatmulHeuristicResult_t checked;
        if (cublasLtMatmulAlgoCheck(handle_, p.desc, p.a, p.b, p.d, p.d, &it->second, &checked) != CUBLAS_STATUS_SUCCESS ||
            checked.workspaceSize > WORKSPACE_BYTES)
            return;
        for (int i = std::min(p.num_algos, MAX_ALGOS - 1); i > 0; i--) p.algos[i] = p.algos[i - 1];
        p.algos[0] = checked;
        p.num_algos = std::min(p.num_algos + 1, MAX_ALGOS);
    }

    static void set_scale_pointers(const std::string& what, Plan& p, const GemmCall& c) {
        cublas_check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &c.a_scale,
                                                    sizeof(c.a_scale)),
                     what + ": A scale pointer");
        cublas_check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &c.b_scale,
                                                    sizeof(c.b_scale)),
                     what + ": B scale pointer");
    }

    // Runs the plan's first algorithm the library accepts for these pointers; an algorithm refused
    // gives way to the next, and the plan keeps the survivor first. A refusal may come as
    // NOT_SUPPORTED or INVALID_VALUE (cublasLtMatmul documents both for a configuration an algorithm
    // cannot run; FP8RL_EMU_CUBLASLT_REFUSAL swaps them in CI): the rules this class can know it
    // checks itself before calling (fp8(), bf16()), so a refusal here only means "another algorithm".
    void run(const std::string& what, const GemmCall& c, cudaStream_t stream) {
        Plan& p = get_plan(what, c);
        if (c.fp8) set_scale_pointers(what, p, c);
        const float alpha = 1.0f, beta = c.accumulate ? 1.0f : 0.0f;
        cublasStatus_t st = CUBLAS_STATUS_NOT_SUPPORTED;
        int i = 0;
        for (; i < p.num_algos && (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE); i++)
            st = cublasLtMatmul(handle_, p.desc, &alpha, c.a, p.a, c.b, p.b, &beta, c.d, p.d, c.d, p.d, &p.algos[i].algo,
                                workspace_.get(), WORKSPACE_BYTES, stream);
        cublas_check(st, strfmt("%s: cublasLtMatmul (%d of %d algorithms tried)", what.c_str(), i, p.num_algos));
        if (i > 1) std::swap(p.algos[0], p.algos[i - 1]);
    }
};

}  // namespace fp8rl

#endif  // FP8RL_FP8_GEMM_CUH
