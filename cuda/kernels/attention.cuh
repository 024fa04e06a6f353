// attention.cuh: causal GQA attention over packed variable-length sequences, forward and backward,
// in FlashAttention-2's structure (spec-gpu.md §3.4), on the tensor cores (cuda/kernels/mma.cuh).
//
// Layouts (those of the CPU engine, cpu/attention.h): q, out, dout, dq [T][H][D]; k, v, dk, dv
// [T][KV][D], all BF16; lse, delta [T][H] FP32. Sequence s is rows cu_seqlens[s] .. cu_seqlens[s+1]
// (int32 on the device, no padding), positions from 0; query head h reads kv head h / (H / KV).
// Scores scale by D^-1/2; lse is the log-sum-exp of the scaled scores of a row.
//
// The tile kernels run one warpgroup (4 warps) per CTA over tiles of 64 rows (16 per warp) kept in
// swizzled shared memory; every tile product is a warpgroup MMA (cuda/kernels/wgmma.cuh, sm_90a,
// SASS HGMMA), the probabilities P and dS rounded to BF16 in registers as its A operand:
//   forward     one CTA per (64-query block, head, sequence): loops over key tiles with an online
//               softmax (running max m, running sum l, O rescaled); writes O (BF16) and lse; the
//               softmax of a tile runs while the previous tile's P V is in flight (FA3's pipelining);
//               at D = 128 also O's FP8 1x128 operand for the O projection (a head's row is one
//               group), from the registers that hold O (perf-anchors.md: no standalone quantization);
//   delta       delta[t][h] = rowsum(dO * O), one thread per (row, head); in an fp8 training step
//               (block scaling) a CTA per 128 tokens x 128 columns, which also writes O's transposed
//               FP8 operand for the O wgrad from the O it reads;
//   dq          one CTA per (64-query block, head, sequence): recomputes P from lse over the key
//               tiles, dS = P (dP - delta) scale, dQ += dS K in FP32 registers, then the cast;
//   dk, dv      one CTA per (64-key block, kv head, sequence): loops over the group's query heads
//               and the query tiles at or after the block, dV += P^T dO, dK += dS^T Q in FP32
//               registers, then the cast.
// In the backward kernels P's exps run while dO V^T is in flight, and (dk, dv) dS's arithmetic while
// dV += P^T dO is: every kernel waits with a wgmma group in flight (wgmma.wait_group 1).
// FA2 folds dQ into the dK/dV kernel with atomic FP32 adds; here dQ has its own kernel (two more
// tile products) so that every output has one writer and a fixed summation order: the backward is
// deterministic, run to run, without a [key blocks][T][H][D] buffer of partial dQ.
// The softmax is FA2/FA3's, in the exp2 domain: P = 2^(s c - m c) with c = scale log2(e), one FFMA and
// one MUFU.EX2 (rl/numerics/exp2.h: ex2.approx.ftz.f32, whose FP32 twin the CPU engine and the
// emulation compute); lse stays natural (m scale + log(sum)) and the backward takes lse log2(e) once
// per row (dk/dv: per query of a tile, in shared memory). The CPU engine rounds at this tiling
// (rl/numerics/attention_tiles.h), so that it is this code's oracle to FP32 rounding and, on a real
// GPU, to ex2.approx's error (docs/gpu-engine.md, "Attention's exp2"). Masks cost only the tiles that
// need them: the forward's and dq's diagonal tile is peeled out of their loops (dq's next-to-last
// round too: its loop copies only full key tiles); dk/dv's queries past the sequence get lse = +inf.
// Head dims 8 (padded to 16 in shared memory), 16, 32, 64 and 128.
#ifndef FP8RL_CUDA_ATTENTION_CUH
#define FP8RL_CUDA_ATTENTION_CUH
#include <cmath>
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/element.cuh"
#include "cuda/kernels/fp8_rows.cuh"
#include "cuda/kernels/mma.cuh"
#include "cuda/kernels/wgmma.cuh"
#include "rl/numerics/attention_tiles.h"
#include "rl/numerics/exp2.h"

namespace fp8rl {

constexpr int kAttnWarps = 4;
constexpr int kAttnTile = 16 * kAttnWarps;  // rows of a query or key tile: 16 per warp
constexpr int kAttnThreads = 32 * kAttnWarps;
static_assert(kAttnWarps == 4, "the tile kernels are one warpgroup (4 warps) issuing warpgroup MMAs");
static_assert(kAttnTile == kFlashTile, "the CPU engine rounds at this tiling (rl/numerics/attention_tiles.h)");

// Head dim D padded to the MMAs' k extent of 16 (the columns past D are zeros and add nothing to a
// product); `frags` 16x8 accumulator blocks span them.
template <int D>
struct AttnTile {
    static constexpr int cols = D < 16 ? 16 : D, frags = cols / 8;
};

// Shapes of a packed batch: T rows in num_seqs sequences, none longer than max_seqlen.
struct PackedAttentionShape {
    long T;
    int H, KV, D, num_seqs, max_seqlen;
};

// The tiles, for the warpgroup MMA: 64 rows of D (padded to 16) BF16 columns, row-major in
// panels of 8W columns (W = min(cols / 8, 8) 16-byte chunks a row, the widest swizzle that fits),
// each row's chunks XORed with its row within the 8-row pattern: the layout TMA writes with a W x 16
// byte swizzle, and both a K-major operand (Q, K: rows x d) and an MN-major one (V: keys x d)
// of cuda/emu/emu_wgmma.cpp's canonical forms. Tiles start on 1024-byte boundaries (their sizes are
// multiples of 2048).
template <int D>
struct SwizzledTile {
    static constexpr int cols = D < 16 ? 16 : D, width = cols / 8 < 8 ? cols / 8 : 8, row_bytes = 16 * width,
                         panel_cols = 8 * width, panel_bytes = kAttnTile * row_bytes, bytes = kAttnTile * cols * 2;
    static constexpr WgmmaSwizzle swizzle = width == 8 ? WgmmaSwizzle::B128 : width == 4 ? WgmmaSwizzle::B64 : WgmmaSwizzle::B32;
    // Where the 16-byte chunk c (columns 8c .. 8c + 7) of row r lies.
    __device__ static int chunk_offset(int r, int c) {
        return (c / width) * panel_bytes + r * row_bytes + ((c % width) ^ ((r % 8) / (8 / width))) * 16;
    }
    // Where k step kk of a K-major operand starts (columns 16 kk ..), and k step kc of an MN-major one (rows 16 kc ..).
    FP8RL_HD static constexpr int k_major_offset(int kk) { return (16 * kk / panel_cols) * panel_bytes + (16 * kk % panel_cols) * 2; }
    FP8RL_HD static constexpr int mn_major_offset(int kc) { return 16 * kc * row_bytes; }
    // The descriptor of a K-major operand (rows x k = columns), k step kk.
    __device__ static uint64_t k_major(const unsigned char* tile, int kk) {
        return advanced(wgmma_descriptor(tile, 16, 8 * row_bytes, swizzle), k_major_offset(kk));
    }
    // The descriptor of an MN-major B operand (k = rows x n = columns), k step kc.
    __device__ static uint64_t mn_major(const unsigned char* tile, int kc) {
        return advanced(wgmma_descriptor(tile, panel_bytes, 8 * row_bytes, swizzle), mn_major_offset(kc));
    }
    // The same from k step 0's descriptor (k_major(tile, 0), mn_major(tile, 0)), computed once.
    __device__ static uint64_t k_major(uint64_t tile_desc, int kk) { return advanced(tile_desc, k_major_offset(kk)); }
    __device__ static uint64_t mn_major(uint64_t tile_desc, int kc) { return advanced(tile_desc, mn_major_offset(kc)); }
    // desc's operand `bytes` (a multiple of 16) further on: its start address field (bits 0-13, the
    // address / 16) plus bytes / 16, which cannot carry into the next field (shared memory ends below
    // 256 KiB), so one add of the tile's descriptor instead of each step's address arithmetic (a 64-bit
    // add: nvcc keeps the descriptor whole, where a 32-bit one made it move the high word again at
    // every wgmma). The same add moves a descriptor to another tile of the same layout.
    __device__ static uint64_t advanced(uint64_t desc, int bytes) {
        return desc + (uint32_t)bytes / 16;
    }
};

// cp.async of the 16 bytes at `src` (global) to `dst` (shared), or of 16 zero bytes where `zero`: PTX's
// ignore-src operand, one LDGSTS either way (the source is not read then, so it may lie past its
// tensor). __pipeline_memcpy_async's zfill form makes two predicated LDGSTS of the same pass.
__device__ __forceinline__ void copy_async_16(unsigned char* dst, const unsigned char* src, bool zero) {
#ifdef FP8RL_EMU
    __pipeline_memcpy_async(dst, src, 16, zero ? 16 : 0);
#else
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\ncp.async.cg.shared.global [%0], [%1], 16, p;\n}\n" ::"r"(
                     shared_window_address(dst)),
                 "l"(src), "r"((int)zero)
                 : "memory");
