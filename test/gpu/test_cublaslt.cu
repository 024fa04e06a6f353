// test_cublaslt.cu: cuBLASLt's documented rules, called as a plain CUDA program calls the library
// (the same code runs against the real cuBLASLt with nvcc and against cuda/emu/emu_cublaslt.cpp in
// emulation, where the message must also name the rule), and the GemmRunner defects those rules
// exposed (issue 26): scale pointers before the heuristic, operand alignment, BF16-output m % 8.
#include <cublasLt.h>

#include <cmath>
#include <cstring>
#include <functional>

#include "fp8_gemm.cuh"
#include "test/gpu/gpu_util.cuh"
#include "test/harness.h"

using namespace fp8rl;

namespace {

#define LT_CHECK(call) cublas_check((call), #call)

// cuBLASLt >= 12.9 on compute capability 9.x, as test_fp8_gemm.cu requires
#define REQUIRE_FP8_BLOCK_GEMM()                                    \
    do {                                                            \
        REQUIRE_GPU();                                              \
        std::string why_not = fp8_block_gemm_unsupported_reason(0); \
        if (!why_not.empty()) SKIP(why_not.c_str());                \
    } while (0)

// One cublasLtMatmul's configuration in cuBLAS's column-major terms; D = C (ldd = m).
struct LtConfig {
    int m = 128, n = 128, k = 128;
    bool fp8 = true;
    cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
    int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    const float *a_scale = nullptr, *b_scale = nullptr;
    cudaDataType_t out = CUDA_R_32F;
    uint32_t pref_align = 256;  // every MIN_ALIGNMENT_*_BYTES
};

// The descriptors of one configuration, destroyed with it.
struct LtPlan {
    cublasLtHandle_t handle = nullptr;
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    explicit LtPlan(const LtConfig& c) {
        LT_CHECK(cublasLtCreate(&handle));
        LT_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &c.transa, sizeof(c.transa)));
        LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &c.transb, sizeof(c.transb)));
        if (c.fp8) {
            LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &c.a_mode, sizeof(c.a_mode)));
            LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &c.b_mode, sizeof(c.b_mode)));
            if (c.a_scale)
                LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &c.a_scale, sizeof(c.a_scale)));
            if (c.b_scale)
                LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &c.b_scale, sizeof(c.b_scale)));
        }
        cudaDataType_t in = c.fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
        bool at = c.transa == CUBLAS_OP_T, bt = c.transb == CUBLAS_OP_T;
        LT_CHECK(cublasLtMatrixLayoutCreate(&a, in, at ? c.k : c.m, at ? c.m : c.k, at ? c.k : c.m));
        LT_CHECK(cublasLtMatrixLayoutCreate(&b, in, bt ? c.n : c.k, bt ? c.k : c.n, bt ? c.n : c.k));
        LT_CHECK(cublasLtMatrixLayoutCreate(&d, c.out, c.m, c.n, c.m));
        LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        size_t ws = GemmRunner::WORKSPACE_BYTES;
        LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
        const cublasLtMatmulPreferenceAttributes_t attrs[4] = {
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
        for (auto attr : attrs) LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &c.pref_align, sizeof(uint32_t)));
    }
    ~LtPlan() {
        cublasLtMatmulPreferenceDestroy(pref);
        cublasLtMatrixLayoutDestroy(d);
        cublasLtMatrixLayoutDestroy(b);
        cublasLtMatrixLayoutDestroy(a);
        cublasLtMatmulDescDestroy(desc);
        cublasLtDestroy(handle);
    }
    cublasStatus_t heuristic(cublasLtMatmulHeuristicResult_t* r, int* found) {
        return cublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, d, d, pref, 1, r, found);
    }
};

// What cuBLASLt answered: the status and, from the heuristic, how many algorithms it found.
struct Answer {
    cublasStatus_t status;
    int found = -1;  // -1: not a heuristic query
};

