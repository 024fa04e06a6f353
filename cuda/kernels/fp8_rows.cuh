// fp8_rows.cuh: the FP8 1x128 operand of a GEMM, written by the kernel that produces the values
// (the norms, SwiGLU, attention at D = 128) or by one pass over a BF16 tensor (the attention output
// at other head dims, or replaced rows: --train_kv_replay), never by a second
// standalone pass over what a producer just wrote (issue 28; Transformer Engine and DeepGEMM fuse
// the cast into the kernel before the GEMM). The codes and scales are those of fp8_gemm.cuh's
// quantize_rowwise_kernel and the CPU's fp8_quantize_rowwise, bit for bit: per row r and group kb of
// 128 columns, scale = fp8_scale_from_amax(max |x|), codes = e4m3(x * scale), scale_inv = 1 / scale
// at vec128_scale_index(r, kb, rows).
//
// Thread layout: a half warp quantizes one group, lane j of the half holding its 8 values
// 8j .. 8j + 7, so one row's 128 BF16 values are one 16-byte load per lane and its codes one 8-byte
// store (codes by encode_e4m3x4: the hardware conversion on the device); the half warp's amax is
// four xor shuffles. Vector accesses go through load_vector / store_vector (aligned, or the
// emulation faults as a GPU would).
#ifndef FP8RL_CUDA_FP8_ROWS_CUH
#define FP8RL_CUDA_FP8_ROWS_CUH
#include "cuda/element.cuh"
#include "fp8_gemm.cuh"  // tile_chunk: the tile quantizer's staged tile
#include "rl/numerics/bf16.h"
#include "rl/numerics/fp8.h"
#include "rl/numerics/fp8_block.h"

#include <cstdint>

namespace fp8rl {

// Where a producer writes the FP8 operand of a [rows][cols] tensor: codes [rows][cols], scale_inv
// VEC128 [ceil(cols / 128)][rows]. rows counts the GEMM's padded rows; rows past the producer's real
// ones get zero codes (an all-zero group's scale), so the padding is a zero operand.
struct Fp8RowsOut {
    uint8_t* codes = nullptr;
    float* scale_inv = nullptr;
    int rows = 0;
    bool pow2 = false;
    FP8RL_HD explicit operator bool() const { return codes != nullptr; }
};

constexpr int kGroupLanes = FP8_BLOCK / 8;  // lanes of a half warp, 8 values each

// v[0..8) = p[0..count) as floats, zeros past count (count <= 8): one 16-byte load when all 8 are
// there and p is 16-byte aligned.
__device__ __forceinline__ void load8(const __nv_bfloat16* p, int count, float v[8]) {
    if (count >= 8 && ((uintptr_t)p & 15) == 0) {
        const uint4 raw = load_vector<uint4>(p);
        const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};  // element 2i in the low half of word i
        for (int e = 0; e < 8; e++) v[e] = bf16_to_float((uint16_t)(words[e / 2] >> (16 * (e % 2))));
        return;
    }
    for (int e = 0; e < 8; e++) v[e] = e < count ? __bfloat162float(p[e]) : 0.0f;
}
__device__ __forceinline__ void load8(const float* p, int count, float v[8]) {
    if (count >= 8 && ((uintptr_t)p & 15) == 0) {
        const float4 a = load_vector<float4>(p), b = load_vector<float4>(p + 4);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
        return;
    }
    for (int e = 0; e < 8; e++) v[e] = e < count ? p[e] : 0.0f;
}

// load8 of data the kernel itself writes (an accumulated output): not through the read-only path.
__device__ __forceinline__ void load8_written(const __nv_bfloat16* p, int count, float v[8]) {
    if (count >= 8 && ((uintptr_t)p & 15) == 0) {
        const uint4 raw = load_vector_written<uint4>(p);
        const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
        for (int e = 0; e < 8; e++) v[e] = bf16_to_float((uint16_t)(words[e / 2] >> (16 * (e % 2))));
        return;
    }
    for (int e = 0; e < 8; e++) v[e] = e < count ? __bfloat162float(p[e]) : 0.0f;
}
__device__ __forceinline__ void load8_written(const float* p, int count, float v[8]) {
    if (count >= 8 && ((uintptr_t)p & 15) == 0) {
        const float4 a = load_vector_written<float4>(p), b = load_vector_written<float4>(p + 4);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
        return;
    }
    for (int e = 0; e < 8; e++) v[e] = e < count ? p[e] : 0.0f;
}

