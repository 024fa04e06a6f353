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
// per row (dk/dv: per query column it reads). The CPU engine rounds at this tiling
// (rl/numerics/attention_tiles.h), so that it is this code's oracle to FP32 rounding and, on a real
// GPU, to ex2.approx's error (docs/gpu-engine.md, "Attention's exp2"). Masks cost only the tiles that
// need them: the forward's and dq's diagonal tile is peeled out of their loops.
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
    // The descriptor of a K-major operand (rows x k = columns), k step kk (columns 16 kk ..).
    __device__ static uint64_t k_major(const unsigned char* tile, int kk) {
        const int k0 = 16 * kk;
        return wgmma_descriptor(tile + (k0 / panel_cols) * panel_bytes + (k0 % panel_cols) * 2, 16, 8 * row_bytes, swizzle);
    }
    // The descriptor of an MN-major B operand (k = rows x n = columns), k step kc (rows 16 kc ..).
    __device__ static uint64_t mn_major(const unsigned char* tile, int kc) {
        return wgmma_descriptor(tile + 16 * kc * row_bytes, panel_bytes, 8 * row_bytes, swizzle);
    }
};

// One thread's share of a tile copy, its addresses computed once per kernel: thread i copies the
// 16-byte chunk c = i % chunks of rows i / chunks + row_step p (p < passes), so its column, its
// swizzle (row_step is a multiple of the 8-row pattern) and its offsets are the same in every tile,
// and a tile costs it `passes` x (a compare, two address adds, one cp.async of 16 bytes, SASS LDGSTS)
// instead of a per-chunk division, swizzle and 64-bit product.
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
    // offset to the head), rows of `row_stride` elements, by cp.async; zeros, stored at once, for
    // r >= rows and in the padding columns. Every thread of the CTA (kAttnThreads) takes part; the
    // caller commits the group, waits for it, fences the async proxy (the MMAs read through it) and syncs.
    __device__ __forceinline__ void start(unsigned char* tile, const __nv_bfloat16* src, long row_stride, long row0,
                                          int rows) const {
        const __nv_bfloat16* from = src + (row0 + first_row) * row_stride + column;
        unsigned char* to = tile + smem_offset;
        const long from_step = row_step * row_stride;
        FP8RL_UNROLL
        for (int p = 0; p < passes; p++) {
            if (column < D && first_row + p * row_step < rows)
                __pipeline_memcpy_async(to + p * row_step * Tile::row_bytes, from + p * from_step, 16);
            else
                *reinterpret_cast<uint4*>(to + p * row_step * Tile::row_bytes) = make_uint4(0, 0, 0, 0);
        }
    }
};

// A warp's 16 rows of a [64 x 64] score product: register 4j + i is element i of the C fragment
// block of columns 8j .. 8j + 7.
using ScoreAccumulator = WgmmaAccumulator<kAttnTile>;

