// test_mma.cu: each wrapper of cuda/kernels/mma.cuh alone against a plain matrix product on the host. The
// operands are small integers, so every product and sum is exact in FP32 whatever the order of
// accumulation: the results must be equal, and a wrong fragment layout (a swapped row, a register
// in the wrong half) shows at once as a mismatch. Two warps run different operands, so a warp
// reading the other's fragments fails too. On a GPU this checks the PTX layouts themselves; in
// emulation it checks the emulated twin against the same definition. The ldmatrix loads are checked
// register by register against the plain loads, whose layout the products check.
#include <vector>

#include "cuda/kernels/mma.cuh"
#include "test/gpu/gpu_util.cuh"
#include "test/harness.h"

using namespace fp8rl;

#define REQUIRE_GPU_FOR_MMA()                        \
    do {                                             \
        std::string why_not = no_gpu_reason();       \
        if (!why_not.empty()) SKIP(why_not.c_str()); \
    } while (0)

namespace {

constexpr int kWarps = 2;

// A small integer that differs between neighbouring rows and columns: (i * 7 + j * 3 + salt) % 9 - 4.
float small_int(int i, int j, int salt) { return (float)((i * 7 + j * 3 + salt) % 9 - 4); }

// d[w] = a[w] b[w] + c[w] per warp w: a [16][16] row-major, b [16][8] given as b_nk [8][16] (by
// columns) or b_kn [16][8] (by rows), c and d [16][8]. b_by_rows picks the B load.
__global__ void mma_kernel(float* d, const __nv_bfloat16* a, const __nv_bfloat16* b, const float* c, bool b_by_rows) {
    const int w = threadIdx.x / 32;
    uint32_t fa[4], fb[2];
    load_a_fragment(fa, a + w * 256, 16);
    if (b_by_rows)
        load_b_fragment_kn(fb, b + w * 128, 8);
    else
        load_b_fragment_nk(fb, b + w * 128, 16);
    float acc[4];
    for (int i = 0; i < 4; i++) acc[i] = c[w * 128 + c_fragment_row(i) * 8 + c_fragment_col(i)];
    mma_m16n8k16(acc, fa, fb);
    for (int i = 0; i < 4; i++) d[w * 128 + c_fragment_row(i) * 8 + c_fragment_col(i)] = acc[i];
}

// d[w] = (a[w] b[w]) e[w]: a [16][16], b [16][16] by rows (two 16x8 products), whose C fragments
// pack_c_as_a turns into the A operand of the product with e [16][8] by rows; d [16][8].
__global__ void chained_mma_kernel(float* d, const __nv_bfloat16* a, const __nv_bfloat16* b, const __nv_bfloat16* e) {
    const int w = threadIdx.x / 32;
    uint32_t fa[4], fb[2];
    load_a_fragment(fa, a + w * 256, 16);
    float left[4] = {0, 0, 0, 0}, right[4] = {0, 0, 0, 0};
    load_b_fragment_kn(fb, b + w * 256, 16);
    mma_m16n8k16(left, fa, fb);
    load_b_fragment_kn(fb, b + w * 256 + 8, 16);
    mma_m16n8k16(right, fa, fb);
    uint32_t fp[4];
    pack_c_as_a(fp, left, right);
    load_b_fragment_kn(fb, e + w * 128, 8);
    float acc[4] = {0, 0, 0, 0};
    mma_m16n8k16(acc, fp, fb);
    for (int i = 0; i < 4; i++) d[w * 128 + c_fragment_row(i) * 8 + c_fragment_col(i)] = acc[i];
}

// out [m][n] = x [m][k] y [k][n], plain loops.
std::vector<float> matmul(const float* x, const float* y, int m, int k, int n) {
    std::vector<float> out((size_t)m * n, 0.0f);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++)
            for (int l = 0; l < k; l++) out[i * n + j] += x[i * k + l] * y[l * n + j];
    return out;
}