// p[0..count) = v rounded to BF16 (count <= 8): one 16-byte store when whole and aligned.
__device__ __forceinline__ void store8(__nv_bfloat16* p, int count, const float v[8]) {
    if (count >= 8 && ((uintptr_t)p & 15) == 0) {
        uint32_t words[4];
        for (int i = 0; i < 4; i++) words[i] = float_to_bf16(v[2 * i]) | (uint32_t)float_to_bf16(v[2 * i + 1]) << 16;
        store_vector<uint4>(p, make_uint4(words[0], words[1], words[2], words[3]));
        return;
    }
    for (int e = 0; e < count; e++) p[e] = __float2bfloat16_rn(v[e]);
}

__device__ __forceinline__ void store8(float* p, int count, const float v[8]) {
    if (count >= 8 && ((uintptr_t)p & 15) == 0) {
        store_vector<float4>(p, make_float4(v[0], v[1], v[2], v[3]));
        store_vector<float4>(p + 4, make_float4(v[4], v[5], v[6], v[7]));
        return;
    }
    for (int e = 0; e < count; e++) p[e] = v[e];
}

// The max over the 16 lanes of this lane's half warp. Every lane of the warp must call it.
__device__ __forceinline__ float half_warp_amax(float amax) {
    for (int offset = kGroupLanes / 2; offset > 0; offset /= 2) {
        const float other = __shfl_xor_sync(0xFFFFFFFFu, amax, offset);
        amax = other > amax ? other : amax;  // never NaN: amax_update drops NaN
    }
    return amax;
}

// Group kb of row r, whose values this lane holds as v (elements 8 * lane16 .. of the group, zeros
// past the tensor), quantized into `out`: codes for the count = cols - kb * 128 - 8 * lane16 (at most
// 8) of this lane's values inside the tensor, and the scale by the half warp's first lane. Every
// lane of the warp must call it (both halves: the shuffles are warp-wide).
__device__ inline void quantize_group8(const float v[8], int r, int kb, int cols, const Fp8RowsOut& out) {
    const int lane16 = threadIdx.x % kGroupLanes, c = kb * FP8_BLOCK + lane16 * 8;
    float amax = 0.0f;
    for (int e = 0; e < 8; e++) amax = amax_update(amax, v[e]);
    const float scale = fp8_scale_from_amax(half_warp_amax(amax), out.pow2);
    const int count = c < cols ? min(8, cols - c) : 0;
    uint8_t* codes = out.codes + (size_t)r * cols + c;
    if (count == 8) {  // cols is a multiple of 16 (check_fp8_rows_out): the 8 codes are 8-byte aligned
        store_vector<uint2>(codes, make_uint2(encode_e4m3x4(v[0] * scale, v[1] * scale, v[2] * scale, v[3] * scale),
                                              encode_e4m3x4(v[4] * scale, v[5] * scale, v[6] * scale, v[7] * scale)));
    } else {
        for (int e = 0; e < count; e++) codes[e] = (uint8_t)encode_e4m3x2(v[e] * scale, 0.0f);
    }
    if (lane16 == 0 && kb * FP8_BLOCK < cols) out.scale_inv[vec128_scale_index(r, kb, out.rows)] = 1.0f / scale;
}

// The transposed FP8 operand of an activation x [rows][cols] kept for its weight gradient: x^T
// quantized 1x128 along rows (codes [cols][rows], VEC128 scales [ceil(rows / 128)][cols]), written in
// a training forward by x's producer (with the rowwise operand, from one tile: fp8_gemm.cuh's
// quantize_rowwise_kernel), so the backward needs neither a BF16 x nor a pass over it.
struct Fp8Transposed {
    uint8_t* codes = nullptr;
    float* scale_inv = nullptr;
    explicit operator bool() const { return codes != nullptr; }
};

// Where a producer writes the transposed FP8 operand of a [rows][cols] tensor (a weight gradient's
// x^T, 1x128 along rows): codes [cols][rows], VEC128 scale_inv [ceil(rows / 128)][cols]. rows counts
// the GEMM's padded rows; rows past the producer's real ones are zero values (zero codes).
struct Fp8TransposedOut {
    uint8_t* codes = nullptr;
    float* scale_inv = nullptr;
    int rows = 0;
    bool pow2 = false;
    FP8RL_HD explicit operator bool() const { return codes != nullptr; }
    Fp8Transposed operand() const { return {codes, scale_inv}; }  // as the wgrad reads it
};

