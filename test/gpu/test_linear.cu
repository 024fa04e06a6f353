// test_linear.cu: the GPU engine's linear layers (cuda/kernels/linear.cuh) against the CPU engine's
// (cpu/linear.h) on the same weights and inputs, in bf16 and fp8: forward, dgrad (accumulating
// into dx), wgrad (accumulating into dW). The GPU pads the token count to 128 with zero rows.
// Tolerance per element, justified: both sides multiply the same BF16 (or FP8-quantized, with the
// same bytes: the quantize kernels are bit-exact with the CPU's) values; they differ only in the
// order of FP32 sums, which Hopper's tensor cores keep to about 2^-11 of sum |a b| (spec-fp8.md §8)
// and the CPU to about 2^-20, so 2^-8 sum |a||b| leaves a factor 8 (FP8 codes can be up to 2^-4
// larger than the values they quantize). A BF16 output is rounded on both sides: one BF16 ulp apart
// at most, 2^-7 |y|.
#include <cmath>
#include <vector>

#include "cpu/linear.h"
#include "cuda/kernels/linear.cuh"
#include "test/gpu/gpu_util.cuh"
#include "test/harness.h"

using namespace fp8rl;

namespace {

std::vector<__nv_bfloat16> to_device_bf16(const std::vector<float>& x, size_t padded) {
    std::vector<__nv_bfloat16> out(padded, __float2bfloat16(0.0f));
    for (size_t i = 0; i < x.size(); i++) out[i] = __float2bfloat16(x[i]);
    return out;
}

std::vector<float> absolute(const std::vector<float>& x) {
    std::vector<float> a(x.size());
    for (size_t i = 0; i < x.size(); i++) a[i] = std::fabs(x[i]);
    return a;
}

// Elements of gpu[0 .. cpu.size()) outside |gpu - cpu| <= 2^-8 abs_dot + rel |cpu|.
long outside(const std::vector<float>& gpu, const std::vector<float>& cpu, const std::vector<float>& abs_dot, double rel,
             const std::string& what) {
    long bad = 0;
    double worst = 0;
    for (size_t i = 0; i < cpu.size(); i++) {
        double tol = std::ldexp((double)abs_dot[i], -8) + rel * std::fabs((double)cpu[i]) + 1e-30;
        double err = std::fabs((double)gpu[i] - cpu[i]);
        bad += !(err <= tol);
        worst = std::fmax(worst, err / tol);
    }
    printf("    %-40s worst |err|/tol %.3g, %ld of %zu outside\n", what.c_str(), worst, bad, cpu.size());
    return bad;
}

std::vector<float> bf16_download(const DeviceBuffer<__nv_bfloat16>& d, size_t n) {
    std::vector<__nv_bfloat16> raw = d.download();
    std::vector<float> out(n);
    for (size_t i = 0; i < n; i++) out[i] = __bfloat162float(raw[i]);
    return out;
}

void check_linear_layer(Precision p, int T, int K, int N, bool pow2) {
    const int Tp = (T + 127) / 128 * 128;
    const std::string tag = strfmt("%s T=%d K=%d N=%d%s", precision_name(p), T, K, N, pow2 ? " pow2" : "");
    std::vector<float> master(N * (size_t)K), x = bf16_values((size_t)T * K, 11, 2.0f),
                                               dy = bf16_values((size_t)T * N, 12, 0.5f);
    for (size_t i = 0; i < master.size(); i++) master[i] = 0.1f * hash_uniform(i, 13 + K) * (1 + (int)(i / K) % 5);
    std::vector<float> w(master.size());
    for (size_t i = 0; i < w.size(); i++) w[i] = round_bf16(master[i]);
    Fp8Weight w8 = fp8_quantize_weight(master.data(), N, K, pow2);
    LinearWeight cw{w.data(), nullptr, N, K, p == Precision::FP8 ? &w8 : nullptr, nullptr};

    // CPU: y, dx, dW (accumulated onto 0.125)
    std::vector<float> y((size_t)T * N), dx((size_t)T * K), dW(master.size(), 0.125f);
    linear_forward(y.data(), x.data(), T, cw, p);
    linear_backward(dx.data(), false, dW.data(), nullptr, dy.data(), x.data(), T, cw, p);

    // GPU
    DeviceBuffer<float> d_master(master);
    DeviceBuffer<__nv_bfloat16> d_w(to_device_bf16(w, w.size())), d_x(to_device_bf16(x, (size_t)Tp * K)),
        d_dy(to_device_bf16(dy, (size_t)Tp * N)), d_y((size_t)Tp * N);
    DeviceBuffer<uint8_t> codes(master.size()), codes_t(master.size());
    DeviceBuffer<float> scales(blk128_scale_count(N, K)), scales_t(blk128_scale_count(K, N));
    Fp8WeightCopy gw8{codes.ptr, scales.ptr, codes_t.ptr, scales_t.ptr, pow2, Fp8Scaling::Block};
    fp8_requantize_weight_gpu(d_master.ptr, N, K, gw8, nullptr, 0);
    LinearDevice gw{d_w.ptr, &gw8, N, K};
    DeviceBuffer<float> d_dx(std::vector<float>((size_t)Tp * K, 0.25f)), d_dW(std::vector<float>(master.size(), 0.125f));
    GemmRunner gemm;
    LinearScratch scratch(Tp, std::max(K, N), pow2);
    // fp8: x's FP8 operand as its producer writes it (here the one pass over a BF16 tensor)
    if (p == Precision::FP8) quantize_rows_gpu(d_x.ptr, T, K, scratch.rows_out(0, Tp, K), 0);
    linear_forward_gpu(gemm, scratch, p, gw, d_x.ptr, Tp, d_y.ptr, GemmOut::BF16, 0);
    linear_backward_gpu(gemm, scratch, p, gw, d_dy.ptr, d_x.ptr, Tp, d_dx.ptr, GemmOut::F32, d_dW.ptr, 0);

    std::vector<float> abs_y((size_t)T * N), abs_dx((size_t)T * K), abs_dw(master.size());
    std::vector<float> ax = absolute(x), aw = absolute(w), ady = absolute(dy);
    gemm_nt(T, N, K, ax.data(), K, aw.data(), K, abs_y.data(), N, false);
    gemm_nn(T, K, N, ady.data(), N, aw.data(), K, abs_dx.data(), K, false);
    gemm_tn(N, K, T, ady.data(), N, ax.data(), K, abs_dw.data(), K, false);
    std::vector<float> gy = bf16_download(d_y, (size_t)T * N), gdx = d_dx.download(), gdw = d_dW.download();
    gdx.resize((size_t)T * K);
    CHECK_EQ(outside(gy, y, abs_y, std::ldexp(1.0, -7), tag + " forward"), 0L);
    CHECK_EQ(outside(gdx, dx, abs_dx, 0, tag + " dgrad"), 0L);
    CHECK_EQ(outside(gdw, dW, abs_dw, 0, tag + " wgrad"), 0L);
    std::vector<float> pad = d_dx.download();
    int touched = 0;
    for (size_t i = (size_t)T * K; i < pad.size(); i++) touched += pad[i] != 0.0f;
    CHECK_MSG(touched == 0, "%s: %d dx entries of padding rows are not zero (their dy rows are zero)", tag.c_str(), touched);
}

}  // namespace