#endif
}

// One thread's share of a tile copy, its addresses computed once per kernel: thread i copies the
// 16-byte chunk c = i % chunks of rows i / chunks + row_step p (p < passes), so its column, its
// swizzle (row_step is a multiple of the 8-row pattern) and its offsets are the same in every tile,
// and a tile costs it `passes` x (a compare, a 64-bit address add, one cp.async of 16 bytes that
// zero-fills the rows past the end, SASS LDGSTS) instead of a per-chunk division, swizzle and 64-bit
// product; with no branch or zero store between them, ptxas puts its three never-executed `@!PT LDS`
// before the tile's first LDGSTS only. Two tiles of the same rows (K and V, Q and dO) share the
// compare; a tile known to be full (start_full) has none.
template <int D>
struct TileCopyPlan {
    using Tile = SwizzledTile<D>;
    static constexpr int chunks = Tile::cols / 8, row_step = kAttnThreads / chunks, passes = kAttnTile / row_step;
    static_assert(kAttnThreads % chunks == 0 && row_step % 8 == 0 && kAttnTile % row_step == 0,
                  "a thread's chunks of a tile share their column and swizzle");
    int first_row, smem_offset, column;  // the thread's first row, its chunk's byte offset in a tile, 8c

    __device__ TileCopyPlan() {
        const int c = (int)threadIdx.x % chunks;
        first_row = (int)threadIdx.x / chunks, column = 8 * c, smem_offset = Tile::chunk_offset(first_row, c);
    }

    // Starts the copy of tile row r = row (row0 + r) of a [T][heads][D] tensor at `src` (already
    // offset to the head), rows of `row_stride` elements, by cp.async; zeros for r >= rows and in the
    // padding columns (zero-filled by the copy: they land with it). Every thread of the CTA
    // (kAttnThreads) takes part; the caller commits the group, waits for it, fences the async proxy
    // (the MMAs read through it) and syncs.
    __device__ __forceinline__ void start(unsigned char* tile, const __nv_bfloat16* src, long row_stride, long row0,
                                          int rows) const {
        start_from(tile, source(src, row_stride) + row0 * row_stride * (long)sizeof(__nv_bfloat16), row_stride, rows);
    }
    // This thread's first chunk (row first_row, column `column`) of the tile whose row 0 is src's row 0.
    __device__ __forceinline__ const unsigned char* source(const __nv_bfloat16* src, long row_stride) const {
        return reinterpret_cast<const unsigned char*>(src + first_row * row_stride + column);
    }
    // start() from `from`, source()'s chunk moved to the tile's first row: a kernel that walks tiles
    // moves one pointer by a tile's rows instead of multiplying out each tile's 64-bit address.
    __device__ __forceinline__ void start_from(unsigned char* tile, const unsigned char* from, long row_stride, int rows) const {
        const Tiles<1> t{{tile}, {from}};
        copy_passes(t, row_stride, rows);
    }
    // start_from() of two tiles of the same rows of two tensors of the same layout: one compare a pass for both.
    __device__ __forceinline__ void start_from(unsigned char* tile_a, const unsigned char* from_a, unsigned char* tile_b,
                                               const unsigned char* from_b, long row_stride, int rows) const {
        const Tiles<2> t{{tile_a, tile_b}, {from_a, from_b}};
        copy_passes(t, row_stride, rows);
    }
    // start_from() of two tiles whose kAttnTile rows all lie before the tensors' end: no compares.
    __device__ __forceinline__ void start_full(unsigned char* tile_a, const unsigned char* from_a, unsigned char* tile_b,
                                               const unsigned char* from_b, long row_stride) const {
        const Tiles<2> t{{tile_a, tile_b}, {from_a, from_b}};
        copy_passes(t, row_stride, kAttnTile, std::true_type());
    }

  private:
    template <int N>
    struct Tiles {
        unsigned char* tile[N];
        const unsigned char* from[N];
    };
    template <int N, class Full = std::false_type>
    __device__ __forceinline__ void copy_passes(const Tiles<N>& t, long row_stride, int rows, Full = {}) const {
        const long from_step = row_step * row_stride * (long)sizeof(__nv_bfloat16);
        FP8RL_UNROLL
        for (int p = 0; p < passes; p++) {
            const bool zero = !(column < D && (Full::value || first_row + p * row_step < rows));
            for (int i = 0; i < N; i++) copy_async_16(t.tile[i] + smem_offset + p * row_step * Tile::row_bytes, t.from[i] + p * from_step, zero);
        }
    }
};

// Keeps wgmma descriptors computed once in registers: nvcc otherwise encodes them again from the
// tiles' addresses in every round of a loop (5 uniform instructions each). No effect in the emulation.
__device__ __forceinline__ void keep_computed(uint64_t& descriptor) {
#ifndef FP8RL_EMU
    asm volatile("" : "+l"(descriptor));
#else
    (void)descriptor;
#endif
}
template <class... Descriptors>
__device__ __forceinline__ void keep_computed(uint64_t& first, Descriptors&... rest) {
    keep_computed(first);
    keep_computed(rest...);
}

// A warp's 16 rows of a [64 x 64] score product: register 4j + i is element i of the C fragment
// block of columns 8j .. 8j + 7.
using ScoreAccumulator = WgmmaAccumulator<kAttnTile>;

// Issues d = A B^T [64 x 64] for the 64 rows A[64][D] of tile `a` and B[64][D] of tile `b`; the k steps
// of 16 run in order, as the CPU engine sums (its oracle). The caller fences before and commits after.
template <int D>
__device__ void issue_product_abt(ScoreAccumulator& d, uint64_t a_desc, uint64_t b_desc) {
    using Tile = SwizzledTile<D>;
    for (int kk = 0; kk < Tile::cols / 16; kk++)
        d.template mma<false, false>(Tile::k_major(a_desc, kk), Tile::k_major(b_desc, kk), kk > 0);
}
template <int D>
__device__ void issue_product_abt(ScoreAccumulator& d, const unsigned char* a, const unsigned char* b) {
    issue_product_abt<D>(d, SwizzledTile<D>::k_major(a, 0), SwizzledTile<D>::k_major(b, 0));
}

// The warp's share of a completed score product as C fragment blocks: s[j] holds columns 8j .. 8j + 7.
__device__ __forceinline__ void scores_of(float s[8][4], ScoreAccumulator& d) {
    for (int j = 0; j < 8; j++)
        for (int i = 0; i < 4; i++) s[j][i] = d[4 * j + i];
}