// Checks that a call was refused and prints what cuBLASLt answered. A refusal is any status but
// success: the documentation gives INVALID_VALUE for "parameters ... in conflict or in an impossible
// configuration" and NOT_SUPPORTED for "the current implementation ... doesn't support", NVIDIA's own
// samples see either for the same FP8 rule, and the heuristic may also succeed with no algorithm
// (FP8RL_EMU_CUBLASLT_REFUSAL answers with each of these in CI). success_allowed: the documentation
// also lets the call succeed (a rule that only limits what the heuristic promises). In emulation the
// message must name the rule.
void check_refused(Answer got, const char* rule, bool success_allowed = false) {
    const bool refused = got.status != CUBLAS_STATUS_SUCCESS || got.found == 0;
    printf("    %s: %s (%d)%s\n", rule, cublasLtGetStatusString(got.status), (int)got.status,
           got.found >= 0 ? strfmt(", %d algorithms", got.found).c_str() : "");
    CHECK_MSG(refused || (success_allowed && !emulated), "cuBLASLt accepted what \"%s\" forbids", rule);
#ifdef FP8RL_EMU
    CHECK_MSG(emu::cublaslt_last_error().find(rule) != std::string::npos, "message \"%s\" lacks \"%s\"",
              emu::cublaslt_last_error().c_str(), rule);
#endif
}

Answer heuristic_status(const LtConfig& c) {
    LtPlan p(c);
    cublasLtMatmulHeuristicResult_t r = {};
    int found = 0;
    cublasStatus_t st = p.heuristic(&r, &found);
    return {st, found};
}

}  // namespace

TEST(cublaslt_fp8_is_tn_only) {
    REQUIRE_FP8_BLOCK_GEMM();
    DeviceBuffer<float> s(64);
    LtConfig c;
    c.a_scale = c.b_scale = s.ptr;
    c.transa = CUBLAS_OP_N;
    check_refused(heuristic_status(c), "TN only");
}

TEST(cublaslt_block_modes_need_scale_pointers_at_heuristic_time) {
    REQUIRE_FP8_BLOCK_GEMM();
    LtConfig c;
    check_refused(heuristic_status(c), "requires a custom pointer for A scale");
}

TEST(cublaslt_block_scale_tensors_are_16_byte_aligned) {
    REQUIRE_FP8_BLOCK_GEMM();
    DeviceBuffer<float> s(64);
    LtConfig c;
    c.a_scale = s.ptr + 1, c.b_scale = s.ptr;
    check_refused(heuristic_status(c), "scale tensors must start on a 16-byte boundary");
}

TEST(cublaslt_fp8_needs_16_byte_alignment) {
    REQUIRE_FP8_BLOCK_GEMM();
    DeviceBuffer<float> s(64);
    LtConfig c;
    c.a_scale = c.b_scale = s.ptr;
    c.pref_align = 8;
    check_refused(heuristic_status(c), "16-byte-aligned A, B, C and D");
}

TEST(cublaslt_fp8_shape_rules) {
    REQUIRE_FP8_BLOCK_GEMM();
    DeviceBuffer<float> s(64);
    LtConfig c;
    c.a_scale = c.b_scale = s.ptr;
    c.m = 126;  // block modes: m and n multiples of 4
    check_refused(heuristic_status(c), "m and n multiples of 4");
    c.m = 128, c.k = 120;  // lda = k: 16-byte rows
    check_refused(heuristic_status(c), "multiples of 16 (16-byte rows)");
    c.k = 128, c.m = 132, c.out = CUDA_R_16BF;  // BF16 D rows of m elements: 16-byte multiples
    check_refused(heuristic_status(c), "ldd (= m) a multiple of 8");
    c.m = 128, c.out = CUDA_R_32F;
    c.a_mode = c.b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    check_refused(heuristic_status(c), "BLK128x128 x BLK128x128");
}

// --fp8_scaling row and tensor: OUTER_VEC_32F pairs only with itself and needs both scale vectors
// (cuBLAS docs, outer vector scaling), SCALAR_32F only with SCALAR_32F, block modes only with block modes.
TEST(cublaslt_outer_vector_and_scalar_mode_rules) {
    REQUIRE_FP8_BLOCK_GEMM();
    DeviceBuffer<float> s(256);
    LtConfig c;
    c.a_scale = c.b_scale = s.ptr;
    c.a_mode = c.b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    Answer outer = heuristic_status(c);
    CHECK_MSG(outer.status == CUBLAS_STATUS_SUCCESS && outer.found >= 1, "outer-vector: status %d, %d algorithms",
              (int)outer.status, outer.found);
    c.a_mode = c.b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    Answer scalar = heuristic_status(c);
    CHECK_MSG(scalar.status == CUBLAS_STATUS_SUCCESS && scalar.found >= 1, "scalar: status %d, %d algorithms",
              (int)scalar.status, scalar.found);
    c.a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, c.b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    check_refused(heuristic_status(c), "cannot pair");
    c.a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, c.b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    check_refused(heuristic_status(c), "both A_SCALE_MODE and B_SCALE_MODE");
    c.a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, c.b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    check_refused(heuristic_status(c), "cannot pair");
    c.a_mode = c.b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    c.b_scale = nullptr;
    check_refused(heuristic_status(c), "needs both scale pointers");
}