TEST(gpu_linear_layers_match_cpu_engine) {
    REQUIRE_GPU();
    for (Precision p : {Precision::BF16, Precision::FP8}) {
        check_linear_layer(p, 200, 80, 48, false);
        check_linear_layer(p, 130, 144, 272, p == Precision::FP8);
    }
}

TEST(gpu_linear_layers_reject_what_they_cannot_run) {
    REQUIRE_GPU();
    GemmRunner gemm;
    LinearScratch scratch(256, 64, false);
    DeviceBuffer<__nv_bfloat16> x(256 * 64);
    DeviceBuffer<float> y(256 * 64);
    LinearDevice no_fp8{x.ptr, nullptr, 64, 64};
    CHECK_THROWS(linear_forward_gpu(gemm, scratch, Precision::FP8, no_fp8, x.ptr, 256, y.ptr, GemmOut::F32, 0),
                 "fp8 needs the weight's FP8 copies");
    Fp8WeightCopy w8{};
    LinearDevice some{x.ptr, &w8, 64, 64};
    CHECK_THROWS(linear_forward_gpu(gemm, scratch, Precision::FP8, some, x.ptr, 200, y.ptr, GemmOut::F32, 0),
                 "padded to a multiple of 128 (got 200)");
    CHECK_THROWS(linear_forward_gpu(gemm, scratch, Precision::FP32, some, x.ptr, 256, y.ptr, GemmOut::F32, 0), "not fp32");
}
