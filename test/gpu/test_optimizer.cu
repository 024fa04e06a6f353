// test_optimizer.cu: the optimizer's kernels against the CPU engine's (rl/objective/adamw.h, rl/numerics/fp8_block.h):
//   - AdamW (cuda/engine/adamw.cuh) equals AdamW::step bit for bit over several steps on ragged sizes,
//     including one past the kernel's grid-stride bound, and its BF16 copy equals round_bf16 of the
//     CPU's master;
//   - the FP8 copies the update writes for the projections equal the CPU quantizer's bytes and scales;
//   - the global gradient norm (cuda/engine/global_norm.cuh) is within its stated bound of grad_norm, and
//     clipping gives clip_grad_norm's gradients.
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "cuda/engine/adamw.cuh"
#include "cuda/engine/global_norm.cuh"
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

// One update of a buffer holding two projections (partial 128x128 blocks both ways, the second
// after its padding) and other parameters between and after them: the tile pass and the flat pass
// together update every parameter as AdamW::step does, and the FP8 copies equal the CPU quantizer's
// of the updated master; without an update, the copies alone (requantize_projections_gpu).
TEST(gpu_adamw_writes_fp8_copies_like_cpu) {
    const AdamWConfig cfg;
    for (bool pow2 : {false, true}) {
        struct Shape { int rows, cols; size_t offset; };
        const Shape shapes[2] = {{300, 260, 64}, {128, 144, 64 + 78016 + 1024}};  // 78000 floats padded to 78016, 1024 others
        const size_t n = shapes[1].offset + 128 * 144 + 333;
        std::vector<float> w(n), g = varied_gradient(n, 5);
        for (size_t i = 0; i < n; i++) w[i] = 0.05f * hash_uniform(i, 9) * (1 + (int)(i / 260) % 7);
        for (size_t i = 64 + 78000; i < 64 + 78016; i++) w[i] = g[i] = 0.0f;  // padding, zero as in weights.h's layout
        DeviceBuffer<float> d_w(w), d_m(std::vector<float>(n, 0.0f)), d_v(std::vector<float>(n, 0.0f)), d_g(g);
        std::vector<__nv_bfloat16> initial_bf16(n);  // the engine's BF16 copy before the update (of zero padding: 0)
        for (size_t i = 0; i < n; i++) initial_bf16[i] = __float2bfloat16_rn(w[i]);
        DeviceBuffer<__nv_bfloat16> d_w_bf16(initial_bf16);
        std::vector<std::unique_ptr<DeviceBuffer<uint8_t>>> codes, codes_t;
        std::vector<std::unique_ptr<DeviceBuffer<float>>> s, s_t;
        std::vector<ProjectionTiles> tiles;
        for (const Shape& sh : shapes) {
            const size_t e = (size_t)sh.rows * sh.cols;
            codes.emplace_back(new DeviceBuffer<uint8_t>(e)), codes_t.emplace_back(new DeviceBuffer<uint8_t>(e));
            s.emplace_back(new DeviceBuffer<float>(blk128_scale_count(sh.rows, sh.cols)));
            s_t.emplace_back(new DeviceBuffer<float>(blk128_scale_count(sh.cols, sh.rows)));
            codes.back()->poison(), codes_t.back()->poison(), s.back()->poison(), s_t.back()->poison();
            tiles.push_back({sh.offset, sh.rows, sh.cols, 0,
                             {codes.back()->ptr, s.back()->ptr, codes_t.back()->ptr, s_t.back()->ptr, pow2, Fp8Scaling::Block}});
        }
        const ProjectionTable table(tiles, n);
        adamw_update_with_fp8_gpu(d_w.ptr, d_m.ptr, d_v.ptr, d_w_bf16.ptr, d_g.ptr, n, table, cfg, 1, 1e-2, 0);
        AdamW cpu(n, cfg);
        cpu.step(w.data(), g.data(), 1e-2);
        std::vector<__nv_bfloat16> want_bf16(n);
        for (size_t i = 0; i < n; i++) want_bf16[i] = __float2bfloat16_rn(w[i]);
        size_t bad = count_bit_mismatches(d_w.download(), w, "w", n) + count_bit_mismatches(d_m.download(), cpu.m(), "m", n) +
                     count_bit_mismatches(d_v.download(), cpu.v(), "v", n) +
                     count_bit_mismatches(d_w_bf16.download(), want_bf16, "w_bf16", n);
        for (int pass = 0; pass < 2; pass++) {  // after the update; then again without one
            if (pass == 1) {
                for (size_t k = 0; k < 2; k++) codes[k]->poison(), codes_t[k]->poison(), s[k]->poison(), s_t[k]->poison();
                requantize_projections_gpu(d_w.ptr, table, 0);
            }
            for (size_t k = 0; k < 2; k++) {
                const Shape& sh = shapes[k];
                const Fp8Tensor q = fp8_quantize_blockwise(w.data() + sh.offset, sh.rows, sh.cols, pow2), qt = fp8_transpose(q);
                bad += count_bit_mismatches(codes[k]->download(), q.data, "codes", q.data.size()) +
                       count_bit_mismatches(s[k]->download(), q.scale_inv, "scale_inv", q.scale_inv.size()) +
                       count_bit_mismatches(codes_t[k]->download(), qt.data, "codes_t", qt.data.size()) +
                       count_bit_mismatches(s_t[k]->download(), qt.scale_inv, "scale_inv_t", qt.scale_inv.size());
            }
        }
        printf("    two projections in %zu parameters, pow2=%d: %zu values or bytes differ from the CPU's\n", n, (int)pow2, bad);
        CHECK(bad == 0);
    }
    std::vector<ProjectionTiles> off = {{32, 128, 128, 0, {}}};
    CHECK_THROWS(ProjectionTable(off, 100000), "it must start on 64");
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