// Stages tile (r0, c0) of a [rows][cols] tensor that a producer computes, as the tile quantizer's
// sources do (fp8_gemm.cuh's TensorTile): a thread per 8 columns of a tile row, value(r, c, count,
// out) filling out[0..count) (count = the 8 columns inside the tensor, <= 8; out zeroed before) for
// the real rows r < valid, zeros elsewhere (a GEMM's padding rows). Ends with __syncthreads().
template <class Value>
__device__ inline void stage_computed_tile(int rows, int cols, int valid, int r0, int c0, float* tile, const Value& value) {
    constexpr int kSegments = FP8_BLOCK / 8;  // of a tile row
    for (int v = threadIdx.x; v < FP8_BLOCK * kSegments; v += blockDim.x) {
        const int tr = v / kSegments, c = c0 + v % kSegments * 8, r = r0 + tr;
        float out[8] = {};
        if (r < valid && r < rows && c < cols) value(r, c, min(8, cols - c), out);
        *tile_chunk(tile, tr, (c - c0) / 4) = make_float4(out[0], out[1], out[2], out[3]);
        *tile_chunk(tile, tr, (c - c0) / 4 + 1) = make_float4(out[4], out[5], out[6], out[7]);
    }
    __syncthreads();
}

// A producer's FP8 output for `rows` real rows of `cols` values: 16-column multiples (the GEMMs'
// k and the 8-byte code stores), room for the real rows.
inline void check_fp8_rows_out(const char* who, long rows, int cols, const Fp8RowsOut& out) {
    if (cols % 16) fail("%s: an FP8 operand needs a multiple of 16 columns (got %d)", who, cols);
    if (rows < 0 || rows > out.rows) fail("%s: %ld real rows in an FP8 operand of %d rows", who, rows, out.rows);
    if (!out.scale_inv) fail("%s: the FP8 operand has codes but no scales", who);
}

inline void check_fp8_transposed_out(const char* who, long rows, int cols, const Fp8TransposedOut& out) {
    if (cols % 16) fail("%s: an FP8 operand needs a multiple of 16 columns (got %d)", who, cols);
    if (rows < 0 || rows > out.rows) fail("%s: %ld real rows in a transposed FP8 operand of %d rows", who, rows, out.rows);
    if (!out.scale_inv) fail("%s: the transposed FP8 operand has codes but no scales", who);
}

// The groups of a row of `cols` values are handled two per warp; a warp's pairs, for a loop whose
// trip count is the same for both halves: group = first + 2 * step + (lane / 16).
FP8RL_HD int group_pairs(int cols) { return (fp8_num_blocks(cols) + 1) / 2; }

// ---------------------------------------------------------------------------------------------
// One pass over a BF16 tensor x [rows][cols] (its first `valid` rows real, the rest zeros) into its
// FP8 operand: the attention output before the O projection where attention does not write it
// (attention.cuh's attention_writes_fp8). Block (r, j) covers the groups
// 16 j .. 16 j + 15 of row r.

inline constexpr int kRowsQuantThreads = 256;

__global__ void __launch_bounds__(kRowsQuantThreads)
    quantize_rows_kernel(const __nv_bfloat16* x, int valid, int cols, Fp8RowsOut out) {
    const int r = blockIdx.x, warp = threadIdx.x / 32, lane16 = threadIdx.x % kGroupLanes;
    const int pair = blockIdx.y * (kRowsQuantThreads / 32) + warp, kb = pair * 2 + (threadIdx.x % 32) / kGroupLanes;
    if (pair >= group_pairs(cols)) return;  // the whole warp
    const int c = kb * FP8_BLOCK + lane16 * 8;
    float v[8];
    load8(x + (size_t)r * cols + c, r < valid && c < cols ? min(8, cols - c) : 0, v);
    quantize_group8(v, r, kb, cols, out);
}

// The FP8 operand of x [out.rows][cols] (rows past `valid` zero) written to `out`.
inline void quantize_rows_gpu(const __nv_bfloat16* x, int valid, int cols, const Fp8RowsOut& out, cudaStream_t stream) {
    check_fp8_rows_out("quantize_rows_gpu", valid, cols, out);
    if (out.rows == 0) return;
    const int warps = kRowsQuantThreads / 32;
    const dim3 grid((unsigned)out.rows, (unsigned)((group_pairs(cols) + warps - 1) / warps));
    LAUNCH_KERNEL(quantize_rows_kernel, grid, kRowsQuantThreads, 0, stream, x, valid, cols, out);
}

}  // namespace fp8rl

#endif  // FP8RL_CUDA_FP8_ROWS_CUH