// The warp's P[16 x 64] (C fragment blocks) rounded to BF16 as the k steps of 16 of a register A
// operand (pack_c_as_a's layout), as FA2/FA3 feed P.
__device__ __forceinline__ void pack_fragments(WgmmaFragmentA (&f)[4], const float p[8][4]) {
    for (int kc = 0; kc < 4; kc++) {
        uint32_t packed[4];
        pack_c_as_a(packed, p[2 * kc], p[2 * kc + 1]);
        for (int r = 0; r < 4; r++) f[kc][r] = packed[r];
    }
}

// Issues acc[64 x D] += P B for the warpgroup's P[64][64] in registers (pack_fragments) and the 64 rows
// B[64][D] of tile `b`; register 4n + i of acc is element i of C block n. The caller fences and commits.
template <int D>
__device__ void issue_product_pb(WgmmaAccumulator<AttnTile<D>::cols>& acc, const WgmmaFragmentA (&p)[4], uint64_t b_desc) {
    for (int kc = 0; kc < 4; kc++) acc.template mma<true>(p[kc], SwizzledTile<D>::mn_major(b_desc, kc), true);
}
template <int D>
__device__ void issue_product_pb(WgmmaAccumulator<AttnTile<D>::cols>& acc, const WgmmaFragmentA (&p)[4],
                                 const unsigned char* b) {
    issue_product_pb<D>(acc, p, SwizzledTile<D>::mn_major(b, 0));
}

template <int D>
__device__ void zero_accumulator(WgmmaAccumulator<AttnTile<D>::cols>& acc) {
    for (int r = 0; r < AttnTile<D>::cols / 2; r++) acc[r] = 0.0f;
}

// The sum (or max) of v over the 4 lanes that hold one row of a C fragment.
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xFFFFFFFFu, v, 1);
    return v + __shfl_xor_sync(0xFFFFFFFFu, v, 2);
}
__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 2));
}

// The warp's acc[16 x D], times factor_lo in rows g and factor_hi in rows g + 8, rounded to BF16 in
// pairs: pairs[2n + half] holds registers 4n + 2 half and 4n + 2 half + 1 (row g + 8 half, columns
// 8n + 2t and 8n + 2t + 1 of the lane's t = lane % 4), the low half first.
template <int D>
using BF16Pairs = uint32_t[AttnTile<D>::cols / 4];
template <int D>
__device__ void round_rows_bf16(BF16Pairs<D>& pairs, WgmmaAccumulator<AttnTile<D>::cols>& acc, float factor_lo, float factor_hi) {
    for (int n = 0; n < AttnTile<D>::frags; n++)
        for (int half = 0; half < 2; half++) {  // rows g, g + 8
            const float factor = half ? factor_hi : factor_lo;
            pairs[2 * n + half] = pack_floats_bf16(acc[4 * n + 2 * half] * factor, acc[4 * n + 2 * half + 1] * factor);
        }
}

// Writes the pairs as BF16 rows row0 .. row0 + 15 of a [T][heads][D] tensor at `dst` (already offset
// to the head): the rows below `row_end`, the columns below D (the rest is padding), a pair a 4-byte store.
template <int D>
__device__ void store_rows_bf16(__nv_bfloat16* dst, long row_stride, long row0, long row_end, const BF16Pairs<D>& pairs) {
    for (int n = 0; n < AttnTile<D>::frags; n++)
        for (int half = 0; half < 2; half++) {
            const long row = row0 + c_fragment_row(2 * half);
            const int col = 8 * n + c_fragment_col(0);
            if (row < row_end && col < D) store_vector<uint32_t>(dst + row * row_stride + col, pairs[2 * n + half]);
        }
}

// The warp's acc[16 x D] as BF16 rows (above).
template <int D>
__device__ void store_rows_bf16(__nv_bfloat16* dst, long row_stride, long row0, long row_end,
                                WgmmaAccumulator<AttnTile<D>::cols>& acc) {
    BF16Pairs<D> pairs;
    round_rows_bf16<D>(pairs, acc, 1.0f, 1.0f);
    store_rows_bf16<D>(dst, row_stride, row0, row_end, pairs);
}

// Whether the forward writes its output's FP8 1x128 operand too: where a head's row of D = 128
// columns is one group, which the CTA that computes the row holds whole.
FP8RL_HD constexpr bool attention_writes_fp8(int head_dim) { return head_dim == FP8_BLOCK; }

// The warp's BF16 rows O[16 x 128] (round_rows_bf16's pairs) quantized as group `group` of rows
// row0 .. row0 + 15 below row_end of the [rows][cols] operand `q8`: a row's amax over the quad's 4
// lanes, then the CPU quantizer's scale and codes (rl/numerics/fp8_block.h, fp8_quantize_rowwise).
// fmaxf(amax, |x|) is amax_update (a NaN dropped) in one FMNMX.
__device__ void store_rows_fp8(const Fp8RowsOut& q8, long cols, long row0, long row_end, int group,
                               const BF16Pairs<FP8_BLOCK>& pairs) {
    float v[2][FP8_BLOCK / 4], amax[2];  // rows g, g + 8: the lane's 32 values of the row, the row's amax
    for (int half = 0; half < 2; half++) {
        amax[half] = 0.0f;
        for (int n = 0; n < FP8_BLOCK / 8; n++) {
            const uint32_t w = pairs[2 * n + half];
            v[half][2 * n] = bits_float(w << 16), v[half][2 * n + 1] = bits_float(w & 0xFFFF0000u);
            amax[half] = fmaxf(amax[half], fmaxf(fabsf(v[half][2 * n]), fabsf(v[half][2 * n + 1])));
        }
        amax[half] = quad_max(amax[half]);
    }
    // lane t of a quad computes row g + 8 (t & 1)'s scale and its inverse (one division each a lane,
    // not two) and the quad shares the scales; lane t = half stores row g + 8 half's inverse
    const int t = lane_id() % 4, quad_lane0 = lane_id() - t;
    const float own_scale = fp8_scale_from_amax(t & 1 ? amax[1] : amax[0], q8.pow2), own_inverse = 1.0f / own_scale;
    const float scale[2] = {__shfl_sync(0xFFFFFFFFu, own_scale, quad_lane0), __shfl_sync(0xFFFFFFFFu, own_scale, quad_lane0 + 1)};
    for (int half = 0; half < 2; half++) {
        const long row = row0 + c_fragment_row(2 * half);
        if (row < row_end) {
            uint8_t* codes = q8.codes + row * cols + group * FP8_BLOCK + c_fragment_col(0);
            for (int n = 0; n < FP8_BLOCK / 8; n++)
                store_vector<uint16_t>(codes + 8 * n, encode_e4m3x2(v[half][2 * n] * scale[half], v[half][2 * n + 1] * scale[half]));
            if (t == half) q8.scale_inv[vec128_scale_index((int)row, group, q8.rows)] = own_inverse;
        }
    }
}

