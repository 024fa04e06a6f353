// Tests of rl/numerics/fast_exp.h against glibc's double-precision exp.
#include <cmath>
#include <cstring>
#include <vector>

#include "rl/common.h"
#include "rl/numerics/fast_exp.h"
#include "test/harness.h"

using namespace fp8rl;

// Every 97th float in [-87, 88] (about 2.2e7 values; every 9973rd under the sanitizer): relative
// error against exp in double below 2 ulp (2^-22).
TEST(fast_exp_within_2_ulp_of_libm) {
    uint32_t lo_bits, hi_bits;
    const float lo = -87.0f, hi = 88.0f;
    std::memcpy(&lo_bits, &lo, 4);
    std::memcpy(&hi_bits, &hi, 4);
    const uint32_t stride = harness::sanitized ? 9973 : 97;
    double worst = 0.0;
    float worst_x = 0.0f;
    long checked = 0;
    auto check_range = [&](uint32_t from, uint32_t to) {  // bit patterns of one sign, walking from..to
        for (uint64_t b = from; b <= to; b += stride) {
            float x;
            const uint32_t bits = (uint32_t)b;
            std::memcpy(&x, &bits, 4);
            const double want = std::exp((double)x), err = std::fabs(fast_exp(x) - want) / want;
            if (err > worst) worst = err, worst_x = x;
            checked++;
        }
    };
    check_range(0, hi_bits);              // +0 .. 88
    check_range(0x80000000u, lo_bits);    // -0 .. -87
    CHECK(checked > 1000);
    CHECK_MSG(worst < std::ldexp(1.0, -22), "worst relative error %.3g at x = %.9g", worst, worst_x);
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
