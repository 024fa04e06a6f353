// fast_exp.h: exp(x) in FP32 for the CPU engine's hot loops (softmax of the head and attention,
// SiLU), eight lanes at a time with AVX2. glibc's expf is not vectorised without -ffast-math, and
// these loops evaluate it ~10^8 times per training step.
//
// Cephes' expf: x = n ln2 + r with n = round(x / ln2) and |r| <= ln2 / 2, exp(r) by a degree-7
// polynomial, times 2^n. Relative error below 2 ulp on the normal range (checked against glibc in
// test_fast_exp). The vector and scalar forms run the same operations (fused multiply-adds
// included), so a value's result does not depend on whether it fell in a vector or in a tail:
// results stay bitwise identical for any thread count and batch layout.
// Range: x < -87 gives 0 (true value below 1.7e-38), x > 88 gives +inf, NaN stays NaN.
#pragma once
#include <cmath>
#include <cstdint>
#include "rl/numerics/hostdevice.h"
#if FP8RL_HOST_AVX2
#include <immintrin.h>
#endif

namespace fp8rl {
namespace fast_exp_detail {
constexpr float kLo = -87.0f, kHi = 88.0f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;  // ln 2 = hi + lo, hi exact in 9 bits
constexpr float kP0 = 1.9875691500e-4f, kP1 = 1.3981999507e-3f, kP2 = 8.3334519073e-3f, kP3 = 4.1665795894e-2f,
                kP4 = 1.6666665459e-1f, kP5 = 5.0000001201e-1f;  // exp(r) ~ 1 + r + r^2 (kP5 + r (kP4 + ...))
}  // namespace fast_exp_detail

namespace fast_exp_detail {
// exp(x) for x in [kLo, kHi]: the polynomial of the reduced argument times 2^n.
FP8RL_HD float in_range(float x) {
    const float n = rintf(x * kLog2e);
    float r = fmaf(n, -kLn2Hi, x);
    r = fmaf(n, -kLn2Lo, r);
    float p = kP0;
    p = fmaf(p, r, kP1);
    p = fmaf(p, r, kP2);
    p = fmaf(p, r, kP3);
    p = fmaf(p, r, kP4);
    p = fmaf(p, r, kP5);
    const float y = fmaf(p, r * r, r) + 1.0f;
    return y * bits_float((uint32_t)((int32_t)n + 127) << 23);  // 2^n, n in [-126, 127] on this range
}
}  // namespace fast_exp_detail

// The scalar form; host and device code (the sampler, rl/numerics/sampling.h) compute the same bits.
FP8RL_HD float fast_exp(float x) {
    using namespace fast_exp_detail;
    if (x != x) return x;  // NaN
    if (x < kLo) return 0.0f;
    if (x > kHi) return INFINITY;
    return in_range(x);
}

// fast_exp(x)'s bits for every x <= 88 and NaN (a softmax's exp(z - max): z - max <= 0), without
// its branches: the polynomial of max(x, -87) (the same operations on x where x >= -87; NaN gives
// -87), then 0 below -87 and x itself for NaN, by selects. A GPU kernel pays every instruction of
// the branches' paths a logit (issue 59: the LM head's statistics); x > 88 is outside its domain
// (it gives exp(88), not inf).
FP8RL_HD float fast_exp_unbranched(float x) {
    using namespace fast_exp_detail;
    const float y = in_range(fmaxf(x, kLo));
    return x != x ? x : x < kLo ? 0.0f : y;
}

#if FP8RL_HOST_AVX2
// The same function on eight lanes.
inline __m256 fast_exp8(__m256 x) {
    using namespace fast_exp_detail;
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Hi), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Lo), r);
    __m256 p = _mm256_set1_ps(kP0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP5));
    const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 out = _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
    out = _mm256_blendv_ps(out, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(kLo), _CMP_LT_OQ));
    return _mm256_blendv_ps(out, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, _mm256_set1_ps(kHi), _CMP_GT_OQ));
}
#endif

// y[i] = exp(x[i] - shift) for i < n (y may alias x).
inline void fast_exp_shifted(float* y, const float* x, float shift, long n) {
    long i = 0;
#if FP8RL_HOST_AVX2
    const __m256 s = _mm256_set1_ps(shift);
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, fast_exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), s)));
#endif
    for (; i < n; i++) y[i] = fast_exp(x[i] - shift);
}

}  // namespace fp8rl
