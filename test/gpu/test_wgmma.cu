// test_wgmma.cu: cuda/kernels/wgmma.cuh's warpgroup MMA against a plain FP64 matrix product on the host,
// for every swizzle mode, both majors of each shared-memory operand and A from registers, with the
// k loop split over two commit groups; then, in emulation, each misuse the emulation refuses.
// The operands are random integers in [-8, 8], so every product and sum is exact in FP32 whatever the
// order of accumulation: D must equal C + A B exactly, and a wrong descriptor field, swizzle or
// fragment layout shows as a mismatch. The host places the operands in shared memory by its own
// formulas, the layouts TMA writes (a row of 16W bytes, its 16-byte chunks XORed with the row within
// its 8-row pattern), not the emulation's address arithmetic. Two warpgroups run different operands.
// The E4M3 form (m64nNk32) is checked as the FP8 block GEMM walks a 128-wide K block (below).
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cuda_fp8.h>

#include "cuda/kernels/mma.cuh"
#include "cuda/kernels/wgmma.cuh"
#include "test/gpu/gpu_util.cuh"
#include "test/harness.h"

using namespace fp8rl;

namespace {

constexpr int kK = 64;      // four k16 steps
constexpr int kGroups = 2;  // warpgroups per block
constexpr uint32_t kRegion = 32768;  // shared bytes per warpgroup's operands

// A shared-memory operand of `rows` (M or N) x kK BF16, K-major or MN-major, W = swizzle bytes / 16.
struct Placement {
    int width;
    bool mn_major;
    int rows;
    uint32_t lbo, sbo;
    uint32_t offset(int mn, int k) const {
        const int s = 16 * width;
        if (!mn_major && width == 1) return (mn / 8) * sbo + (k / 8) * lbo + (mn % 8) * 16 + (k % 8) * 2;
        if (mn_major && width == 1) return (mn / 8) * sbo + (k / 8) * lbo + (k % 8) * 16 + (mn % 8) * 2;
        const int phase = 8 / width;  // rows per step of the XOR pattern
        if (!mn_major) {
            const int panel = 8 * width;  // k elements in a row
            return (k / panel) * rows * s + (mn / 8) * 8 * s + (mn % 8) * s + (((k % panel) / 8) ^ ((mn % 8) / phase)) * 16 +
                   (k % 8) * 2;
        }
        const int panel = 8 * width;  // mn elements in a row
        return (mn / panel) * kK * s + k * s + (((mn % panel) / 8) ^ ((k % 8) / phase)) * 16 + (mn % 8) * 2;
    }
    // Where k step `step` (columns 16 step ..) starts.
    uint32_t step_offset(int step) const {
        const int k0 = 16 * step, s = 16 * width;
        if (width == 1) return (uint32_t)(2 * step) * lbo;
        if (!mn_major) return (k0 / (8 * width)) * rows * s + (k0 % (8 * width)) * 2;
        return (uint32_t)(k0 * s);
    }
};

Placement place(int width, bool mn_major, int rows) {
    Placement p{width, mn_major, rows, 0, 0};
    const uint32_t s = 16 * width;
    if (width == 1 && !mn_major) p.lbo = 128, p.sbo = 128 * (kK / 8);
    else if (width == 1) p.sbo = 128, p.lbo = 128 * ((rows + 7) / 8);
    else if (!mn_major) p.lbo = 16, p.sbo = 8 * s;  // LBO unused: a k16 step lies in one row
    else p.lbo = kK * s, p.sbo = 8 * s;
    return p;
}

WgmmaSwizzle swizzle_of(int width) {
    return width == 8 ? WgmmaSwizzle::B128 : width == 4 ? WgmmaSwizzle::B64 : width == 2 ? WgmmaSwizzle::B32 : WgmmaSwizzle::None;
}

struct OperandArg {
    uint32_t base, step[4], lbo, sbo;
    WgmmaSwizzle swizzle;
};

OperandArg operand_arg(const Placement& p, uint32_t base) {
    OperandArg a{base, {}, p.lbo, p.sbo, swizzle_of(p.width)};
    for (int s = 0; s < 4; s++) a.step[s] = p.step_offset(s);
    return a;
}

// d = c + A B per warpgroup (c used when use_c, else the first step overwrites D); image: the
// warpgroups' operand bytes, kRegion each; a_frags [group][step][thread][4] when ARegs.
template <int N, bool TransA, bool TransB, bool ARegs>
__global__ void wgmma_kernel(float* d, const float* c, const uint4* image, const uint32_t* a_frags, OperandArg a_op,
                             OperandArg b_op, bool use_c) {
    DYNAMIC_SHARED(unsigned char, raw);
    unsigned char* smem = align_shared_1024(raw);
    for (uint32_t i = threadIdx.x; i < kGroups * kRegion / 16; i += blockDim.x) reinterpret_cast<uint4*>(smem)[i] = image[i];
    fence_proxy_async_shared();
    __syncthreads();
    const int group = threadIdx.x / 128, tid = threadIdx.x % 128, w = tid / 32, g = lane_id() / 4, t = lane_id() % 4;
    unsigned char* mine = smem + group * kRegion;
    WgmmaAccumulator<N> acc;
    for (int v = 0; v < N / 2; v++)
        acc[v] = use_c ? c[(group * 64 + 16 * w + g + 8 * ((v >> 1) & 1)) * N + 8 * (v >> 2) + 2 * t + (v & 1)] : 0.0f;
    WgmmaFragmentA fa[4];
    if (ARegs)
        for (int s = 0; s < 4; s++)
            for (int r = 0; r < 4; r++) fa[s][r] = a_frags[((group * 4 + s) * 128 + tid) * 4 + r];
    wgmma_fence();
    for (int s = 0; s < 4; s++) {
        const uint64_t b_desc = wgmma_descriptor(mine + b_op.base + b_op.step[s], b_op.lbo, b_op.sbo, b_op.swizzle);
        const bool accumulate = use_c || s > 0;
        if constexpr (ARegs)
            acc.template mma<TransB>(fa[s], b_desc, accumulate);
        else
            acc.template mma<TransA, TransB>(wgmma_descriptor(mine + a_op.base + a_op.step[s], a_op.lbo, a_op.sbo, a_op.swizzle),
                                             b_desc, accumulate);
        if (s == 1) wgmma_commit();
    }
    wgmma_commit();
    wgmma_wait<1>();
    wgmma_wait<0>(acc);
    for (int v = 0; v < N / 2; v++)
        d[(group * 64 + 16 * w + g + 8 * ((v >> 1) & 1)) * N + 8 * (v >> 2) + 2 * t + (v & 1)] = acc[v];
}

uint16_t bf16_bits_of(float x) {
    const __nv_bfloat16 b = __float2bfloat16(x);
    uint16_t u;
    memcpy(&u, &b, 2);
    return u;
}

// One configuration on both warpgroups; returns the mismatches against FP64.
template <int N, bool TransA, bool TransB, bool ARegs>
int run_case(int width, bool use_c, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> small(-8, 8);
    const Placement pa = place(width, TransA, 64), pb = place(width, TransB, N);
    const uint32_t b_base = 16384;  // A's bytes fit below (64 x 64 BF16 = 8 KiB, in any layout here)
    std::vector<uint8_t> image(kGroups * kRegion, 0);
    std::vector<float> a(kGroups * 64 * kK), b(kGroups * kK * N), c(kGroups * 64 * N);
    std::vector<uint32_t> frags(kGroups * 4 * 128 * 4);
    for (float& x : a) x = (float)small(rng);
    for (float& x : b) x = (float)small(rng);
    for (float& x : c) x = (float)(small(rng) * 16);
    for (int grp = 0; grp < kGroups; grp++) {
        uint8_t* region = image.data() + grp * kRegion;
        for (int m = 0; m < 64; m++)
            for (int k = 0; k < kK; k++) {
                const uint16_t h = bf16_bits_of(a[(grp * 64 + m) * kK + k]);
                if (!ARegs) memcpy(region + pa.offset(m, k), &h, 2);
            }
        for (int k = 0; k < kK; k++)
            for (int n = 0; n < N; n++) {
                const uint16_t h = bf16_bits_of(b[(grp * kK + k) * N + n]);
                const uint32_t off = b_base + pb.offset(n, k);
                CHECK(off + 2 <= kRegion);
                memcpy(region + off, &h, 2);
            }
        // register A: thread tid of the warpgroup, warp w = tid / 32, holds rows 16 w + g + 8 (r & 1),
        // columns 16 s + 8 (r >> 1) + 2t + {0, 1} in a[r] of step s
        for (int s = 0; s < 4; s++)
            for (int tid = 0; tid < 128; tid++)
                for (int r = 0; r < 4; r++) {
                    const int row = 16 * (tid / 32) + (tid % 32) / 4 + 8 * (r & 1), col = 16 * s + 8 * (r >> 1) + 2 * (tid % 4);
                    const float* src = &a[(grp * 64 + row) * kK + col];
                    frags[((grp * 4 + s) * 128 + tid) * 4 + r] = bf16_bits_of(src[0]) | (uint32_t)bf16_bits_of(src[1]) << 16;
                }
    }
    DeviceBuffer<uint4> d_image(image.size() / 16);
    CUDA_CHECK(cudaMemcpy(d_image.ptr, image.data(), image.size(), cudaMemcpyHostToDevice));
    DeviceBuffer<uint32_t> d_frags(frags);
    DeviceBuffer<float> d_c(c), d_d(kGroups * 64 * N);
    d_d.poison();
    const size_t smem = kGroups * kRegion + 1024;
    allow_dynamic_smem(wgmma_kernel<N, TransA, TransB, ARegs>, smem);
    LAUNCH_KERNEL((wgmma_kernel<N, TransA, TransB, ARegs>), 1, 128 * kGroups, smem, 0, d_d.ptr, (const float*)d_c.ptr,
                  (const uint4*)d_image.ptr, (const uint32_t*)d_frags.ptr, operand_arg(pa, 0), operand_arg(pb, b_base), use_c);
    const std::vector<float> got = d_d.download();
    int mismatches = 0;
    for (int grp = 0; grp < kGroups; grp++)
        for (int m = 0; m < 64; m++)
            for (int n = 0; n < N; n++) {
                double want = use_c ? c[(grp * 64 + m) * N + n] : 0.0;
                for (int k = 0; k < kK; k++) want += (double)a[(grp * 64 + m) * kK + k] * b[(grp * kK + k) * N + n];
                const float have = got[(grp * 64 + m) * N + n];
                if ((double)have != want && mismatches++ < 3)
                    CHECK_MSG(false, "W %d group %d D[%d][%d] = %g, expected %g", width, grp, m, n, have, want);
            }
    return mismatches;
}

template <int N, bool TransA, bool TransB, bool ARegs>
void check_all_swizzles(const char* what, bool use_c) {
    REQUIRE_GPU();
    for (int width : {1, 2, 4, 8}) {
        const int bad = run_case<N, TransA, TransB, ARegs>(width, use_c, 1000u * width + N);
        printf("  %s, %s swizzle: %d / %d mismatches\n", what,
               width == 1 ? "no" : width == 2 ? "32-byte" : width == 4 ? "64-byte" : "128-byte", bad, kGroups * 64 * N);
        CHECK_EQ(bad, 0);
    }
}

}  // namespace