// GemmRunner names the pairing rule before cuBLASLt sees the call.
TEST(gemm_runner_pairs_scale_modes_of_one_granularity) {
    REQUIRE_FP8_BLOCK_GEMM();
    GemmRunner runner;
    DeviceBuffer<uint8_t> a(128 * 128), b(128 * 128);
    DeviceBuffer<float> s(256);
    DeviceBuffer<char> d(128 * 128 * 4);
    const Fp8ScaleMode pairs[][2] = {{Fp8ScaleMode::OUTER_VEC, Fp8ScaleMode::VEC128},
                                     {Fp8ScaleMode::SCALAR, Fp8ScaleMode::OUTER_VEC},
                                     {Fp8ScaleMode::BLK128x128, Fp8ScaleMode::SCALAR}};
    for (auto pair : pairs)
        CHECK_THROWS(runner.fp8("fprop", 128, 128, 128, a.ptr, s.ptr, pair[0], b.ptr, s.ptr, pair[1], d.ptr, GemmOut::F32, 0),
                     "cuBLASLt pairs a block mode with a block mode");
}

TEST(cublaslt_leading_dimension_below_rows_is_invalid) {
    REQUIRE_FP8_BLOCK_GEMM();
    cublasLtMatrixLayout_t l = nullptr;
    LtConfig c;
    c.fp8 = false;
    LtPlan p(c);
    LT_CHECK(cublasLtMatrixLayoutCreate(&l, CUDA_R_16BF, 128, 128, 64));  // ld 64 < 128 rows
    cublasLtMatmulHeuristicResult_t r = {};
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(p.handle, p.desc, l, p.b, p.d, p.d, p.pref, 1, &r, &found);
    check_refused({st, found}, "leading dimension");
    cublasLtMatrixLayoutDestroy(l);
}

// An algorithm chosen for 256-byte alignment (the preference's default) may refuse a pointer with
// less: the preference only bounds what the heuristic promises, so the real library may also run it
// (most kernels need 16 bytes); emulation refuses, naming the preference, so code that relies on
// the run succeeding fails in CI.
TEST(cublaslt_pointer_less_aligned_than_the_preference_may_be_refused) {
    REQUIRE_FP8_BLOCK_GEMM();
    LtConfig c;
    c.fp8 = false;
    LtPlan p(c);
    cublasLtMatmulHeuristicResult_t r = {};
    int found = 0;
    LT_CHECK(p.heuristic(&r, &found));
    CHECK(found >= 1);
    DeviceBuffer<__nv_bfloat16> a(128 * 128 + 64), b(128 * 128);
    DeviceBuffer<float> d(128 * 128);
    DeviceArray<uint8_t> ws;
    ws.resize(GemmRunner::WORKSPACE_BYTES, "workspace");
    const float alpha = 1, beta = 0;
    check_refused({cublasLtMatmul(p.handle, p.desc, &alpha, a.ptr + 64, p.a, b.ptr, p.b, &beta, d.ptr, p.d, d.ptr, p.d,
                                 &r.algo, ws.get(), GemmRunner::WORKSPACE_BYTES, 0)},
                  "MIN_ALIGNMENT_A_BYTES", /*success_allowed=*/true);
}

// Defect 1: GemmRunner must put the scale pointers on the descriptor before the heuristic query.
TEST(gemm_runner_block_scaled_plan_sets_scale_pointers_first) {
    REQUIRE_FP8_BLOCK_GEMM();
    GemmRunner runner;
    const int m = 128, n = 128, k = 256;
    DeviceBuffer<uint8_t> a(std::vector<uint8_t>((size_t)m * k, 0x38)), b(std::vector<uint8_t>((size_t)n * k, 0x38));  // 1.0
    DeviceBuffer<float> sa(std::vector<float>(64, 1.0f)), sb(std::vector<float>(256, 0.5f));
    DeviceBuffer<float> d((size_t)m * n);
    runner.fp8("fprop", m, n, k, a.ptr, sa.ptr, Fp8ScaleMode::BLK128x128, b.ptr, sb.ptr, Fp8ScaleMode::VEC128, d.ptr,
               GemmOut::F32, 0);
    std::vector<float> got = d.download();
    CHECK_EQ(got[0], 128.0f);  // 256 products of 1.0, at scales 1 x 0.5
    CHECK_EQ(got.back(), 128.0f);
}