// One CTA (one warpgroup) per (query block blockIdx.x, head blockIdx.y, sequence blockIdx.z). Shared
// memory: the query tile, two key tiles and two value tiles, swizzled. The rounds are FA3's
// intra-warpgroup pipeline: round j issues S_j = Q K_j^T and O += P_{j-1} V_{j-1} as two commit
// groups, waits for the first alone (wgmma.wait_group 1) and runs the softmax of S_j while P V is in
// flight, then waits for it and rescales O. The copies run a round ahead: round j starts K_{j+1} and
// V_j (read in round j + 1). O sees the operations of an unpipelined loop in their order (O *=
// correction_j, then O += P_j V_j, k steps of 16 in order), so the CPU engine's tiling
// (rl/numerics/attention_tiles.h) stays this kernel's oracle. With `q8` (attention_writes_fp8(D)) the
// rows' FP8 operand too, and the first block of the last sequence zeroes the head's group in the
// operand's padding rows (T .. q8.rows: zero codes, an all-zero group's scale), a zero GEMM operand.
template <int D>
__global__ void __launch_bounds__(kAttnThreads)
    attention_forward_kernel(__nv_bfloat16* out, float* lse, const __nv_bfloat16* q, const __nv_bfloat16* k,
                             const __nv_bfloat16* v, const int* cu_seqlens, int H, int KV, const float* k_scale,
                             const float* v_scale, Fp8RowsOut q8) {
    using Tile = SwizzledTile<D>;
    DYNAMIC_SHARED(unsigned char, smem_raw);
    unsigned char* q_tile = align_shared_1024(smem_raw);
    unsigned char *k_tiles = q_tile + Tile::bytes, *v_tiles = k_tiles + 2 * Tile::bytes;  // key tile j: buffer j & 1
    const long seq_begin = cu_seqlens[blockIdx.z], seq_len = cu_seqlens[blockIdx.z + 1] - seq_begin;
    // (unsigned: positive operands, and the unsigned divisions are the shorter SASS)
    const int head = blockIdx.y, kv_head = (int)(blockIdx.y / ((unsigned)H / (unsigned)KV)), warp = threadIdx.x / 32;
    const long q0 = (long)blockIdx.x * kAttnTile;  // within the sequence
    const long ldq = (long)H * D, ldk = (long)KV * D;
    if constexpr (attention_writes_fp8(D)) {
        if (q8 && blockIdx.x == 0 && blockIdx.z + 1 == gridDim.z) {
            const long T = seq_begin + seq_len;
            constexpr int chunks = D / 16;  // 16-byte chunks of codes in a row's group
            FP8RL_NO_UNROLL
            for (long i = threadIdx.x; i < (q8.rows - T) * chunks; i += kAttnThreads) {
                const long row = T + i / chunks;
                store_vector<uint4>(q8.codes + row * ldq + head * D + 16 * (i % chunks), make_uint4(0, 0, 0, 0));
                if (i % chunks == 0) q8.scale_inv[vec128_scale_index((int)row, head, q8.rows)] = 1.0f / fp8_scale_from_amax(0.0f, q8.pow2);
            }
        }
    }
    if (q0 >= seq_len) return;
    const long key_end = min(q0 + kAttnTile, seq_len);  // causal: no row of the block sees a later key
    const int key_tiles = (int)((key_end + kAttnTile - 1) / kAttnTile);
    const TileCopyPlan<D> copy;
    // this thread's chunk of key and value tile 0; tile j's lies j x tile_bytes further on
    const unsigned char *k_from = copy.source(k + seq_begin * ldk + kv_head * D, ldk),
                        *v_from = copy.source(v + seq_begin * ldk + kv_head * D, ldk);
    const long tile_bytes = kAttnTile * ldk * (long)sizeof(__nv_bfloat16);
    const int key_count = (int)key_end;  // within the sequence, whose length is an int (max_seqlen)
    auto start_copy = [&](unsigned char* tiles, const unsigned char* from, int tile) {
        copy.start_from(tiles + (tile & 1) * Tile::bytes, from + tile * tile_bytes, ldk, min(kAttnTile, key_count - tile * kAttnTile));
    };
    copy.start(q_tile, q + seq_begin * ldq + head * D, ldq, q0, (int)(key_end - q0));
    start_copy(k_tiles, k_from, 0);
    __pipeline_commit();
    const float scale = 1.0f / sqrtf((float)D) * (k_scale ? k_scale[kv_head] : 1.0f);  // K scale: see attention_forward
    const float v_factor = v_scale ? v_scale[kv_head] : 1.0f;  // read here: the epilogue is then one code path
    const float c = exp2_domain(scale);  // scores to the exp2 domain
    const long warp_row0 = q0 + 16 * warp;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};  // rows g and g + 8 (raw scores); row_sum per lane
    ScoreAccumulator s_acc;
    WgmmaAccumulator<Tile::cols> o;  // register 4n + i: the C fragment block n, element i
    zero_accumulator<D>(o);
    WgmmaFragmentA p[4];  // the previous round's P, the A operand of O += P V
    // Round j's copies (K_{j+1} and V_j), then K_j and V_{j-1} (in round 0: Q and K_0) landed for every thread.
    auto copies_of_round = [&](int tile) {
        if (tile + 1 < key_tiles) start_copy(k_tiles, k_from, tile + 1);
        if (tile < key_tiles) start_copy(v_tiles, v_from, tile);
        __pipeline_commit();
        __pipeline_wait_prior(1);
        fence_proxy_async_shared();  // ... visible to the warpgroup MMA's reads
        __syncthreads();             // ... for every thread's copies
    };
    // The online softmax of the completed S_tile in the exp2 domain: s gets P = 2^(s c - max c)
    // (unnormalised), correction the factor of O and of the running sums. Only the block's last key
    // tile (the diagonal, and the sequence's end) holds keys a row must not see: `masked` (a
    // std::bool_constant) masks them; earlier tiles are all before the block's first query. Key 0 is
    // in the first tile and every row sees it, so the running max is finite from then on.
    auto softmax = [&](int tile, float s[8][4], float correction[2], auto masked) {
        scores_of(s, s_acc);
        if (decltype(masked)::value) {
            // row r sees key k0 + 8j + c_fragment_col(i) iff key <= r and key < key_end: iff its column
            // less the lane's first one, 8j + (i & 1), is below `visible` (once per row, 32-bit)
            const int k0 = tile * kAttnTile, col0 = c_fragment_col(0);
            int visible[2];
            for (int r = 0; r < 2; r++)
                visible[r] = min((int)warp_row0 + c_fragment_row(2 * r) + 1, key_count) - k0 - col0;
            for (int j = 0; j < 8; j++)
                for (int i = 0; i < 4; i++)
                    if (8 * j + (i & 1) >= visible[i >> 1]) s[j][i] = -INFINITY;
        }
        float tile_max[2] = {-INFINITY, -INFINITY}, max_c[2];
        for (int j = 0; j < 8; j++)
            for (int i = 0; i < 4; i++) tile_max[i >> 1] = fmaxf(tile_max[i >> 1], s[j][i]);
        for (int r = 0; r < 2; r++) {
            const float new_max = fmaxf(row_max[r], quad_max(tile_max[r]));
            max_c[r] = mul_rn(new_max, c);
            correction[r] = exp2_approx(mul_rn(row_max[r], c) - max_c[r]);  // 2^-inf = 0 in round 0
            row_max[r] = new_max;
            row_sum[r] *= correction[r];
        }
        for (int j = 0; j < 8; j++)
            for (int i = 0; i < 4; i++) {
                s[j][i] = exp2_fma(s[j][i], c, max_c[i >> 1]);  // masked: 2^-inf = 0
                row_sum[i >> 1] += s[j][i];
            }
    };
    float s[8][4], correction[2];
    copies_of_round(0);
    wgmma_fence();
    issue_product_abt<D>(s_acc, q_tile, k_tiles);
    wgmma_commit();
    wgmma_wait<0>(s_acc);
    softmax(0, s, correction, std::true_type());  // masked even where it is not the last tile: once per CTA
    pack_fragments(p, s);  // (O is zero: its correction, 2^-inf = 0, would leave it zero)
    __syncthreads();  // every warp is done with K_0 before round 1's copies refill its buffer
    auto round = [&](int tile, auto masked) {
        copies_of_round(tile);
        wgmma_fence();
        issue_product_abt<D>(s_acc, q_tile, k_tiles + (tile & 1) * Tile::bytes);
        wgmma_commit();
        issue_product_pb<D>(o, p, v_tiles + ((tile - 1) & 1) * Tile::bytes);
        wgmma_commit();
        wgmma_wait<1>(s_acc);  // S_tile has landed; O += P V of the previous tile stays in flight under the softmax
        softmax(tile, s, correction, masked);
        wgmma_wait<0>(o);
        for (int r = 0; r < Tile::cols / 2; r++) o[r] *= correction[(r >> 1) & 1];
        pack_fragments(p, s);
        __syncthreads();  // every warp is done with K_tile and V_{tile-1} before the next round's copies refill them
    };
    for (int tile = 1; tile < key_tiles - 1; tile++) round(tile, std::false_type());
    if (key_tiles > 1) round(key_tiles - 1, std::true_type());  // the diagonal tile, peeled out of the loop
    copies_of_round(key_tiles);
    wgmma_fence();
    issue_product_pb<D>(o, p, v_tiles + ((key_tiles - 1) & 1) * Tile::bytes);
    wgmma_commit();
    wgmma_wait<0>(o);
    float total[2], inv[2];
    for (int r = 0; r < 2; r++) total[r] = quad_sum(row_sum[r]), inv[r] = v_factor / total[r];
    const int lse_half = lane_id() % 4;  // lanes 0 and 1 of a quad write rows g and g + 8's lse: one logf a lane
    const long lse_row = warp_row0 + lane_id() / 4 + 8 * lse_half;
    if (lse_half < 2 && lse_row < seq_len)
        lse[(seq_begin + lse_row) * H + head] = fmaf(lse_half ? row_max[1] : row_max[0], scale, logf(lse_half ? total[1] : total[0]));
    BF16Pairs<D> o_bf16;  // O normalised, rounded: what `out` holds and what its FP8 operand quantizes
    round_rows_bf16<D>(o_bf16, o, inv[0], inv[1]);
    store_rows_bf16<D>(out + seq_begin * ldq + head * D, ldq, warp_row0, seq_len, o_bf16);
    if constexpr (attention_writes_fp8(D))
        if (q8) store_rows_fp8(q8, ldq, seq_begin + warp_row0, seq_begin + seq_len, head, o_bf16);
}

