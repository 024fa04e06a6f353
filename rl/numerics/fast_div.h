// fast_div.h: n / d and n % d by a divisor known only at run time, as a multiply-high, an add and
// a shift with a multiplier computed once on the host (Granlund & Montgomery, "Division by invariant
// integers using multiplication", 1994; PyTorch's IntDivider). A GPU has no integer divide: nvcc
// expands a runtime n / d into ~20 instructions through the float reciprocal (I2F.U32.RP,
// MUFU.RCP, F2I) and a 64-bit one into a call, which the decode-attention kernel paid per key.
// Exact for 0 <= n < 2^31 and 1 <= d < 2^31 (checked against plain division by test_fast_div).
#pragma once
#include <cstdint>

#include "rl/numerics/hostdevice.h"

namespace fp8rl {

struct FastDivisor {
    uint32_t d = 1, mul = 1, shift = 0;
    FastDivisor() = default;
    // shift = ceil(log2 d); mul = floor(2^32 (2^shift - d) / d) + 1, so that
    // n / d = (umulhi(n, mul) + n) >> shift for n < 2^31 (the sum fits 32 bits).
    explicit FastDivisor(uint32_t divisor) : d(divisor), shift(0) {
        while (shift < 31 && (1u << shift) < d) shift++;
        mul = (uint32_t)(((uint64_t)1 << 32) * ((1ull << shift) - d) / d + 1);
    }
    FP8RL_HD uint32_t div(uint32_t n) const {
#ifdef __CUDA_ARCH__
        const uint32_t hi = __umulhi(n, mul);
#else
        const uint32_t hi = (uint32_t)(((uint64_t)n * mul) >> 32);
#endif
        return (hi + n) >> shift;
    }
    FP8RL_HD uint32_t mod(uint32_t n) const { return n - div(n) * d; }
};

}  // namespace fp8rl
