// bench_rollout.cu: generation through the engine interface (GpuEngine::generate, rl/driver/engine.h: rollout.cu's
// prefill, paged-KV decode and device sampling). Three settings at the same size: bf16 weights + bf16
// KV cache, fp8 weights + bf16 KV, fp8 weights + fp8 KV; random models of Qwen3-0.6B and 1.7B shape
// with the real vocabulary (bench_model.h); prompts of 64 random ids, temperature 1, no eos in practice;
// then cascade attention against per-row decode attention at a GRPO group's shape (print_cascade_row),
// and decode attention's kernels one at a time, bytes/s beside HBM and the model (print_decode_kernel_rows).
// The target is 256 sequences x 1,024 new tokens. The size grows from 4 x 8 (sequences and new
// tokens doubled in turn) while the next size, at most twice the last one's time, fits the model's
// time budget, so a slow generator reports a smaller size instead of overrunning dev/gpu_check.sh's
// limit; the table says which size ran, and a model is skipped, saying so, when those before it took
// over 1.5 budgets. What is timed: the whole generate() call (prefill, decode, sampling, the results'
// transfer). The fractions of that time in sampling and in attention are estimates (the decode step
// has no timers inside; rollout.cu is not changed for a benchmark): after each run, the two are timed
// alone at the run's shapes (component_shares) and scaled by the run's decode steps. Peak: the
// engine's device high-water mark during the call (DeviceArray's count, cuda/engine/device_array.cuh).
// --tiny: the tiny model, 2 x 4, no growth.
#include <chrono>
#include <cstdio>
#include <vector>

#include "cuda/perf/decode_perf_model.h"
#include "cuda/engine/engine_gpu.cuh"
#include "cuda/rollout/sampling.cuh"
#include "kv_cache.cuh"
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
    long tokens;         // generated
    RolloutStats stats;  // the engine's, of this call
    size_t peak;         // the engine's device bytes at most during the call
};

// What every run samples with (the component timing samples the same way).
SamplingConfig run_sampling(int new_tokens) {
    SamplingConfig sampling;
    sampling.max_new_tokens = new_tokens;
    sampling.seed = 1;
    return sampling;
}