// delta[t][h] = sum_d dout[t][h][d] * out[t][h][d], one thread per (t, h): in d order from 0, every
// product rounded before its add (mul_rn: nvcc would fuse them), the CPU's dot_in_order. A template
// like the other kernels, so that the header defines it in every file that includes it without a
// duplicate symbol.
template <int D>
__global__ void attention_delta_kernel(float* delta, const __nv_bfloat16* dout, const __nv_bfloat16* out, long rows) {
    const long th = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (th >= rows) return;
    float sum = 0.0f;
    for (int d = 0; d < D; d++) sum += mul_rn(__bfloat162float(dout[th * D + d]), __bfloat162float(out[th * D + d]));
    delta[th] = sum;
}

// The delta kernel of an fp8 training step (block scaling), which also writes out's transposed FP8
// operand, the O wgrad's x^T (1x128 along tokens: fp8_rows.cuh's Fp8TransposedOut), so that no
// standalone pass reads out again for it. A CTA per tile of 128 tokens x 128 columns of out [T][H D]
// (128 / D whole heads; D divides 128): a thread per tile row loads its row of out and dout in 16-byte
// loads (8 of each in flight), sums delta as attention_delta_kernel does (the same bits) and stages
// out in the tile quantizer's swizzled FP32 tile; then fp8_gemm.cuh's quantize_tile_transposed writes
// the codes and scales from it, as the pass over out did. Rows past T are zeros (the engine's zeroed
// padding rows of out), up to the operand's rows.
constexpr int kDeltaTileThreads = FP8_BLOCK;  // a thread per tile row

template <int D>
__global__ void __launch_bounds__(kDeltaTileThreads)
    attention_delta_fp8_kernel(float* delta, const __nv_bfloat16* dout, const __nv_bfloat16* out, long T, int H,
                               Fp8TransposedOut out_t) {
    static_assert(FP8_BLOCK % D == 0 && D % 8 == 0, "whole heads of 8-value chunks in a tile row");
    constexpr int kChunks = FP8_BLOCK / 8, kInFlight = 8;  // 8-value chunks of a tile row; loads in flight
    DYNAMIC_SHARED(float, tile);  // [128][128], swizzled (tile_chunk)
    const int tile_c = blockIdx.x, tile_r = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int cols = H * D, c0 = tile_c * FP8_BLOCK;
    // tile row: the 8 lanes of a store phase take rows 4 apart, whose swizzles differ (no bank conflict)
    const int tr = 32 * warp + 4 * (lane % 8) + lane / 8;
    const long t = (long)tile_r * FP8_BLOCK + tr;
    const size_t row = (size_t)t * cols + c0;
    float sum = 0.0f;
    for (int b = 0; b < kChunks; b += kInFlight) {
        uint4 o_raw[kInFlight], d_raw[kInFlight];
        FP8RL_UNROLL
        for (int k = 0; k < kInFlight; k++) {  // every load issued before any value is used
            const bool inside = t < T && c0 + 8 * (b + k) < cols;
            o_raw[k] = inside ? load_vector<uint4>(out + row + 8 * (b + k)) : make_uint4(0u, 0u, 0u, 0u);
            d_raw[k] = inside ? load_vector<uint4>(dout + row + 8 * (b + k)) : make_uint4(0u, 0u, 0u, 0u);
        }
        FP8RL_UNROLL
        for (int k = 0; k < kInFlight; k++) {
            const int c = 8 * (b + k);  // the chunk's first column in the tile
            float o[8], d[8];
            TileLoad<__nv_bfloat16>::unpack(o_raw[k], o);
            TileLoad<__nv_bfloat16>::unpack(d_raw[k], d);
            for (int e = 0; e < 8; e++) sum += mul_rn(d[e], o[e]);
            if ((c + 8) % D == 0) {  // the head's last chunk
                if (t < T && c0 + c < cols) delta[t * H + (c0 + c) / D] = sum;
                sum = 0.0f;
            }
            *tile_chunk(tile, tr, c / 4) = make_float4(o[0], o[1], o[2], o[3]);
            *tile_chunk(tile, tr, c / 4 + 1) = make_float4(o[4], o[5], o[6], o[7]);
        }
    }
    __syncthreads();
    Fp8Amax block_scaling;  // 1x128 groups, no amax pass
    quantize_tile_transposed(tile, kDeltaTileThreads / 32, tile_r, tile_c, out_t.rows, cols, out_t.pow2, block_scaling,
                             out_t.codes, out_t.scale_inv);
}

// The warp's P for one tile pair: s holds A B^T of the score operands (queries x keys, or keys x
// queries) and becomes P = 2^(s c - lse log2(e)), c = exp2_domain(scale); entries where visible(j, i)
// is false become 0; lse2_of(j, i) gives the lse log2(e) of entry i of C fragment block j's query
// (its row, c_fragment_row(i), or column, 8 j + c_fragment_col(i)).
template <class Visible, class Lse2>
__device__ void probabilities(float s[8][4], float c, Visible visible, Lse2 lse2_of) {
    for (int j = 0; j < 8; j++)
        for (int i = 0; i < 4; i++) {
            const float p = exp2_fma(s[j][i], c, lse2_of(j, i));  // for every entry: no load under the mask's predicate
            s[j][i] = visible(j, i) ? p : 0.0f;
        }
}

// dS = P (dP - delta) scale in place of dp, the dO V^T product matching P; delta_of(j, i) as lse2_of above.
template <class Delta>
__device__ void dscores(float dp[8][4], const float p[8][4], float scale, Delta delta_of) {
    for (int j = 0; j < 8; j++)
        for (int i = 0; i < 4; i++) dp[j][i] = p[j][i] * (dp[j][i] - delta_of(j, i)) * scale;
}