// Defect 3: a BF16 operand 128-byte aligned (a weight slice) must get an algorithm for its alignment.
TEST(gemm_runner_plans_for_the_operands_alignment) {
    REQUIRE_FP8_BLOCK_GEMM();
    GemmRunner runner;
    const int m = 128, n = 128, k = 128;
    DeviceBuffer<__nv_bfloat16> a(std::vector<__nv_bfloat16>((size_t)m * k + 64, __float2bfloat16(1.0f)));
    DeviceBuffer<__nv_bfloat16> b(std::vector<__nv_bfloat16>((size_t)n * k, __float2bfloat16(2.0f)));
    DeviceBuffer<float> d((size_t)m * n);
    runner.bf16("aligned", m, n, k, a.ptr, b.ptr, d.ptr, GemmOut::F32, 0);
    runner.bf16("slice", m, n, k, a.ptr + 64, b.ptr, d.ptr, GemmOut::F32, 0);  // 128 bytes past a 256-byte boundary
    std::vector<float> got = d.download();
    CHECK_EQ(got[0], 256.0f);
    CHECK_EQ(got.back(), 256.0f);
}

// Defects 2 and 7: GemmRunner names the rule before cuBLASLt refuses the call.
TEST(gemm_runner_checks_fp8_alignment_and_bf16_rows) {
    REQUIRE_FP8_BLOCK_GEMM();
    GemmRunner runner;
    DeviceBuffer<uint8_t> a(256 * 128), b(256 * 128);
    DeviceBuffer<float> s(1024), d(256 * 256 + 4);
    CHECK_THROWS(runner.fp8("fprop", 132, 128, 128, a.ptr, s.ptr, Fp8ScaleMode::BLK128x128, b.ptr, s.ptr,
                            Fp8ScaleMode::VEC128, d.ptr, GemmOut::BF16, 0),
                 "BF16 output needs m a multiple of 8");
    CHECK_THROWS(runner.fp8("fprop", 128, 128, 128, a.ptr, s.ptr, Fp8ScaleMode::BLK128x128, b.ptr, s.ptr,
                            Fp8ScaleMode::VEC128, d.ptr + 2, GemmOut::F32, 0),
                 "A, B and D on 16-byte boundaries");
    // B's leading dimension (a column slice of wider rows): a multiple of 8, at least its rows' elements
    DeviceBuffer<__nv_bfloat16> x(256 * 128), y(256 * 128);
    CHECK_THROWS(runner.bf16("dX", 128, 64, 128, x.ptr, y.ptr, d.ptr, GemmOut::F32, 0, GemmOps::NN, true, 120),
                 "leading dimension 120 must be a multiple of 8 and at least 128");
    CHECK_THROWS(runner.bf16("dW", 128, 64, 128, x.ptr, y.ptr, d.ptr, GemmOut::F32, 0, GemmOps::NT, true, 132),
                 "leading dimension 132 must be a multiple of 8 and at least 64");
}

