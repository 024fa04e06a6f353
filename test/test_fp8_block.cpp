// test_fp8_block.cpp: blockwise E4M3 quantization (rl/numerics/fp8_block.h) and the emulated FP8 GEMMs
// (cpu/fp8_gemm_ref.h). Expected codes, scales and GEMM results come from torch
// (dev/make_fp8_fixtures.py: float8_e4m3fn casts, float64 products of the dequantized operands);
// the rest are properties (NaN/Inf/zero blocks, transposition, bounds).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "cpu/fp8_gemm_ref.h"
#include "rl/io/json.h"
#include "test/harness.h"

using namespace fp8rl;

namespace {

struct Fixtures {
    int T = 0, K = 0, N = 0;
    std::map<std::string, std::string> bytes;  // array name -> raw little-endian contents

    template <class V>
    std::vector<V> get(const std::string& name, size_t expected_count) const {
        auto it = bytes.find(name);
        if (it == bytes.end()) fail("test/fixtures/fp8: array '%s' missing; rerun dev/make_fp8_fixtures.py", name.c_str());
        if (it->second.size() != expected_count * sizeof(V))
            fail("test/fixtures/fp8/%s.bin: %zu bytes, expected %zu", name.c_str(), it->second.size(),
                 expected_count * sizeof(V));
        std::vector<V> out(expected_count);
        memcpy(out.data(), it->second.data(), it->second.size());
        return out;
    }
};

const Fixtures& fixtures() {
    static Fixtures f = [] {
        Fixtures f;
        Json m = json_parse_file("test/fixtures/fp8/manifest.json");
        f.T = (int)m.find("T")->integer, f.K = (int)m.find("K")->integer, f.N = (int)m.find("N")->integer;
        for (const auto& kv : m.find("arrays")->fields)
            f.bytes[kv.first] = read_file("test/fixtures/fp8/" + kv.first + ".bin");
        return f;
    }();
    return f;
}

template <class A, class B>
int count_differences(const std::vector<A>& ours, const std::vector<B>& want, const char* what) {
    int bad = 0;
    for (size_t i = 0; i < ours.size(); i++)
        if (memcmp(&ours[i], &want[i], sizeof(A)) != 0) {
            if (bad++ < 3) fprintf(stderr, "    %s[%zu]: ours %g, torch %g\n", what, i, (double)ours[i], (double)want[i]);
        }
    return bad;
}

// Relative error bound of the emulated GEMM vs a float64 product of the same dequantized operands:
// each K block is a sum of at most 128 exact FP32 products (error <= 127 u sum|a b|), scaled by one
// rounded multiplier (2 roundings) and added to an FP32 total (L - 1 roundings), u = 2^-24; plus
// one rounding of the float32-stored reference. So |ours - ref| <= (K + 2L + 1) u sum_k |a_k b_k|.
void check_gemm(const Fp8GemmOperand& a, const Fp8GemmOperand& b, const std::vector<float>& ours,
                const std::vector<float>& ref, const char* what) {
    int K = a.cols, L = fp8_num_blocks(K), bad = 0;
    double err2 = 0, ref2 = 0;
    for (int i = 0; i < a.rows; i++)
        for (int j = 0; j < b.rows; j++) {
            double abs_sum = 0;
            for (int k = 0; k < K; k++)
                abs_sum += std::fabs((double)a.values[(size_t)i * K + k] * a.scale_inv[(size_t)i * L + k / 128] *
                                     b.values[(size_t)j * K + k] * b.scale_inv[(size_t)j * L + k / 128]);
            double bound = (K + 2.0 * L + 1) * std::ldexp(1.0, -24) * abs_sum + 1e-30;
            double got = ours[(size_t)i * b.rows + j], want = ref[(size_t)i * b.rows + j];
            err2 += (got - want) * (got - want), ref2 += want * want;
            if (!(std::fabs(got - want) <= bound) && bad++ < 3)
                fprintf(stderr, "    %s[%d][%d]: ours %.9g, torch float64 %.9g, bound %.3g\n", what, i, j, got, want, bound);
        }
    CHECK_MSG(bad == 0, "%s: %d elements outside the FP32 accumulation bound", what, bad);
    printf("    %s: relative Frobenius error vs torch float64 %.3g\n", what, std::sqrt(err2 / ref2));
}

}  // namespace

