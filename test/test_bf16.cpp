// Tests of rl/numerics/bf16.h: hand-derivable IEEE facts (exact values, round-to-nearest-even ties, NaN and
// overflow). The exhaustive bit-exact comparison with cuda_bf16.h lives with the FP8 tests.
#include <cmath>
#include <limits>

#include "rl/numerics/bf16.h"
#include "rl/common.h"
#include "test/harness.h"

using namespace fp8rl;

TEST(bf16_known_values) {
    CHECK_EQ(float_to_bf16(1.0f), (uint16_t)0x3F80);
    CHECK_EQ(float_to_bf16(-2.0f), (uint16_t)0xC000);
    CHECK_EQ(float_to_bf16(0.0f), (uint16_t)0x0000);
    CHECK_EQ(float_to_bf16(-0.0f), (uint16_t)0x8000);
    CHECK_EQ(float_to_bf16(INFINITY), (uint16_t)0x7F80);
    CHECK_EQ(float_to_bf16(-INFINITY), (uint16_t)0xFF80);
    CHECK_EQ(bf16_to_float(0x3F80), 1.0f);
    CHECK_EQ(bf16_to_float(0x4049), 3.140625f);
    CHECK_EQ(float_to_bf16(3.14159265f), (uint16_t)0x4049);
    CHECK_EQ(bf16_to_float(0x0001), std::ldexp(1.0f, -133));  // smallest subnormal
}

TEST(bf16_round_to_nearest_even) {
    // 1 + 2^-8 is halfway between 1 (0x3F80, even) and 1 + 2^-7 (0x3F81): ties go to even.
    CHECK_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), (uint16_t)0x3F80);
    // 1 + 3*2^-8 is halfway between 0x3F81 (odd) and 0x3F82 (even).
    CHECK_EQ(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), (uint16_t)0x3F82);
    // just above the tie rounds up, just below rounds down
    CHECK_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), (uint16_t)0x3F81);
    CHECK_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8) - std::ldexp(1.0f, -20)), (uint16_t)0x3F80);
    // the largest finite float rounds to infinity; the largest BF16 stays
    CHECK_EQ(float_to_bf16(std::numeric_limits<float>::max()), (uint16_t)0x7F80);
    CHECK_EQ(float_to_bf16(bf16_to_float(0x7F7F)), (uint16_t)0x7F7F);
    CHECK_EQ(round_bf16(1.0f + std::ldexp(1.0f, -7)), 1.0f + std::ldexp(1.0f, -7));
}

TEST(bf16_nan_stays_nan) {
    for (uint32_t bits : {0x7FC00000u, 0x7F800001u, 0xFF800001u, 0x7FFFFFFFu, 0x7F80FFFFu}) {
        uint16_t h = float_to_bf16(bits_float(bits));
        CHECK_MSG(std::isnan(bf16_to_float(h)), "0x%08x -> 0x%04x", bits, h);
        CHECK_EQ(h >> 15, (int)(bits >> 31));  // sign kept
    }
}

TEST(bf16_decode_encode_round_trip) {
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = bf16_to_float((uint16_t)h);
        if (std::isnan(f)) continue;
        if (float_to_bf16(f) != h) bad++;
    }
    CHECK_EQ(bad, 0);
}

TEST(bf16_f16_conversions) {
    CHECK_EQ(f16_to_float(0x3C00), 1.0f);
    CHECK_EQ(f16_to_float(0xC000), -2.0f);
    CHECK_EQ(f16_to_float(0x7BFF), 65504.0f);
    CHECK_EQ(f16_to_float(0x0001), std::ldexp(1.0f, -24));
    CHECK_EQ(f16_to_float(0x0400), std::ldexp(1.0f, -14));
    CHECK(std::isinf(f16_to_float(0x7C00)));
    CHECK(std::isnan(f16_to_float(0x7E00)));
    CHECK_EQ(float_to_f16(65519.0f), (uint16_t)0x7BFF);
    CHECK_EQ(float_to_f16(65520.0f), (uint16_t)0x7C00);
    CHECK_EQ(float_to_f16(1.0f + std::ldexp(1.0f, -11)), (uint16_t)0x3C00);      // tie to even
    CHECK_EQ(float_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), (uint16_t)0x3C02);  // tie to even
    CHECK_EQ(float_to_f16(std::ldexp(1.0f, -25)), (uint16_t)0x0000);             // half the smallest subnormal: tie to 0
    CHECK_EQ(float_to_f16(3 * std::ldexp(1.0f, -25)), (uint16_t)0x0002);
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = f16_to_float((uint16_t)h);
        if (!std::isnan(f) && float_to_f16(f) != h) bad++;
    }
    CHECK_EQ(bad, 0);
}
