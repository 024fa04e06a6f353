// fast_log.h: log(x) in FP32 whose bits the host and the device agree on, for decode attention's
// log-sum-exp (kv_cache.cuh's split kernel and cpu/attention.h's decode row). CUDA's logf and glibc's
// logf may differ in the last bit, and CUDA's converts the exponent with an I2F instruction; this
// one takes the exponent to float by adding it to the bits of 1.5 x 2^23.
//
// Cephes' logf: x = m 2^e with m in [sqrt(1/2), sqrt(2)), log(1 + f) for f = m - 1 by a degree-9
// polynomial, plus e ln 2 (ln 2 = hi + lo). Faithful: within 1 ulp of log in double on the
// positive floats (0.94 at worst; test_fast_log). Every product is an explicit fmaf or mul_rn, so nvcc contracts nothing.
// x = 0 gives -inf, +inf gives +inf, x < 0 and NaN give NaN.
#pragma once
#include <cmath>
#include <cstdint>
#include "rl/numerics/hostdevice.h"

namespace fp8rl {
namespace fast_log_detail {
constexpr float kSqrtHalf = 0.707106781186547524f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;  // ln 2 = hi + lo, hi exact in 9 bits
constexpr float kL0 = 7.0376836292e-2f, kL1 = -1.1514610310e-1f, kL2 = 1.1676998740e-1f, kL3 = -1.2420140846e-1f,
                kL4 = 1.4249322787e-1f, kL5 = -1.6668057665e-1f, kL6 = 2.0000714765e-1f, kL7 = -2.4999993993e-1f,
                kL8 = 3.3333331174e-1f;  // log(1 + f) ~ f - f^2 / 2 + f^3 (kL8 + f (kL7 + ...))
}  // namespace fast_log_detail

FP8RL_HD float fast_log(float x) {
    using namespace fast_log_detail;
    if (!(x > 0.0f)) return x == 0.0f ? -INFINITY : NAN;  // negative or NaN
    if (x == INFINITY) return x;
    uint32_t u = float_bits(x);
    int e = -126;
    if (u < 0x00800000u) u = float_bits(mul_rn(x, 8388608.0f)), e -= 23;  // subnormal: x 2^23 is normal
    e += (int)(u >> 23);
    float m = bits_float((u & 0x007FFFFFu) | 0x3F000000u);  // x = m 2^e, m in [0.5, 1)
    if (m < kSqrtHalf) {
        e -= 1;
        m = m + m - 1.0f;  // exact: 2m in [1, sqrt 2)
    } else {
        m = m - 1.0f;  // exact (Sterbenz)
    }
    const float z = mul_rn(m, m);
    float p = kL0;
    p = fmaf(p, m, kL1);
    p = fmaf(p, m, kL2);
    p = fmaf(p, m, kL3);
    p = fmaf(p, m, kL4);
    p = fmaf(p, m, kL5);
    p = fmaf(p, m, kL6);
    p = fmaf(p, m, kL7);
    p = fmaf(p, m, kL8);
    float y = mul_rn(mul_rn(p, m), z);
    const float ef = bits_float(0x4B400000u + (uint32_t)e) - 12582912.0f;  // (float)e: 1.5 x 2^23 + e, less 1.5 x 2^23
    y = fmaf(ef, kLn2Lo, y);
    y = fmaf(z, -0.5f, y);
    return fmaf(ef, kLn2Hi, m + y);
}

}  // namespace fp8rl