TEST(fp8_block_quantizers_match_torch) {
    const Fixtures& f = fixtures();
    auto x = f.get<float>("x", (size_t)f.T * f.K), w = f.get<float>("w", (size_t)f.N * f.K);
    auto dy = f.get<float>("dy", (size_t)f.T * f.N);
    for (bool pow2 : {false, true}) {
        std::string sfx = pow2 ? "_pow2" : "";
        Fp8Tensor xq = fp8_quantize_rowwise(x.data(), f.T, f.K, pow2);
        Fp8Tensor xtq = fp8_quantize_rowwise_transposed(x.data(), f.T, f.K, pow2);
        Fp8Tensor wq = fp8_quantize_blockwise(w.data(), f.N, f.K, pow2);
        Fp8Tensor dyq = fp8_quantize_rowwise(dy.data(), f.T, f.N, pow2);
        Fp8Tensor dytq = fp8_quantize_rowwise_transposed(dy.data(), f.T, f.N, pow2);
        struct Case {
            const char* name;
            const std::vector<uint8_t>& codes;
            const std::vector<float>& scales;
        } cases[] = {{"x", xq.data, xq.scale_inv},
                     {"xt", xtq.data, xtq.scale_inv},
                     {"w", wq.data, wq.scale_inv},
                     {"dy", dyq.data, dyq.scale_inv},
                     {"dyt", dytq.data, dytq.scale_inv}};
        for (const Case& c : cases) {
            std::string codes = std::string(c.name) + "_codes" + sfx, scales = std::string(c.name) + "_scale_inv" + sfx;
            CHECK_MSG(count_differences(c.codes, f.get<uint8_t>(codes, c.codes.size()), codes.c_str()) == 0,
                      "%s differ from torch", codes.c_str());
            CHECK_MSG(count_differences(c.scales, f.get<float>(scales, c.scales.size()), scales.c_str()) == 0,
                      "%s differ from torch", scales.c_str());
        }
    }
}

TEST(fp8_block_gemms_match_torch_float64) {
    const Fixtures& f = fixtures();
    auto x = f.get<float>("x", (size_t)f.T * f.K), w = f.get<float>("w", (size_t)f.N * f.K);
    auto dy = f.get<float>("dy", (size_t)f.T * f.N);
    Fp8Weight wq = fp8_quantize_weight(w.data(), f.N, f.K, false);
    std::vector<float> y((size_t)f.T * f.N), dx((size_t)f.T * f.K), dw((size_t)f.N * f.K);
    fp8_linear_fprop(x.data(), f.T, wq, y.data(), false);
    fp8_linear_dgrad(dy.data(), f.T, wq, dx.data(), false);
    fp8_linear_wgrad(dy.data(), x.data(), f.T, f.N, f.K, false, Fp8Scaling::Block, dw.data(), false);
    auto xop = fp8_gemm_operand(fp8_quantize_rowwise(x.data(), f.T, f.K, false));
    auto dyop = fp8_gemm_operand(fp8_quantize_rowwise(dy.data(), f.T, f.N, false));
    check_gemm(xop, fp8_gemm_operand(wq.w), y, f.get<float>("y_ref", y.size()), "fprop Y");
    check_gemm(dyop, fp8_gemm_operand(wq.wt), dx, f.get<float>("dx_ref", dx.size()), "dgrad dX");
    check_gemm(fp8_gemm_operand(fp8_quantize_rowwise_transposed(dy.data(), f.T, f.N, false)),
               fp8_gemm_operand(fp8_quantize_rowwise_transposed(x.data(), f.T, f.K, false)), dw,
               f.get<float>("dw_ref", dw.size()), "wgrad dW");
    // accumulate = true adds onto what is there
    std::vector<float> y2 = y;
    fp8_linear_fprop(x.data(), f.T, wq, y2.data(), true);
    for (size_t i = 0; i < y.size(); i++) CHECK_MSG(y2[i] == y[i] + y[i], "accumulate at %zu", i);
}

