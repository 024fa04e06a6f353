// test_sampling_gpu: rl/rng.h and rl/sampling.h run as CUDA device code give what the host gives.
// Philox words must match bit for bit; sampled tokens must match, and log-probs within 1e-5
// (device expf/logf may differ from glibc's in the last ulps).
// Build and run on a GPU machine:
//   nvcc -std=c++17 -O3 -gencode arch=compute_90,code=sm_90 -I. -o build/test_sampling_gpu test/gpu/test_sampling_gpu.cu
//   ./build/test_sampling_gpu
#include <cmath>
#include <cstdio>
#include <vector>

#include "rl/rng.h"
#include "rl/sampling.h"

using namespace fp8rl;

#define CUDA_OK(x)                                                                        \
    do {                                                                                  \
        cudaError_t e = (x);                                                              \
        if (e != cudaSuccess) {                                                           \
            fprintf(stderr, "CUDA error %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); \
            return 1;                                                                     \
        }                                                                                 \
    } while (0)

__global__ void philox_kernel(uint64_t seed, int n, uint32_t* out) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const Philox4 r = rng_bits(seed, (uint32_t)i / 64, (uint32_t)i % 64, (uint32_t)i * 7919u, (uint32_t)i % 3);
    for (int w = 0; w < 4; w++) out[4 * i + w] = r.w[w];
}

__global__ void sample_kernel(const float* logits, int rows, int n, const SamplingParams* params, uint64_t seed,
                              float* scratch, SampledToken* out) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float u = rng_uniform(seed, 3, (uint32_t)r, 17);
    out[r] = sample_token(logits + (long)r * n, n, params[r], u, scratch + (long)r * n);
}

int main() {
    int failures = 0, checks = 0;
    // 1. Philox words.
    const int draws = 1 << 14;
    const uint64_t seed = 0x0123456789ABCDEFull;
    uint32_t* d_words;
    CUDA_OK(cudaMalloc(&d_words, sizeof(uint32_t) * 4 * draws));
    philox_kernel<<<(draws + 255) / 256, 256>>>(seed, draws, d_words);
    std::vector<uint32_t> words(4 * draws);
    CUDA_OK(cudaMemcpy(words.data(), d_words, words.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    for (int i = 0; i < draws; i++) {
        const Philox4 r = rng_bits(seed, (uint32_t)i / 64, (uint32_t)i % 64, (uint32_t)i * 7919u, (uint32_t)i % 3);
        for (int w = 0; w < 4; w++) {
            checks++;
            if (r.w[w] != words[4 * i + w] && failures++ < 10)
                fprintf(stderr, "philox draw %d word %d: host %08x device %08x\n", i, w, r.w[w], words[4 * i + w]);
        }
    }
    // 2. Sampling: rows of random logits under a table of settings.
    const int rows = 256, n = 32000;
    const SamplingParams table[] = {{1.0f, 0, 1.0f}, {0.7f, 20, 0.95f}, {0.6f, 0, 0.8f},
                                    {1.3f, 50, 1.0f}, {0.0f, 0, 1.0f},  {1.0f, 1, 1.0f}};
    std::vector<float> logits((size_t)rows * n);
    std::vector<SamplingParams> params(rows);
    for (int r = 0; r < rows; r++) {
        params[r] = table[r % 6];
        const float scale = 0.5f + (r % 7);  // flat to peaked
        for (int i = 0; i < n; i++) {
            const Philox4 b = rng_bits(99, 0, (uint32_t)r, (uint32_t)i, kRngInit);
            logits[(size_t)r * n + i] = scale * (uniform_from_bits(b.w[0]) + uniform_from_bits(b.w[1]) - 1.0f) * 3.0f;
        }
    }
    float *d_logits, *d_scratch;
    SamplingParams* d_params;
    SampledToken* d_out;
    CUDA_OK(cudaMalloc(&d_logits, logits.size() * sizeof(float)));
    CUDA_OK(cudaMalloc(&d_scratch, logits.size() * sizeof(float)));
    CUDA_OK(cudaMalloc(&d_params, rows * sizeof(SamplingParams)));
    CUDA_OK(cudaMalloc(&d_out, rows * sizeof(SampledToken)));
    CUDA_OK(cudaMemcpy(d_logits, logits.data(), logits.size() * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_params, params.data(), rows * sizeof(SamplingParams), cudaMemcpyHostToDevice));
    sample_kernel<<<(rows + 63) / 64, 64>>>(d_logits, rows, n, d_params, seed, d_scratch, d_out);
    CUDA_OK(cudaGetLastError());
    std::vector<SampledToken> dev(rows);
    CUDA_OK(cudaMemcpy(dev.data(), d_out, rows * sizeof(SampledToken), cudaMemcpyDeviceToHost));
    std::vector<float> scratch(n);
    for (int r = 0; r < rows; r++) {
        const float u = rng_uniform(seed, 3, (uint32_t)r, 17);
        const SampledToken h = sample_token(&logits[(size_t)r * n], n, params[r], u, scratch.data());
        const bool ok = h.token == dev[r].token && std::fabs(h.logprob - dev[r].logprob) <= 1e-5f * (1 + std::fabs(h.logprob)) &&
                        std::fabs(h.logprob_full - dev[r].logprob_full) <= 1e-5f * (1 + std::fabs(h.logprob_full));
        checks++;
        if (!ok && failures++ < 20)
            fprintf(stderr, "row %d (T=%g k=%d p=%g): host %d %.8g %.8g, device %d %.8g %.8g\n", r, params[r].temperature,
                    params[r].top_k, params[r].top_p, h.token, h.logprob, h.logprob_full, dev[r].token, dev[r].logprob,
                    dev[r].logprob_full);
    }
    printf("test_sampling_gpu: %d checks, %d failed (Philox words bitwise, %d sampled rows of vocab %d)\n", checks,
           failures, rows, n);
    return failures == 0 ? 0 : 1;
}
