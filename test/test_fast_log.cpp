// Tests of rl/numerics/fast_log.h against glibc's double-precision log.
#include <cmath>
#include <cstring>

#include "rl/common.h"
#include "rl/numerics/fast_log.h"
#include "test/harness.h"

using namespace fp8rl;

// Every 97th positive finite float from the smallest subnormal up (about 2.2e7 values; every 9973rd under the
// sanitizer): within 1 ulp of log in double, the ulp of the float nearest it (faithful rounding;
// 0.94 ulp at worst over every 7th float when written).
TEST(fast_log_within_1_ulp_of_libm) {
    const uint32_t stride = harness::sanitized ? 9973 : 97;
    double worst = 0.0;
    float worst_x = 0.0f;
    long checked = 0;
    for (uint64_t b = 1; b < 0x7F800000u; b += stride) {
        const float x = bits_float((uint32_t)b);
        const double want = std::log((double)x);
        const float near = (float)want;
        const double ulp = near == 0.0f ? 1.4e-45 : std::fabs((double)std::nextafter(near, INFINITY) - (double)near);
        const double err = std::fabs((double)fast_log(x) - want) / ulp;
        if (err > worst) worst = err, worst_x = x;
        checked++;
    }
    CHECK(checked > 1000);
    CHECK_MSG(worst < 1.0, "worst error %.3f ulp at x = %.9g", worst, worst_x);
}

TEST(fast_log_edges) {
    CHECK(fast_log(1.0f) == 0.0f);
    CHECK(fast_log(2.0f) == (float)std::log(2.0));
    CHECK(std::isinf(fast_log(0.0f)) && fast_log(0.0f) < 0);
    CHECK(std::isinf(fast_log(-0.0f)) && fast_log(-0.0f) < 0);
    CHECK(std::isinf(fast_log(INFINITY)) && fast_log(INFINITY) > 0);
    CHECK(std::isnan(fast_log(-1.0f)));
    CHECK(std::isnan(fast_log(-INFINITY)));
    CHECK(std::isnan(fast_log(NAN)));
}
