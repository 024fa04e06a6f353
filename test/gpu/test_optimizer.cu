// test_optimizer.cu: the optimizer's kernels against the CPU engine's (rl/objective/adamw.h, rl/numerics/fp8_block.h):
//   - AdamW (cuda/adamw.cuh) equals AdamW::step bit for bit over several steps on ragged sizes,
//     including one past the kernel's grid-stride bound, and its BF16 copy equals round_bf16 of the
//     CPU's master;
//   - the requantized FP8 copy of a projection weight equals the CPU quantizer's bytes and scales;
//   - the global gradient norm (cuda/global_norm.cuh) is within its stated bound of grad_norm, and
//     clipping gives clip_grad_norm's gradients.
#include <cmath>
#include <cstring>
#include <vector>

#include "cuda/adamw.cuh"
#include "cuda/global_norm.cuh"
#include "test/gpu/gpu_util.cuh"
#include "test/harness.h"

using namespace fp8rl;

namespace {

// Gradients as training produces them: magnitudes spread over many binades, exact zeros, and
// FP32-subnormal values (which the moments square into zero).
std::vector<float> varied_gradient(size_t n, uint32_t seed) {
    std::vector<float> g(n);
    for (size_t i = 0; i < n; i++) {
        float mag = std::ldexp(1.0f, (int)(12 * hash_uniform(i, seed + 1)) - 6);
        g[i] = mag * hash_uniform(i, seed);
        if (i % 97 == 5) g[i] = 0.0f;
        if (i % 101 == 7) g[i] = 3e-40f * hash_uniform(i, seed + 2);
    }
    return g;
}

template <class T>
size_t count_bit_mismatches(const std::vector<T>& a, const std::vector<T>& b, const char* what, size_t n) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(T)) != 0 && bad++ < 3)
            fprintf(stderr, "    %s[%zu]: device bits differ from the host's\n", what, i);
    return bad;
}

std::vector<uint16_t> bf16_bits(const std::vector<__nv_bfloat16>& x) {
    std::vector<uint16_t> out(x.size());
    memcpy(out.data(), x.data(), x.size() * sizeof(uint16_t));
    return out;
}

}  // namespace

TEST(gpu_adamw_matches_cpu_bit_for_bit) {
    const AdamWConfig cfg;  // torch's defaults, weight decay 0.01
    const double lrs[] = {1e-3, 3e-4, 2e-2};
    for (size_t n : {(size_t)1, (size_t)1000, (size_t)4099, (size_t)ADAMW_MAX_BLOCKS * ADAMW_THREADS + 77}) {
        std::vector<float> w(n);
        for (size_t i = 0; i < n; i++) w[i] = 0.5f * hash_uniform(i, 3);
        DeviceBuffer<float> d_w(w), d_m(std::vector<float>(n, 0.0f)), d_v(std::vector<float>(n, 0.0f)), d_g(n);
        DeviceBuffer<__nv_bfloat16> d_w_bf16(n);
        AdamW cpu(n, cfg);
        int steps = n > 10000 ? 1 : 3;
        size_t bad = 0;
        for (int step = 1; step <= steps; step++) {
            std::vector<float> g = varied_gradient(n, 10 * step);
            d_g.upload(g);
            d_w_bf16.poison();
            cpu.step(w.data(), g.data(), lrs[step - 1]);
            adamw_update_gpu(d_w.ptr, d_m.ptr, d_v.ptr, d_w_bf16.ptr, d_g.ptr, n, cfg, step, lrs[step - 1], 0);
            bad += count_bit_mismatches(d_w.download(), w, "w", n);
            bad += count_bit_mismatches(d_m.download(), cpu.m(), "m", n);
            bad += count_bit_mismatches(d_v.download(), cpu.v(), "v", n);
            std::vector<uint16_t> expected(n);
            for (size_t i = 0; i < n; i++) expected[i] = float_to_bf16(w[i]);
            bad += count_bit_mismatches(bf16_bits(d_w_bf16.download()), expected, "w_bf16", n);
        }
        printf("    n=%zu, %d steps: %zu of %zu w/m/v/BF16 values differ in any bit from rl/objective/adamw.h\n", n, steps, bad,
               4 * n * steps);
        CHECK_MSG(bad == 0, "n=%zu: %zu values differ", n, bad);
    }
    CHECK_THROWS(adamw_update_gpu(nullptr, nullptr, nullptr, nullptr, nullptr, 10, cfg, 0, 1e-3, 0), "step number");
}