// dq: one CTA per (query block blockIdx.x, head blockIdx.y, sequence blockIdx.z). Shared memory:
// the query and dO tiles and two buffers of (K, V) tiles.
template <int D>
__global__ void __launch_bounds__(kAttnThreads)
    attention_backward_dq_kernel(__nv_bfloat16* dq, const __nv_bfloat16* dout, const float* lse, const float* delta,
                                 const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                                 const int* cu_seqlens, int H, int KV) {
    using Tile = SwizzledTile<D>;
    constexpr int bytes = Tile::bytes;
    DYNAMIC_SHARED(unsigned char, smem_raw);
    unsigned char *q_tile = align_shared_1024(smem_raw), *do_tile = q_tile + bytes;
    unsigned char* kv_tiles = do_tile + bytes;  // buffer b: K at kv_tiles + 2 b bytes, V after it
    const long seq_begin = cu_seqlens[blockIdx.z], seq_len = cu_seqlens[blockIdx.z + 1] - seq_begin;
    const int head = blockIdx.y, kv_head = head / (H / KV), warp = threadIdx.x / 32;
    const long q0 = (long)blockIdx.x * kAttnTile;
    if (q0 >= seq_len) return;
    const long ldq = (long)H * D, ldk = (long)KV * D;
    const long key_end = min(q0 + kAttnTile, seq_len);
    const int key_tiles = (int)((key_end + kAttnTile - 1) / kAttnTile);
    const TileCopyPlan<D> copy;
    // this thread's chunk of key and value tile 0; tile j's lies j x tile_bytes further on
    const unsigned char *k_from = copy.source(k + seq_begin * ldk + kv_head * D, ldk),
                        *v_from = copy.source(v + seq_begin * ldk + kv_head * D, ldk);
    const long tile_bytes = kAttnTile * ldk * (long)sizeof(__nv_bfloat16);
    // Key tile `tile`'s K and V into buffer tile & 1; only the last (the diagonal) may end before 64 rows.
    auto load_key_tile = [&](int tile, auto full) {
        unsigned char* buf = kv_tiles + 2 * (tile & 1) * bytes;
        const long at = tile * tile_bytes;
        if (decltype(full)::value) copy.start_full(buf, k_from + at, buf + bytes, v_from + at, ldk);
        else copy.start_from(buf, k_from + at, buf + bytes, v_from + at, ldk, (int)min((long)kAttnTile, key_end - (long)tile * kAttnTile));
    };
    const long q_at = q0 * ldq * (long)sizeof(__nv_bfloat16);
    copy.start_from(q_tile, copy.source(q + seq_begin * ldq + head * D, ldq) + q_at, do_tile,
                    copy.source(dout + seq_begin * ldq + head * D, ldq) + q_at, ldq, (int)(key_end - q0));
    load_key_tile(0, std::false_type());
    __pipeline_commit();
    const float scale = 1.0f / sqrtf((float)D), c = exp2_domain(scale);
    const long warp_row0 = q0 + 16 * warp;
    float row_lse2[2], row_delta[2];  // rows g and g + 8 of the warp (lse log2(e)); rows past the sequence see no key
    for (int r = 0; r < 2; r++) {
        const long row = warp_row0 + lane_id() / 4 + 8 * r;
        row_lse2[r] = row < seq_len ? exp2_domain(lse[(seq_begin + row) * H + head]) : 0.0f;
        row_delta[r] = row < seq_len ? delta[(seq_begin + row) * H + head] : 0.0f;
    }
    // The tiles' descriptors, once: a round moves the key buffer's by a constant.
    uint64_t q_desc = Tile::k_major(q_tile, 0), do_desc = Tile::k_major(do_tile, 0), k_desc = Tile::k_major(kv_tiles, 0),
             k_mn_desc = Tile::mn_major(kv_tiles, 0);
    keep_computed(q_desc, do_desc, k_desc, k_mn_desc);
    ScoreAccumulator s_acc, dp_acc;
    WgmmaAccumulator<AttnTile<D>::cols> acc;
    zero_accumulator<D>(acc);
    // One key tile, and the copy of the next (`next`: 0 none, 1 the diagonal tile, 2 a full tile). Only
    // the last (the diagonal) holds keys a row must not see (`masked`, a std::bool_constant); the rows
    // past the sequence are not stored, and their dO and delta are 0.
    auto round = [&](int tile, auto masked, auto next) {
        if (decltype(next)::value != 0) load_key_tile(tile + 1, std::bool_constant<decltype(next)::value == 2>());
        __pipeline_commit();
        __pipeline_wait_prior(1);    // this tile's group (and in the first round the query and dO tiles') has landed
        fence_proxy_async_shared();  // ... visible to the warpgroup MMA's reads
        __syncthreads();             // ... for every thread's copies
        const long k0 = (long)tile * kAttnTile;
        const uint32_t buffer = 2 * (tile & 1) * bytes;
        wgmma_fence();
        issue_product_abt<D>(s_acc, q_desc, Tile::advanced(k_desc, buffer));
        wgmma_commit();
        issue_product_abt<D>(dp_acc, do_desc, Tile::advanced(k_desc, buffer + bytes));
        wgmma_commit();
        wgmma_wait<1>(s_acc);  // S has landed; dO V^T stays in flight under P's exps
        float p[8][4], ds[8][4];
        scores_of(p, s_acc);
        probabilities(
            p, c,
            [&](int j, int i) {
                const long query = warp_row0 + c_fragment_row(i);
                return !decltype(masked)::value || (query < seq_len && k0 + 8 * j + c_fragment_col(i) <= query);
            },
            [&](int, int i) { return row_lse2[i >> 1]; });
        wgmma_wait<0>(dp_acc);
        scores_of(ds, dp_acc);
        dscores(ds, p, scale, [&](int, int i) { return row_delta[i >> 1]; });
        WgmmaFragmentA ds_fragments[4];
        pack_fragments(ds_fragments, ds);
        wgmma_fence();
        issue_product_pb<D>(acc, ds_fragments, Tile::advanced(k_mn_desc, buffer));
        wgmma_commit();
        wgmma_wait<0>(acc);
        __syncthreads();  // every warp is done with this buffer before the next round's copy refills it
    };
    using Full = std::integral_constant<int, 2>;
    for (int tile = 0; tile < key_tiles - 2; tile++) round(tile, std::false_type(), Full());
    if (key_tiles > 1) round(key_tiles - 2, std::false_type(), std::integral_constant<int, 1>());  // loads the diagonal tile
    round(key_tiles - 1, std::true_type(), std::integral_constant<int, 0>());  // the diagonal tile, peeled out of the loop
    store_rows_bf16<D>(dq + seq_begin * ldq + head * D, ldq, warp_row0, seq_len, acc);
}

