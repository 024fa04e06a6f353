// bench_model: speed of the CPU model (rl/model.h, rl/generate.h) on random weights, with the
// machine's FP32 FMA peak measured in the same run.
//   1. training step: forward + backward of a ~25M-parameter Llama-style config over 4096 tokens
//      (8 sequences x 512), achieved GFLOP/s = (6 * params * tokens + causal attention) / time;
//   2. generation on llama2.c's stories15M shape (dim 288, 6 layers, 6 heads, hidden 768, vocab
//      32000, tied): batch 1 against llama2.c's run.c loop on the same weights in the same run
//      (bench/llama2c_baseline.h; run.c itself printed about 206 tok/s on the 2-core development
//      machine), and a batch of 64 sequences (tokens/s over all sequences).
// Usage: ./build/bench_model   (threads: OMP_NUM_THREADS, default all cores)
#include <cstdio>
#include <vector>

#include "bench/bench_util.h"
#include "bench/llama2c_baseline.h"
#include "rl/generate.h"
#include "rl/model.h"
#include "rl/rng.h"
#include "rl/weights.h"

using namespace fp8rl;

static ModelConfig llama_config(int64_t V, int64_t C, int64_t I, int64_t L, int64_t H) {
    ModelConfig c;
    c.arch = Arch::Llama;
    c.vocab_size = V, c.hidden_size = C, c.intermediate_size = I, c.num_layers = L;
    c.num_heads = c.num_kv_heads = H;
    c.head_dim = C / H;
    c.rms_norm_eps = 1e-5;
    c.tie_word_embeddings = true;
    return c;
}

// Weights uniform in [-0.5, 0.5) / sqrt(fan-in); norm weights 1.
static ModelWeights random_weights(const ModelConfig& c) {
    ModelWeights w = ModelWeights::from_config(c);
    for (const TensorInfo& t : w.tensors) {
        float* x = w.master.data() + t.offset;
        if (t.shape.size() == 1) {
            std::fill(x, x + t.numel, 1.0f);
            continue;
        }
        const float scale = 1.0f / std::sqrt((float)t.shape[1]);
        for (size_t i = 0; i < t.numel; i++)
            x[i] = scale * (rng_uniform(1, 0, (uint32_t)t.offset, (uint32_t)i, kRngInit) - 0.5f);
    }
    return w;
}

static void bench_training(double peak) {
    const ModelConfig cfg = llama_config(32000, 384, 1024, 7, 6);
    const ModelWeights w = random_weights(cfg);
    const CpuModel m(w);
    ModelParams p;
    p.prepare(m, Precision::FP32);
    const int seqs = 8, len = 512;
    TokenBatch batch;
    for (int s = 0; s < seqs; s++) {
        std::vector<int32_t> ids(len);
        for (int i = 0; i < len; i++) ids[i] = (int32_t)(rng_bits(2, 0, s, i, kRngInit).w[0] % cfg.vocab_size);
        batch.add(ids);
    }
    const long T = batch.num_tokens();
    ForwardActs acts;
    std::vector<float> logprob(T), entropy(T), dlogprob(T, -1.0f / T), dentropy(T, 0.0f), grad(w.num_floats());
    const double s = best_seconds(2, [&] {
        model_forward(m, p, batch, 1.0f, acts, logprob.data(), entropy.data());
        model_backward(m, p, acts, dlogprob.data(), dentropy.data(), grad.data());
    });
    const double params = (double)w.num_params();
    // causal attention: per layer and head, QK^T and PV cost 2 * D FLOPs per (query, key) pair
    // each; backward costs twice the forward
    const double pairs = (double)seqs * len * (len + 1) / 2;
    const double attn = 3.0 * cfg.num_layers * cfg.num_heads * 4.0 * cfg.head_dim * pairs;
    const double flops = 6.0 * params * T + attn;
    printf("training step, fp32: %.1fM params (V %lld, C %lld, I %lld, L %lld, H %lld), %ld tokens (%d x %d)\n",
           params * 1e-6, (long long)cfg.vocab_size, (long long)cfg.hidden_size, (long long)cfg.intermediate_size,
           (long long)cfg.num_layers, (long long)cfg.num_heads, T, seqs, len);
    printf("  forward+backward %.3f s: %.1f GFLOP/s achieved (%.0f%% of peak; target >= 90 on 2 threads), %.0f tokens/s\n",
           s, flops / s * 1e-9, 100.0 * flops / s * 1e-9 / peak, T / s);
}

// Tokens per second of generating `new_tokens` after a one-token prompt, for `batch` sequences.
static double generation_tokens_per_s(const CpuModel& m, const ModelParams& p, int batch, int new_tokens) {
    std::vector<std::vector<int32_t>> prompts(batch, std::vector<int32_t>{1});
    GenerateOptions o;
    o.max_new_tokens = new_tokens;  // no eos: every sequence runs the whole budget
    o.seed = 7;
    Generator gen;
    const double s = best_seconds(2, [&] { gen.generate(m, p, prompts, o); });
    return (double)batch * new_tokens / s;
}

static void bench_generation() {
    const ModelConfig cfg = llama_config(32000, 288, 768, 6, 6);
    const ModelWeights w = random_weights(cfg);
    const CpuModel m(w);
    ModelParams p;
    p.prepare(m, Precision::FP32);
    const int new_tokens = 256;
    printf("generation, fp32 weights and KV cache, llama2.c stories15M shape (%.1fM params), T = 1 sampling, %d new tokens:\n",
           w.num_params() * 1e-6, new_tokens);
    Llama2cBaseline baseline(m);
    const double base = new_tokens / best_seconds(2, [&] { baseline.generate(new_tokens, 7); });
    printf("  llama2.c run.c loop, batch 1: %7.1f tokens/s (baseline)\n", base);
    const double one = generation_tokens_per_s(m, p, 1, new_tokens);
    printf("  batch  1: %7.1f tokens/s  = %.2fx the llama2.c loop (target >= 1)\n", one, one / base);
    const double many = generation_tokens_per_s(m, p, 64, new_tokens);
    printf("  batch 64: %7.1f tokens/s  = %.1fx batch 1 (target >= 10x)\n", many, many / one);
}

int main() {
    const int threads = omp_get_max_threads();
    const double peak = fma_peak_gflops(threads);
    printf("threads: %d; FP32 FMA peak: %.1f GFLOP/s\n", threads, peak);
    bench_training(peak);
    bench_generation();
    return 0;
}
