// sampling.cuh: the next token of B sequences on the device, by the host sampler's exact rule
// (rl/sampling.h's sample_token: temperature, top-k, top-p, inverse CDF in id order) with the
// uniform cpu/generate.h draws: u = rng_uniform(seed, step, key_b, position_b). The device runs the
// very code the host runs (rl/sampling.h and rl/rng.h are FP8RL_HD): fast_exp, unfused products and
// fixed-order LaneSum sums, so tokens and log-probs are the host's bits wherever the device's double
// log (the two log-probs' last step) rounds as glibc's does.
//
// One thread per row: the rule is sequential by design (its sums add in one fixed order), and a
// row's work is O(n) per bisection pass.
#ifndef FP8RL_CUDA_SAMPLING_CUH
#define FP8RL_CUDA_SAMPLING_CUH
#include <cstdint>

#include "cuda/common.cuh"
#include "rl/rng.h"
#include "rl/sampling.h"

namespace fp8rl {

constexpr int kSampleThreads = 64;  // rows per block

static __global__ void sample_rows_kernel(SampledToken* out, int32_t* tokens, const float* logits, int B, long V,
                                          int n, SamplingParams params, uint64_t seed, uint32_t step,
                                          const uint32_t* keys, const uint32_t* positions, float* scratch) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= B) return;
    const float u = rng_uniform(seed, step, keys[row], positions[row]);
    const SampledToken t = sample_token(logits + row * V, n, params, u, scratch + (long)row * n);
    out[row] = t;
    if (tokens) tokens[row] = t.token;
}

// For rows b < B of logits [B][V] (FP32, device): out[b] = sample_token(logits_b, n, params, u_b,
// ...) with u_b = rng_uniform(seed, step, keys[b], positions[b]) (keys, positions: device [B]);
// tokens (device int32 [B], may be null) gets the tokens too, to feed the next decode step. n <= V
// is the vocabulary limit (SamplingConfig.vocab_limit: only ids < n are drawn). scratch: device
// FP32 [B][n]. No host sync, no allocation: capturable in a CUDA graph.
inline void sample_tokens_gpu(SampledToken* out, int32_t* tokens, const float* logits, int B, int V, int n,
                              const SamplingParams& params, uint64_t seed, uint32_t step, const uint32_t* keys,
                              const uint32_t* positions, float* scratch, cudaStream_t stream) {
    if (B < 0 || n < 1 || n > V)
        fail("sample_tokens_gpu: B = %d rows, vocabulary limit n = %d, V = %d: need B >= 0 and 1 <= n <= V", B, n, V);
    if (!(params.temperature >= 0.0f) || !(params.top_p > 0.0f))
        fail("sample_tokens_gpu: temperature %g, top_p %g: need temperature >= 0 (0 = greedy) and top_p > 0",
             params.temperature, params.top_p);
    if (B == 0) return;
    LAUNCH_KERNEL(sample_rows_kernel, (unsigned)((B + kSampleThreads - 1) / kSampleThreads), kSampleThreads, 0, stream,
                  out, tokens, logits, B, (long)V, n, params, seed, step, keys, positions, scratch);
}

}  // namespace fp8rl

#endif  // FP8RL_CUDA_SAMPLING_CUH