TEST(wgmma_a_registers_b_k_major_n64_matches_fp64) { check_all_swizzles<64, false, false, true>("A regs, B K-major, N 64", true); }

TEST(wgmma_a_registers_b_mn_major_n32_matches_fp64) { check_all_swizzles<32, false, true, true>("A regs, B MN-major, N 32", false); }

TEST(wgmma_a_k_major_b_mn_major_n128_matches_fp64) {
    check_all_swizzles<128, false, true, false>("A K-major, B MN-major, N 128", true);
}

TEST(wgmma_a_mn_major_b_k_major_n16_matches_fp64) {
    check_all_swizzles<16, true, false, false>("A MN-major, B K-major, N 16", false);
}

// The E4M3 form (m64nNk32.f32.e4m3.e4m3) as the FP8 block GEMM uses it: one 128-wide K block of A
// (64 x 128) and B (N x 128), K-major with the 128-byte swizzle (a 128-byte row is the block's K),
// walked as four k32 steps whose descriptors advance the start address 32 bytes; the first step
// overwrites D (accumulate false: the NaN D starts with must vanish), the others accumulate. The host
// places the bytes as TMA's 128-byte swizzle does (16-byte chunk c of row r of an 8-row, 1024-byte
// pattern at chunk c ^ r) and decodes the codes with cuda_fp8.h.
namespace {

constexpr int kE4m3K = 128;             // one scale block of K
constexpr uint32_t kE4m3BBase = 8192;   // B after A's 64 x 128 bytes, on a 1024-byte boundary

uint32_t e4m3_swizzled_offset(int mn, int k) {
    return (uint32_t)((mn / 8) * 1024 + (mn % 8) * 128 + (((k / 16) ^ (mn % 8)) * 16) + k % 16);
}

float e4m3_value_cuda(uint8_t code) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)code, __NV_E4M3)));
}

