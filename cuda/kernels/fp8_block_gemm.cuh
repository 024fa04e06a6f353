// fp8_block_gemm.cuh: fp8rl's own block-scaled FP8 GEMM on Hopper's warpgroup MMA, for the trainer's
// projection GEMMs (fprop, dgrad, wgrad: cuda/kernels/linear.cuh), in DeepGEMM's structure without
// TMA (the emulation has none):
//   D [n][m] (+)= B [n][k] . A [m][k]^T, E4M3 operands, A's scales BLK128x128 (a weight: fprop,
//   dgrad) or VEC128 (x^T: wgrad), B's VEC128, FP32 or BF16 D; m, n, k multiples of 128.
// Its bits are cuBLASLt's as the emulation computes them (cuda/emu/emu_cublaslt.cpp) and the CPU
// engine's (cpu/fp8_gemm_ref.h): for each output (row j of n, column i of m) and each 128-wide k block
// kb in order, block = 0 + the 128 exact products added one by one in k order (FP32), then
// part = fma(block, sa(i, kb) * sb(j, kb), part), one rounding (DeepGEMM's promotion, one FFMA), part from 0;
// D = part (+ C when accumulating, FP32 D), a BF16 D rounded to nearest even.
//
// A CTA computes a 128 x 128 tile of D (128 rows of n, 128 columns of m) with two warpgroups, each
// 64 rows (wgmma's M) by the 128 columns (N = 128). Shared memory holds a ring of kBlockGemmStages
// k blocks: per stage B's 128 rows and A's 128 rows of one k block (128 bytes a row: one 128-byte
// swizzle row, both K-major, as E4M3 wgmma requires) and their scales, filled by cp.async from
// addresses each thread computes once (BlockGemmCopyPlan). For k block kb every thread
//   waits for the block's copies, fences the async proxy and syncs (the CTA's copies landed, and
//   every thread is done with the stage of kb - 2: its wgmmas waited for, its scales read);
//   issues 4 wgmma.m64n128k32 (the k steps of 32 in order, the first not accumulating: block from
//   0) into one of two accumulators, then the copies of block kb + kBlockGemmAhead into that stage;
//   waits for block kb - 1's wgmmas (wait depth 1: block kb's stay in flight) and promotes them
//   into part with their scales while the tensor cores run block kb's.
// DeepGEMM promotes the same way (two math warpgroups, FP32 accumulators promoted per 128-block);
// it copies by TMA from a producer warpgroup, which the emulation does not have yet.
#ifndef FP8RL_CUDA_FP8_BLOCK_GEMM_CUH
#define FP8RL_CUDA_FP8_BLOCK_GEMM_CUH
#include <cstdint>
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/element.cuh"
#include "cuda/kernels/mma.cuh"
#include "cuda/kernels/wgmma.cuh"
#include "rl/numerics/fp8_block.h"