// dk, dv: one CTA per (key block blockIdx.x, kv head blockIdx.y, sequence blockIdx.z); it walks the
// (query head of the group, query tile at or after the block) pairs, head-major. Shared memory: the
// key and value tiles, then two buffers of (Q, dO tiles, lse log2(e) and delta of the query tile).
// A query past the sequence gets lse = +inf (and delta 0, its Q and dO rows zeros), so that its P is
// 2^(0 - inf) = 0 without a test: only the diagonal tile's causal mask is left to the elements.
template <int D>
__global__ void __launch_bounds__(kAttnThreads)
    attention_backward_dkv_kernel(__nv_bfloat16* dk, __nv_bfloat16* dv, const __nv_bfloat16* dout, const float* lse,
                                  const float* delta, const __nv_bfloat16* q, const __nv_bfloat16* k,
                                  const __nv_bfloat16* v, const int* cu_seqlens, int H, int KV) {
    using Tile = SwizzledTile<D>;
    constexpr int bytes = Tile::bytes;
    static_assert(kAttnThreads >= kAttnTile, "a thread per query of a tile copies its lse and delta");
    DYNAMIC_SHARED(unsigned char, smem_raw);
    unsigned char *k_tile = align_shared_1024(smem_raw), *v_tile = k_tile + bytes;
    unsigned char* qdo_tiles = v_tile + bytes;  // buffer b: Q at qdo_tiles + 2 b bytes, dO after it
    float* stat_tiles = reinterpret_cast<float*>(qdo_tiles + 4 * bytes);  // buffer b: lse at 2 b kAttnTile, delta after
    const long seq_begin = cu_seqlens[blockIdx.z], seq_len = cu_seqlens[blockIdx.z + 1] - seq_begin;
    const int kv_head = blockIdx.y, group = H / KV, warp = threadIdx.x / 32;
    const long k0 = (long)blockIdx.x * kAttnTile;
    if (k0 >= seq_len) return;
    const long ldq = (long)H * D, ldk = (long)KV * D;
    const int keys = (int)min((long)kAttnTile, seq_len - k0);
    const int query_tiles = (int)((seq_len - k0 + kAttnTile - 1) / kAttnTile);  // causal: earlier queries do not see the block
    const TileCopyPlan<D> copy;
    // this thread's chunk of the query and dO tiles at row 0 and head 0
    const unsigned char *q_from = copy.source(q + seq_begin * ldq, ldq), *do_from = copy.source(dout + seq_begin * ldq, ldq);
    // Thread r < kAttnTile copies query r's lse and delta of a tile: their rows at query tile 0
    const long stat_row = (seq_begin + k0 + (long)threadIdx.x) * H;
    const float *lse_row = lse + stat_row, *delta_row = delta + stat_row;
    // The copies of step (head, query tile) into buffer `buffer`: the last query tile of a head may end before 64 rows.
    auto load_query_tile = [&](int head, int tile, int buffer) {
        const long q0 = k0 + (long)tile * kAttnTile;
        const int queries = (int)min((long)kAttnTile, seq_len - q0);
        unsigned char* buf = qdo_tiles + 2 * buffer * bytes;
        const long at = (q0 * ldq + head * D) * (long)sizeof(__nv_bfloat16);
        copy.start_from(buf, q_from + at, buf + bytes, do_from + at, ldq, queries);
        float* stats = stat_tiles + 2 * buffer * kAttnTile;
        const int r = threadIdx.x;
        if (r < kAttnTile) {
            if (r < queries) {
                const long at = (long)tile * kAttnTile * H + head;
                __pipeline_memcpy_async(stats + r, lse_row + at, sizeof(float));
                __pipeline_memcpy_async(stats + kAttnTile + r, delta_row + at, sizeof(float));
            } else {
                stats[r] = INFINITY, stats[kAttnTile + r] = 0.0f;
            }
        }
    };
    const long k_at = k0 * ldk * (long)sizeof(__nv_bfloat16);
    copy.start_from(k_tile, copy.source(k + seq_begin * ldk + kv_head * D, ldk) + k_at, v_tile,
                    copy.source(v + seq_begin * ldk + kv_head * D, ldk) + k_at, ldk, keys);
    load_query_tile(kv_head * group, 0, 0);
    __pipeline_commit();
    const float scale = 1.0f / sqrtf((float)D), c = exp2_domain(scale);
    const long warp_key0 = k0 + 16 * warp;
    // The tiles' descriptors, once: a step moves the query buffer's by a constant.
    uint64_t k_desc = Tile::k_major(k_tile, 0), v_desc = Tile::k_major(v_tile, 0), q_desc = Tile::k_major(qdo_tiles, 0),
             q_mn_desc = Tile::mn_major(qdo_tiles, 0);
    keep_computed(k_desc, v_desc, q_desc, q_mn_desc);
    ScoreAccumulator st_acc, dpt_acc;
    WgmmaAccumulator<AttnTile<D>::cols> dk_acc, dv_acc;
    zero_accumulator<D>(dk_acc);
    zero_accumulator<D>(dv_acc);
    const int steps = group * query_tiles;
    int tile = 0, next_head = kv_head * group, next_tile = 1;  // this step's query tile, the next step's (head, tile)
    if (next_tile == query_tiles) next_head++, next_tile = 0;
    for (int step = 0; step < steps; step++) {
        if (step + 1 < steps) load_query_tile(next_head, next_tile, (step + 1) & 1);
        __pipeline_commit();
        __pipeline_wait_prior(1);  // this step's group (and in the first round the key and value tiles') has landed
        const int buffer = step & 1;
        float* lse_tile = stat_tiles + 2 * buffer * kAttnTile;
        const float* delta_tile = lse_tile + kAttnTile;
        if (threadIdx.x < kAttnTile) lse_tile[threadIdx.x] = exp2_domain(lse_tile[threadIdx.x]);  // the thread's own copy
        fence_proxy_async_shared();  // ... visible to the warpgroup MMA's reads
        __syncthreads();             // ... for every thread's copies
        const int key_offset = (int)(warp_key0 - k0) - tile * kAttnTile;  // the warp's first key less the tile's first query
        const uint32_t qdo = 2 * buffer * bytes;
        // keys x queries: S^T = K Q^T, dP^T = V dO^T; dV += P^T dO runs under dS's arithmetic
        wgmma_fence();
        issue_product_abt<D>(st_acc, k_desc, Tile::advanced(q_desc, qdo));
        wgmma_commit();
        issue_product_abt<D>(dpt_acc, v_desc, Tile::advanced(q_desc, qdo + bytes));
        wgmma_commit();
        wgmma_wait<1>(st_acc);  // S^T has landed; V dO^T stays in flight under P's exps
        float pt[8][4], dst[8][4];
        scores_of(pt, st_acc);
        // the lane's queries: columns 8 j + 2t and 8 j + 2t + 1 (t = lane % 4), one 8-byte load a pair
        float2 lse2[8], delta2[8];
        for (int j = 0; j < 8; j++) lse2[j] = reinterpret_cast<const float2*>(lse_tile)[4 * j + lane_id() % 4];
        // key row - query col = 8 (i >> 1) - 8 j - (i & 1) + above: the diagonal tile's causal mask
        const int above = lane_id() / 4 - 2 * (lane_id() % 4) + key_offset;
        probabilities(
            pt, c, [&](int j, int i) { return 8 * ((i >> 1) - j) - (i & 1) + above <= 0; },
            [&](int j, int i) { return i & 1 ? lse2[j].y : lse2[j].x; });
        WgmmaFragmentA p_fragments[4], ds_fragments[4];
        pack_fragments(p_fragments, pt);
        wgmma_fence();
        issue_product_pb<D>(dv_acc, p_fragments, Tile::advanced(q_mn_desc, qdo + bytes));
        wgmma_commit();
        wgmma_wait<1>(dpt_acc);  // dP^T has landed; dV += P^T dO stays in flight
        scores_of(dst, dpt_acc);
        for (int j = 0; j < 8; j++) delta2[j] = reinterpret_cast<const float2*>(delta_tile)[4 * j + lane_id() % 4];
        dscores(dst, pt, scale, [&](int j, int i) { return i & 1 ? delta2[j].y : delta2[j].x; });
        pack_fragments(ds_fragments, dst);
        wgmma_fence();
        issue_product_pb<D>(dk_acc, ds_fragments, Tile::advanced(q_mn_desc, qdo));
        wgmma_commit();
        wgmma_wait<0>(dk_acc, dv_acc);
        __syncthreads();  // every warp is done with this buffer before the next round's copy refills it
        tile = next_tile;
        if (++next_tile == query_tiles) next_head++, next_tile = 0;
    }
    store_rows_bf16<D>(dk + seq_begin * ldk + kv_head * D, ldk, warp_key0, seq_len, dk_acc);
    store_rows_bf16<D>(dv + seq_begin * ldk + kv_head * D, ldk, warp_key0, seq_len, dv_acc);
}

// Calls f(std::integral_constant<int, D>()) with D = head_dim if the kernels support it; else fails
// naming `who`.
template <class F>
void with_head_dim(const char* who, int head_dim, F f) {
    switch (head_dim) {
        case 8:
            return f(std::integral_constant<int, 8>());
        case 16:
            return f(std::integral_constant<int, 16>());
        case 32:
            return f(std::integral_constant<int, 32>());
        case 64:
            return f(std::integral_constant<int, 64>());
        case 128:
            return f(std::integral_constant<int, 128>());
        default:
            fail("%s: head dim D = %d is not supported (8, 16, 32, 64 or 128)", who, head_dim);
    }
}