template <int N>
__global__ void wgmma_e4m3_kernel(float* d, const uint4* image) {
    DYNAMIC_SHARED(unsigned char, raw);
    unsigned char* smem = align_shared_1024(raw);
    for (uint32_t i = threadIdx.x; i < (kE4m3BBase + N * kE4m3K) / 16; i += blockDim.x)
        reinterpret_cast<uint4*>(smem)[i] = image[i];
    fence_proxy_async_shared();
    __syncthreads();
    const int w = threadIdx.x / 32, g = lane_id() / 4, t = lane_id() % 4;
    WgmmaAccumulator<N> acc;
    for (int v = 0; v < N / 2; v++) acc[v] = __int_as_float(0x7FFFFFFF);  // overwritten by the first step
    wgmma_fence();
    for (int s = 0; s < kE4m3K / 32; s++)
        acc.mma_e4m3(wgmma_descriptor(smem + 32 * s, 16, 1024, WgmmaSwizzle::B128),
                     wgmma_descriptor(smem + kE4m3BBase + 32 * s, 16, 1024, WgmmaSwizzle::B128), s > 0);
    wgmma_commit();
    wgmma_wait<0>(acc);
    for (int v = 0; v < N / 2; v++) d[(16 * w + g + 8 * ((v >> 1) & 1)) * N + 8 * (v >> 2) + 2 * t + (v & 1)] = acc[v];
}