// The dgrad copy is the transposed bytes and scale grid: every element dequantizes the same.
TEST(fp8_block_transpose_is_exact) {
    int N = 300, K = 200;
    std::vector<float> w((size_t)N * K);
    for (size_t i = 0; i < w.size(); i++) w[i] = std::sin(0.37f * (float)i) * (float)(1 + i % 13);
    Fp8Weight q = fp8_quantize_weight(w.data(), N, K, false);
    CHECK_EQ(q.wt.rows, K);
    CHECK_EQ(q.wt.cols, N);
    CHECK_EQ(q.wt.scale_inv.size(), (size_t)2 * round_up4(3));  // ceil(200/128) x roundup4(ceil(300/128))
    int bad = 0;
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++)
            bad += q.w.data[(size_t)n * K + k] != q.wt.data[(size_t)k * N + n] ||
                   q.w.scale_inv_at(n, k / 128) != q.wt.scale_inv_at(k, n / 128);
    CHECK_EQ(bad, 0);
}

// Zero, Inf, NaN and subnormal blocks give finite, positive scales; NaN stays NaN, Inf saturates.
TEST(fp8_block_special_values) {
    std::vector<float> x(4 * 256, 0.5f);  // [4][256]: rows 0..3, two groups each
    for (int c = 0; c < 128; c++) x[c] = 0.0f;                      // row 0 group 0: all zero
    x[1 * 256 + 3] = NAN;                                            // row 1 group 0: one NaN
    x[2 * 256 + 7] = -INFINITY;                                      // row 2 group 0: one -Inf
    for (int c = 128; c < 256; c++) x[3 * 256 + c] = 1e-40f;        // row 3 group 1: FP32 subnormals
    for (bool pow2 : {false, true}) {
        Fp8Tensor q = fp8_quantize_rowwise(x.data(), 4, 256, pow2);
        for (float s : q.scale_inv) CHECK_MSG(std::isfinite(s) && s > 0.0f, "scale_inv %g", s);
        CHECK_EQ(q.scale_inv_at(0, 0), 1.0f);
        CHECK_EQ(q.data[0], 0x00);
        CHECK_EQ(q.data[1 * 256 + 3], 0x7F);                    // NaN code
        CHECK_EQ(q.scale_inv_at(1, 0), pow2 ? 1.0f / 512.0f : 1.0f / 896.0f);  // amax 0.5: the NaN was ignored
        CHECK_EQ(q.scale_inv_at(2, 0), 1.0f);                   // Inf amax: scale 1
        CHECK_EQ(q.data[2 * 256 + 7], 0xFE);                    // -Inf saturates to -448
        CHECK_EQ(q.data[2 * 256 + 8], float_to_e4m3(0.5f));
        float deq = e4m3_to_float(q.data[3 * 256 + 200]) * q.scale_inv_at(3, 1);
        CHECK_NEAR(deq, 1e-40f, 0.07, 0);  // FLT_MAX scale: still within E4M3's relative step
        Fp8Tensor b = fp8_quantize_blockwise(x.data(), 4, 256, pow2);
        for (float s : b.scale_inv) CHECK_MSG(std::isfinite(s) && s >= 0.0f, "block scale_inv %g", s);
    }
}

