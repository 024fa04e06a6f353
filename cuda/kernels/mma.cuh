// mma.cuh: the warp-level tensor-core product the attention kernels are built on,
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (D[16x8] = A[16x16] B[16x8] + C, BF16
// operands, FP32 accumulate), and the fragment loads and stores around it.
//
// Fragments (PTX ISA, spec-gpu.md §2.2; g = lane / 4, t = lane % 4); each 32-bit register holds
// two BF16 values, the lower-indexed one in the low half:
//   A a[r] (r = 0..3) holds A[g + 8*(r & 1)][2t + 8*(r >> 1) + {0, 1}]
//   B b[r] (r = 0..1) holds B[2t + 8*r + {0, 1}][g]
//   C c[i] (i = 0..3) holds C[g + 8*(i >> 1)][2t + (i & 1)]
// The C fragments of two adjacent 16x8 products are, once packed to BF16, the A fragment of their
// 16x16 concatenation (pack_c_as_a): how FlashAttention-2 feeds the probabilities P, computed in
// registers, into P V without a trip through shared memory.
//
// The PTX instruction cannot run on the CPU, so under FP8RL_EMU mma_m16n8k16 has a twin that
// follows the same layouts: every lane deposits its fragments in its warp's scratch tile,
// __syncwarp, every lane computes its own four outputs, __syncwarp (before the scratch is reused).
// Everything else here is plain code, the same in both builds.
#ifndef FP8RL_CUDA_MMA_CUH
#define FP8RL_CUDA_MMA_CUH
#include <cstdint>
#include <cstring>

#include "cuda/common.cuh"

namespace fp8rl {

__device__ __forceinline__ int lane_id() { return (int)(threadIdx.x % 32); }

__device__ __forceinline__ uint32_t bf16_bits(__nv_bfloat16 x) {
    uint16_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

// Two consecutive BF16 values p[0], p[1] as one register (p 4-byte aligned).
__device__ __forceinline__ uint32_t load_bf16_pair(const __nv_bfloat16* p) {
    const __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(p);
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

__device__ __forceinline__ uint32_t pack_bf16_pair(__nv_bfloat16 lo, __nv_bfloat16 hi) {
    return bf16_bits(lo) | bf16_bits(hi) << 16;
}

// lo and hi rounded to BF16, lo in the low half: one F2FP.BF16.F32.PACK_AB on the device (nvcc does
// not always fuse two conversions and a shift into it).
__device__ __forceinline__ uint32_t pack_floats_bf16(float lo, float hi) {
#ifdef FP8RL_EMU
    return pack_bf16_pair(__float2bfloat16_rn(lo), __float2bfloat16_rn(hi));
#else
    const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);  // .x = lo: the low half
    return *reinterpret_cast<const uint32_t*>(&pair);
#endif
}

#ifdef FP8RL_EMU
namespace mma_emu {
__device__ __forceinline__ float bf16_lo(uint32_t r) {
    const uint32_t u = r << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
__device__ __forceinline__ float bf16_hi(uint32_t r) {
    const uint32_t u = r & 0xFFFF0000u;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
// One warp's operands, as the lanes deposited them.
struct WarpOperands {
    float a[16][16], b[16][8];
};
// The scratch of the calling thread's warp in its CTA (CTAs run at once in emulation).
inline WarpOperands& warp_operands() { return *static_cast<WarpOperands*>(::emu::warp_scratch(sizeof(WarpOperands))); }
}  // namespace mma_emu
#endif

// c[4] += A B for the warp's fragments a[4] (A 16x16) and b[2] (B 16x8). All 32 lanes must call it.
__device__ __forceinline__ void mma_m16n8k16(float c[4], const uint32_t a[4], const uint32_t b[2]) {
#ifdef FP8RL_EMU
    mma_emu::WarpOperands& w = mma_emu::warp_operands();
    const int g = lane_id() / 4, t = lane_id() % 4;
    for (int r = 0; r < 4; r++) {
        w.a[g + 8 * (r & 1)][2 * t + 8 * (r >> 1)] = mma_emu::bf16_lo(a[r]);
        w.a[g + 8 * (r & 1)][2 * t + 8 * (r >> 1) + 1] = mma_emu::bf16_hi(a[r]);
    }
    for (int r = 0; r < 2; r++) {
        w.b[2 * t + 8 * r][g] = mma_emu::bf16_lo(b[r]);
        w.b[2 * t + 8 * r + 1][g] = mma_emu::bf16_hi(b[r]);
    }
    __syncwarp();
    for (int i = 0; i < 4; i++) {
        const int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
        // Products of BF16 values are exact in FP32; the sum is one chain from c in k order, the
        // order of cpu/gemm.h's FMA chains, so the emulated attention kernels agree with the CPU
        // engine bit for bit (a tensor core orders and truncates its sums its own way: the engine
        // tests bound that on a GPU).
        for (int k = 0; k < 16; k++) c[i] += w.a[row][k] * w.b[k][col];
    }
    __syncwarp();
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// A fragment of the 16x16 tile A[m][k] = tile[m * ld + k] (ld even, tile 4-byte aligned).
__device__ __forceinline__ void load_a_fragment(uint32_t a[4], const __nv_bfloat16* tile, int ld) {
    const int g = lane_id() / 4, t = lane_id() % 4;
    for (int r = 0; r < 4; r++) a[r] = load_bf16_pair(tile + (g + 8 * (r & 1)) * ld + 2 * t + 8 * (r >> 1));
}

// B fragment of the 16x8 tile B[k][n] = tile[n * ld + k]: B stored by columns, as K is for Q K^T
// (ld even, tile 4-byte aligned).
__device__ __forceinline__ void load_b_fragment_nk(uint32_t b[2], const __nv_bfloat16* tile, int ld) {
    const int g = lane_id() / 4, t = lane_id() % 4;
    for (int r = 0; r < 2; r++) b[r] = load_bf16_pair(tile + g * ld + 2 * t + 8 * r);
}

// B fragment of the 16x8 tile B[k][n] = tile[k * ld + n]: B stored by rows, as V is for P V.
__device__ __forceinline__ void load_b_fragment_kn(uint32_t b[2], const __nv_bfloat16* tile, int ld) {
    const int g = lane_id() / 4, t = lane_id() % 4;
    for (int r = 0; r < 2; r++) {
        const int k = 2 * t + 8 * r;
        b[r] = pack_bf16_pair(tile[k * ld + g], tile[(k + 1) * ld + g]);
    }
}

// The A fragment (16x16, BF16) of the two 16x8 FP32 products left (columns 0..7) and right (8..15).
__device__ __forceinline__ void pack_c_as_a(uint32_t a[4], const float left[4], const float right[4]) {
    a[0] = pack_floats_bf16(left[0], left[1]);
    a[1] = pack_floats_bf16(left[2], left[3]);
    a[2] = pack_floats_bf16(right[0], right[1]);
    a[3] = pack_floats_bf16(right[2], right[3]);
}

// ---------------------------------------------------------------------------------------------
// ldmatrix: fragments straight from shared memory, four 8x8 BF16 matrices per instruction
// (ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16, SASS LDSM; PTX ISA "Warp-level matrix load
// instruction: ldmatrix"). Lane 8i + r gives the address of row r of matrix i (16 bytes, 16-byte
// aligned, in shared memory); register i of lane l receives row l / 4, elements 2 (l % 4) and
// 2 (l % 4) + 1 of matrix i, low half first; .trans delivers the transposed matrix instead. All 32
// lanes must execute it (.sync.aligned). The emulation (emu::ldmatrix) follows the same rules and
// refuses a misaligned or non-shared row address or lanes that disagree. The fragments equal
// load_a_fragment's and load_b_fragment_*'s above (test/gpu/test_mma.cu checks it).
template <bool Trans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const __nv_bfloat16* row_address) {
#ifdef FP8RL_EMU
    ::emu::ldmatrix(r, 4, Trans, row_address);
#else
    const unsigned addr = (unsigned)__cvta_generic_to_shared(row_address);
    if constexpr (Trans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(addr));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(addr));
#endif
}

// load_a_fragment's A fragment of the 16x16 tile A[m][k] = tile[m * ld + k] in one ldmatrix: the
// matrices are (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15). tile and ld * 2 bytes
// multiples of 16 bytes, tile in shared memory.
__device__ __forceinline__ void ldmatrix_a_fragment(uint32_t a[4], const __nv_bfloat16* tile, int ld) {
    const int i = lane_id() / 8, r = lane_id() % 8;
    ldmatrix_x4<false>(a, tile + (r + 8 * (i & 1)) * ld + 8 * (i >> 1));
}

// load_b_fragment_nk's B fragments of two adjacent 16x8 tiles, B[k][n] = tile[n * ld + k] for n in
// 0..7 (b0) and 8..15 (b1), in one ldmatrix: the matrices are (n 0-7, k 0-7), (n 0-7, k 8-15),
// (n 8-15, k 0-7), (n 8-15, k 8-15). Same alignment as ldmatrix_a_fragment.
__device__ __forceinline__ void ldmatrix_b_fragments_nk(uint32_t b0[2], uint32_t b1[2], const __nv_bfloat16* tile,
                                                        int ld) {
    const int i = lane_id() / 8, r = lane_id() % 8;
    uint32_t m[4];
    ldmatrix_x4<false>(m, tile + (r + 8 * (i >> 1)) * ld + 8 * (i & 1));
    b0[0] = m[0], b0[1] = m[1], b1[0] = m[2], b1[1] = m[3];
}

// load_b_fragment_kn's B fragments of two adjacent 16x8 tiles, B[k][n] = tile[k * ld + n] for n in
// 0..7 (b0) and 8..15 (b1), in one transposing ldmatrix: the matrices are (k 0-7, n 0-7),
// (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15). Same alignment as ldmatrix_a_fragment.
__device__ __forceinline__ void ldmatrix_b_fragments_kn(uint32_t b0[2], uint32_t b1[2], const __nv_bfloat16* tile,
                                                        int ld) {
    const int i = lane_id() / 8, r = lane_id() % 8;
    uint32_t m[4];
    ldmatrix_x4<true>(m, tile + (r + 8 * (i & 1)) * ld + 8 * (i >> 1));
    b0[0] = m[0], b0[1] = m[1], b1[0] = m[2], b1[1] = m[3];
}
// ---------------------------------------------------------------------------------------------

// Row and column of element i (0..3) of the calling lane's C fragment.
__device__ __forceinline__ int c_fragment_row(int i) { return lane_id() / 4 + 8 * (i >> 1); }
__device__ __forceinline__ int c_fragment_col(int i) { return 2 * (lane_id() % 4) + (i & 1); }

}  // namespace fp8rl

#endif  // FP8RL_CUDA_MMA_CUH