TEST(gpu_adamw_projection_requantizes_fp8_like_cpu) {
    const AdamWConfig cfg;
    for (bool pow2 : {false, true}) {
        const int rows = 300, cols = 260;  // partial 128x128 blocks in both directions
        const size_t n = (size_t)rows * cols;
        std::vector<float> w(n), g = varied_gradient(n, 5);
        for (size_t i = 0; i < n; i++) w[i] = 0.05f * hash_uniform(i, 9) * (1 + (int)(i / cols) % 7);
        DeviceBuffer<float> d_w(w), d_m(std::vector<float>(n, 0.0f)), d_v(std::vector<float>(n, 0.0f)), d_g(g);
        DeviceBuffer<__nv_bfloat16> d_w_bf16(n);
        DeviceBuffer<uint8_t> codes(n), codes_t(n);
        DeviceBuffer<float> s(blk128_scale_count(rows, cols)), s_t(blk128_scale_count(cols, rows));
        codes.poison(), codes_t.poison(), s.poison(), s_t.poison();
        adamw_update_projection_gpu(d_w.ptr, d_m.ptr, d_v.ptr, d_w_bf16.ptr, d_g.ptr, rows, cols, cfg, 1, 1e-2,
                                    {codes.ptr, s.ptr, codes_t.ptr, s_t.ptr, pow2}, 0);
        AdamW cpu(n, cfg);
        cpu.step(w.data(), g.data(), 1e-2);
        Fp8Blockwise q = fp8_quantize_blockwise(w.data(), rows, cols, pow2), qt = fp8_transpose(q);
        size_t bad_w = count_bit_mismatches(d_w.download(), w, "w", n);
        size_t bad_codes = count_bit_mismatches(codes.download(), q.data, "codes", n);
        size_t bad_scales = count_bit_mismatches(s.download(), q.scale_inv, "scale_inv", q.scale_inv.size());
        size_t bad_codes_t = count_bit_mismatches(codes_t.download(), qt.data, "codes_t", n);
        size_t bad_scales_t = count_bit_mismatches(s_t.download(), qt.scale_inv, "scale_inv_t", qt.scale_inv.size());
        printf("    [%d][%d] pow2=%d: bytes differing from the CPU quantizer: codes %zu, scales %zu, transposed codes "
               "%zu, transposed scales %zu (master %zu)\n",
               rows, cols, (int)pow2, bad_codes, bad_scales, bad_codes_t, bad_scales_t, bad_w);
        CHECK(bad_w == 0 && bad_codes == 0 && bad_scales == 0 && bad_codes_t == 0 && bad_scales_t == 0);
    }
}

// Norm: S = sum g^2 has exact terms in double, so the CPU's sequential sum and the GPU's tree each
// round at most (number of additions) times: |S_gpu - S_cpu| <= (2n) 2^-53 S, and the square root
// halves a relative error and adds one rounding: |norm_gpu / norm_cpu - 1| <= (n + 1) 2^-53.
// Clipping: the factor is computed from the norm by the same double operations, so equal norms give
// equal gradients bit for bit; a norm that differs (within the bound) can move a scaled value by
// one float ulp.
TEST(gpu_grad_norm_and_clipping_match_cpu) {
    DeviceBuffer<double> partial(GRAD_NORM_MAX_BLOCKS), sum_sq(1), norm(1);
    for (size_t n : {(size_t)1, (size_t)300, (size_t)GRAD_NORM_MAX_BLOCKS * GRAD_NORM_THREADS + 4433}) {
        std::vector<float> g = varied_gradient(n, 77);
        DeviceBuffer<float> d_g(g);
        grad_norm_squared_gpu(d_g.ptr, n, partial.ptr, sum_sq.ptr, 0);
        double cpu_norm = grad_norm(g.data(), n);
        double rel = std::fabs(std::sqrt(sum_sq.download()[0]) / cpu_norm - 1.0), bound = (n + 1) * std::ldexp(1.0, -53);
        printf("    n=%zu: |norm_gpu / norm_cpu - 1| = %.3g (bound %.3g)\n", n, rel, bound);
        CHECK_MSG(rel <= bound, "n=%zu: relative norm error %.3g above %.3g", n, rel, bound);

        for (double max_norm : {cpu_norm / 3, cpu_norm * 2, 0.0}) {  // clips, does not clip, disabled
            std::vector<float> clipped = g;
            double cpu_before = clip_grad_norm(clipped.data(), n, max_norm);
            d_g.upload(g);
            clip_grad_norm_gpu(d_g.ptr, n, sum_sq.ptr, max_norm, norm.ptr, 0);
            std::vector<float> gpu = d_g.download();
            double gpu_before = norm.download()[0];
            size_t differ = 0, beyond_ulp = 0;
            for (size_t i = 0; i < n; i++) {
                if (float_bits(gpu[i]) == float_bits(clipped[i])) continue;
                differ++;
                beyond_ulp += std::fabs(gpu[i] - clipped[i]) > std::fabs(std::nextafter(clipped[i], 0.0f) - clipped[i]);
            }
            bool same_norm = gpu_before == cpu_before;
            printf("    n=%zu max_norm=%.4g: norms %s, %zu gradients differ in bits, %zu by more than an ulp\n", n,
                   max_norm, same_norm ? "equal" : "differ", differ, beyond_ulp);
            CHECK_MSG(std::fabs(gpu_before / cpu_before - 1.0) <= bound, "n=%zu: the reported norm", n);
            CHECK_MSG(same_norm ? differ == 0 : beyond_ulp == 0, "n=%zu max_norm=%g: clipped gradients", n, max_norm);
        }
    }
    // A NaN gradient: the norm is NaN and nothing is scaled (the engine skips the update).
    std::vector<float> g = varied_gradient(1000, 3);
    g[123] = NAN;
    DeviceBuffer<float> d_g(g);
    grad_norm_squared_gpu(d_g.ptr, g.size(), partial.ptr, sum_sq.ptr, 0);
    clip_grad_norm_gpu(d_g.ptr, g.size(), sum_sq.ptr, 1.0, norm.ptr, 0);
    std::vector<float> after = d_g.download();
    CHECK(std::isnan(norm.download()[0]));
    CHECK(count_bit_mismatches(after, g, "g", g.size()) == 0);
    CHECK_THROWS(grad_norm_squared_gpu(d_g.ptr, 0, partial.ptr, sum_sq.ptr, 0), "no elements");
}