// Quantize-dequantize error: at most half an E4M3 step, i.e. 2^-4 of the element for normals and
// half the subnormal step 2^-9 (in scaled units, times scale_inv) for subnormals.
TEST(fp8_block_round_trip_error_bound) {
    int R = 64, C = 320;
    std::vector<float> x((size_t)R * C);
    uint32_t s = 12345;
    for (float& v : x) {
        s = s * 1664525u + 1013904223u;
        v = ((float)(s >> 8) / 16777216.0f - 0.5f) * (1 + (s & 7));
    }
    for (bool pow2 : {false, true}) {
        Fp8Tensor q = fp8_quantize_rowwise(x.data(), R, C, pow2);
        int bad = 0;
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++) {
                float si = q.scale_inv_at(r, c / 128), v = x[(size_t)r * C + c];
                float deq = e4m3_to_float(q.data[(size_t)r * C + c]) * si;
                // normals: half a step is 2^-4 of the value; subnormals: half of 2^-9 (in scaled units)
                double tol = std::fmax(std::fabs(v) * 0.0625, std::ldexp(1.0, -10) * si) * 1.000001;
                bad += !(std::fabs(deq - v) <= tol);
            }
        CHECK_EQ(bad, 0);
        if (pow2)
            for (float si : q.scale_inv) CHECK_EQ(float_bits(si) & 0x007FFFFFu, 0u);  // powers of two
    }
}

TEST(fp8_block_bad_shapes_fail) {
    std::vector<float> x(16, 1.0f);
    CHECK_THROWS(fp8_quantize_rowwise(x.data(), 0, 16, false), "shape [0][16]");
    CHECK_THROWS(fp8_quantize_blockwise(x.data(), 4, -1, false), "must be positive");
    Fp8GemmOperand a = fp8_gemm_operand(fp8_quantize_rowwise(x.data(), 2, 8, false));
    Fp8GemmOperand b = fp8_gemm_operand(fp8_quantize_rowwise(x.data(), 4, 4, false));
    std::vector<float> out(8);
    CHECK_THROWS(fp8_gemm_nt_ref(a, b, out.data(), false), "reduction dims differ");
}

// --fp8_scaling row and tensor by their definition (spec-fp8.md §4): row r's scale is 448 over the
// amax of the whole row, the tensor's over the amax of all of it, each code the E4M3 of x * scale;
// the transposed quantizer quantizes x^T's rows; and the coarse granularities coincide with the
// fine one where their groups are the same (one 128-column group per row; one row).
TEST(fp8_row_and_tensor_quantizers_follow_their_definition) {
    const int R = 37, C = 300;
    std::vector<float> x((size_t)R * C);
    uint32_t s = 777;
    for (float& v : x) {
        s = s * 1664525u + 1013904223u;
        v = ((float)(s >> 8) / 16777216.0f - 0.5f) * (float)(1 + (s & 15));
    }
    for (bool pow2 : {false, true}) {
        const Fp8Tensor row = fp8_quantize_rowwise(x.data(), R, C, pow2, Fp8Scaling::Row);
        const Fp8Tensor tensor = fp8_quantize_rowwise(x.data(), R, C, pow2, Fp8Scaling::Tensor);
        CHECK_EQ(row.scale_inv.size(), (size_t)R);
        CHECK_EQ(tensor.scale_inv.size(), (size_t)1);
        double all = 0;
        for (float v : x) all = std::max(all, (double)std::fabs(v));
        const float tensor_scale = fp8_scale_from_amax((float)all, pow2);
        CHECK_EQ(tensor.scale_inv[0], 1.0f / tensor_scale);
        int bad = 0;
        for (int r = 0; r < R; r++) {
            double amax = 0;
            for (int c = 0; c < C; c++) amax = std::max(amax, (double)std::fabs(x[(size_t)r * C + c]));
            const float scale = fp8_scale_from_amax((float)amax, pow2);
            bad += row.scale_inv_at(r, 0) != 1.0f / scale;
            for (int c = 0; c < C; c++) {
                const float v = x[(size_t)r * C + c];
                bad += row.data[(size_t)r * C + c] != float_to_e4m3(v * scale);
                bad += tensor.data[(size_t)r * C + c] != float_to_e4m3(v * tensor_scale);
            }
        }
        CHECK_EQ(bad, 0);
        std::vector<float> xt((size_t)R * C);  // [C][R]
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++) xt[(size_t)c * R + r] = x[(size_t)r * C + c];
        for (Fp8Scaling g : {Fp8Scaling::Row, Fp8Scaling::Tensor}) {
            const Fp8Tensor t = fp8_quantize_rowwise_transposed(x.data(), R, C, pow2, g), u = fp8_quantize_rowwise(xt.data(), C, R, pow2, g);
            CHECK(t.data == u.data && t.scale_inv == u.scale_inv);
        }
        // one group per row: row scaling is 1x128 scaling; one row: tensor scaling is row scaling
        const Fp8Tensor narrow_row = fp8_quantize_rowwise(x.data(), R, 128, pow2, Fp8Scaling::Row);
        const Fp8Tensor narrow_block = fp8_quantize_rowwise(x.data(), R, 128, pow2, Fp8Scaling::Block);
        CHECK(narrow_row.data == narrow_block.data && narrow_row.scale_inv == narrow_block.scale_inv);
        const Fp8Tensor one_row = fp8_quantize_rowwise(x.data(), 1, C, pow2, Fp8Scaling::Row);
        const Fp8Tensor one_tensor = fp8_quantize_rowwise(x.data(), 1, C, pow2, Fp8Scaling::Tensor);
        CHECK(one_row.data == one_tensor.data && one_row.scale_inv == one_tensor.scale_inv);
    }
}