// Runs the kernel on codes drawn from `pool`; returns D [64][N] and the codes (a [64][K], b [N][K]).
template <int N>
std::vector<float> run_e4m3(const std::vector<uint8_t>& pool, uint32_t seed, std::vector<uint8_t>& a, std::vector<uint8_t>& b) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<size_t> pick(0, pool.size() - 1);
    a.resize(64 * kE4m3K), b.resize(N * kE4m3K);
    for (uint8_t& c : a) c = pool[pick(rng)];
    for (uint8_t& c : b) c = pool[pick(rng)];
    std::vector<uint8_t> image(kE4m3BBase + N * kE4m3K, 0);
    for (int m = 0; m < 64; m++)
        for (int k = 0; k < kE4m3K; k++) image[e4m3_swizzled_offset(m, k)] = a[m * kE4m3K + k];
    for (int n = 0; n < N; n++)
        for (int k = 0; k < kE4m3K; k++) image[kE4m3BBase + e4m3_swizzled_offset(n, k)] = b[n * kE4m3K + k];
    DeviceBuffer<uint4> d_image(image.size() / 16);
    CUDA_CHECK(cudaMemcpy(d_image.ptr, image.data(), image.size(), cudaMemcpyHostToDevice));
    DeviceBuffer<float> d_d(64 * N);
    d_d.poison();
    const size_t smem = image.size() + 1024;
    allow_dynamic_smem(wgmma_e4m3_kernel<N>, smem);
    LAUNCH_KERNEL(wgmma_e4m3_kernel<N>, 1, 128, smem, 0, d_d.ptr, (const uint4*)d_image.ptr);
    return d_d.download();
}