// Issues d = A B^T [64 x 64] for the 64 rows A[64][D] of tile `a` and B[64][D] of tile `b`; the k steps
// of 16 run in order, as the CPU engine sums (its oracle). The caller fences before and commits after.
template <int D>
__device__ void issue_product_abt(ScoreAccumulator& d, const unsigned char* a, const unsigned char* b) {
    using Tile = SwizzledTile<D>;
    for (int kk = 0; kk < Tile::cols / 16; kk++) d.template mma<false, false>(Tile::k_major(a, kk), Tile::k_major(b, kk), kk > 0);
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
__device__ void issue_product_pb(WgmmaAccumulator<AttnTile<D>::cols>& acc, const WgmmaFragmentA (&p)[4],
                                 const unsigned char* b) {
    for (int kc = 0; kc < 4; kc++) acc.template mma<true>(p[kc], SwizzledTile<D>::mn_major(b, kc), true);
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
    float v[2][FP8_BLOCK / 4], scale[2];  // rows g, g + 8: the lane's 32 values of the row, the row's scale
    for (int half = 0; half < 2; half++) {
        float amax = 0.0f;
        for (int n = 0; n < FP8_BLOCK / 8; n++) {
            const uint32_t w = pairs[2 * n + half];
            v[half][2 * n] = bits_float(w << 16), v[half][2 * n + 1] = bits_float(w & 0xFFFF0000u);
            amax = fmaxf(amax, fmaxf(fabsf(v[half][2 * n]), fabsf(v[half][2 * n + 1])));
        }
        scale[half] = fp8_scale_from_amax(quad_max(amax), q8.pow2);
    }
    for (int half = 0; half < 2; half++) {
        const long row = row0 + c_fragment_row(2 * half);
        if (row >= row_end) return;  // and row g + 8
        uint8_t* codes = q8.codes + row * cols + group * FP8_BLOCK + c_fragment_col(0);
        for (int n = 0; n < FP8_BLOCK / 8; n++)
            store_vector<uint16_t>(codes + 8 * n, encode_e4m3x2(v[half][2 * n] * scale[half], v[half][2 * n + 1] * scale[half]));
        if (lane_id() % 4 == 0) q8.scale_inv[vec128_scale_index((int)row, group, q8.rows)] = 1.0f / scale[half];
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
    const int head = blockIdx.y, kv_head = head / (H / KV), warp = threadIdx.x / 32;
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
    const __nv_bfloat16 *k_src = k + seq_begin * ldk + kv_head * D, *v_src = v + seq_begin * ldk + kv_head * D;
    const TileCopyPlan<D> copy;
    auto start_copy = [&](unsigned char* tiles, const __nv_bfloat16* src, int tile) {
        const long k0 = (long)tile * kAttnTile;
        copy.start(tiles + (tile & 1) * Tile::bytes, src, ldk, k0, (int)min((long)kAttnTile, key_end - k0));
    };
    copy.start(q_tile, q + seq_begin * ldq + head * D, ldq, q0, (int)(key_end - q0));
    start_copy(k_tiles, k_src, 0);
    __pipeline_commit();
    const float scale = 1.0f / sqrtf((float)D) * (k_scale ? k_scale[kv_head] : 1.0f);  // K scale: see attention_forward
    const float c = exp2_domain(scale);  // scores to the exp2 domain
    const long warp_row0 = q0 + 16 * warp;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};  // rows g and g + 8 (raw scores); row_sum per lane
    ScoreAccumulator s_acc;
    WgmmaAccumulator<Tile::cols> o;  // register 4n + i: the C fragment block n, element i
    zero_accumulator<D>(o);
    WgmmaFragmentA p[4];  // the previous round's P, the A operand of O += P V
    // Round j's copies (K_{j+1} and V_j), then K_j and V_{j-1} (in round 0: Q and K_0) landed for every thread.
    auto copies_of_round = [&](int tile) {
        if (tile + 1 < key_tiles) start_copy(k_tiles, k_src, tile + 1);
        if (tile < key_tiles) start_copy(v_tiles, v_src, tile);
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
            const long k0 = (long)tile * kAttnTile;
            for (int j = 0; j < 8; j++)
                for (int i = 0; i < 4; i++) {
                    const long key = k0 + 8 * j + c_fragment_col(i), row = warp_row0 + c_fragment_row(i);
                    if (!(key <= row && key < key_end)) s[j][i] = -INFINITY;
                }
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
    for (int r = 0; r < Tile::cols / 2; r++) o[r] *= correction[(r >> 1) & 1];
    pack_fragments(p, s);
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
    float inv[2];
    for (int r = 0; r < 2; r++) {
        const float total = quad_sum(row_sum[r]);
        inv[r] = (v_scale ? v_scale[kv_head] : 1.0f) / total;
        const long row = warp_row0 + lane_id() / 4 + 8 * r;
        if (lane_id() % 4 == 0 && row < seq_len) lse[(seq_begin + row) * H + head] = fmaf(row_max[r], scale, logf(total));
    }
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
// queries) and becomes P = 2^(s c - lse log2(e)), c = exp2_domain(scale); entries where visible(row,
// col) is false become 0; lse2_of gives a query's lse log2(e) by its (row or column) index within the tiles.
template <class Visible, class Lse2>
__device__ void probabilities(float s[8][4], float c, Visible visible, Lse2 lse2_of) {
    for (int j = 0; j < 8; j++)
        for (int i = 0; i < 4; i++) {
            const int row = c_fragment_row(i), col = 8 * j + c_fragment_col(i);
            s[j][i] = visible(row, col) ? exp2_fma(s[j][i], c, lse2_of(row, col)) : 0.0f;
        }
}

// dS = P (dP - delta) scale in place of dp, the dO V^T product matching P.
template <class Delta>
__device__ void dscores(float dp[8][4], const float p[8][4], float scale, Delta delta_of) {
    for (int j = 0; j < 8; j++)
        for (int i = 0; i < 4; i++) {
            const int row = c_fragment_row(i), col = 8 * j + c_fragment_col(i);
            dp[j][i] = p[j][i] * (dp[j][i] - delta_of(row, col)) * scale;
        }
}

// dq: one CTA per (query block blockIdx.x, head blockIdx.y, sequence blockIdx.z). Shared memory:
// the query and dO tiles and two buffers of (K, V) tiles.
template <int D>
__global__ void __launch_bounds__(kAttnThreads)
    attention_backward_dq_kernel(__nv_bfloat16* dq, const __nv_bfloat16* dout, const float* lse, const float* delta,
                                 const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                                 const int* cu_seqlens, int H, int KV) {
    constexpr int bytes = SwizzledTile<D>::bytes;
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
    const __nv_bfloat16 *k_src = k + seq_begin * ldk + kv_head * D, *v_src = v + seq_begin * ldk + kv_head * D;
    const TileCopyPlan<D> copy;
    auto load_key_tile = [&](int tile) {
        const long k0 = (long)tile * kAttnTile;
        unsigned char* buf = kv_tiles + 2 * (tile & 1) * bytes;
        const int rows = (int)min((long)kAttnTile, key_end - k0);
        copy.start(buf, k_src, ldk, k0, rows);
        copy.start(buf + bytes, v_src, ldk, k0, rows);
    };
    copy.start(q_tile, q + seq_begin * ldq + head * D, ldq, q0, (int)(key_end - q0));
    copy.start(do_tile, dout + seq_begin * ldq + head * D, ldq, q0, (int)(key_end - q0));
    load_key_tile(0);
    __pipeline_commit();
    const float scale = 1.0f / sqrtf((float)D), c = exp2_domain(scale);
    const long warp_row0 = q0 + 16 * warp;
    float row_lse2[2], row_delta[2];  // rows g and g + 8 of the warp (lse log2(e)); rows past the sequence see no key
    for (int r = 0; r < 2; r++) {
        const long row = warp_row0 + lane_id() / 4 + 8 * r;
        row_lse2[r] = row < seq_len ? exp2_domain(lse[(seq_begin + row) * H + head]) : 0.0f;
        row_delta[r] = row < seq_len ? delta[(seq_begin + row) * H + head] : 0.0f;
    }
    ScoreAccumulator s_acc, dp_acc;
    WgmmaAccumulator<AttnTile<D>::cols> acc;
    zero_accumulator<D>(acc);
    // One key tile. Only the last (the diagonal) holds keys a row must not see (`masked`, a
    // std::bool_constant); the rows past the sequence are not stored, and their dO and delta are 0.
    auto round = [&](int tile, auto masked) {
        if (tile + 1 < key_tiles) load_key_tile(tile + 1);
        __pipeline_commit();
        __pipeline_wait_prior(1);    // this tile's group (and in the first round the query and dO tiles') has landed
        fence_proxy_async_shared();  // ... visible to the warpgroup MMA's reads
        __syncthreads();             // ... for every thread's copies
        const long k0 = (long)tile * kAttnTile;
        const unsigned char *k_tile = kv_tiles + 2 * (tile & 1) * bytes, *v_tile = k_tile + bytes;
        wgmma_fence();
        issue_product_abt<D>(s_acc, q_tile, k_tile);
        wgmma_commit();
        issue_product_abt<D>(dp_acc, do_tile, v_tile);
        wgmma_commit();
        wgmma_wait<1>(s_acc);  // S has landed; dO V^T stays in flight under P's exps
        float p[8][4], ds[8][4];
        scores_of(p, s_acc);
        probabilities(
            p, c,
            [&](int row, int col) {
                const long query = warp_row0 + row;
                return !decltype(masked)::value || (query < seq_len && k0 + col <= query);
            },
            [&](int row, int) { return row_lse2[row >> 3]; });
        wgmma_wait<0>(dp_acc);
        scores_of(ds, dp_acc);
        dscores(ds, p, scale, [&](int row, int) { return row_delta[row >> 3]; });
        WgmmaFragmentA ds_fragments[4];
        pack_fragments(ds_fragments, ds);
        wgmma_fence();
        issue_product_pb<D>(acc, ds_fragments, k_tile);
        wgmma_commit();
        wgmma_wait<0>(acc);
        __syncthreads();  // every warp is done with this buffer before the next round's copy refills it
    };
    for (int tile = 0; tile < key_tiles - 1; tile++) round(tile, std::false_type());
    round(key_tiles - 1, std::true_type());  // the diagonal tile, peeled out of the loop
    store_rows_bf16<D>(dq + seq_begin * ldq + head * D, ldq, warp_row0, seq_len, acc);
}

// dk, dv: one CTA per (key block blockIdx.x, kv head blockIdx.y, sequence blockIdx.z); it walks the
// (query head of the group, query tile at or after the block) pairs, head-major. Shared memory: the
// key and value tiles, then two buffers of (Q, dO tiles, lse and delta of the query tile).
template <int D>
__global__ void __launch_bounds__(kAttnThreads)
    attention_backward_dkv_kernel(__nv_bfloat16* dk, __nv_bfloat16* dv, const __nv_bfloat16* dout, const float* lse,
                                  const float* delta, const __nv_bfloat16* q, const __nv_bfloat16* k,
                                  const __nv_bfloat16* v, const int* cu_seqlens, int H, int KV) {
    constexpr int bytes = SwizzledTile<D>::bytes;
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
    auto load_query_tile = [&](int step) {
        const int head = kv_head * group + step / query_tiles;
        const long q0 = k0 + (long)(step % query_tiles) * kAttnTile;
        const int queries = (int)min((long)kAttnTile, seq_len - q0);
        unsigned char* buf = qdo_tiles + 2 * (step & 1) * bytes;
        copy.start(buf, q + seq_begin * ldq + head * D, ldq, q0, queries);
        copy.start(buf + bytes, dout + seq_begin * ldq + head * D, ldq, q0, queries);
        float* stats = stat_tiles + 2 * (step & 1) * kAttnTile;
        for (int r = threadIdx.x; r < kAttnTile; r += blockDim.x)
            if (r < queries) {
                __pipeline_memcpy_async(stats + r, lse + (seq_begin + q0 + r) * H + head, sizeof(float));
                __pipeline_memcpy_async(stats + kAttnTile + r, delta + (seq_begin + q0 + r) * H + head, sizeof(float));
            } else {
                stats[r] = stats[kAttnTile + r] = 0.0f;
            }
    };
    copy.start(k_tile, k + seq_begin * ldk + kv_head * D, ldk, k0, keys);
    copy.start(v_tile, v + seq_begin * ldk + kv_head * D, ldk, k0, keys);
    load_query_tile(0);
    __pipeline_commit();
    const float scale = 1.0f / sqrtf((float)D), c = exp2_domain(scale);
    const long warp_key0 = k0 + 16 * warp;
    ScoreAccumulator st_acc, dpt_acc;
    WgmmaAccumulator<AttnTile<D>::cols> dk_acc, dv_acc;
    zero_accumulator<D>(dk_acc);
    zero_accumulator<D>(dv_acc);
    const int steps = group * query_tiles;
    for (int step = 0; step < steps; step++) {
        if (step + 1 < steps) load_query_tile(step + 1);
        __pipeline_commit();
        __pipeline_wait_prior(1);    // this step's group (and in the first round the key and value tiles') has landed
        fence_proxy_async_shared();  // ... visible to the warpgroup MMA's reads
        __syncthreads();             // ... for every thread's copies
        const long q0 = k0 + (long)(step % query_tiles) * kAttnTile;
        const int queries = (int)min((long)kAttnTile, seq_len - q0);
        const unsigned char *q_tile = qdo_tiles + 2 * (step & 1) * bytes, *do_tile = q_tile + bytes;
        const float *lse_tile = stat_tiles + 2 * (step & 1) * kAttnTile, *delta_tile = lse_tile + kAttnTile;
        const int key_offset = (int)(warp_key0 - q0);  // the warp's first key less the tile's first query: >= -kAttnTile
        // keys x queries: S^T = K Q^T, dP^T = V dO^T; dV += P^T dO runs under dS's arithmetic
        wgmma_fence();
        issue_product_abt<D>(st_acc, k_tile, q_tile);
        wgmma_commit();
        issue_product_abt<D>(dpt_acc, v_tile, do_tile);
        wgmma_commit();
        wgmma_wait<1>(st_acc);  // S^T has landed; V dO^T stays in flight under P's exps
        float pt[8][4], dst[8][4];
        scores_of(pt, st_acc);
        probabilities(
            pt, c, [&](int row, int col) { return col < queries && row + key_offset <= col; },
            [&](int, int col) { return exp2_domain(lse_tile[col]); });
        WgmmaFragmentA p_fragments[4], ds_fragments[4];
        pack_fragments(p_fragments, pt);
        wgmma_fence();
        issue_product_pb<D>(dv_acc, p_fragments, do_tile);
        wgmma_commit();
        wgmma_wait<1>(dpt_acc);  // dP^T has landed; dV += P^T dO stays in flight
        scores_of(dst, dpt_acc);
        dscores(dst, pt, scale, [&](int, int col) { return delta_tile[col]; });
        pack_fragments(ds_fragments, dst);
        wgmma_fence();
        issue_product_pb<D>(dk_acc, ds_fragments, q_tile);
        wgmma_commit();
        wgmma_wait<0>(dk_acc, dv_acc);
        __syncthreads();  // every warp is done with this buffer before the next round's copy refills it
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
