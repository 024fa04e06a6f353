// bench_rollout.cu: generation through the engine interface (GpuEngine::generate, rl/engine.h), so it
// times whatever the engine generates with: today the CPU model on the host (cuda/engine_gpu.cuh),
// rollout.cu once merged. Three settings at the same size: bf16 weights + bf16 KV cache, fp8
// weights + bf16 KV, fp8 weights + fp8 KV; random models of Qwen3-0.6B and 1.7B shape with the real
// vocabulary (bench_model.h); prompts of 64 random ids, temperature 1, no eos in practice.
// The target is 256 sequences x 1,024 new tokens. The size grows from 4 x 8 (sequences and new
// tokens doubled in turn) while the next size, at most twice the last one's time, fits the model's
// time budget, so a slow generator reports a smaller size instead of overrunning dev/gpu_check.sh's
// limit; the table says which size ran, and a model is skipped, saying so, when those before it took
// over 1.5 budgets. What is timed: the whole generate() call (prefill, decode, sampling, the results'
// transfer); the fractions in sampling and in attention need timers inside the generator and are not
// measured here. --tiny: the tiny model, 2 x 4, no growth.
#include <chrono>
#include <cstdio>
#include <vector>

#include "cuda/engine_gpu.cuh"
#include "test/gpu/bench_model.h"
#include "test/gpu/bench_util.cuh"

using namespace fp8rl;

namespace {

constexpr int kTargetSequences = 256, kTargetNewTokens = 1024, kPromptLength = 64;
constexpr double kBudgetSeconds = 10;  // per model: the growth, then the other two settings

struct Setting {
    Precision weights, kv_cache;
};
const Setting kSettings[] = {{Precision::BF16, Precision::BF16}, {Precision::FP8, Precision::BF16}, {Precision::FP8, Precision::FP8}};

struct Run {
    double seconds;
    long tokens;  // generated
};

Run generate(GpuEngine& engine, const Setting& s, int sequences, int new_tokens, long vocab) {
    std::vector<GenRequest> requests((size_t)sequences);
    for (int r = 0; r < sequences; r++) {
        for (int i = 0; i < kPromptLength; i++)
            requests[r].prompt.push_back((int32_t)((hash_uniform(r * 1009 + i, 9) + 1.0f) * 0.5f * (vocab - 1)));
        requests[r].sequence = (uint32_t)r;
    }
    SamplingConfig sampling;
    sampling.max_new_tokens = new_tokens;
    sampling.seed = 1;
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<Generation> out = engine.generate(requests, 0, sampling, s.weights, s.kv_cache, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    Run run{std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0};
    for (const Generation& g : out) run.tokens += (long)g.tokens.size();
    return run;
}

void print_row(const BenchModel& m, int sequences, int new_tokens, const Setting& s, const Run& r, double base_seconds) {
    printf("| %s | %d x %d | %s | %s | %.2f | %ld | %.0f | %.2f |\n", m.name, sequences, new_tokens, precision_name(s.weights),
           precision_name(s.kv_cache), r.seconds, r.tokens, r.tokens / r.seconds, base_seconds / r.seconds);
    fflush(stdout);
}

void bench_model(const BenchModel& m, bool tiny) {
    GpuEngine engine(bench_model_dir(m));
    int sequences = tiny ? 2 : 4, new_tokens = tiny ? 4 : 8;
    for (const Setting& s : kSettings) generate(engine, s, sequences, new_tokens, m.vocab);  // warm-up: buffers, copies
    Run base = generate(engine, kSettings[0], sequences, new_tokens, m.vocab);
    double spent = base.seconds;
    for (bool grow_tokens = false; !tiny && (sequences < kTargetSequences || new_tokens < kTargetNewTokens);
         grow_tokens = !grow_tokens) {
        // the next size (<= 2x this time), then the other two settings at it (each up to 2x slower again)
        if (spent + 2 * base.seconds * (1 + 2 * 2) > kBudgetSeconds) break;
        const bool tokens = (grow_tokens && new_tokens < kTargetNewTokens) || sequences >= kTargetSequences;
        (tokens ? new_tokens : sequences) *= 2;
        base = generate(engine, kSettings[0], sequences, new_tokens, m.vocab);
        spent += base.seconds;
    }
    print_row(m, sequences, new_tokens, kSettings[0], base, base.seconds);
    for (int i = 1; i < 3; i++) print_row(m, sequences, new_tokens, kSettings[i], generate(engine, kSettings[i], sequences, new_tokens, m.vocab), base.seconds);
}

}  // namespace

int main(int argc, char** argv) {
    const bool tiny = bench_tiny(argc, argv, "bench_rollout");
    std::string why_not = bench_unavailable_reason();
    if (!why_not.empty()) {
        printf("bench_rollout: SKIPPED: %s\n", why_not.c_str());
        return 0;
    }
    print_bench_header("bench_rollout", tiny);
    printf("GpuEngine::generate timed whole (prefill, decode, sampling, transfers; sampling and attention are not "
           "timed apart); target %d x %d, grown from 4 x 8 within %.0f s per model; speedup = bf16/bf16 time / this "
           "time\n\n",
           kTargetSequences, kTargetNewTokens, kBudgetSeconds);
    printf("| model | sequences x new tokens | weights | KV cache | seconds | tokens | tokens/s | speedup |\n");
    printf("|---|---|---|---|---|---|---|---|\n");
    std::vector<BenchModel> models = {kQwen3_0_6B, kQwen3_1_7B};
    if (tiny) models = {kTinyBenchModel};
    int failures = 0;
    const auto start = std::chrono::steady_clock::now();
    for (const BenchModel& m : models) {
        // a slow generator (the host's, today) would take the next model past dev/gpu_check.sh's limit
        const double spent = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (spent > 1.5 * kBudgetSeconds) {
            printf("| %s | SKIPPED: the models before it took %.0f s, over 1.5 x the %.0f s budget |\n", m.name, spent,
                   kBudgetSeconds);
            continue;
        }
        try {
            bench_model(m, tiny);
        } catch (const Error& e) {
            printf("| %s | ERROR: %s |\n", m.name, e.what());
            failures++;
            cudaGetLastError();  // clear a sticky launch error so the next model can run
        }
    }
    printf("\nbench_rollout: %d model(s) failed\n", failures);
    return failures ? 1 : 0;
}