// Exact: codes whose values are multiples of 1/2 up to 2 in magnitude, so every product (a multiple of
// 1/4) and partial sum (at most 512) is exact in 12 bits: D equals the FP64 sum in any order, on a GPU
// too, whose FP8 accumulation keeps about 14 bits (DeepSeek-V3 technical report §3.3.2). Then all
// finite codes: the emulation's D is the FP32 sum of the products one at a time in k order, bit for
// bit; a GPU's order and truncation are undocumented, so there D is only held within 2^-5 sum |x y|
// of FP64 (4 instructions, each aligning 33 terms to its largest with 13+ bits kept: < 4 x 33 x 2^-12).
template <int N>
void check_e4m3(uint32_t seed) {
    std::vector<uint8_t> exact_pool, finite_pool;
    for (int code = 0; code < 256; code++) {
        const float v = e4m3_value_cuda((uint8_t)code);
        if (v != v) continue;
        finite_pool.push_back((uint8_t)code);
        if (std::fabs(v) <= 2.0f && v * 2.0f == std::floor(v * 2.0f)) exact_pool.push_back((uint8_t)code);
    }
    std::vector<uint8_t> a, b;
    std::vector<float> got = run_e4m3<N>(exact_pool, seed, a, b);
    int bad = 0, nonzero = 0;
    for (int m = 0; m < 64; m++)
        for (int n = 0; n < N; n++) {
            double want = 0;
            for (int k = 0; k < kE4m3K; k++) want += (double)e4m3_value_cuda(a[m * kE4m3K + k]) * e4m3_value_cuda(b[n * kE4m3K + k]);
            nonzero += want != 0;
            if ((double)got[m * N + n] != want && bad++ < 3)
                CHECK_MSG(false, "exact codes: D[%d][%d] = %.9g, FP64 %.9g", m, n, got[m * N + n], want);
        }
    CHECK(nonzero > 64 * N / 2);
    printf("  N %d, exact codes: %d / %d mismatches against FP64\n", N, bad, 64 * N);
    got = run_e4m3<N>(finite_pool, seed + 1, a, b);
    int bad_order = 0, differs_from_fp64 = 0;
    for (int m = 0; m < 64; m++)
        for (int n = 0; n < N; n++) {
            float acc = 0.0f;
            double exact = 0, magnitude = 0;
            for (int k = 0; k < kE4m3K; k++) {
                const float x = e4m3_value_cuda(a[m * kE4m3K + k]), y = e4m3_value_cuda(b[n * kE4m3K + k]);
                acc += x * y;  // exact product, one FP32 rounding per k
                exact += (double)x * y;
                magnitude += std::fabs((double)x * y);
            }
            differs_from_fp64 += (double)acc != exact;
#ifdef FP8RL_EMU
            const bool wrong = memcmp(&acc, &got[m * N + n], 4) != 0;
#else
            const bool wrong = !(std::fabs(got[m * N + n] - exact) <= magnitude / 32);
#endif
            if (wrong && bad_order++ < 3)
                CHECK_MSG(false, "all codes: D[%d][%d] = %.9g, FP32 k-order sum %.9g, FP64 %.9g", m, n, got[m * N + n], acc,
                          exact);
        }
    CHECK(differs_from_fp64 > 0);  // the case tells orders apart
    printf("  N %d, all finite codes: %d / %d mismatches against %s (the FP32 k-order sum differs from FP64 in %d)\n", N,
           bad_order, 64 * N, emulated ? "the FP32 k-order sum" : "FP64 within 2^-5 sum |x y|", differs_from_fp64);
}

}  // namespace

TEST(wgmma_e4m3_k32_swizzle128_n128_matches_cuda_fp8_reference) {
    REQUIRE_GPU();
    check_e4m3<128>(59);
}

TEST(wgmma_e4m3_k32_swizzle128_n32_matches_cuda_fp8_reference) {
    REQUIRE_GPU();
    check_e4m3<32>(60);
}