void check_mma(bool b_by_rows) {
    REQUIRE_GPU_FOR_MMA();
    std::vector<float> a(kWarps * 256), b(kWarps * 128), b_stored(kWarps * 128), c(kWarps * 128);
    for (int w = 0; w < kWarps; w++) {
        for (int i = 0; i < 16; i++)
            for (int j = 0; j < 16; j++) a[w * 256 + i * 16 + j] = small_int(i, j, w);
        for (int k = 0; k < 16; k++)
            for (int n = 0; n < 8; n++) {
                const float v = small_int(k + 3, 2 * n, 5 * w + 1);  // B[k][n]
                b[w * 128 + k * 8 + n] = v;
                b_stored[w * 128 + (b_by_rows ? k * 8 + n : n * 16 + k)] = v;
                c[w * 128 + k * 8 + n] = (float)(k * 8 + n + 1000 * w);  // C[row][col], row = k here
            }
    }
    DeviceBuffer<__nv_bfloat16> d_a(to_bf16(a)), d_b(to_bf16(b_stored));
    DeviceBuffer<float> d_c(c), d_d(kWarps * 128);
    d_d.poison();
    LAUNCH_KERNEL(mma_kernel, 1, 32 * kWarps, 0, 0, d_d.ptr, d_a.ptr, d_b.ptr, d_c.ptr, b_by_rows);
    std::vector<float> got = d_d.download();
    int mismatches = 0;
    for (int w = 0; w < kWarps; w++) {
        std::vector<float> want = matmul(&a[w * 256], &b[w * 128], 16, 16, 8);
        for (int i = 0; i < 128; i++) {
            want[i] += c[w * 128 + i];
            if (got[w * 128 + i] != want[i]) {
                if (mismatches++ < 5)
                    CHECK_MSG(false, "warp %d D[%d][%d] = %g, expected %g", w, i / 8, i % 8, got[w * 128 + i], want[i]);
            }
        }
    }
    printf("  mma (B by %s): %d / %d mismatches\n", b_by_rows ? "rows" : "columns", mismatches, kWarps * 128);
    CHECK_EQ(mismatches, 0);
}

}  // namespace

TEST(mma_m16n8k16_b_by_columns_matches_matmul) { check_mma(false); }

TEST(mma_m16n8k16_b_by_rows_matches_matmul) { check_mma(true); }

// (A B) E with A B kept in registers and repacked as an A operand: the probabilities-times-V path.
TEST(mma_chained_through_pack_c_as_a_matches_matmul) {
    REQUIRE_GPU_FOR_MMA();
    std::vector<float> a(kWarps * 256), b(kWarps * 256), e(kWarps * 128);
    for (int w = 0; w < kWarps; w++) {
        // Entries in [-2, 2]: A B stays within +-64, an integer BF16 holds exactly.
        for (int i = 0; i < 16; i++)
            for (int j = 0; j < 16; j++) {
                a[w * 256 + i * 16 + j] = (float)((i * 5 + j * 3 + w) % 5 - 2);
                b[w * 256 + i * 16 + j] = (float)((i * 3 + j * 7 + 2 * w + 1) % 5 - 2);
            }
        for (int k = 0; k < 16; k++)
            for (int n = 0; n < 8; n++) e[w * 128 + k * 8 + n] = small_int(k, n + 2, w + 3);
    }
    DeviceBuffer<__nv_bfloat16> d_a(to_bf16(a)), d_b(to_bf16(b)), d_e(to_bf16(e));
    DeviceBuffer<float> d_d(kWarps * 128);
    d_d.poison();
    LAUNCH_KERNEL(chained_mma_kernel, 1, 32 * kWarps, 0, 0, d_d.ptr, d_a.ptr, d_b.ptr, d_e.ptr);
    std::vector<float> got = d_d.download();
    int mismatches = 0;
    for (int w = 0; w < kWarps; w++) {
        std::vector<float> ab = matmul(&a[w * 256], &b[w * 256], 16, 16, 16);
        std::vector<float> want = matmul(ab.data(), &e[w * 128], 16, 16, 8);
        for (int i = 0; i < 128; i++)
            if (got[w * 128 + i] != want[i] && mismatches++ < 5)
                CHECK_MSG(false, "warp %d D[%d][%d] = %g, expected %g", w, i / 8, i % 8, got[w * 128 + i], want[i]);
    }
    printf("  chained mma: %d / %d mismatches\n", mismatches, kWarps * 128);
    CHECK_EQ(mismatches, 0);
}