// Defect 4: a row of D must not depend on the batch (n) it is computed with, or a completion decodes
// differently with other requests beside it. cuBLASLt ranks split-K first for outputs too small to
// fill the SMs, and split-K's sums follow the shape. The runner pins one algorithm per weight and
// size class (decode-sized n <= 256, larger n), so a large n (m = 128: n = 16,896, 132 output tiles of
// 128 x 128: a prefill) pins one, n = 128 (a decode step's rows) another, and n = 4 and 384 run their
// class's. Each D's rows must equal the first rows at the large n, bit for bit, in FP32, from FP8
// (block-scaled) and BF16 operands: on a GPU this holds the two classes' kernels to summing alike, at
// m = 128, k = 512 and at the projections of Qwen3-1.7B and Qwen3-8B (QKV, O, gate|up, down: m x k,
// the large n 2,048, at least 256 output tiles); in emulation, at the small shape alone (the others
// would cost minutes), it also checks which algorithm ran (emu_cublaslt.cpp ranks a narrow tile, 3,
// first among the unsplit ones where the output is skinny, the plain one, 0, where it fills the SMs).
TEST(gemm_runner_rows_do_not_depend_on_n) {
    REQUIRE_FP8_BLOCK_GEMM();
    struct Shape {
        int m, k, big;  // the weight's m x k; the large n that pins the big class
    };
    const Shape shapes[] = {
        {128, 512, 132 * 128},  // 4 k blocks: 2 split parts of 2
#ifndef FP8RL_EMU
        {4096, 2048, 2048}, {2048, 2048, 2048}, {12288, 2048, 2048}, {2048, 6144, 2048},    // Qwen3-1.7B
        {6144, 4096, 2048}, {4096, 4096, 2048}, {24576, 4096, 2048}, {4096, 12288, 2048},  // Qwen3-8B
#endif
    };
    for (const Shape& shape : shapes) {
        const int m = shape.m, k = shape.k, big = shape.big, L = k / 128, mb = m / 128;
        const int ns[] = {big, 128, 4, 384};  // the first pins the big class
#ifdef FP8RL_EMU
        const int algorithm[] = {0, 3, 3, 0};  // what each n runs in emulation: its class's pin
#endif
        // D [n][m] from the first n rows of the operand B; its first rows must be the large n's run's
        auto check_every_n = [&](const char* what, const std::function<void(int n, float* d)>& gemm) {
            std::vector<float> want;
            for (int t = 0; t < 4; t++) {
                const int n = ns[t];
                DeviceBuffer<float> d((size_t)m * n);
                gemm(n, d.ptr);
                const std::vector<float> got = d.download();
                if (t == 0) want = got;
                CHECK_MSG(memcmp(got.data(), want.data(), (size_t)m * n * sizeof(float)) == 0,
                          "%s, m = %d, k = %d: the first %d rows of D differ at n = %d and n = %d", what, m, k, n, n, big);
#ifdef FP8RL_EMU
                CHECK_MSG(emu::cublaslt_last_algorithm() == algorithm[t], "%s at n = %d ran algorithm %d, not its class's %d",
                          what, n, emu::cublaslt_last_algorithm(), algorithm[t]);
#endif
            }
        };
        {
            GemmRunner runner;
            auto spread = [](size_t n, uint32_t seed) {  // BF16 values over 2^-8..2^8, so the FP32 sums round
                std::vector<float> x(n);
                for (size_t i = 0; i < n; i++) x[i] = round_bf16(hash_uniform(i, seed) * exp2f(std::floor(8.0f * hash_uniform(i, seed + 1))));
                return x;
            };
            DeviceBuffer<__nv_bfloat16> a(to_bf16(spread((size_t)m * k, 1))), b(to_bf16(spread((size_t)big * k, 3)));
            check_every_n("BF16", [&](int n, float* d) { runner.bf16("rows", m, n, k, a.ptr, b.ptr, d, GemmOut::F32, 0); });
        }
        GemmRunner runner;
        std::vector<uint8_t> a8((size_t)m * k), b8((size_t)big * k);  // E4M3 codes of every magnitude but NaN
        for (size_t i = 0; i < a8.size(); i++) a8[i] = (uint8_t)((hash_uniform(i, 3) + 1.0f) * 63.0f) ^ (i % 2 ? 0x80 : 0);
        for (size_t i = 0; i < b8.size(); i++) b8[i] = (uint8_t)((hash_uniform(i, 4) + 1.0f) * 63.0f) ^ (i % 3 ? 0 : 0x80);
        const int L4 = (L + 3) / 4 * 4;
        std::vector<float> sa((size_t)mb * L4), sb((size_t)L * big);  // A BLK128x128 [m/128][L rounded up to 4], B VEC128 [L][n]
        for (size_t i = 0; i < sa.size(); i++) sa[i] = 1.0f + 0.37f * hash_uniform(i, 5);
        for (size_t i = 0; i < sb.size(); i++) sb[i] = 1.0f + 0.37f * hash_uniform(i, 6);
        DeviceBuffer<uint8_t> a(a8), b(b8);
        DeviceBuffer<float> da(sa);
        check_every_n("FP8", [&](int n, float* d) {
            std::vector<float> sb_n((size_t)L * n);  // the first n rows' scales, [L][n]
            for (int kb = 0; kb < L; kb++)
                for (int j = 0; j < n; j++) sb_n[(size_t)kb * n + j] = sb[(size_t)kb * big + j];
            DeviceBuffer<float> db(sb_n);
            runner.fp8("rows", m, n, k, a.ptr, da.ptr, Fp8ScaleMode::BLK128x128, b.ptr, db.ptr, Fp8ScaleMode::VEC128, d,
                       GemmOut::F32, 0);
            CUDA_CHECK(cudaDeviceSynchronize());  // db is freed on return
        });
    }
}