#ifdef FP8RL_EMU
namespace {

// Misuse, one per mode, on one warpgroup with A and B no-swizzle K-major at shared 0 and 2048 (the
// right program is mode 0). On a GPU each is undefined behaviour, so these are the emulation's tests.
//   1 read D before the wait            2 no wgmma.fence before the first mma
//   3 D written after the fence         4 no commit, then wait 0 and a read
//   5 warp 1 gives another B descriptor 6 a block of 64 threads (half a warpgroup)
//   7 128-byte swizzle starting 128 bytes into its pattern
//   8 SBO placing rows past shared memory 9 A fragment written while its wgmma is in flight
//   10 reserved descriptor bits          11 wait 1 leaves the newest group's D in flight
__global__ void wgmma_rule_kernel(float* out, int mode) {
    DYNAMIC_SHARED(unsigned char, smem);
    for (int i = threadIdx.x; i < 4096; i += blockDim.x) smem[i] = 0;
    __syncthreads();
    WgmmaAccumulator<16> acc, other;
    for (int v = 0; v < 8; v++) acc[v] = 0.0f, other[v] = 0.0f;
    WgmmaFragmentA fa;
    for (int r = 0; r < 4; r++) fa[r] = 0;
    const int warp = threadIdx.x / 32;
    uint64_t a_desc = wgmma_descriptor(smem, 128, 256, WgmmaSwizzle::None);
    uint64_t b_desc = wgmma_descriptor(smem + 2048 + (mode == 5 && warp == 1 ? 256 : 0), 128, 256, WgmmaSwizzle::None);
    if (mode == 7) b_desc = wgmma_descriptor(smem + 1024 + 128, 16, 1024, WgmmaSwizzle::B128);
    if (mode == 8) b_desc = wgmma_descriptor(smem + 2048, 128, 8192, WgmmaSwizzle::None);
    if (mode == 10) b_desc |= 1ull << 15;
    if (mode != 2) wgmma_fence();
    if (mode == 3) acc[0] = 1.0f;
    if (mode == 9) {
        acc.mma<false>(fa, b_desc, true);
        fa[0] = 1;
    }
    acc.mma<false, false>(a_desc, b_desc, true);
    if (mode == 1) out[threadIdx.x] = acc[0];
    if (mode != 4) wgmma_commit();
    other.mma<false, false>(a_desc, b_desc, false);
    if (mode != 4) wgmma_commit();
    if (mode == 11) {
        wgmma_wait<1>(acc);
        out[threadIdx.x] = acc[0];  // completed
        out[threadIdx.x] = other[0];
    }
    wgmma_wait<0>(acc, other);
    out[threadIdx.x] = acc[0] + other[0];
}

// The asynchronous read: B is overwritten between the mma and its wait (a bug on a GPU, where the
// tensor cores may read either); the emulation reads shared memory at the wait, so the product shows
// the late bytes, and a kernel that recycles an operand buffer too early computes with them.
__global__ void wgmma_late_write_kernel(float* out) {
    DYNAMIC_SHARED(unsigned char, smem);
    __nv_bfloat16* tiles = reinterpret_cast<__nv_bfloat16*>(smem);
    for (int i = threadIdx.x; i < 2048; i += blockDim.x) tiles[i] = __float2bfloat16(1.0f);  // A, then B: ones
    __syncthreads();
    WgmmaAccumulator<16> acc;
    wgmma_fence();
    acc.mma<false, false>(wgmma_descriptor(tiles, 128, 256, WgmmaSwizzle::None),
                          wgmma_descriptor(tiles + 1024, 128, 256, WgmmaSwizzle::None), false);
    wgmma_commit();
    __syncthreads();
    for (int i = threadIdx.x; i < 256; i += blockDim.x) tiles[1024 + i] = __float2bfloat16(2.0f);  // B's 16 x 16
    __syncthreads();
    wgmma_wait<0>(acc);
    out[threadIdx.x] = acc[0];
}

}  // namespace

