// bf16.h: BF16 and F16 <-> FP32 scalar conversions, shared by host and device code (FP8RL_HD).
// BF16 is the upper 16 bits of an IEEE FP32. Encoding rounds to nearest, ties to even (what
// torch's .to(bfloat16) and CUDA's __float2bfloat16 do); a NaN stays a quiet NaN with its sign;
// overflow rounds to infinity. Decoding is exact. F16 (IEEE half) only needs exact decoding
// here (checkpoints stored in float16); its encoder rounds to nearest even as well.
#pragma once
#include <cstdint>

#include "rl/numerics/hostdevice.h"

namespace fp8rl {

FP8RL_HD float bf16_to_float(uint16_t h) { return bits_float((uint32_t)h << 16); }

FP8RL_HD uint16_t float_to_bf16(float f) {
    uint32_t u = float_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u);  // NaN: keep sign, force quiet
    uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u);  // ties go to the even upper half
    return (uint16_t)((u + rounding) >> 16);
}

// Rounds an FP32 value to the nearest BF16 value, kept in FP32 (where the GPU stores BF16).
FP8RL_HD float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

FP8RL_HD float f16_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t man = h & 0x3FFu;
    if (exp == 0x1F) return bits_float(sign | 0x7F800000u | (man << 13));  // inf / NaN
    if (exp == 0) {                                                         // zero / subnormal: man * 2^-24
        float v = (float)man * 5.9604644775390625e-08f;
        return sign ? -v : v;
    }
    return bits_float(sign | ((exp + 112u) << 23) | (man << 13));
}

FP8RL_HD uint16_t float_to_f16(float f) {
    uint32_t u = float_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu));  // quiet NaN
    if (a >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);  // >= 65520 rounds to infinity
    if (a < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal, step 2^-24
        // a * 2^24 rounded to nearest even; exact in FP32 because the result is below 2^10
        float scaled = bits_float(a) * 16777216.0f;
        uint32_t q = (uint32_t)scaled;
        float rem = scaled - (float)q;
        if (rem > 0.5f || (rem == 0.5f && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t rounding = 0xFFFu + ((a >> 13) & 1u);
    return (uint16_t)(sign | ((a - (112u << 23) + rounding) >> 13));
}

}  // namespace fp8rl