// The row and tensor GEMMs (OUTER_VEC, SCALAR) apply sA(i) sB(j) to the FP32 sum over all of K (cuBLAS
// docs): against an FP64 sum of the decoded products times the two scales, within FP32 summation
// error (2^-20 of sum |a b|, K = 300), for weights quantized per output channel and per input channel.
TEST(fp8_row_and_tensor_gemms_scale_after_the_full_k_sum) {
    const int T = 20, K = 300, N = 24;
    std::vector<float> x((size_t)T * K), w((size_t)N * K);
    uint32_t s = 99;
    for (std::vector<float>* v : {&x, &w})
        for (float& e : *v) {
            s = s * 1664525u + 1013904223u;
            e = ((float)(s >> 8) / 16777216.0f - 0.5f) * (float)(1 + (s & 7));
        }
    for (Fp8Scaling g : {Fp8Scaling::Row, Fp8Scaling::Tensor}) {
        const Fp8Weight wq = fp8_quantize_weight(w.data(), N, K, false, g);
        const Fp8Tensor xq = fp8_quantize_rowwise(x.data(), T, K, false, g);
        std::vector<float> y((size_t)T * N);
        fp8_linear_fprop(x.data(), T, wq, y.data(), false);
        int bad = 0;
        for (int t = 0; t < T; t++)
            for (int n = 0; n < N; n++) {
                double sum = 0, abs_sum = 0;
                for (int k = 0; k < K; k++) {
                    const double p = (double)e4m3_to_float(xq.data[(size_t)t * K + k]) * e4m3_to_float(wq.w.data[(size_t)n * K + k]);
                    sum += p, abs_sum += std::fabs(p);
                }
                const double sx = xq.scale_inv_at(t, 0), sw = wq.w.scale_inv_at(n, 0);
                bad += !(std::fabs(y[(size_t)t * N + n] - sx * sw * sum) <= std::ldexp(abs_sum, -20) * sx * sw * 1.01);
            }
        CHECK_MSG(bad == 0, "%s: %d outputs off the FP64 product", fp8_scaling_name(g), bad);
        // the dgrad copy is W^T quantized per input channel (row) or with W's one scale (tensor)
        const Fp8Tensor wt = fp8_quantize_rowwise_transposed(w.data(), N, K, false, g);
        CHECK(wq.wt.data == wt.data && wq.wt.scale_inv == wt.scale_inv);
        if (g == Fp8Scaling::Tensor) CHECK_EQ(wq.wt.scale_inv[0], wq.w.scale_inv[0]);
    }
}