TEST(emu_rule_wgmma_discipline_and_descriptors) {
    DeviceBuffer<float> out(128);
    const size_t smem = 4096;
    LAUNCH_KERNEL(wgmma_rule_kernel, 1, 128, smem, 0, out.ptr, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    const char* rules[] = {"",
                           "wgmma accumulator registers accessed while wgmma.mma_async #1",
                           "accessed after this thread's last wgmma.fence (0 fences so far)",
                           "uses the accumulator registers, accessed after this thread's last wgmma.fence",
                           "wgmma accumulator registers accessed while wgmma.mma_async #1",
                           "the warpgroup's 4 warps execute the same wgmma.mma_async",
                           "warpgroup (warps 0-3) is incomplete in a block of 64 threads",
                           "start address 0x480 with address bits 7.. = 1",
                           "outside the block's dynamic shared memory",
                           "wgmma A fragment registers accessed while wgmma.mma_async #1",
                           "sets reserved bits 0x0000000000008000",
                           "wgmma accumulator registers accessed while wgmma.mma_async #2"};
    check_refusals(rules, 1, 11,
                   [&](int mode) { LAUNCH_KERNEL(wgmma_rule_kernel, 1, mode == 6 ? 64 : 128, smem, 0, out.ptr, mode); });
}

namespace {

// E4M3 misuse (A, B no-swizzle K-major at shared 0 and 2048; mode 0 is right):
//   1 no wgmma.fence before the first mma_e4m3   2 warp 1 issues the BF16 form, the others E4M3
//   3 B MN-major (imm-trans-b: no FP8 form has it) 4 A in registers (not emulated)
//   5 LBO putting k 16..31 of B past shared memory  6 read D before the wait
__global__ void wgmma_e4m3_rule_kernel(float* out, int mode) {
    DYNAMIC_SHARED(unsigned char, smem);
    for (int i = threadIdx.x; i < 4096; i += blockDim.x) smem[i] = 0x38;  // 1.0
    __syncthreads();
    WgmmaAccumulator<16> acc;
    for (int v = 0; v < 8; v++) acc[v] = 0.0f;
    const uint64_t a_desc = wgmma_descriptor(smem, 128, 256, WgmmaSwizzle::None);
    const uint64_t b_desc = wgmma_descriptor(smem + 2048, mode == 5 ? 4096 : 128, 256, WgmmaSwizzle::None);
    if (mode != 1) wgmma_fence();
    float d[8] = {};
    ::emu::WgmmaGuard d_guard, a_guard;
    const uint32_t a_regs[4] = {};
    if (mode == 2 && threadIdx.x / 32 == 1) acc.mma<false, false>(a_desc, b_desc, false);
    else if (mode == 3) ::emu::wgmma_issue(::emu::WgmmaType::E4M3, 16, d, d_guard, nullptr, nullptr, a_desc, b_desc, false, false, true);
    else if (mode == 4) ::emu::wgmma_issue(::emu::WgmmaType::E4M3, 16, d, d_guard, a_regs, &a_guard, 0, b_desc, false, false, false);
    else acc.mma_e4m3(a_desc, b_desc, false);
    wgmma_commit();
    if (mode == 6) out[threadIdx.x] = acc[0];
    wgmma_wait<0>(acc);
    out[threadIdx.x] = acc[0];
}

}  // namespace

TEST(emu_rule_wgmma_e4m3_is_k_major_from_descriptors) {
    DeviceBuffer<float> out(128);
    LAUNCH_KERNEL(wgmma_e4m3_rule_kernel, 1, 128, 4096, 0, out.ptr, 0);
    CHECK_EQ(out.download()[0], 32.0f);  // 32 products of 1 x 1
    const char* rules[] = {"",
                           "accessed after this thread's last wgmma.fence (0 fences so far)",
                           "the warpgroup's 4 warps execute the same wgmma.mma_async",
                           "imm-trans-a and imm-trans-b exist only for .f16 / .bf16; FP8 operands are K-major",
                           "m64n16k32.f32.e4m3.e4m3 with A in registers (not emulated",
                           "puts element (0, 16) at shared address 0x1800, outside the block's dynamic shared memory",
                           "wgmma accumulator registers accessed while wgmma.mma_async #1"};
    check_refusals(rules, 1, 6, [&](int mode) { LAUNCH_KERNEL(wgmma_e4m3_rule_kernel, 1, 128, 4096, 0, out.ptr, mode); });
}

TEST(emu_wgmma_reads_shared_memory_when_its_group_completes) {
    DeviceBuffer<float> out(128);
    LAUNCH_KERNEL(wgmma_late_write_kernel, 1, 128, 4096, 0, out.ptr);
    const std::vector<float> got = out.download();
    CHECK_EQ(got[0], 32.0f);  // 16 products of 1 x 2, not of 1 x 1
    CHECK_EQ(got[127], 32.0f);
}
#endif