namespace {

// A padded shared tile as the attention kernels keep theirs: 16 rows of 16 BF16, row stride 24.
constexpr int kLdsmLd = 24, kLdsmTile = 16 * kLdsmLd;

// Per warp w, tile w of `in` staged in shared memory; out[w][lane][0..11] = the A, B-by-columns and
// B-by-rows fragments (two 16x8 B tiles each) through ldmatrix, out[w][lane][12..23] the same
// through the plain loads.
__global__ void ldmatrix_kernel(uint32_t* out, const __nv_bfloat16* in) {
    DYNAMIC_SHARED(__nv_bfloat16, tiles);
    for (int i = threadIdx.x; i < kWarps * kLdsmTile; i += blockDim.x) tiles[i] = in[i];
    __syncthreads();
    const int w = threadIdx.x / 32;
    const __nv_bfloat16* tile = tiles + w * kLdsmTile;
    uint32_t* o = out + (w * 32 + lane_id()) * 24;
    ldmatrix_a_fragment(o, tile, kLdsmLd);
    ldmatrix_b_fragments_nk(o + 4, o + 6, tile, kLdsmLd);
    ldmatrix_b_fragments_kn(o + 8, o + 10, tile, kLdsmLd);
    load_a_fragment(o + 12, tile, kLdsmLd);
    load_b_fragment_nk(o + 16, tile, kLdsmLd);
    load_b_fragment_nk(o + 18, tile + 8 * kLdsmLd, kLdsmLd);
    load_b_fragment_kn(o + 20, tile, kLdsmLd);
    load_b_fragment_kn(o + 22, tile + 8, kLdsmLd);
}

}  // namespace

// Every element distinct (its own BF16 bit pattern), so any misplaced row, column or half shows.
TEST(ldmatrix_fragments_equal_the_plain_fragment_loads) {
    REQUIRE_GPU_FOR_MMA();
    std::vector<__nv_bfloat16> in(kWarps * kLdsmTile);
    for (size_t i = 0; i < in.size(); i++) {
        __nv_bfloat16_raw raw;
        raw.x = (unsigned short)(0x3F80 + i);
        in[i] = raw;
    }
    DeviceBuffer<__nv_bfloat16> d_in(in);
    DeviceBuffer<uint32_t> d_out(kWarps * 32 * 24);
    d_out.poison();
    LAUNCH_KERNEL(ldmatrix_kernel, 1, 32 * kWarps, kWarps * kLdsmTile * sizeof(__nv_bfloat16), 0, d_out.ptr, d_in.ptr);
    const std::vector<uint32_t> got = d_out.download();
    int mismatches = 0;
    for (int t = 0; t < kWarps * 32; t++)
        for (int r = 0; r < 12; r++)
            if (got[t * 24 + r] != got[t * 24 + 12 + r] && mismatches++ < 5)
                CHECK_MSG(false, "warp %d lane %d register %d: ldmatrix 0x%08x, plain load 0x%08x", t / 32, t % 32, r,
                          got[t * 24 + r], got[t * 24 + 12 + r]);
    printf("  ldmatrix: %d / %d registers differ from the plain loads\n", mismatches, kWarps * 32 * 12);
    CHECK_EQ(mismatches, 0);
}
