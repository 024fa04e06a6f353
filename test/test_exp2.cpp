// Tests of rl/numerics/exp2.h (the host form of ex2.approx.ftz.f32) against glibc's double-precision exp2
// and against the special cases the PTX ISA gives ex2.approx.ftz.f32.
#include <cmath>
#include <cstring>
#include <vector>

#include "rl/common.h"
#include "rl/numerics/exp2.h"
#include "test/float_sweep.h"
#include "test/harness.h"

using namespace fp8rl;

// Every 97th float in [-126, 128) (about 2.3e7 values; every 9973rd under the sanitizer): relative error
// against exp2 in double below 2^-23.5 (the header's 7.3e-8 with a margin), well inside ex2.approx.f32's
// documented 2 ulp (2^-22).
TEST(exp2_approx_within_its_bound_of_libm) {
    const uint32_t lo = float_bits_of(-126.0f), hi = float_bits_of(std::nextafter(128.0f, 0.0f));
    const uint32_t stride = harness::sanitized ? 9973 : 97;
    auto ours = [](float x) { return exp2_approx(x); };
    auto exact = [](double x) { return std::exp2(x); };
    FloatSweep e;
    e.range(0x00800000u, hi, stride, ours, exact);  // the smallest normal .. 128
    e.range(0x80800000u, lo, stride, ours, exact);  // -the smallest normal .. -126
    e.range(hi, hi, 1, ours, exact);                // the ends themselves
    e.range(lo, lo, 1, ours, exact);
    CHECK(e.checked > 1000);
    printf("  worst relative error %.3g (2^%.2f) at x = %.9g\n", e.worst, std::log2(e.worst), e.worst_x);
    CHECK_MSG(e.worst < std::ldexp(1.0, -23.5), "worst relative error %.3g at x = %.9g", e.worst, e.worst_x);
}

// ex2.approx.ftz.f32's special cases (PTX ISA, ex2): -inf -> +0, +-0 -> 1, +inf -> +inf, NaN -> NaN; with
// .ftz subnormal inputs read as 0 and results below 2^-126 flush to +0.
TEST(exp2_approx_special_cases) {
    const float tiny = std::ldexp(1.0f, -140), below = std::nextafter(-126.0f, -INFINITY);
    CHECK(exp2_approx(-INFINITY) == 0.0f && !std::signbit(exp2_approx(-INFINITY)));
    CHECK(exp2_approx(0.0f) == 1.0f && exp2_approx(-0.0f) == 1.0f);
    CHECK(exp2_approx(tiny) == 1.0f && exp2_approx(-tiny) == 1.0f);
    CHECK(exp2_approx(-126.0f) == std::ldexp(1.0f, -126));
    CHECK(exp2_approx(below) == 0.0f && exp2_approx(-140.0f) == 0.0f);
    CHECK(std::isinf(exp2_approx(128.0f)) && std::isinf(exp2_approx(INFINITY)));
    CHECK(std::isfinite(exp2_approx(std::nextafter(128.0f, 0.0f))));
    CHECK(std::isnan(exp2_approx(NAN)));
    for (int e = -126; e <= 127; e++) CHECK_MSG(exp2_approx((float)e) == std::ldexp(1.0f, e), "2^%d", e);
}

// The vector body and the scalar tail give the same bits for the same value, whatever its place.
TEST(exp2_approx_vector_equals_scalar) {
    std::vector<float> x(1003), y(x.size());
    for (size_t i = 0; i < x.size(); i++) x[i] = -140.0f + 280.0f * (float)i / (float)x.size() + 1e-3f * (float)(i % 7);
    x[5] = NAN, x[6] = -INFINITY, x[7] = INFINITY, x[8] = std::ldexp(1.0f, -140);
    const float domain[2][2] = {{1.0f, 0.0f}, {exp2_domain(0.125f), 0.5f}};  // (c, shift): the edges, then a softmax's
    for (const auto& [c, shift] : domain)
    for (size_t start = 0; start < 8; start++) {
        exp2_fma_row(y.data() + start, x.data() + start, c, shift, (long)(x.size() - start));
        for (size_t i = start; i < x.size(); i++) {
            const float want = exp2_fma(x[i], c, shift);
            CHECK_MSG(std::memcmp(&y[i], &want, 4) == 0 || (std::isnan(y[i]) && std::isnan(want)),
                      "x = %.9g at offset %zu: vector %.9g, scalar %.9g", x[i], i - start, y[i], want);
        }
    }
}