Run generate(GpuEngine& engine, const Setting& s, int sequences, int new_tokens, long vocab) {
    std::vector<GenRequest> requests((size_t)sequences);
    for (int r = 0; r < sequences; r++) {
        for (int i = 0; i < kPromptLength; i++)
            requests[r].prompt.push_back((int32_t)((hash_uniform(r * 1009 + i, 9) + 1.0f) * 0.5f * (vocab - 1)));
        requests[r].sequence = (uint32_t)r;
    }
    reset_device_bytes_peak();
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<Generation> out = engine.generate(requests, 0, run_sampling(new_tokens), s.weights, s.kv_cache, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    Run run{std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0, engine.rollout_stats(),
            device_bytes_peak()};
    for (const Generation& g : out) run.tokens += (long)g.tokens.size();
    return run;
}

struct Shares {
    double sampling, attention;  // fractions of the run's seconds
    double attention_bandwidth;  // bytes/s decode attention read, timed alone
};

// The run's time in sampling and in attention, estimated from the kernels timed alone (cudaEvents,
// median_ms) at its shapes, per decode step times its decode steps: sampling = sample_tokens_gpu
// over [B][V] FP32 logits rows with the run's temperature, top-k and top-p (the head's logits GEMM
// before it is counted in neither); attention = PagedKvCache::decode_attention in every layer at
// the mean context (prompt + half the new tokens), with the run's KV storage and page size. B is the
// most sequences the run decoded together (its slot count, when it has that many sequences); the
// prefills' first tokens are not counted.
Shares component_shares(const ModelConfig& c, const EngineOptions& o, const Setting& s, const Run& run, int new_tokens) {
    const int B = run.stats.max_running, V = (int)c.vocab_size, V8 = round_up8(V), H = (int)c.num_heads, D = (int)c.head_dim;
    const int L = (int)c.num_layers;
    const SamplingConfig sc = run_sampling(new_tokens);
    const int context = kPromptLength + new_tokens / 2, max_len = kPromptLength + new_tokens;
    const double steps = (double)run.stats.decode_steps;

    DeviceArray<float> logits((size_t)B * V8, "benchmark logits"), scratch((size_t)B * V, "benchmark sampling scratch");
    DeviceArray<uint32_t> keys((size_t)B, "benchmark sampling keys"), positions((size_t)B, "benchmark sampling positions"),
        step_ids((size_t)B, "benchmark sampling steps");
    DeviceArray<SampledToken> sampled((size_t)B, "benchmark sampled tokens");
    fill_uniform(logits.get(), logits.size(), 21, 8.0f);
    std::vector<uint32_t> ids((size_t)B);
    for (int b = 0; b < B; b++) ids[(size_t)b] = (uint32_t)b;
    keys.upload(ids);
    positions.upload(std::vector<uint32_t>((size_t)B, (uint32_t)context));
    step_ids.upload(std::vector<uint32_t>((size_t)B, 0u));
    const double sampling_ms = median_ms([&] {
        sample_tokens_gpu(sampled.get(), nullptr, logits.get(), B, V8, V, {sc.temperature, sc.top_k, sc.top_p}, sc.seed, step_ids.get(),
                          keys.get(), positions.get(), scratch.get(), 0);
    });

    // sequence b holds pages [b * pages, (b + 1) * pages), filled with random K and V in every layer
    const int page_tokens = o.kv_page_tokens, pages = (context + page_tokens - 1) / page_tokens,
              max_pages = (max_len + page_tokens - 1) / page_tokens;
    PagedKvCache cache(KvCacheShape{L, (int)c.num_kv_heads, D, page_tokens, B * pages}, s.kv_cache);
    cache.reserve_decode(B, H, max_len);
    const long slots = cache.shape().slots(), width = cache.shape().width();
    DeviceArray<bf16> k((size_t)(slots * width), "benchmark K"), v((size_t)(slots * width), "benchmark V");
    DeviceArray<bf16> q((size_t)B * H * D, "benchmark queries"), out((size_t)B * H * D, "benchmark attention output");
    fill_uniform(k.get(), k.size(), 22, 1.0f), fill_uniform(v.get(), v.size(), 23, 1.0f);
    fill_uniform(q.get(), q.size(), 24, 1.0f);
    std::vector<int32_t> rows((size_t)slots), table((size_t)B * max_pages, 0);
    for (long i = 0; i < slots; i++) rows[(size_t)i] = (int32_t)i;
    for (int b = 0; b < B; b++)
        for (int j = 0; j < pages; j++) table[(size_t)b * max_pages + j] = b * pages + j;
    DeviceArray<int32_t> rows_d(rows.size(), "benchmark cache rows"), table_d(table.size(), "benchmark page table");
    DeviceArray<int32_t> lens((size_t)B, "benchmark lengths");
    rows_d.upload(rows), table_d.upload(table), lens.upload(std::vector<int32_t>((size_t)B, context));
    for (int l = 0; l < L; l++) cache.append(l, k.get(), v.get(), rows_d.get(), slots, 0);
    const double attention_ms = median_ms([&] {
        cache.plan_decode(lens.get(), nullptr, B, max_len, 0);  // once a step, as rollout.cu plans it
        for (int l = 0; l < L; l++) cache.decode_attention(l, out.get(), q.get(), H, table_d.get(), max_pages, 0);
    });
    const double attention_bytes = (double)B * context * L * 2 * (double)c.kv_dim() * (s.kv_cache == Precision::FP8 ? 1 : 2);
    // the model's price of these launches (kernel_perf_model.h: B rows of `context` own keys, no prefix,
    // the plan once, L layers of split and combine)
    DecodeAttentionShape a;
    a.fp8_kv = s.kv_cache == Precision::FP8, a.H = H, a.KV = (int)c.num_kv_heads, a.D = D;
    a.grid_rows = a.live_rows = B, a.own_keys = context, a.max_len = max_len;
    const DecodeAttentionPrice priced = decode_attention_price(bench_gpu(), a);
    record_calibration("bench_rollout", strfmt("decode attention, %lld layers, %d rows x %d keys, %s KV", (long long)c.num_layers, B,
                                               context, precision_name(s.kv_cache)),
                       attention_ms * 1e-3, priced.step_seconds(L), priced.per_row.bound());
    const double sampling_bytes = (double)B * V * 4 * (1 + kSamplingPasses);
    record_calibration("bench_rollout", strfmt("sampling %d rows x %d", B, V), sampling_ms * 1e-3,
                       sampling_bytes / bench_gpu().bandwidth(), "hbm");
    return {steps * sampling_ms * 1e-3 / run.seconds, steps * attention_ms * 1e-3 / run.seconds,
            attention_bytes / (attention_ms * 1e-3)};
}

// The run's figures, each measured one next to what cuda/perf/decode_perf_model.h predicts for the run's
// decode steps (its most rows at once, at the mean context).
void print_row(const BenchModel& m, const ModelConfig& c, int sequences, int new_tokens, const Setting& s, const Run& r,
               double base_seconds, const Shares& shares) {
    const DecodePrediction p = predict_decode_step(bench_hardware(), c, r.stats.max_running, kPromptLength + new_tokens / 2.0,
                                                   s.weights, s.kv_cache);
    const double predicted_s = (double)r.stats.decode_steps * p.step_s();
    printf("| %s | %d x %d | %s | %s | %.2f | %ld | %.0f (%.0f) | %.2f | %.1f (%.1f) | %.1f (%.1f) | %.0f (%.0f) | %lld | %.2f |\n",
           m.name, sequences, new_tokens, precision_name(s.weights), precision_name(s.kv_cache), r.seconds, r.tokens,
           r.tokens / r.seconds, r.tokens / predicted_s, base_seconds / r.seconds, 100 * shares.sampling,
           100 * r.stats.decode_steps * p.sampling_s / predicted_s, 100 * shares.attention,
           100 * r.stats.decode_steps * p.attention_s / predicted_s, shares.attention_bandwidth / 1e9,
           p.attention_bandwidth() / 1e9, (long long)r.stats.decode_steps, r.peak / 1073741824.0);
    fflush(stdout);
}

// Cascade attention (kv_cache.cuh): one layer's decode attention over `rows` rows in groups of
// kGroupSamples samples of a prompt (GRPO's G), each group's prompt of `prompt` tokens on shared
// pages, every row at `context` keys, timed with the groups (one CTA reads a prefix tile for up to
// cascade_rows() rows) and without (each row reads its prompt); the speedup next to the one
// cuda/perf/decode_perf_model.h predicts from the bytes each reads, and the bandwidth each reaches.
constexpr int kGroupSamples = 8;
void print_cascade_row(const BenchModel& m, const ModelConfig& c, Precision kv, bool tiny) {
    const int rows = tiny ? 16 : 256, prompt = tiny ? 64 : 512, context = tiny ? 96 : 1024, page_tokens = kKvPageTokens;
    const int H = (int)c.num_heads, D = (int)c.head_dim, groups = rows / kGroupSamples;
    const int shared_pages = prompt / page_tokens, own_pages = (context - prompt + page_tokens - 1) / page_tokens,
              max_pages = shared_pages + own_pages;
    PagedKvCache cache(KvCacheShape{1, (int)c.num_kv_heads, D, page_tokens, groups * shared_pages + rows * own_pages}, kv);
    cache.reserve_decode(rows, H, context);
    const long slots = cache.shape().slots(), width = cache.shape().width();
    DeviceArray<bf16> k((size_t)(slots * width), "benchmark K"), v((size_t)(slots * width), "benchmark V");
    DeviceArray<bf16> q((size_t)rows * H * D, "benchmark queries"), out((size_t)rows * H * D, "benchmark attention output");
    fill_uniform(k.get(), k.size(), 32, 1.0f), fill_uniform(v.get(), v.size(), 33, 1.0f), fill_uniform(q.get(), q.size(), 34, 1.0f);
    std::vector<int32_t> slot_ids((size_t)slots), table((size_t)rows * max_pages), group_rows, start = {0}, shared((size_t)rows, 1);
    for (long i = 0; i < slots; i++) slot_ids[(size_t)i] = (int32_t)i;
    for (int r = 0; r < rows; r++) {
        for (int j = 0; j < max_pages; j++)
            table[(size_t)r * max_pages + j] = j < shared_pages ? (r / kGroupSamples) * shared_pages + j
                                                                 : groups * shared_pages + r * own_pages + (j - shared_pages);
        group_rows.push_back(r);
        if ((int)group_rows.size() - start.back() == cache.cascade_rows() || r % kGroupSamples == kGroupSamples - 1)
            start.push_back((int)group_rows.size());
    }
    DeviceArray<int32_t> slots_d(slot_ids.size(), "benchmark cache rows"), table_d(table.size(), "benchmark page table"),
        lens((size_t)rows, "benchmark lengths"), prefix((size_t)rows, "benchmark prefixes"),
        rows_d(group_rows.size(), "cascade rows"), start_d(start.size(), "cascade starts"), count_d(1, "cascade count"),
        shared_d(shared.size(), "cascade rows shared");
    slots_d.upload(slot_ids), table_d.upload(table), lens.upload(std::vector<int32_t>((size_t)rows, context));
    prefix.upload(std::vector<int32_t>((size_t)rows, (int32_t)decode_prefix_keys(prompt, context)));
    rows_d.upload(group_rows), start_d.upload(start), count_d.upload(std::vector<int32_t>{(int32_t)start.size() - 1});
    shared_d.upload(shared);
    cache.append(0, k.get(), v.get(), slots_d.get(), slots, 0);
    DecodeCascade cascade;
    cascade.rows = rows_d.get(), cascade.start = start_d.get(), cascade.count = count_d.get(), cascade.shared = shared_d.get();
    cascade.max_groups = rows / 2;
    auto timed = [&](const DecodeCascade& with) {
        return median_ms([&] {
            cache.plan_decode(lens.get(), prefix.get(), rows, context, 0, with);
            cache.decode_attention(0, out.get(), q.get(), H, table_d.get(), max_pages, 0);
        });
    };
    const double per_row_ms = timed(DecodeCascade()), cascade_ms = timed(cascade);
    DecodeAttentionShape a;  // the model's price of both (kernel_perf_model.h): one layer, the grid of `context`
    a.fp8_kv = kv == Precision::FP8, a.H = H, a.KV = (int)c.num_kv_heads, a.D = D, a.grid_rows = a.live_rows = rows;
    a.own_keys = context, a.max_len = context;
    const DecodeAttentionPrice alone_price = decode_attention_price(bench_gpu(), a);
    record_calibration("bench_rollout", strfmt("decode attention per-row, %d rows x %d keys, %s KV", rows, context, precision_name(kv)),
                       per_row_ms * 1e-3, alone_price.step_seconds(1), alone_price.per_row.bound());
    a.own_keys = context - decode_prefix_keys(prompt, context), a.prefix = decode_prefix_keys(prompt, context);
    a.cascade_groups = groups, a.group_members = std::min(kGroupSamples, cache.cascade_rows());
    a.cascade_grid = rows / 2;
    const DecodeAttentionPrice both = decode_attention_price(bench_gpu(), a);
    record_calibration("bench_rollout", strfmt("decode attention cascade, %d rows x %d keys, %s KV", rows, context, precision_name(kv)),
                       cascade_ms * 1e-3, both.step_seconds(1), both.cascade.bound());
    ModelConfig one_layer = c;
    one_layer.num_layers = 1;
    const PerfHardware& hw = bench_hardware();
    const int group = std::min(kGroupSamples, cache.cascade_rows());
    const DecodePrediction alone = predict_decode_step(hw, one_layer, rows, context, Precision::BF16, kv),
                           shared_p = predict_decode_step(hw, one_layer, rows, context, Precision::BF16, kv, prompt, group);
    printf("| %s | %d rows, %d per prompt, %d-token prompts, %d keys | %s | %.3f | %.3f | %.2f (%.2f) | %.0f (%.0f) | %.0f (%.0f) |\n",
           m.name, rows, kGroupSamples, prompt, context, precision_name(kv), per_row_ms, cascade_ms, per_row_ms / cascade_ms,
           alone.attention_s / shared_p.attention_s, alone.attention_bytes / (per_row_ms * 1e-3) / 1e9,
           alone.attention_bandwidth() / 1e9, shared_p.attention_bytes / (cascade_ms * 1e-3) / 1e9,
           shared_p.attention_bandwidth() / 1e9);
    fflush(stdout);
}

// Decode attention's kernels one at a time (kv_cache.cuh: the step's kv_decode_plan_kernel, then one
// layer's kv_decode_split_kernel and kv_decode_combine_kernel, as plan_decode, decode_split and
// decode_combine launch them), `rows` rows of `context` keys each on their own pages: each kernel's
// median time alone, its bytes (as kernel_perf_model.h's decode_attention_price counts them: the
// split's K/V reads and partials, the combine's partials and output, the plan's lengths and list)
// over that time, beside the HBM bandwidth the model assumes and beside the model's time for the
// same launch (its bytes over its predicted seconds).
void print_decode_kernel_rows(const BenchModel& m, const ModelConfig& c, Precision kv, bool tiny) {
    const int rows = tiny ? 4 : 512, context = tiny ? 96 : 1024, page_tokens = kKvPageTokens;
    const int H = (int)c.num_heads, D = (int)c.head_dim, pages = (context + page_tokens - 1) / page_tokens;
    PagedKvCache cache(KvCacheShape{1, (int)c.num_kv_heads, D, page_tokens, rows * pages}, kv);
    cache.reserve_decode(rows, H, context);
    const long slots = cache.shape().slots(), width = cache.shape().width();
    DeviceArray<bf16> k((size_t)(slots * width), "benchmark K"), v((size_t)(slots * width), "benchmark V");
    DeviceArray<bf16> q((size_t)rows * H * D, "benchmark queries"), out((size_t)rows * H * D, "benchmark attention output");
    fill_uniform(k.get(), k.size(), 42, 1.0f), fill_uniform(v.get(), v.size(), 43, 1.0f), fill_uniform(q.get(), q.size(), 44, 1.0f);
    std::vector<int32_t> slot_ids((size_t)slots), table((size_t)rows * pages);
    for (long i = 0; i < slots; i++) slot_ids[(size_t)i] = (int32_t)i;
    for (size_t i = 0; i < table.size(); i++) table[i] = (int32_t)i;  // row r's pages r * pages ..
    DeviceArray<int32_t> slots_d(slot_ids.size(), "benchmark cache rows"), table_d(table.size(), "benchmark page table"),
        lens((size_t)rows, "benchmark lengths");
    slots_d.upload(slot_ids), table_d.upload(table), lens.upload(std::vector<int32_t>((size_t)rows, context));
    cache.append(0, k.get(), v.get(), slots_d.get(), slots, 0);
    const double plan_ms = median_ms([&] { cache.plan_decode(lens.get(), nullptr, rows, context, 0); });
    const double split_ms = median_ms([&] { cache.decode_split(0, q.get(), H, table_d.get(), pages, 0); });
    const double combine_ms = median_ms([&] { cache.decode_combine(out.get(), H, 0); });
    DecodeAttentionShape a;
    a.fp8_kv = kv == Precision::FP8, a.H = H, a.KV = (int)c.num_kv_heads, a.D = D, a.grid_rows = a.live_rows = rows;
    a.own_keys = context, a.max_len = context;
    const DecodeAttentionPrice priced = decode_attention_price(bench_gpu(), a);
    const double hbm = bench_gpu().bandwidth();
    const struct {
        const char* name;
        double ms;
        const KernelPrice& price;
    } kernels[] = {{"kv_decode_plan_kernel", plan_ms, priced.plan},
                   {"kv_decode_split_kernel", split_ms, priced.per_row},
                   {"kv_decode_combine_kernel", combine_ms, priced.combine}};
    for (const auto& kk : kernels) {
        const double bytes = kk.price.hbm_s * hbm, predicted_s = kk.price.seconds();
        record_calibration("bench_rollout", strfmt("%s, %d rows x %d keys, %s KV", kk.name, rows, context, precision_name(kv)),
                           kk.ms * 1e-3, predicted_s, kk.price.bound());
        printf("| %s | %s | %d rows x %d keys | %s | %.4f (%.4f) | %.2f | %.0f (%.0f) | %.0f | %.2f (%.2f) |\n", m.name, kk.name,
               rows, context, precision_name(kv), kk.ms, predicted_s * 1e3, bytes / 1e6, bytes / (kk.ms * 1e-3) / 1e9,
               bytes / predicted_s / 1e9, hbm / 1e9, bytes / (kk.ms * 1e-3) / hbm, bytes / predicted_s / hbm);
    }
    fflush(stdout);
}

// Returns the last setting's key figures (fp8 weights + fp8 KV), for the closing line (dev/gpu_check.sh's summary).
std::string bench_model(const BenchModel& m, bool tiny) {
    const EngineOptions options;
    GpuEngine engine(bench_model_dir(m), options);
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
    std::string key;
    const auto report = [&](const Setting& s, const Run& r) {
        const Shares shares = component_shares(engine.config(), options, s, r, new_tokens);
        print_row(m, engine.config(), sequences, new_tokens, s, r, base.seconds, shares);
        key = strfmt("%s %s/%s at %d x %d: %.0f tokens/s (%.2fx bf16/bf16), sampling %.1f%%, attention %.1f%%, peak %.2f GiB",
                     m.name, precision_name(s.weights), precision_name(s.kv_cache), sequences, new_tokens, r.tokens / r.seconds,
                     base.seconds / r.seconds, 100 * shares.sampling, 100 * shares.attention, r.peak / 1073741824.0);
    };
    report(kSettings[0], base);
    for (int i = 1; i < 3; i++) report(kSettings[i], generate(engine, kSettings[i], sequences, new_tokens, m.vocab));
    return key;
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
    printf("GpuEngine::generate timed whole (prefill, decode, sampling, transfers); target %d x %d, grown from 4 x 8 "
           "within %.0f s per model; speedup = bf16/bf16 time / this time; sampling %% and attention %% are estimated "
           "from the kernels timed alone at the run's shapes (sample_tokens_gpu on [slots][V] FP32 logits, the logits "
           "GEMM not included; decode_attention in every layer at prompt + half the new tokens, the run's KV storage "
           "and page size) times the run's decode steps, over its seconds%s; attention GB/s = the K and V bytes it "
           "reads over its time alone; in parentheses what cuda/perf/decode_perf_model.h predicts for the run's decode steps "
           "(weights, attention and sampling bytes at the H200's anchors; prefill not counted); peak = the engine's "
           "device high-water mark during the call (DeviceArray's count)\n\n",
           kTargetSequences, kTargetNewTokens, kBudgetSeconds,
           emulated ? " (in emulation the fractions mean nothing: the CPU runs each kernel at its own speed)" : "");
    printf("| model | sequences x new tokens | weights | KV cache | seconds | tokens | tokens/s (predicted) | speedup | "
           "sampling %% (predicted) | attention %% (predicted) | attention GB/s (predicted) | decode steps | peak GiB |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    std::vector<BenchModel> models = {kQwen3_0_6B, kQwen3_1_7B};
    if (tiny) models = {kTinyBenchModel};
    int failures = 0;
    std::string key;  // the last model's
    const auto start = std::chrono::steady_clock::now();
    for (const BenchModel& m : models) {
        // a slow generator would take the next model past dev/gpu_check.sh's limit
        const double spent = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (spent > 1.5 * kBudgetSeconds) {
            printf("| %s | SKIPPED: the models before it took %.0f s, over 1.5 x the %.0f s budget |\n", m.name, spent,
                   kBudgetSeconds);
            continue;
        }
        try {
            key = "; " + bench_model(m, tiny);
        } catch (const Error& e) {
            printf("| %s | ERROR: %s |\n", m.name, e.what());
            failures++;
            cudaGetLastError();  // clear a sticky launch error so the next model can run
        }
    }
    printf("\nCascade attention: one layer's decode attention with the rows of a prompt in groups (one CTA reads each "
           "prefix tile for up to %d of them) against each row reading its own prompt; ms per call, speedup = per-row / "
           "cascade time; GB/s = K/V bytes each reads over its time; in parentheses cuda/perf/decode_perf_model.h's "
           "prediction%s\n\n", kCascadeRows, emulated ? " (in emulation the times mean nothing)" : "");
    printf("| model | shape | KV cache | per-row ms | cascade ms | speedup (predicted) | per-row GB/s (predicted) | cascade GB/s "
           "(predicted) |\n|---|---|---|---|---|---|---|---|\n");
    const BenchModel& shape = tiny ? kTinyBenchModel : kQwen3_1_7B;
    // One table's rows, BF16 then FP8 KV cache; a failed row is printed and counted.
    auto kv_rows = [&](void (*print_rows)(const BenchModel&, const ModelConfig&, Precision, bool)) {
        for (Precision kv : {Precision::BF16, Precision::FP8}) {
            try {
                print_rows(shape, parse_model_config(json_parse(bench_model_config(shape), shape.name), shape.name), kv, tiny);
            } catch (const Error& e) {
                printf("| %s | ERROR: %s |\n", shape.name, e.what());
                failures++;
                cudaGetLastError();
            }
        }
    };
    kv_rows(print_cascade_row);
    printf("\nDecode attention's kernels, each timed alone (the plan once a step; the split and the combine for one "
           "layer): ms per call; MB = the bytes the model counts for it; GB/s = those bytes over the time, beside the "
           "HBM bandwidth the model assumes (0.9 of the datasheet's) and the fraction of it reached; in parentheses "
           "cuda/perf/kernel_perf_model.h's prediction for the same launch%s\n\n", emulated ? " (in emulation the times mean nothing)" : "");
    printf("| model | kernel | shape | KV cache | ms (predicted) | MB | GB/s (predicted) | HBM GB/s | of HBM (predicted) |\n"
           "|---|---|---|---|---|---|---|---|---|\n");
    kv_rows(print_decode_kernel_rows);
    printf("\nbench_rollout: %d model(s) failed%s\n", failures, key.c_str());
    return failures ? 1 : 0;
}
