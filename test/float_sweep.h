// float_sweep.h: the worst relative error of an FP32 function against its double-precision
// definition over a range of float bit patterns (test_fast_exp.cpp, test_exp2.cpp).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

struct FloatSweep {
    double worst = 0.0;  // NaN once an error is NaN, so that the bound's check fails
    float worst_x = 0.0f;
    long checked = 0;

    // Every stride-th bit pattern from `from` to `to` (one sign's patterns, walking up in magnitude).
    template <class Ours, class Exact>
    void range(uint32_t from, uint32_t to, uint32_t stride, Ours ours, Exact exact) {
        for (uint64_t b = from; b <= to; b += stride) {
            float x;
            const uint32_t bits = (uint32_t)b;
            std::memcpy(&x, &bits, 4);
            const double want = exact((double)x), err = std::fabs(ours(x) - want) / want;
            if (!(err <= worst)) worst = err, worst_x = x;
            checked++;
        }
    }
};

inline uint32_t float_bits_of(float x) {
    uint32_t b;
    std::memcpy(&b, &x, 4);
    return b;
}
