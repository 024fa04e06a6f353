// GPU tests of rl/numerics/rng.h and rl/numerics/sampling.h run as CUDA device code: the same functions must give
// what the host gives. Philox words bit for bit; sampled tokens exactly, log-probs within 1e-5
// (device expf/logf may differ from glibc's in the last ulps). Part of ./test_gpu.
#include <cmath>
#include <vector>

#include "rl/numerics/rng.h"
#include "rl/numerics/sampling.h"
#include "test/gpu/gpu_util.cuh"
#include "test/harness.h"

using namespace fp8rl;

namespace {

// The key of draw i: spreads i over steps, sequences, positions and streams.
__host__ __device__ Philox4 draw(uint64_t seed, int i) {
    return rng_bits(seed, (uint32_t)i / 64, (uint32_t)i % 64, (uint32_t)i * 7919u, (uint32_t)i % 3);
}

__global__ void philox_kernel(uint64_t seed, int n, uint32_t* out) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const Philox4 r = draw(seed, i);
    for (int w = 0; w < 4; w++) out[4 * i + w] = r.w[w];
}

// One thread per row, as a rollout kernel would call the rule.
__global__ void sample_kernel(const float* logits, int rows, int n, const SamplingParams* params, uint64_t seed,
                              float* scratch, SampledToken* out) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float u = rng_uniform(seed, 3, (uint32_t)r, 17);
    out[r] = sample_token(logits + (long)r * n, n, params[r], u, scratch + (long)r * n);
}

}  // namespace

TEST(gpu_rng_philox_matches_host) {
    REQUIRE_GPU();
    const int draws = 1 << 14;
    const uint64_t seed = 0x0123456789ABCDEFull;
    DeviceBuffer<uint32_t> d_words(4 * draws);
    LAUNCH_KERNEL(philox_kernel, (draws + 255) / 256, 256, 0, 0, seed, draws, d_words.ptr);
    const std::vector<uint32_t> words = d_words.download();
    int differ = 0;
    for (int i = 0; i < draws; i++) {
        const Philox4 r = draw(seed, i);
        for (int w = 0; w < 4; w++) differ += r.w[w] != words[4 * i + w];
    }
    CHECK_MSG(differ == 0, "%d of %d Philox words differ between device and host", differ, 4 * draws);
}

TEST(gpu_sampling_matches_host) {
    REQUIRE_GPU();
    const int rows = 256, n = 32000;
    const uint64_t seed = 99;
    const SamplingParams table[] = {{1.0f, 0, 1.0f}, {0.7f, 20, 0.95f}, {0.6f, 0, 0.8f},
                                    {1.3f, 50, 1.0f}, {0.0f, 0, 1.0f},  {1.0f, 1, 1.0f}};
    std::vector<float> logits((size_t)rows * n);
    std::vector<SamplingParams> params(rows);
    for (int r = 0; r < rows; r++) {
        params[r] = table[r % 6];
        const float scale = 3.0f * (0.5f + r % 7);  // flat to peaked
        for (int i = 0; i < n; i++) {
            const Philox4 b = rng_bits(seed, 0, (uint32_t)r, (uint32_t)i, kRngInit);
            logits[(size_t)r * n + i] = scale * (uniform_from_bits(b.w[0]) + uniform_from_bits(b.w[1]) - 1.0f);
        }
    }
    DeviceBuffer<float> d_logits(logits), d_scratch(logits.size());
    DeviceBuffer<SamplingParams> d_params(params);
    DeviceBuffer<SampledToken> d_out(rows);
    LAUNCH_KERNEL(sample_kernel, (rows + 63) / 64, 64, 0, 0, d_logits.ptr, rows, n, d_params.ptr, seed, d_scratch.ptr, d_out.ptr);
    const std::vector<SampledToken> dev = d_out.download();
    std::vector<float> scratch(n);
    for (int r = 0; r < rows; r++) {
        const float u = rng_uniform(seed, 3, (uint32_t)r, 17);
        const SampledToken h = sample_token(&logits[(size_t)r * n], n, params[r], u, scratch.data());
        CHECK_MSG(h.token == dev[r].token, "row %d (T=%g k=%d p=%g): host token %d, device %d", r,
                  params[r].temperature, params[r].top_k, params[r].top_p, h.token, dev[r].token);
        CHECK_NEAR(dev[r].logprob, h.logprob, 1e-5, 1e-6);
        CHECK_NEAR(dev[r].logprob_full, h.logprob_full, 1e-5, 1e-6);
    }
}