namespace fp8rl {

constexpr int kBlockGemmTile = 128;                   // rows of n and columns of m a CTA computes
constexpr int kBlockGemmK = FP8_BLOCK;                // one k block (128 E4M3 = one 128-byte swizzle row)
constexpr int kBlockGemmWarpgroups = 2;               // each 64 rows (wgmma M)
constexpr int kBlockGemmThreads = 128 * kBlockGemmWarpgroups;
constexpr int kBlockGemmStages = 6;                   // stages of the shared-memory ring
constexpr int kBlockGemmAhead = kBlockGemmStages - 2;  // k blocks copied ahead of the one whose wgmmas issue
constexpr int kBlockGemmOperandBytes = kBlockGemmTile * kBlockGemmK;  // 16 KiB: one operand's k block
constexpr int kBlockGemmStageBytes = 2 * kBlockGemmOperandBytes;      // B's rows, then A's
constexpr int kBlockGemmScaleFloats = 2 * kBlockGemmTile;             // a stage's scales: B's rows, then A's columns
// The ring, its scales, and 1024 bytes to start the ring on a swizzle pattern's boundary.
constexpr size_t kBlockGemmSmemBytes =
    (size_t)kBlockGemmStages * (kBlockGemmStageBytes + kBlockGemmScaleFloats * sizeof(float)) + 1024;
static_assert(kBlockGemmK == 128 && kBlockGemmTile == 128, "a stage row is one 128-byte swizzle row");

// One thread's share of a stage's copies, its addresses computed once per kernel (attention.cuh's
// TileCopyPlan): thread i copies 16-byte chunk c = i % 8 of operand rows i / 8 + 32 p (p < 4) of both
// operands, so its swizzled offset (chunk c ^ row % 8; rows 32 apart share it) and its sources are
// fixed, and a k block moves them 128 bytes on. Threads 0-31 also copy 16 bytes of B's scales, 32-63
// of A's (VEC128: 128 consecutive floats per k block for the tile's rows or columns); at BLK128x128
// thread 32 alone copies the 4 of A's tile row that hold block kb's (a row of the grid is padded to
// a multiple of 4), so the promotion reads every scale from shared memory.
struct BlockGemmCopyPlan {
    static constexpr int chunks = kBlockGemmK / 16, row_step = kBlockGemmThreads / chunks,
                         passes = kBlockGemmTile / row_step;
    static_assert(row_step % 8 == 0 && kBlockGemmTile % row_step == 0, "a thread's chunks share their swizzle");
    const uint8_t *a_src, *b_src;  // row first_row of the tile, chunk c, the next k block start copies
    const float* scale_src;        // this thread's 4 scales of k block 0 (threads 0-63; A's BLK128x128: 32)
    size_t operand_step;           // bytes between rows 32 apart (k)
    size_t scale_step;             // floats between k blocks of scale_src (n for B's, m for A's, 1 for BLK)
    int scale_block_mask;          // block kb's scales at (kb & mask) * scale_step: ~3 for BLK's groups of 4
    int smem_offset;               // the chunk's byte offset in an operand's stage
    int scale_offset;              // the 4 scales' float offset in a stage's scales; -1: none

    __device__ BlockGemmCopyPlan(const uint8_t* a, const float* a_scale, bool a_block, const uint8_t* b,
                                 const float* b_scale, int m, int n, int k, int m0, int n0) {
        const int c = (int)threadIdx.x % chunks, first_row = (int)threadIdx.x / chunks;
        a_src = a + (size_t)(m0 + first_row) * k + 16 * c;
        b_src = b + (size_t)(n0 + first_row) * k + 16 * c;
        operand_step = (size_t)row_step * k;
        smem_offset = first_row * kBlockGemmK + ((c ^ (first_row % 8)) * 16);
        const int t = (int)threadIdx.x, quad = t % 32;
        const bool b_scales = t < 32, a_scales = t >= 32 && t < (a_block ? 33 : 64);
        scale_offset = b_scales ? 4 * quad : a_scales ? kBlockGemmTile + 4 * quad : -1;
        scale_src = b_scales    ? b_scale + n0 + 4 * quad
                    : !a_scales ? nullptr
                    : a_block   ? a_scale + (size_t)(m0 / kBlockGemmTile) * round_up4(k / kBlockGemmK)
                                : a_scale + m0 + 4 * quad;
        scale_step = b_scales ? (size_t)n : a_block ? 1 : (size_t)m;
        scale_block_mask = a_scales && a_block ? ~3 : ~0;
    }

