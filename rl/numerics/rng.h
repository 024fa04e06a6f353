// rng.h: counter-based random numbers (Philox4x32-10, Salmon et al., SC'11 "Parallel random
// numbers: as easy as 1, 2, 3"). A draw is a pure function of (seed, step, sequence, position,
// stream): no generator state is carried between draws, so a sample never depends on batch
// composition, on which thread drew it, or on whether the CPU or a CUDA kernel drew it.
//
// Layout of the Philox input (all little-endian 32-bit words):
//   key     = { seed bits 0..31, seed bits 32..63 }
//   counter = { position, sequence, step, stream }
// `stream` separates independent uses (token sampling, data shuffling, weight init) that share a
// seed and would otherwise collide on the same (step, sequence, position).
#pragma once
#include <cstdint>

#include "rl/numerics/hostdevice.h"

namespace fp8rl {

struct Philox4 {
    uint32_t w[4];
};

// Named streams (the fourth counter word). Add new uses here so two never share a value.
enum RngStream : uint32_t {
    kRngSampling = 0,  // token sampling during generation
    kRngShuffle = 1,   // dataset order
    kRngInit = 2,      // random weight initialization
};

// One Philox4x32 round: two 32x32->64 multiplies, the high halves xor'ed with the key.
FP8RL_HD void philox_round(uint32_t ctr[4], const uint32_t key[2]) {
    const uint64_t p0 = (uint64_t)0xD2511F53u * ctr[0];
    const uint64_t p1 = (uint64_t)0xCD9E8D57u * ctr[2];
    const uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    const uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    const uint32_t c1 = ctr[1], c3 = ctr[3];
    ctr[0] = hi1 ^ c1 ^ key[0];
    ctr[1] = lo1;
    ctr[2] = hi0 ^ c3 ^ key[1];
    ctr[3] = lo0;
}

// Philox4x32 with 10 rounds; the key is bumped by the Weyl constants between rounds.
FP8RL_HD Philox4 philox4x32_10(const uint32_t counter[4], const uint32_t key[2]) {
    uint32_t c[4] = {counter[0], counter[1], counter[2], counter[3]};
    uint32_t k[2] = {key[0], key[1]};
    for (int round = 0; round < 10; round++) {
        if (round > 0) {
            k[0] += 0x9E3779B9u;
            k[1] += 0xBB67AE85u;
        }
        philox_round(c, k);
    }
    return Philox4{{c[0], c[1], c[2], c[3]}};
}

// The four random words of one (seed, step, sequence, position, stream) draw.
FP8RL_HD Philox4 rng_bits(uint64_t seed, uint32_t step, uint32_t sequence, uint32_t position,
                          uint32_t stream = kRngSampling) {
    const uint32_t counter[4] = {position, sequence, step, stream};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    return philox4x32_10(counter, key);
}

// A uniform float in [0, 1): the top 24 bits of x times 2^-24. Every value k * 2^-24
// (k = 0 .. 2^24-1) is exactly representable, equally likely, and never rounds up to 1.0.
FP8RL_HD float uniform_from_bits(uint32_t x) { return (float)(x >> 8) * (1.0f / 16777216.0f); }

// The uniform used to sample the token at `position` of `sequence` in RL step `step`: the first
// word of the draw.
FP8RL_HD float rng_uniform(uint64_t seed, uint32_t step, uint32_t sequence, uint32_t position,
                           uint32_t stream = kRngSampling) {
    return uniform_from_bits(rng_bits(seed, step, sequence, position, stream).w[0]);
}

}  // namespace fp8rl
