// fp8.h: FP8 (OCP E4M3 "fn" and E5M2) <-> FP32 scalar conversions, shared by host and device code
// (FP8RL_HD), so the GPU quantize kernels and the CPU engine produce the same bytes.
// Encoding is one round-to-nearest-even step straight from FP32 (never through FP16: that would
// round twice), bit-exact with CUDA's __nv_cvt_float_to_fp8 (checked over all 2^32 inputs):
//   satfinite: magnitudes that round above the largest finite value (and +-Inf) give +-max
//              (E4M3 448, E5M2 57344);
//   no saturation: they give NaN (E4M3 0x7F/0xFF, which has no Inf) or +-Inf (E5M2 0x7C/0xFC);
//   a NaN input gives 0x7F in both formats (the sign is dropped, as CUDA does);
//   tiny magnitudes round to a signed zero; subnormals round correctly.
// Decoding is exact (every FP8 value is an FP32 value).
#pragma once
#include <cstdint>

#include "rl/numerics/bf16.h"
#include "rl/numerics/hostdevice.h"

namespace fp8rl {

enum class Fp8Format { E4M3, E5M2 };

constexpr float E4M3_MAX = 448.0f;
constexpr float E5M2_MAX = 57344.0f;

FP8RL_HD float fp8_max(Fp8Format fmt) { return fmt == Fp8Format::E4M3 ? E4M3_MAX : E5M2_MAX; }

FP8RL_HD uint8_t float_to_fp8(float x, Fp8Format fmt, bool satfinite) {
    bool e4m3 = fmt == Fp8Format::E4M3;
    uint32_t man_bits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
    uint32_t max_code = e4m3 ? 0x7Eu : 0x7Bu, overflow_code = satfinite ? max_code : (e4m3 ? 0x7Fu : 0x7Cu);
    uint32_t u = float_bits(x);
    uint32_t a = u & 0x7FFFFFFFu;  // |x|
    // Normal range: drop the low FP32 mantissa bits with round-to-nearest-even (add just under half
    // an FP8 ulp, plus one when the kept part is odd), then rebias the exponent. Magnitudes too
    // large for FP8 (Inf included) come out above max_code.
    uint32_t drop = 23 - man_bits;
    uint32_t rounding = (1u << (drop - 1)) - 1u + ((a >> drop) & 1u);
    uint32_t normal = (a + rounding - ((127 - bias) << 23)) >> drop;
    // Subnormal range: adding 2^(24 - bias - man_bits), whose FP32 ulp is the FP8 subnormal step,
    // makes the FPU round |x| to that grid in one RNE step; the mantissa bits are then the code.
    float magic = bits_float((127 + 24 - bias - man_bits) << 23);
    uint32_t subnormal = float_bits(bits_float(a) + magic) - float_bits(magic);
    uint32_t min_normal = (127 + 1 - bias) << 23;
    // Selects by masks rather than branches, so loops over tensors vectorize.
    uint32_t is_subnormal = 0u - (uint32_t)(a < min_normal);
    uint32_t code = (subnormal & is_subnormal) | (normal & ~is_subnormal);
    uint32_t is_overflow = 0u - (uint32_t)(code > max_code);
    code = (overflow_code & is_overflow) | (code & ~is_overflow);
    uint32_t is_nan = 0u - (uint32_t)(a > 0x7F800000u);
    return (uint8_t)((0x7Fu & is_nan) | ((((u >> 24) & 0x80u) | code) & ~is_nan));  // NaN loses its sign, as in CUDA
}

// The recipe's encoder: E4M3, saturate to finite (what every fp8rl FP8 tensor uses).
FP8RL_HD uint8_t float_to_e4m3(float x) { return float_to_fp8(x, Fp8Format::E4M3, true); }

FP8RL_HD float fp8_to_float(uint8_t code, Fp8Format fmt) {
    bool e4m3 = fmt == Fp8Format::E4M3;
    int man_bits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
    uint32_t sign = (uint32_t)(code & 0x80u) << 24;
    uint32_t exp = (code & 0x7Fu) >> man_bits;
    uint32_t man = code & ((1u << man_bits) - 1u);
    if (e4m3 && (code & 0x7Fu) == 0x7Fu) return bits_float(0x7FFFFFFFu);  // E4M3's only NaN
    if (!e4m3 && exp == 0x1Fu) return bits_float(sign | 0x7F800000u | (man << 21));  // Inf / NaN
    if (exp == 0) {  // zero / subnormal: man * 2^(1 - bias - man_bits), exact in FP32
        float quantum = bits_float((uint32_t)(127 + 1 - bias - man_bits) << 23);
        return bits_float(sign | float_bits((float)man * quantum));
    }
    return bits_float(sign | ((exp - bias + 127) << 23) | (man << (23 - man_bits)));
}

FP8RL_HD float e4m3_to_float(uint8_t code) { return fp8_to_float(code, Fp8Format::E4M3); }

}  // namespace fp8rl
