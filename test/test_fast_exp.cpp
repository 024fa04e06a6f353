// Tests of rl/numerics/fast_exp.h against glibc's double-precision exp.
#include <cmath>
#include <cstring>
#include <vector>

#include "rl/common.h"
#include "rl/numerics/fast_exp.h"
#include "test/float_sweep.h"
#include "test/harness.h"

using namespace fp8rl;

// Every 97th float in [-87, 88] (about 2.2e7 values; every 9973rd under the sanitizer): relative
// error against exp in double below 2 ulp (2^-22).
TEST(fast_exp_within_2_ulp_of_libm) {
    const uint32_t stride = harness::sanitized ? 9973 : 97;
    auto ours = [](float x) { return fast_exp(x); };
    auto exact = [](double x) { return std::exp(x); };
    FloatSweep e;
    e.range(0, float_bits_of(88.0f), stride, ours, exact);             // +0 .. 88
    e.range(0x80000000u, float_bits_of(-87.0f), stride, ours, exact);  // -0 .. -87
    CHECK(e.checked > 1000);
    CHECK_MSG(e.worst < std::ldexp(1.0, -22), "worst relative error %.3g at x = %.9g", e.worst, e.worst_x);
}

TEST(fast_exp_edges) {
    CHECK(fast_exp(0.0f) == 1.0f);
    CHECK(fast_exp(-INFINITY) == 0.0f);
    CHECK(fast_exp(-100.0f) == 0.0f);
    CHECK(std::isinf(fast_exp(100.0f)));
    CHECK(std::isinf(fast_exp(INFINITY)));
    CHECK(std::isnan(fast_exp(NAN)));
}

// The vector body and the scalar tail give the same bits for the same value, whatever its place.
TEST(fast_exp_vector_equals_scalar) {
    std::vector<float> x(1003), y(x.size());
    for (size_t i = 0; i < x.size(); i++) x[i] = -90.0f + 180.0f * (float)i / (float)x.size() + 1e-3f * (float)(i % 7);
    x[5] = NAN, x[6] = -INFINITY, x[7] = INFINITY;
    for (size_t start = 0; start < 8; start++) {
        fast_exp_shifted(y.data() + start, x.data() + start, 0.5f, (long)(x.size() - start));
        for (size_t i = start; i < x.size(); i++) {
            const float want = fast_exp(x[i] - 0.5f);
            CHECK_MSG(std::memcmp(&y[i], &want, 4) == 0 || (std::isnan(y[i]) && std::isnan(want)),
                      "x = %.9g at offset %zu: vector %.9g, scalar %.9g", x[i], i - start, y[i], want);
        }
    }
}

// fast_exp_unbranched gives fast_exp's bits on its domain (x <= 88, NaN): every 97th pattern from -0
// to -inf and from +0 to 88 (every 9973rd under the sanitizer), and the edges around -87 and 88.
TEST(fast_exp_unbranched_equals_fast_exp) {
    const uint32_t stride = harness::sanitized ? 9973 : 97;
    long checked = 0, differing = 0;
    auto check = [&](float x) {
        const float a = fast_exp_unbranched(x), b = fast_exp(x);
        checked++;
        if (std::memcmp(&a, &b, 4) != 0 && differing++ < 5) printf("    x = %.9g: %.9g, fast_exp %.9g\n", x, a, b);
    };
    auto sweep = [&](uint32_t from, uint32_t to) {
        for (uint64_t bits = from; bits <= to; bits += stride) {
            float x;
            const uint32_t b = (uint32_t)bits;
            std::memcpy(&x, &b, 4);
            check(x);
        }
    };
    sweep(0x80000000u, float_bits_of(-INFINITY));
    sweep(0, float_bits_of(88.0f));
    for (const float edge : {-87.0f, 88.0f, 0.0f}) {  // the edge and 3 floats below it; above it too but at 88
        float below = edge, above = edge;
        for (int i = 0; i < 4; i++) {
            check(below), below = std::nextafter(below, -INFINITY);
            if (edge < 88.0f) check(above), above = std::nextafter(above, INFINITY);
        }
    }
    for (const float x : {-0.0f, -INFINITY, NAN, -NAN, std::nanf("0x12345")}) check(x);
    printf("    %ld values, %ld differing\n", checked, differing);
    CHECK(checked > 1000);
    CHECK(differing == 0);
}