    // Starts the copies of k block kb into a stage (operands at `stage`, scales at `scales`); called for
    // kb = 0, 1, 2, ... in order, each moving the operand sources one k block on.
    __device__ __forceinline__ void start(unsigned char* stage, float* scales, int kb) {
        FP8RL_UNROLL
        for (int p = 0; p < passes; p++) {
            const int to = smem_offset + p * row_step * kBlockGemmK;
            __pipeline_memcpy_async(stage + to, b_src + p * operand_step, 16);
            __pipeline_memcpy_async(stage + kBlockGemmOperandBytes + to, a_src + p * operand_step, 16);
        }
        b_src += kBlockGemmK;
        a_src += kBlockGemmK;
        if (scale_offset >= 0)
            __pipeline_memcpy_async(scales + scale_offset, scale_src + (size_t)(kb & scale_block_mask) * scale_step, 16);
    }
};

// The descriptor of a K-major E4M3 operand at `operand` (rows x 128 bytes, 128-byte swizzle, 8-row
// patterns 1024 bytes apart). That of the same operand `bytes` further on (a later stage, k step kk at
// 32 kk) is this one plus bytes / 16: the start address field holds address / 16 in 14 bits, and the
// shared window (below 228 KiB) never carries out of them.
__device__ __forceinline__ uint64_t block_gemm_descriptor(const unsigned char* operand) {
    return wgmma_descriptor(operand, 16, 8 * kBlockGemmK, WgmmaSwizzle::B128);
}

// D [n][m] (+)= B [n][k] . A [m][k]^T as the header says; grid (m / 128, n / 128), kBlockGemmThreads
// threads, kBlockGemmSmemBytes of dynamic shared memory. ABlock: A's scales are BLK128x128
// (a_scale[(i / 128) * round_up4(k / 128) + kb]), else VEC128 (a_scale[kb * m + i]); B's are VEC128
// (b_scale[kb * n + j]). Out: D's type, __nv_bfloat16 or float; Accumulate: D += (FP32 only).
// OddBlocks: k / 128 is odd (the launcher picks by it). The modes and the tail are template arguments so
// an instantiation's code is what it executes: one tail and one epilogue (the model prices its SASS).
template <bool ABlock, class Out, bool Accumulate, bool OddBlocks>
__global__ void __launch_bounds__(kBlockGemmThreads, 1)
    fp8_block_gemm_kernel(const uint8_t* a, const float* a_scale, const uint8_t* b, const float* b_scale, Out* d, int m,
                          int n, int k) {
    constexpr bool out_f32 = std::is_same<Out, float>::value;
    static_assert(out_f32 || (std::is_same<Out, __nv_bfloat16>::value && !Accumulate), "D is BF16, FP32 or FP32 +=");
    using Accumulator = WgmmaAccumulator<kBlockGemmTile>;
    DYNAMIC_SHARED(unsigned char, smem_raw);
    unsigned char* ring = align_shared_1024(smem_raw);
    float* ring_scales = reinterpret_cast<float*>(ring + kBlockGemmStages * kBlockGemmStageBytes);
    const int m0 = (int)blockIdx.x * kBlockGemmTile, n0 = (int)blockIdx.y * kBlockGemmTile;
    const int blocks = k / kBlockGemmK, warpgroup = (int)threadIdx.x / 128, warp = (int)threadIdx.x / 32 % 4;
    const int lane = (int)threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int row0 = 64 * warpgroup + 16 * warp + g;  // the thread's rows of the tile: row0 and row0 + 8
    BlockGemmCopyPlan copy(a, a_scale, ABlock, b, b_scale, m, n, k, m0, n0);
    // Stage indices are carried from k block to k block (no modulo): kb's stage, then the next.
    auto next_stage = [](int stage) { return stage == kBlockGemmStages - 1 ? 0 : stage + 1; };
    auto copy_block = [&](int kb, int stage) {
        copy.start(ring + stage * kBlockGemmStageBytes, ring_scales + stage * kBlockGemmScaleFloats, kb);
    };
    for (int kb = 0; kb < kBlockGemmAhead; kb++) {  // one group per k block, empty past the last
        if (kb < blocks) copy_block(kb, kb);
        __pipeline_commit();
    }
    // Stage 0's operands: this warpgroup's 64 rows of B, and A. The warpgroup read from lane 0 is
    // warp-uniform to the compiler, so B's descriptor stays in uniform registers as A's does (no
    // per-thread descriptor arithmetic moved to uniform registers before each wgmma).
    const int uniform_warpgroup = __shfl_sync(0xFFFFFFFFu, warpgroup, 0);
    const uint64_t b_desc = block_gemm_descriptor(ring + 64 * uniform_warpgroup * kBlockGemmK),
                   a_desc = block_gemm_descriptor(ring + kBlockGemmOperandBytes);
    // Issues k block kb's wgmmas (in `stage`) into acc, then the copies of block kb + kBlockGemmAhead
    // into the stage of kb - 2: every thread passed the barrier after its wait for kb - 2's wgmmas and
    // its promotion.
    auto issue = [&](Accumulator& acc, int kb, int stage) {
        __pipeline_wait_prior(kBlockGemmAhead - 1);  // k block kb's group (older ones too)
        fence_proxy_async_shared();
        __syncthreads();
        const uint64_t offset = (uint32_t)stage * (uint32_t)(kBlockGemmStageBytes / 16);  // unsigned: no sign extension
        wgmma_fence();
        FP8RL_UNROLL
        for (int kk = 0; kk < kBlockGemmK / 32; kk++)
            acc.mma_e4m3(b_desc + offset + 2 * kk, a_desc + offset + 2 * kk, kk > 0);
        wgmma_commit();
        if (kb + kBlockGemmAhead < blocks) copy_block(kb + kBlockGemmAhead, stage >= 2 ? stage - 2 : stage + 4);
        __pipeline_commit();
    };
    // part = fma(block kb's sums in acc (completed), its scale, part): one FFMA a value (the oracle's).
    float part[Accumulator::regs];  // register v: row row0 + 8 ((v >> 1) & 1), column 8 (v >> 2) + 2t + (v & 1)
    for (int v = 0; v < Accumulator::regs; v++) part[v] = 0.0f;
    auto promote = [&](Accumulator& acc, int kb, int stage) {
        const float* s = ring_scales + stage * kBlockGemmScaleFloats;
        const float sb[2] = {s[row0], s[row0 + 8]};
        const float a_block = ABlock ? s[kBlockGemmTile + (kb & 3)] : 0.0f;
        FP8RL_UNROLL
        for (int c = 0; c < Accumulator::regs / 4; c++) {  // columns 8c + 2t, 8c + 2t + 1
            const float2 sa = ABlock ? make_float2(a_block, a_block) : *reinterpret_cast<const float2*>(s + kBlockGemmTile + 8 * c + 2 * t);
            FP8RL_UNROLL
            for (int e = 0; e < 4; e++) {
                const int v = 4 * c + e;
                part[v] = __fmaf_rn(acc[v], __fmul_rn(e & 1 ? sa.y : sa.x, sb[e >> 1]), part[v]);
            }
        }
    };
    // Two accumulators: block kb + 1's wgmmas run while block kb is promoted (wait depth 1). The loop
    // takes whole pairs, so every wait in it has the same depth (ptxas serializes the wgmmas when it
    // cannot tell which group an accumulator belongs to); the last two blocks (OddBlocks: one) follow it.
    // The loop's exit is checked against the parity the launcher chose: a wrong instantiation traps
    // instead of dropping a block. The branch also steers ptxas 13.5, which schedules within basic
    // blocks: without it before the tail it serializes every wgmma (C7514); when accumulating, the
    // same check after the tail keeps D's loads below the last wait (hoisted above it: 242 registers).
    Accumulator even, odd;
    issue(even, 0, 0);
    int kb = 0, stage = 0;  // stage: k block kb's
    for (; kb + 2 < blocks; kb += 2) {
        const int stage1 = next_stage(stage), stage2 = next_stage(stage1);
        issue(odd, kb + 1, stage1);
        wgmma_wait<1>(even);
        promote(even, kb, stage);
        issue(even, kb + 2, stage2);
        wgmma_wait<1>(odd);
        promote(odd, kb + 1, stage1);
        stage = stage2;
    }
    if (kb + (OddBlocks ? 1 : 2) != blocks) __trap();
    if constexpr (OddBlocks) {
        wgmma_wait<0>(even);
        promote(even, kb, stage);
    } else {
        const int stage1 = next_stage(stage);
        issue(odd, kb + 1, stage1);
        wgmma_wait<1>(even);
        promote(even, kb, stage);
        wgmma_wait<0>(odd);
        promote(odd, kb + 1, stage1);
    }
    if (Accumulate && kb + (OddBlocks ? 1 : 2) != blocks) __trap();
    // Epilogue: column pairs (2t, 2t + 1) of 8-column groups, one 8-byte (FP32) or 4-byte (BF16) store each.
    auto at = [&](int v) {  // register v's (and v + 1's) place in D
        return d + (size_t)(n0 + row0 + 8 * ((v >> 1) & 1)) * m + (size_t)(m0 + 8 * (v >> 2) + 2 * t);
    };
    if constexpr (Accumulate) {  // every load of D before the first store: the loads may alias the
        FP8RL_UNROLL             // stores to the compiler, so interleaved each would wait its round trip
        for (int v = 0; v < Accumulator::regs; v += 2) {
            const float2 c = load_vector_written<float2>(at(v));
            part[v] = __fadd_rn(part[v], c.x), part[v + 1] = __fadd_rn(part[v + 1], c.y);
        }
    }
    FP8RL_UNROLL
    for (int v = 0; v < Accumulator::regs; v += 2) {
        if constexpr (out_f32) store_vector(at(v), make_float2(part[v], part[v + 1]));
        else store_vector(at(v), pack_bf16_pair(__float2bfloat16_rn(part[v]), __float2bfloat16_rn(part[v + 1])));
    }
}

// Whether fp8_block_gemm takes a GEMM of this shape: m, n, k whole tiles and k blocks.
inline bool fp8_block_gemm_fits(int m, int n, int k) {
    return m > 0 && n > 0 && k > 0 && m % kBlockGemmTile == 0 && n % kBlockGemmTile == 0 && k % kBlockGemmK == 0;
}

// The instantiation for D's mode and k's parity (fp8_block_gemm_kernel's template arguments).
template <bool ABlock, class Out, bool Accumulate, bool OddBlocks>
void launch_fp8_block_gemm(int m, int n, int k, const uint8_t* a, const float* a_scale, const uint8_t* b,
                           const float* b_scale, void* d, cudaStream_t stream) {
    const dim3 grid((unsigned)(m / kBlockGemmTile), (unsigned)(n / kBlockGemmTile));
    allow_dynamic_smem(fp8_block_gemm_kernel<ABlock, Out, Accumulate, OddBlocks>, kBlockGemmSmemBytes);
    LAUNCH_KERNEL((fp8_block_gemm_kernel<ABlock, Out, Accumulate, OddBlocks>), grid, kBlockGemmThreads,
                  kBlockGemmSmemBytes, stream, a, a_scale, b, b_scale, static_cast<Out*>(d), m, n, k);
}
template <bool ABlock, class Out, bool Accumulate>
void launch_fp8_block_gemm_by_parity(int m, int n, int k, const uint8_t* a, const float* a_scale, const uint8_t* b,
                                     const float* b_scale, void* d, cudaStream_t stream) {
    if (k / kBlockGemmK % 2)
        launch_fp8_block_gemm<ABlock, Out, Accumulate, true>(m, n, k, a, a_scale, b, b_scale, d, stream);
    else
        launch_fp8_block_gemm<ABlock, Out, Accumulate, false>(m, n, k, a, a_scale, b, b_scale, d, stream);
}
template <bool ABlock>
void launch_fp8_block_gemm_by_output(int m, int n, int k, const uint8_t* a, const float* a_scale, const uint8_t* b,
                                     const float* b_scale, void* d, bool out_f32, bool accumulate, cudaStream_t stream) {
    if (!out_f32)
        launch_fp8_block_gemm_by_parity<ABlock, __nv_bfloat16, false>(m, n, k, a, a_scale, b, b_scale, d, stream);
    else if (accumulate)
        launch_fp8_block_gemm_by_parity<ABlock, float, true>(m, n, k, a, a_scale, b, b_scale, d, stream);
    else
        launch_fp8_block_gemm_by_parity<ABlock, float, false>(m, n, k, a, a_scale, b, b_scale, d, stream);
}

// Launches the kernel on device pointers (16-byte aligned; the caller, GemmRunner::fp8, checks the
// modes and alignments and that the shape fits): the instantiation of A's scale mode, D's mode
// (BF16; FP32; FP32 +=) and k's parity.
inline void fp8_block_gemm(int m, int n, int k, const uint8_t* a, const float* a_scale, bool a_block, const uint8_t* b,
                           const float* b_scale, void* d, bool out_f32, bool accumulate, cudaStream_t stream) {
    if (!fp8_block_gemm_fits(m, n, k))
        fail("fp8_block_gemm: m=%d n=%d k=%d; it needs positive multiples of %d", m, n, k, kBlockGemmTile);
    if (accumulate && !out_f32) fail("fp8_block_gemm: accumulating into D needs an FP32 output");
    if (a_block) launch_fp8_block_gemm_by_output<true>(m, n, k, a, a_scale, b, b_scale, d, out_f32, accumulate, stream);
    else launch_fp8_block_gemm_by_output<false>(m, n, k, a, a_scale, b, b_scale, d, out_f32, accumulate, stream);
}

}  // namespace fp8rl

#endif  // FP8RL_CUDA_FP8_BLOCK_GEMM_CUH