// Checks a packed batch's shapes against what the kernels support; names the wrong one.
inline void check_attention_shape(const char* who, const PackedAttentionShape& s) {
    with_head_dim(who, s.D, [](auto) {});
    if (s.H < 1 || s.KV < 1 || s.H % s.KV != 0)
        fail("%s: heads H = %d must be a positive multiple of kv heads KV = %d", who, s.H, s.KV);
    if (s.T < 0 || s.num_seqs < 0 || s.max_seqlen > s.T || s.max_seqlen < (s.T > 0 ? 1 : 0))
        fail("%s: T = %ld, num_seqs = %d, max_seqlen = %d: need 1 <= max_seqlen <= T (or T = 0)", who, s.T, s.num_seqs,
             s.max_seqlen);
    if (s.H > 65535 || s.num_seqs > 65535)
        fail("%s: H = %d or num_seqs = %d exceeds a grid dimension (65535)", who, s.H, s.num_seqs);
}

// One CTA per (tile of the longest sequence, head, sequence).
inline dim3 attention_grid(const PackedAttentionShape& s, int heads) {
    return dim3((unsigned)((s.max_seqlen + kAttnTile - 1) / kAttnTile), (unsigned)heads, (unsigned)s.num_seqs);
}

// Dynamic shared memory of `tiles` tiles of head dim D plus `extra` bytes, allowed above 48 KB for `kernel` (once).
template <int D, class Kernel>
size_t attention_smem(Kernel kernel, int tiles, size_t extra) {
    const size_t bytes = (size_t)tiles * SwizzledTile<D>::bytes + extra + 1024;  // 1024: to align the tiles
    allow_dynamic_smem(kernel, bytes);
    return bytes;
}

template <int D>
void attention_forward_d(__nv_bfloat16* out, float* lse, const __nv_bfloat16* q, const __nv_bfloat16* k,
                         const __nv_bfloat16* v, const int* cu_seqlens, const PackedAttentionShape& s,
                         cudaStream_t stream, const float* k_scale, const float* v_scale, const Fp8RowsOut& q8) {
    const size_t smem = attention_smem<D>(attention_forward_kernel<D>, 5, 0);
    LAUNCH_KERNEL(attention_forward_kernel<D>, attention_grid(s, s.H), kAttnThreads, smem, stream, out, lse, q, k, v,
                  cu_seqlens, s.H, s.KV, k_scale, v_scale, q8);
}

template <int D>
void attention_backward_d(__nv_bfloat16* dq, __nv_bfloat16* dk, __nv_bfloat16* dv, float* delta,
                          const __nv_bfloat16* dout, const __nv_bfloat16* out, const float* lse, const __nv_bfloat16* q,
                          const __nv_bfloat16* k, const __nv_bfloat16* v, const int* cu_seqlens,
                          const PackedAttentionShape& s, cudaStream_t stream, const Fp8TransposedOut& out_t) {
    if (out_t) {
        allow_tile_smem(attention_delta_fp8_kernel<D>);
        const dim3 grid(fp8_num_blocks(s.H * D), fp8_num_blocks(out_t.rows));
        LAUNCH_KERNEL(attention_delta_fp8_kernel<D>, grid, kDeltaTileThreads, TILE_BYTES, stream, delta, dout, out, s.T,
                      s.H, out_t);
    } else {
        const long rows = s.T * s.H;
        LAUNCH_KERNEL(attention_delta_kernel<D>, (unsigned)((rows + 255) / 256), 256, 0, stream, delta, dout, out, rows);
    }
    const size_t dq_smem = attention_smem<D>(attention_backward_dq_kernel<D>, 6, 0);
    LAUNCH_KERNEL(attention_backward_dq_kernel<D>, attention_grid(s, s.H), kAttnThreads, dq_smem, stream, dq, dout, lse,
                  delta, q, k, v, cu_seqlens, s.H, s.KV);
    const size_t dkv_smem = attention_smem<D>(attention_backward_dkv_kernel<D>, 6, 4 * kAttnTile * sizeof(float));
    LAUNCH_KERNEL(attention_backward_dkv_kernel<D>, attention_grid(s, s.KV), kAttnThreads, dkv_smem, stream, dk, dv,
                  dout, lse, delta, q, k, v, cu_seqlens, s.H, s.KV);
}

// Forward: out [T][H][D], lse [T][H] from q [T][H][D], k, v [T][KV][D]; cu_seqlens [num_seqs + 1]
// on the device, increasing from 0 to T, no sequence longer than max_seqlen. k_scale, v_scale [KV] on
// the device (null: 1): K and V are FP8 codes' values (--train_kv_replay, kv_replay.cuh), read as
// decode reads them: a KV head's K scale joins the scores' D^-1/2, its V scale the output's 1 / sum
// (the CPU engine's attention_forward_packed). q8: out's FP8 1x128 operand [q8.rows >= T][H D] as
// well (fp8_rows.cuh; the rows past T zero), where attention_writes_fp8(D).

inline void attention_forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* q, const __nv_bfloat16* k,
                              const __nv_bfloat16* v, const int* cu_seqlens, const PackedAttentionShape& s,
                              cudaStream_t stream, const float* k_scale = nullptr, const float* v_scale = nullptr,
                              const Fp8RowsOut& q8 = {}) {
    check_attention_shape("attention_forward", s);
    if (q8) {
        if (!attention_writes_fp8(s.D))
            fail("attention_forward: an FP8 output needs head dim D = %d (one 1x128 group a head's row); got %d: quantize "
                 "the BF16 output instead (quantize_rows_gpu)", FP8_BLOCK, s.D);
        check_fp8_rows_out("attention_forward", s.T, s.H * s.D, q8);
    }
    if (s.T == 0 || s.num_seqs == 0) return;
    with_head_dim("attention", s.D, [&](auto head_dim) {
        attention_forward_d<decltype(head_dim)::value>(out, lse, q, k, v, cu_seqlens, s, stream, k_scale, v_scale, q8);
    });
}

// Backward: dq [T][H][D], dk, dv [T][KV][D] from dout, out [T][H][D] and lse [T][H] of the forward;
// delta [T][H] is scratch (rowsum(dout * out)). Same cu_seqlens and shape as the forward. out_t: out's
// transposed FP8 operand (the O wgrad's, 1x128 along tokens) [H D][out_t.rows >= T] as well (the rows
// past T zero), written by the delta kernel from the out it reads; out and dout 16-byte aligned.
inline void attention_backward(__nv_bfloat16* dq, __nv_bfloat16* dk, __nv_bfloat16* dv, float* delta,
                               const __nv_bfloat16* dout, const __nv_bfloat16* out, const float* lse,
                               const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                               const int* cu_seqlens, const PackedAttentionShape& s, cudaStream_t stream,
                               const Fp8TransposedOut& out_t = {}) {
    check_attention_shape("attention_backward", s);
    if (out_t) {
        check_fp8_transposed_out("attention_backward", s.T, s.H * s.D, out_t);
        if ((uintptr_t)out % 16 || (uintptr_t)dout % 16)
            fail("attention_backward: writing out's FP8 operand reads out and dout in 16-byte loads; they are not "
                 "16-byte aligned");
    }
    if (s.T == 0 || s.num_seqs == 0) return;
    with_head_dim("attention", s.D, [&](auto head_dim) {
        attention_backward_d<decltype(head_dim)::value>(dq, dk, dv, delta, dout, out, lse, q, k, v, cu_seqlens, s,
                                                        stream, out_t);
    });
}

}  // namespace fp8rl

#endif  // FP8RL_CUDA_ATTENTION_CUH
