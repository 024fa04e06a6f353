// exp2.h: 2^x in FP32 for the training attention's softmax (cuda/kernels/attention.cuh and its CPU
// oracle, cpu/attention.h), FlashAttention-2/3's exp2 domain: p = 2^(s * scale log2(e) - m scale log2(e)),
// one FFMA and one MUFU.EX2 an element on the GPU instead of fast_exp.h's dozen instructions.
//
// On a device (nvcc's device pass) it is PTX's ex2.approx.ftz.f32. Everywhere else (the CPU engine,
// and the emulated GPU, whose kernels g++ compiles as host code) it is one FP32 function: x = n + r
// with n = rint(x), r = x - n exact, |r| <= 1/2; 2^r by its Taylor polynomial e^(r ln 2) to degree 7
// (FMAs); times 2^n as two exact power-of-two products. Its relative error is below 7.3e-8 (0.61 x
// 2^-23; test_exp2 sweeps every 61st float of [-126, 128) against double-precision exp2), inside the
// PTX ISA's bound for ex2.approx.f32 (at most 2 ulp from the correctly rounded result, the ex2
// section's notes), so the emulation stays a GPU the PTX specification allows. Its special cases are ex2.approx.ftz.f32's: a subnormal input gives 1 (as
// 0 does: n = 0 and 1 + r p(r) rounds to 1), a result below 2^-126 (x < -126) flushes to +0, -inf gives +0, x >= 128 gives +inf,
// NaN stays NaN. The vector and scalar forms run the same operations, so results do not depend on
// where a value falls.
//
// So a real GPU's P differs from the CPU's (and the emulation's) by at most 2 ulp + 1/2 ulp (the
// correct rounding) + 0.61 ulp: 2^-22 + 2^-24 + 2^-23.7 < 3.7e-7 relative per exp (docs/gpu-engine.md, "Attention's exp2", carries that to P, O and lse).
#pragma once
#include <cmath>
#include <cstdint>
#include "rl/numerics/hostdevice.h"
#if FP8RL_HOST_AVX2
#include <immintrin.h>
#endif

namespace fp8rl {
namespace exp2_detail {
constexpr float kLo = -126.0f, kHi = 128.0f;  // below: a subnormal result, flushed; from kHi on: +inf
constexpr float kLog2e = 1.44269504088896341f;
// (ln 2)^k / k!, k = 1..7, rounded to FP32
constexpr float kC1 = 0.693147182464599609f, kC2 = 0.240226507186889648f, kC3 = 0.0555041097104549408f,
                kC4 = 0.00961812864989042282f, kC5 = 0.00133335578721016645f, kC6 = 0.000154035296873189509f,
                kC7 = 1.52527336467755958e-05f;
}  // namespace exp2_detail

// scale log2(e), the factor that takes a score to the exp2 domain (rounded once, as on the GPU).
FP8RL_HD float exp2_domain(float scale) { return mul_rn(scale, exp2_detail::kLog2e); }

FP8RL_HD float exp2_approx(float x) {
#ifdef __CUDA_ARCH__
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#else
    using namespace exp2_detail;
    if (x != x) return x;  // NaN
    if (x < kLo) return 0.0f;
    if (x >= kHi) return INFINITY;
    const float n = rintf(x), r = x - n;              // exact: n and x are within a factor 2, or n = 0
    float p = kC7;
    p = fmaf(p, r, kC6);
    p = fmaf(p, r, kC5);
    p = fmaf(p, r, kC4);
    p = fmaf(p, r, kC3);
    p = fmaf(p, r, kC2);
    p = fmaf(p, r, kC1);
    const float y = fmaf(p, r, 1.0f);
    const int32_t e = (int32_t)n, half = e >> 1;  // e in [-126, 128]: both halves are normal powers of 2
    return y * bits_float((uint32_t)(half + 127) << 23) * bits_float((uint32_t)(e - half + 127) << 23);
#endif
}

// 2^(x c - shift) with the product and the difference one FMA: the softmax's exp in the exp2 domain
// (c = exp2_domain(scale), shift = a running max times c, or a row's log-sum-exp times log2(e)).
FP8RL_HD float exp2_fma(float x, float c, float shift) { return exp2_approx(fmaf(x, c, -shift)); }

#if FP8RL_HOST_AVX2
// exp2_approx on eight lanes (the host form's operations).
inline __m256 exp2_approx8(__m256 x) {
    using namespace exp2_detail;
    const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), r = _mm256_sub_ps(x, n);
    __m256 p = _mm256_set1_ps(kC7);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC5));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC1));
    const __m256 y = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_cvtps_epi32(n), half = _mm256_srai_epi32(e, 1), bias = _mm256_set1_epi32(127);
    const __m256 lo = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, bias), 23));
    const __m256 hi = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(e, half), bias), 23));
    __m256 out = _mm256_mul_ps(_mm256_mul_ps(y, lo), hi);
    out = _mm256_blendv_ps(out, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(kLo), _CMP_LT_OQ));
    out = _mm256_blendv_ps(out, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, _mm256_set1_ps(kHi), _CMP_GE_OQ));
    return _mm256_blendv_ps(out, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));  // NaN stays NaN
}
#endif

// y[i] = exp2_fma(x[i], c, shift) for i < n (y may alias x).
inline void exp2_fma_row(float* y, const float* x, float c, float shift, long n) {
    long i = 0;
#if FP8RL_HOST_AVX2
    const __m256 cv = _mm256_set1_ps(c), neg = _mm256_set1_ps(-shift);
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp2_approx8(_mm256_fmadd_ps(_mm256_loadu_ps(x + i), cv, neg)));
#endif
    for (; i < n; i++) y[i] = exp2_fma(x[i], c, shift);
}

}  // namespace fp8rl
