// test_rollout.cu: generation on the GPU engine (rollout.cu over kv_cache.cuh's pages) against
// independent references: the engine's own prefill forward (teacher-forced decode), the CPU
// engine's greedy generation, and each request generated alone (scheduling), plus bad input.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "cpu/engine_cpu.h"
#include "cuda/engine/engine_gpu.cuh"
#include "rl/model/init_model.h"
#include "test/gpu/bench_model.h"
#include "test/gpu/gpu_util.cuh"
#include "test/harness.h"
#include "test/kept_turns.h"
#include "test/temp_dir.h"

using namespace fp8rl;

namespace {

const char* const kFixtures[] = {"test/fixtures/models/qwen3_tiny", "test/fixtures/models/qwen2_tiny",
                                 "test/fixtures/models/llama_tiny", "test/fixtures/models/qwen3_gqa3_tiny"};

std::vector<int32_t> random_ids(int n, int V, uint32_t seed) {
    std::vector<int32_t> ids;
    for (int i = 0; i < n; i++) ids.push_back((int32_t)((hash_uniform(i, seed) + 1.0f) * 0.5f * (V - 1)));
    return ids;
}

// Prompts of ragged lengths (1 to 23 tokens), each its own sequence key.
std::vector<GenRequest> ragged_requests(int count, int V, uint32_t seed) {
    std::vector<GenRequest> r;
    for (int i = 0; i < count; i++) r.push_back({random_ids(1 + (i * 7) % 23, V, seed + 31 * i), (uint32_t)(100 + i)});
    return r;
}

double rms(const std::vector<double>& d) {
    double s = 0;
    for (double x : d) s += x * x;
    return std::sqrt(s / std::max<size_t>(d.size(), 1));
}

EngineOptions small_pages(int page_tokens) {
    EngineOptions o;
    o.kv_page_tokens = page_tokens;
    return o;
}

}  // namespace

// Teacher forcing through the pages: feeding prompt + completion token by token (prefill of the
// prompt, then one decode step per token over pages of 4 tokens, so sequences span many pages)
// gives the log-probs the engine's prefill forward gives over the whole sequence. The bound,
// justified: both paths store the same BF16 activations except in attention (the decode kernel
// reads the cached K/V and sums in its own order and roundings; FlashAttention-2 rounds its
// unnormalized probabilities), so they are two BF16 computations of the same function. The size of
// one such computation's rounding is the CPU engine's distance from bf16 to fp32 on the same
// sequences: the decode path must be within twice that RMS of the prefill. With an FP8 cache K and
// V are rounded to E4M3 (3 mantissa bits, 16x BF16's relative step): its distance to the prefill is
// reported and bounded by 16x the BF16 bound. Under ASan only the GQA-3 fixture runs.
TEST(rollout_teacher_forced_decode_matches_prefill) {
    REQUIRE_GPU();
    const std::vector<const char*> dirs = harness::sanitized ? std::vector<const char*>{kFixtures[3]}
                                                             : std::vector<const char*>{kFixtures[0], kFixtures[1], kFixtures[3]};
    for (const char* dir : dirs) {
        CpuEngine cpu(dir);
        GpuEngine gpu(dir, small_pages(4));
        const int V = (int)cpu.config().vocab_size;
        std::vector<GenRequest> requests = ragged_requests(5, V, 11);
        std::vector<std::vector<int32_t>> completions;
        std::vector<Sequence> seqs;
        for (size_t i = 0; i < requests.size(); i++) {
            completions.push_back(random_ids(3 + 5 * (int)i, V, 500 + (uint32_t)i));
            Sequence s{requests[i].prompt, (int32_t)requests[i].prompt.size()};
            s.ids.insert(s.ids.end(), completions.back().begin(), completions.back().end());
            seqs.push_back(s);
        }
        TokenValues prefill, cpu32, cpu16;
        gpu.logprobs(seqs, Precision::BF16, 1.0f, &prefill, nullptr);
        cpu.logprobs(seqs, Precision::FP32, 1.0f, &cpu32, nullptr);
        cpu.logprobs(seqs, Precision::BF16, 1.0f, &cpu16, nullptr);
        std::vector<double> noise;
        for (size_t s = 0; s < seqs.size(); s++)
            for (size_t k = 0; k < cpu16[s].size(); k++) noise.push_back((double)cpu16[s][k] - cpu32[s][k]);
        const double bound = 2 * rms(noise);
        double by_kv[2] = {0, 0};
        for (Precision kv : {Precision::BF16, Precision::FP8}) {
            std::vector<Generation> dec = gpu.teacher_forced(requests, completions, Precision::BF16, kv);
            std::vector<double> d;
            bool same_tokens = dec.size() == seqs.size();
            for (size_t s = 0; s < dec.size() && same_tokens; s++) {
                same_tokens = dec[s].tokens == completions[s] && dec[s].logprobs.size() == prefill[s].size();
                for (size_t k = 0; same_tokens && k < prefill[s].size(); k++) d.push_back((double)dec[s].logprobs[k] - prefill[s][k]);
            }
            CHECK_MSG(same_tokens, "%s: teacher forcing did not return the forced tokens", dir);
            by_kv[kv == Precision::FP8] = rms(d);
            if (kv == Precision::FP8) CHECK(gpu.rollout_stats().k_scale.size() == (size_t)cpu.config().num_layers);
        }
        printf("    %s: RMS(decode - prefill) bf16 KV %.3g, fp8 KV %.3g; bound %.3g (bf16), %.3g (fp8)\n", dir, by_kv[0],
               by_kv[1], bound, 16 * bound);
        CHECK_MSG(by_kv[0] <= bound, "%s: bf16 KV decode off the prefill by %.3g RMS (bound %.3g)", dir, by_kv[0], bound);
        CHECK_MSG(by_kv[1] <= 16 * bound, "%s: fp8 KV decode off the prefill by %.3g RMS (bound %.3g)", dir, by_kv[1],
                  16 * bound);
    }
}

namespace {

// The first position where two completions differ (the shorter's length when one is a prefix).
size_t first_departure(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
    size_t k = 0;
    while (k < a.size() && k < b.size() && a[k] == b[k]) k++;
    return k;
}

}  // namespace

// Greedy and sampled completions (temperature 0.8, top-p 0.95) against the CPU engine's, with bf16
// weights and KV cache and with fp8 weights and an FP8 KV cache. The CPU engine rounds where the
// kernels round (cpu/attention.h), so a completion may leave the CPU's only where the two engines'
// FP32 roundings decide a near tie. At every departure the CPU scores the GPU's completion by teacher
// forcing through its own generator (the same prefill, decode steps and KV cache): the sample_offset
// of the GPU's token there (rl/numerics/sampling.h: greedy, the logit gap to the CPU's argmax;
// sampled, how far the CPU's uniform lies outside the token's CDF interval, in kept mass) must be
// within a tenth of the precision's own error (test_engine.cu's bound), the largest |log-prob|
// distance of the CPU's completions between this precision and fp32 (a log-prob error e moves the
// CDF by at most about e). The CPU's teacher
// forcing of its own completions must reproduce its log-probs bit for bit, every own token inside
// its interval. In emulation the engines agree bit for bit, so every completion must be equal.
namespace {

struct WeightsAndKv {
    Precision weights, kv;
};

// The check above on one model with the engines' options, for `requests` (empty: 6 ragged prompts)
// sampled as `base` says at each of `temperatures` (top-p 0.95 where sampling); counts the
// completions equal to the CPU's.
void completions_match_cpu(const std::string& dir, const EngineOptions& cpu_options, const std::vector<WeightsAndKv>& precisions,
                           int& same, int& total, std::vector<GenRequest> requests = {}, SamplingConfig base = {},
                           const std::vector<float>& temperatures = {0.0f, 0.8f}) {
    {
        EngineOptions gpu_options = small_pages(8);
        gpu_options.fp8_scaling = cpu_options.fp8_scaling;
        CpuEngine cpu(dir, cpu_options);
        GpuEngine gpu(dir, gpu_options);
        const int V = (int)cpu.config().vocab_size;
        if (requests.empty()) requests = ragged_requests(6, V, 77), base.max_new_tokens = 12, base.seed = 5;
        for (const auto& pr : precisions)
            for (float temperature : temperatures) {
                SamplingConfig s = base;
                s.temperature = temperature;
                s.top_p = temperature > 0 ? 0.95f : 1.0f;
                const uint32_t step = 3;
                const std::vector<Generation> want = cpu.generate(requests, step, s, pr.weights, pr.kv, nullptr);
                const std::vector<Generation> got = gpu.generate(requests, step, s, pr.weights, pr.kv, nullptr);
                CHECK_EQ(got.size(), requests.size());
                CHECK_EQ(want.size(), requests.size());
                if (got.size() != requests.size() || want.size() != requests.size()) continue;
                std::vector<std::vector<int32_t>> own, theirs;  // the GPU's up to its first departure
                for (size_t i = 0; i < requests.size(); i++) {
                    own.push_back(want[i].tokens);
                    const size_t k = first_departure(got[i].tokens, want[i].tokens);
                    theirs.emplace_back(got[i].tokens.begin(), got[i].tokens.begin() + (long)std::min(got[i].tokens.size(), k + 1));
                }
                const std::vector<Generation> replay = cpu.teacher_forced(requests, own, step, s, pr.weights, pr.kv);
                const std::vector<Generation> exact = cpu.teacher_forced(requests, own, step, s, Precision::FP32, Precision::FP32);
                const std::vector<Generation> scored = cpu.teacher_forced(requests, theirs, step, s, pr.weights, pr.kv);
                double precision_error = 0;  // on these completions
                for (size_t i = 0; i < requests.size(); i++) {
                    CHECK_MSG(replay[i].logprobs == want[i].logprobs, "%s request %zu: teacher forcing does not reproduce "
                              "the CPU's log-probs", dir.c_str(), i);
                    for (size_t k = 0; k < own[i].size(); k++) {
                        CHECK_MSG(replay[i].sample_offsets[k] <= 0, "%s request %zu token %zu: the CPU's own token is "
                                  "outside its draw (offset %g)", dir.c_str(), i, k, replay[i].sample_offsets[k]);
                        precision_error = std::max(precision_error, std::fabs((double)want[i].logprobs[k] - exact[i].logprobs[k]));
                    }
                }
                const double tolerance = 0.1 * precision_error;
                for (size_t i = 0; i < requests.size(); i++) {
                    total++;
                    const size_t k = first_departure(got[i].tokens, want[i].tokens);
                    if (k == got[i].tokens.size() && k == want[i].tokens.size()) {
                        same++;
                        CHECK(got[i].finished == want[i].finished);
                        continue;
                    }
                    CHECK_MSG(k < got[i].tokens.size() && k < want[i].tokens.size(),
                              "%s request %zu: one completion is a prefix of the other", dir.c_str(), i);
                    if (k >= got[i].tokens.size() || k >= want[i].tokens.size()) continue;
                    const float offset = scored[i].sample_offsets[k];
                    printf("    %s %s/%s T %.1f request %zu: differs at token %zu (CPU %d, GPU %d), CPU offset %.3g "
                           "(tolerance %.3g)\n", dir.c_str(), precision_name(pr.weights), precision_name(pr.kv), temperature, i,
                           k, want[i].tokens[k], got[i].tokens[k], offset, tolerance);
                    CHECK_MSG(offset <= tolerance, "%s request %zu: the GPU's token %d at %zu is no near tie of the CPU's "
                              "%d (offset %.3g > %.3g)", dir.c_str(), i, got[i].tokens[k], k, want[i].tokens[k], offset, tolerance);
                }
            }
    }
}

}  // namespace

TEST(rollout_completions_match_cpu_engine_but_at_near_ties) {
    REQUIRE_GPU();
    int same = 0, total = 0;
    for (const char* dir : kFixtures) {
        if (harness::sanitized ? dir != kFixtures[3] : dir == kFixtures[1]) continue;  // ASan: 1 of the 4, else 3
        completions_match_cpu(dir, EngineOptions{}, {{Precision::BF16, Precision::BF16}, {Precision::FP8, Precision::FP8}},
                              same, total);
    }
    printf("    completions equal to the CPU engine's: %d of %d\n", same, total);
    if (emulated) CHECK_EQ(same, total);
}

// The same at --fp8_scaling row and tensor (fp8 weights, FP8 KV cache), on one fixture.
TEST(rollout_completions_match_cpu_engine_at_row_and_tensor_scaling) {
    REQUIRE_GPU();
    int same = 0, total = 0;
    // ASan: tensor alone (the emulation runs ~3x slower there)
    const std::vector<Fp8Scaling> scalings =
        harness::sanitized ? std::vector<Fp8Scaling>{Fp8Scaling::Tensor} : std::vector<Fp8Scaling>{Fp8Scaling::Row, Fp8Scaling::Tensor};
    for (Fp8Scaling scaling : scalings) {
        EngineOptions o;
        o.fp8_scaling = scaling;
        completions_match_cpu(kFixtures[harness::sanitized ? 3 : 0], o, {{Precision::FP8, Precision::FP8}}, same, total);
    }
    printf("    completions equal to the CPU engine's: %d of %d\n", same, total);
    if (emulated) CHECK_EQ(same, total);
}

namespace {

// A copy of a fixture model whose generation config stops on ids 0..39 (1/8 of the vocabulary),
// so sampled completions end anywhere from 1 token to the budget.
std::string many_eos_model(const harness::TempDir& tmp, const char* dir) {
    const std::string out = tmp / "many_eos";
    std::filesystem::create_directories(out);
    for (const auto& e : std::filesystem::directory_iterator(dir))
        std::filesystem::copy_file(e.path(), out + "/" + e.path().filename().string());
    std::string eos;
    for (int i = 0; i < 40; i++) eos += strfmt("%s%d", i ? ", " : "", i);
    harness::write_text(out + "/generation_config.json", "{\"eos_token_id\": [" + eos + "]}\n");
    return out;
}

// Sampling at temperature 1 over the whole vocabulary.
SamplingConfig sampled(int max_new_tokens, uint64_t seed) {
    SamplingConfig s;
    s.temperature = 1.0f, s.max_new_tokens = max_new_tokens, s.seed = seed;
    return s;
}

}  // namespace

// Scheduling: 5 prompts x 2 samples through 3 slots with a page pool too small for three long
// sequences (pages of 4 tokens), so sequences wait for slots, finish at every length, share their
// prompt's pages and get preempted; every completion must equal the same request generated alone
// (one slot: its prompt prefilled for it alone), bit for bit. With every request in a slot at once
// each prompt is prefilled once for its two samples.
TEST(rollout_scheduling_matches_each_request_alone) {
    REQUIRE_GPU();
    harness::TempDir tmp;
    const std::string dir = many_eos_model(tmp, kFixtures[0]);
    const SamplingConfig s = sampled(16, 5);
    const Precision kv = Precision::BF16;  // the schedule is the same for either storage
    std::vector<GenRequest> requests;
    long distinct_prompt_tokens = 0;
    for (const GenRequest& r : ragged_requests(5, 320, 3)) {
        distinct_prompt_tokens += (long)r.prompt.size();
        for (int g = 0; g < 2; g++) requests.push_back({r.prompt, r.sequence * 2 + (uint32_t)g});
    }
    EngineOptions tight = small_pages(4), one_slot = small_pages(4), wide = small_pages(4);
    tight.rollout_slots = 3;
    const size_t page = PagedKvCache::page_bytes({2, 2, 32, 4, 1}, kv);
    tight.kv_cache_mb = (16 * page + page / 2) / 1048576.0;  // 16 pages: 2 sequences at full length hold 12
    one_slot.rollout_slots = 1;
    GpuEngine batched(dir, tight), alone(dir, one_slot), together(dir, wide);
    const std::vector<Generation> all = batched.generate(requests, 2, s, Precision::BF16, kv, nullptr);
    const std::vector<Generation> each = alone.generate(requests, 2, s, Precision::BF16, kv, nullptr);
    const std::vector<Generation> at_once = together.generate(requests, 2, s, Precision::BF16, kv, nullptr);
    const RolloutStats st = batched.rollout_stats();
    std::vector<size_t> lengths;
    CHECK(all.size() == requests.size() && each.size() == requests.size() && at_once.size() == requests.size());
    for (size_t i = 0; i < std::min(all.size(), each.size()); i++) {
        CHECK_MSG(each[i].tokens == all[i].tokens && each[i].logprobs == all[i].logprobs && each[i].finished == all[i].finished,
                  "request %zu: batched completion (%zu tokens) differs from the one alone (%zu tokens)", i,
                  all[i].tokens.size(), each[i].tokens.size());
        CHECK_MSG(i >= at_once.size() || (each[i].tokens == at_once[i].tokens && each[i].logprobs == at_once[i].logprobs),
                  "request %zu: with every request in a slot the completion differs from the one alone", i);
        lengths.push_back(all[i].tokens.size());
    }
    std::sort(lengths.begin(), lengths.end());
    printf("    3 slots: %lld prefills of %lld tokens, %lld decode steps (%lld graphs captured, %lld replays), %lld "
           "preemptions, %lld refills on the device, at most %d running; lengths %zu..%zu; all at once: %lld prompt "
           "tokens prefilled of %ld distinct\n",
           (long long)st.prefills, (long long)st.prefill_tokens, (long long)st.decode_steps, (long long)st.graphs_captured,
           (long long)st.graph_launches, (long long)st.preemptions, (long long)st.refills, st.max_running, lengths.front(),
           lengths.back(),
           (long long)together.rollout_stats().prefill_tokens, distinct_prompt_tokens);
    CHECK(st.preemptions > 0);
    CHECK_EQ(st.max_running, 3);
    CHECK_EQ(alone.rollout_stats().max_running, 1);
    CHECK_EQ(together.rollout_stats().prefill_tokens, distinct_prompt_tokens);
    CHECK_EQ(together.rollout_stats().prefills, (int64_t)1);
    CHECK_EQ(lengths.front(), (size_t)1);
    CHECK_EQ(lengths.back(), (size_t)s.max_new_tokens);
}

// Multi-turn rollouts over kept pages (start_turns, next_turns; test/kept_turns.h's three turns):
// 3 prompts x 2 samples on a model that stops on 1/8 of its ids, pages of 4 tokens, bf16 weights and
// an FP8 cache. In a pool that holds every trajectory, and through 3 slots in a pool of 14 pages
// (held pages give way, rows are fed again), every turn's tokens, log-probs and ends are the same bit
// for bit; in emulation they are also the CPU engine's (test_environment.cpp checks those against
// teacher forcing through the decode path, and the emulated binary's BF16-cache turns against the
// CPU binary's). A next turn feeds each row's last token and its observation, nothing before; the
// cache keeps turn 1's scales.
TEST(rollout_kept_turns_match_cpu_engine_and_page_pressure) {
    REQUIRE_GPU();
    harness::TempDir tmp;
    const std::string dir = many_eos_model(tmp, kFixtures[0]);
    std::vector<GenRequest> requests;
    for (const GenRequest& r : ragged_requests(3, 320, 11))
        for (int g = 0; g < 2; g++) requests.push_back({r.prompt, r.sequence * 2 + (uint32_t)g});
    const SamplingConfig s = sampled(5, 4);
    const Precision w = Precision::BF16, p = Precision::FP8;
    EngineOptions wide = small_pages(4), tight = small_pages(4);
    tight.rollout_slots = 3;
    const size_t page = PagedKvCache::page_bytes({2, 2, 32, 4, 1}, p);
    tight.kv_cache_mb = (14 * page + page / 2) / 1048576.0;
    CpuEngine cpu(dir);
    GpuEngine a(dir, wide), c(dir, tight);
    const kept_turns::Run want = kept_turns::run(cpu, requests, 2, s, w, p, 4, 14);
    const kept_turns::Run got = kept_turns::run(a, requests, 2, s, w, p, 4, 14);
    const kept_turns::Run pressed = kept_turns::run(c, requests, 2, s, w, p, 4, 14);
    const RolloutStats st = c.rollout_stats();
    printf("    rows %zu, %zu, %zu; fed %lld + %lld; in 14 pages: %lld preemptions, %lld tokens fed again\n", got.rows[0].size(),
           got.rows[1].size(), got.rows[2].size(), (long long)got.fed[0], (long long)got.fed[1], (long long)st.preemptions,
           (long long)st.replayed_tokens);
    CHECK(st.preemptions + st.replayed_tokens > 0);
    CHECK_EQ(got.fed[0], kept_turns::expected_fed(got, 1));
    CHECK_EQ(got.fed[1], kept_turns::expected_fed(got, 2));
    CHECK(!got.k_scale.empty() && got.k_scale_end == got.k_scale && got.v_scale_end == got.v_scale);
    auto same = [](const kept_turns::Run& x, const kept_turns::Run& y) {
        if (x.rows != y.rows || x.sequences != y.sequences || x.turns.size() != y.turns.size()) return false;
        for (size_t t = 0; t < x.turns.size(); t++)
            for (size_t k = 0; k < x.turns[t].size(); k++) {
                const Generation &g = x.turns[t][k], &h = y.turns[t][k];
                if (g.tokens != h.tokens || g.finished != h.finished ||
                    memcmp(g.logprobs.data(), h.logprobs.data(), g.logprobs.size() * sizeof(float)) != 0)
                    return false;
            }
        return true;
    };
    CHECK_MSG(same(got, pressed), "under page pressure the turns differ");
    if (emulated) CHECK_MSG(same(got, want), "the turns differ from the CPU engine's");
}

// Refills on the device (issue 29): 12 samples of each of two prompts (40 and 50 tokens, in turn)
// through 3 slots, on a model that stops on 1/8 of its ids, so sequences stop anywhere within a window
// while their siblings wait. A row whose sequence stops takes a waiting request of a cached prompt in
// the next step (its first token drawn at the window's start), without the host, and leaves its
// cascade group (the prompts' first 32 keys are read once per group of siblings; a row of the other
// prompt in the group would read the wrong pages): no row idles while a sibling waits, so the
// decode steps stay within greedy list scheduling's bound (Graham: the row-steps over the rows,
// plus the longest sequence's steps), every window but the last runs its 16 steps (the host looks
// once per 16), and every completion equals the same request decoded with all 24 at once, bit for
// bit; so do their teacher-forced log-probs. Under ASan, which looks for memory errors, 6 samples of each
// prompt (21 s of CI there with 12).
TEST(rollout_stopped_rows_take_waiting_siblings_on_the_device) {
    REQUIRE_GPU();
    harness::TempDir tmp;
    const std::string dir = many_eos_model(tmp, kFixtures[0]);
    const SamplingConfig s = sampled(24, 9);
    const int samples = harness::sanitized ? 12 : 24;
    std::vector<GenRequest> requests;
    for (uint32_t g = 0; g < (uint32_t)samples; g++) requests.push_back({random_ids(g % 2 ? 50 : 40, 320, 5 + g % 2), 1000 + g});
    EngineOptions three = small_pages(4), all = small_pages(4);
    three.rollout_slots = 3;
    GpuEngine batched(dir, three), together(dir, all);
    const std::vector<Generation> got = batched.generate(requests, 1, s, Precision::BF16, Precision::FP8, nullptr);
    const std::vector<Generation> want = together.generate(requests, 1, s, Precision::BF16, Precision::FP8, nullptr);
    const RolloutStats st = batched.rollout_stats();
    long row_steps = 0, longest = 0;
    int same = 0;
    for (size_t i = 0; i < requests.size(); i++) {
        row_steps += (long)got[i].tokens.size() - 1, longest = std::max(longest, (long)got[i].tokens.size() - 1);
        same += got[i].tokens == want[i].tokens && got[i].logprobs == want[i].logprobs &&
                got[i].logprobs_sampled == want[i].logprobs_sampled && got[i].finished == want[i].finished;
    }
    const long bound = (row_steps + 2) / 3 + longest;
    printf("    %d samples in 3 slots: %lld decode steps for %ld row-steps (bound %ld) in %lld windows, %lld refills on the "
           "device, %lld rows in cascade groups; %d of %d completions equal to all at once\n",
           samples, (long long)st.decode_steps, row_steps, bound, (long long)st.windows, (long long)st.refills,
           (long long)st.cascade_rows, same, samples);
    CHECK_EQ(same, samples);
    CHECK(st.refills > 0 && st.cascade_rows > 0);
    CHECK_MSG(st.decode_steps <= bound, "%lld decode steps, more than %ld", (long long)st.decode_steps, bound);
    CHECK_MSG(st.windows <= (st.decode_steps + 15) / 16, "%lld windows for %lld decode steps", (long long)st.windows,
              (long long)st.decode_steps);
    // teacher forcing of the same completions: the forced rows are refilled alike
    std::vector<std::vector<int32_t>> tokens;
    for (const Generation& g : want) tokens.push_back(g.tokens);
    const std::vector<Generation> forced = batched.teacher_forced(requests, tokens, Precision::BF16, Precision::FP8),
                                  forced_all = together.teacher_forced(requests, tokens, Precision::BF16, Precision::FP8);
    int forced_same = 0;
    for (size_t i = 0; i < requests.size(); i++)
        forced_same += forced[i].tokens == tokens[i] && forced[i].logprobs == forced_all[i].logprobs;
    printf("    teacher forcing: %lld refills, %d of %d log-prob rows equal to all at once\n",
           (long long)batched.rollout_stats().refills, forced_same, samples);
    CHECK(batched.rollout_stats().refills > 0);
    CHECK_EQ(forced_same, samples);
}

// CUDA graphs: generation with the decode steps replayed from graphs (the default) equals the same
// generation launched kernel by kernel (--cuda_graphs 0), bit for bit, with bf16 weights and KV and
// with fp8 weights and KV, sampling (temperature 1, top-k, top-p) and teacher forcing (of the
// sampled completions). 3 prompts x 2 samples on 4 slots and a pool of 8 pages of 4 tokens:
// sequences finish at every length, so the bucket moves between 4, 2 and 1 (3 running: one
// padding row), and some are preempted. Under ASan only fp8.
TEST(rollout_cuda_graphs_match_launches) {
    REQUIRE_GPU();
    harness::TempDir tmp;
    const std::string dir = many_eos_model(tmp, kFixtures[0]);
    SamplingConfig s;
    s.temperature = 1.0f, s.top_k = 50, s.top_p = 0.9f, s.max_new_tokens = 6, s.seed = 7;
    std::vector<GenRequest> requests;
    for (const GenRequest& r : ragged_requests(3, 320, 9))
        for (int g = 0; g < 2; g++) requests.push_back({r.prompt, r.sequence * 2 + (uint32_t)g});
    const std::vector<Precision> precisions =
        harness::sanitized ? std::vector<Precision>{Precision::FP8} : std::vector<Precision>{Precision::BF16, Precision::FP8};
    for (Precision p : precisions) {
        EngineOptions graphs = small_pages(4);
        graphs.rollout_slots = 4;
        const size_t page = PagedKvCache::page_bytes({2, 2, 32, 4, 1}, p);
        graphs.kv_cache_mb = (8 * page + page / 2) / 1048576.0;
        EngineOptions launches = graphs;
        launches.cuda_graphs = false;
        GpuEngine on(dir, graphs), off(dir, launches);
        std::vector<std::vector<int32_t>> sampled;
        for (bool teacher : {false, true}) {
            auto run = [&](GpuEngine& e) {
                return teacher ? e.teacher_forced(requests, sampled, p, p) : e.generate(requests, 3, s, p, p, nullptr);
            };
            const std::vector<Generation> got = run(on), want = run(off);
            const RolloutStats st = on.rollout_stats();
            const char* what = teacher ? "teacher forcing" : "sampling";
            printf("    %s %s: %lld decode steps, %lld graphs captured, %lld replays, %lld preemptions\n", precision_name(p),
                   what, (long long)st.decode_steps, (long long)st.graphs_captured, (long long)st.graph_launches,
                   (long long)st.preemptions);
            CHECK(st.graphs_captured >= 2);
            CHECK(st.graph_launches > st.graphs_captured);
            CHECK(st.preemptions >= 1);
            CHECK_EQ(st.decode_steps, off.rollout_stats().decode_steps);
            CHECK_EQ(off.rollout_stats().graphs_captured + off.rollout_stats().graph_launches, (int64_t)0);
            CHECK_EQ(got.size(), want.size());
            for (size_t i = 0; i < std::min(got.size(), want.size()); i++)
                CHECK_MSG(got[i].tokens == want[i].tokens && got[i].logprobs == want[i].logprobs &&
                              got[i].finished == want[i].finished,
                          "%s %s, request %zu: with graphs %zu tokens, launched one by one %zu, or other log-probs",
                          precision_name(p), what, i, got[i].tokens.size(), want[i].tokens.size());
            for (const Generation& g : want) sampled.push_back(g.tokens);
        }
    }
}

// A prefill that grows the FP8 GEMM scratch (a long prompt admitted after the first decode steps)
// frees the buffers the captured graphs quantize into: they are captured again, and the generation
// still equals the one launched kernel by kernel (under ASan a stale graph reads freed memory).
// Teacher forcing on 2 slots: two short prompts decode first, the long one joins when the shorter
// completion ends, at the end of a window.
TEST(rollout_cuda_graphs_recaptured_after_the_scratch_grows) {
    REQUIRE_GPU();
    const std::vector<GenRequest> requests = {{random_ids(4, 320, 1), 0}, {random_ids(4, 320, 2), 1}, {random_ids(140, 320, 3), 2}};
    const std::vector<std::vector<int32_t>> forced = {random_ids(6, 320, 4), random_ids(2, 320, 5), random_ids(4, 320, 6)};
    EngineOptions graphs;
    graphs.rollout_slots = 2;
    EngineOptions launches = graphs;
    launches.cuda_graphs = false;
    GpuEngine on(kFixtures[0], graphs), off(kFixtures[0], launches);
    const std::vector<Generation> got = on.teacher_forced(requests, forced, Precision::FP8, Precision::BF16);
    const std::vector<Generation> want = off.teacher_forced(requests, forced, Precision::FP8, Precision::BF16);
    const RolloutStats st = on.rollout_stats();
    printf("    %lld decode steps, %lld graphs captured, %lld replays\n", (long long)st.decode_steps,
           (long long)st.graphs_captured, (long long)st.graph_launches);
    CHECK(st.graphs_captured >= 2);  // bucket 2 before and after the long prefill
    CHECK_EQ(got.size(), want.size());
    for (size_t i = 0; i < std::min(got.size(), want.size()); i++)
        CHECK_MSG(got[i].tokens == want[i].tokens && got[i].logprobs == want[i].logprobs,
                  "request %zu: with graphs other log-probs than launched one by one", i);
}

namespace {

// A random 1-layer Qwen3 (hidden 128, 2 heads of 64, vocabulary 512) with 40,960 positions, for
// completions past the fixtures' 512.
std::string long_context_model() {
    const BenchModel m = {"long_context", 128, 256, 1, 2, 2, 64, 512};
    const std::string dir = harness::scratch_dir() + "/rollout_long_context";
    write_random_model(dir, bench_model_config(m), {}, 1);
    return dir;
}

// `prompts` prompts (40, 45, ... tokens: a prefix of 32 keys, read once for both samples by cascade
// attention) x 2 samples; vocab_limit keeps the eos id (511) out, so every completion runs to
// max_new_tokens.
std::vector<GenRequest> long_requests(int prompts) {
    std::vector<GenRequest> r;
    for (int i = 0; i < prompts; i++)
        for (int g = 0; g < 2; g++) r.push_back({random_ids(40 + 5 * i, 511, 40 + i), (uint32_t)(10 * i + g)});
    return r;
}

SamplingConfig long_sampling(int tokens) {
    SamplingConfig s;
    s.temperature = 1.0f, s.max_new_tokens = tokens, s.seed = 17, s.vocab_limit = 511;
    return s;
}

}  // namespace

// The decode loop runs without the host (issue 29): a 100-token generation makes at most one host
// synchronization per 16 decode steps (kDecodeWindow) beyond what a 1-token generation of the same
// requests makes (its set-up, the prefill, one window), and at most one host-to-device copy per
// decode step, counted by the emulation as issued, in the rollout range, once the buffers have
// their size. A second call of the same shapes captures no graph: the first one's are kept. The
// counters exist in emulation only (on a GPU, Nsight Systems shows the same ranges). The plain
// build's two rows of a 200-token prompt cross the 256-key chunk edge midway (a second split chunk
// and its graph: what 300 tokens after a 40-token prompt reached, at a third of the decode steps);
// ASan, which looks for memory errors, decodes 50 tokens after a 40-token prompt.
#ifdef FP8RL_EMU
TEST(rollout_decode_loop_waits_for_the_device_once_per_16_steps) {
    REQUIRE_GPU();
    GpuEngine gpu(long_context_model());
    const std::vector<int32_t> prompt = random_ids(harness::sanitized ? 40 : 200, 511, 40);
    const std::vector<GenRequest> requests = {{prompt, 0}, {prompt, 1}};
    auto counted = [&](int tokens) {
        emu::start_stats();
        gpu.generate(requests, 2, long_sampling(tokens), Precision::BF16, Precision::BF16, nullptr);
        emu::stop_stats();
        return emu::range_stats("rollout");
    };
    const int tokens = harness::sanitized ? 50 : 100;
    counted(tokens);  // the buffers' allocation at their size (cudaFree synchronizes) and the graphs' capture
    const emu::RangeStats one = counted(1), all = counted(tokens);
    const RolloutStats st = gpu.rollout_stats();
    const long steps = (long)st.decode_steps, syncs = (long)(all.host_syncs - one.host_syncs);
    printf("    %d tokens x %zu sequences: %ld decode steps (%lld graph replays, %lld captured): %ld host syncs more than "
           "1 token's %lld; host-to-device copies %lld, device-to-host %lld\n",
           tokens, requests.size(), steps, (long long)st.graph_launches, (long long)st.graphs_captured, syncs,
           (long long)one.host_syncs, (long long)all.h2d_copies, (long long)all.d2h_copies);
    CHECK_EQ(steps, (long)tokens - 1);  // the first token is drawn from the prompt's prefill
    CHECK_MSG(syncs <= (steps + 15) / 16, "%ld more host syncs for %ld decode steps", syncs, steps);
    CHECK_MSG((long)all.h2d_copies <= steps, "%lld host-to-device copies for %ld decode steps", (long long)all.h2d_copies, steps);
    SamplingConfig short_run = long_sampling(40);
    gpu.generate(requests, 3, short_run, Precision::BF16, Precision::BF16, nullptr);
    gpu.generate(requests, 4, short_run, Precision::BF16, Precision::BF16, nullptr);
    CHECK_EQ(gpu.rollout_stats().graphs_captured, (int64_t)0);
    CHECK(gpu.rollout_stats().graph_launches > 0);
}

// Decode attention's CTAs follow the rows' current lengths, not the configured maximum (issue 58):
// each step's plan sizes the split kernel's grid for its longest row rounded up to whole chunks (at
// most prompt + max_new_tokens), and a graph is kept per such length. Two sibling rows of a 240-token
// prompt (one cascade group, its 224-key prefix) of one layer and 2 kv heads: per step and kv head
// 2 rows x decode_chunks(length) + the group's prefix chunks, summed over the steps; fewer than a grid
// fixed at the maximum length. Counted as launched (FP8RL_EMU_STATS' ctas) in the decode_step range.
// The long prompt brings the rows to the 256-key chunk edge in a few steps (30 decode steps, not the
// 230 a 40-token prompt took: a fifth of the time).
TEST(rollout_decode_attention_ctas_follow_the_rows_lengths) {
    REQUIRE_GPU();
    GpuEngine gpu(long_context_model());
    const int tokens = 30, P = 240, KV = 2, L = 1, rows = 2, groups = 1;  // past 256 keys: a second chunk
    const std::vector<int32_t> prompt = random_ids(P, 511, 40);
    const std::vector<GenRequest> requests = {{prompt, 0}, {prompt, 1}};
    emu::start_stats();
    gpu.generate(requests, 2, long_sampling(tokens), Precision::BF16, Precision::BF16, nullptr);
    emu::stop_stats();
    emu::RangeStats st = emu::range_stats("decode_step");
    const uint64_t got = st.ctas["kv_decode_split_kernel"];
    auto step_ctas = [&](long max_len) {  // the split launches of one step planned for max_len keys
        return (uint64_t)KV * L * (rows * PagedKvCache::decode_chunks((int)max_len) + groups * decode_span_chunks(max_len, kDecodeSplitKeys));
    };
    uint64_t want = 0, fixed = 0, with_keys = 0;
    for (int k = 0; k < tokens - 1; k++) {  // decode step k feeds token k + 1: its rows hold P + 1 + k keys
        const long len = P + 1 + k, prefix = decode_prefix_keys(P, len);
        want += step_ctas(std::min<long>(P + tokens, (len + kDecodeSplitKeys - 1) / kDecodeSplitKeys * kDecodeSplitKeys));
        fixed += step_ctas(P + tokens);
        with_keys += (uint64_t)KV * L * (rows * decode_span_chunks(len - prefix, kDecodeSplitKeys) + groups * decode_span_chunks(prefix, kDecodeSplitKeys));
    }
    printf("    %d tokens, %lld decode steps: %llu split CTAs launched (%llu with keys), %llu with a grid fixed at %d keys\n",
           tokens, (long long)gpu.rollout_stats().decode_steps, (unsigned long long)got, (unsigned long long)with_keys,
           (unsigned long long)fixed, P + tokens);
    CHECK_EQ(gpu.rollout_stats().decode_steps, (int64_t)tokens - 1);
    CHECK_EQ(got, want);
    CHECK(got < fixed);
}
#endif  // FP8RL_EMU

// Batch invariance past 512 tokens (issue 29): 3 completions of 520 tokens (2 samples of a prompt,
// 1 of another) are the same, bit for bit (tokens, both log-probs), decoded all at once or 2 at a time in a page
// pool too small for two (so requests wait, join at window edges beside others, are preempted and
// fed their kept tokens again; the two samples' prompt prefix is read once per group by cascade
// attention when they run together, and per row in a replay), and in emulation the CPU engine's
// (tokens and log-probs), in fp8 with an FP8 KV cache (the
// path with the most shape-dependent steps: KV quantization, FP8 GEMMs; bf16 past 512 tokens is
// held to the CPU engine by the greedy test below). The emulation's GEMMs round by their shapes (a
// split-K algorithm where the heuristic ranks one first), so a batch size that changed a row's
// algorithm would show.
TEST(rollout_batch_invariant_past_512_tokens) {
    REQUIRE_GPU();
    const std::string dir = long_context_model();
    std::vector<GenRequest> requests = long_requests(2);
    requests.pop_back();
    // under ASan 40 tokens in 9 pages (the same schedule: one preempted), the plain build past 512
    const int tokens = harness::sanitized ? 40 : 520, pages = harness::sanitized ? 9 : 72;
    const SamplingConfig s = long_sampling(tokens);
    for (Precision p : {Precision::FP8}) {
        EngineOptions all, tight;
        const size_t page = PagedKvCache::page_bytes({1, 2, 64, tight.kv_page_tokens, 1}, p);
        tight.kv_cache_mb = (pages * page + page / 2) / 1048576.0;  // pages of 16: 2.1 completions at full length
        GpuEngine a(dir, all), c(dir, tight);
        const std::vector<Generation> want = a.generate(requests, 3, s, p, p, nullptr);
        const std::vector<Generation> got = c.generate(requests, 3, s, p, p, nullptr);
        if (emulated) {  // and the CPU engine's, bit for bit (on a GPU the greedy test below allows near ties)
            const std::vector<Generation> cpu = CpuEngine(dir).generate(requests, 3, s, p, p, nullptr);
            for (size_t i = 0; i < requests.size(); i++)
                CHECK_MSG(cpu[i].tokens == want[i].tokens && cpu[i].logprobs == want[i].logprobs,
                          "%s request %zu: other tokens or log-probs than the CPU engine's", precision_name(p), i);
        }
        const RolloutStats st = c.rollout_stats();
        printf("    %s, %d tokens: %lld decode steps; in %d pages %lld, %lld preemptions, %lld kept tokens fed again\n",
               precision_name(p), tokens, (long long)a.rollout_stats().decode_steps, pages, (long long)st.decode_steps,
               (long long)st.preemptions, (long long)st.replayed_tokens);
        CHECK(st.preemptions > 0 && st.replayed_tokens > 0);
        CHECK(a.rollout_stats().cascade_rows > 0 && st.cascade_rows > 0);  // the two samples of prompt 0 cascaded
        for (size_t i = 0; i < requests.size(); i++) {
            CHECK_EQ(want[i].tokens.size(), (size_t)tokens);
            CHECK_MSG(got[i].tokens == want[i].tokens && got[i].logprobs == want[i].logprobs &&
                          got[i].logprobs_sampled == want[i].logprobs_sampled,
                      "%s request %zu: preempted, other tokens or log-probs than in a pool that holds them all",
                      precision_name(p), i);
        }
    }
}

// Greedy completions of 600 tokens (issue 29's length; two prompts) leave the CPU engine's only at
// near ties, as the test above checks at 12 tokens: in bf16 and, on a GPU, in fp8 with an FP8 KV
// cache (in emulation the batch-invariance test above holds fp8 + FP8 KV past 512 tokens to the CPU
// engine bit for bit). Skipped under ASan, which looks for memory errors: there the batch-invariance
// test decodes this model in fp8 and the near-ties test decodes greedily in bf16 and fp8 (9 s of CI
// for 40 greedy fp8 tokens here).
TEST(rollout_600_token_greedy_completions_match_cpu_engine_but_at_near_ties) {
    REQUIRE_GPU();
    if (harness::sanitized) SKIP("the plain build runs it; ASan decodes this model and greedily in the tests above");
    const std::vector<GenRequest> pairs = long_requests(2);
    std::vector<WeightsAndKv> precisions = {{Precision::BF16, Precision::BF16}};
    if (!emulated) precisions.push_back({Precision::FP8, Precision::FP8});
    int same = 0, total = 0;
    completions_match_cpu(long_context_model(), EngineOptions{}, precisions, same, total, {pairs[0], pairs[2]},
                          long_sampling(600), {0.0f});
    printf("    greedy completions equal to the CPU engine's: %d of %d\n", same, total);
    if (emulated) CHECK_EQ(same, total);
}

namespace {

long differing_bits(const TokenValues& a, const TokenValues& b) {
    if (a.size() != b.size()) return 1L << 30;
    long n = 0;
    for (size_t s = 0; s < a.size(); s++) {
        if (a[s].size() != b[s].size()) n += (long)std::max(a[s].size(), b[s].size());
        for (size_t t = 0; t < std::min(a[s].size(), b[s].size()); t++) n += memcmp(&a[s][t], &b[s][t], sizeof(float)) != 0;
    }
    return n;
}

}  // namespace

// --mismatch_report's teacher forcing (Engine::decode_logprobs, rollout.cu's forced_token_kernel at
// the sampler's temperature over the vocabulary limit) reproduces the GPU engine's own FP8 rollout
// (FP8 weights and KV cache) bit for bit, siblings of one prompt included, and keeps its KV scales;
// in emulation the GPU engine's decode path with either source switched to BF16 (the weights, the
// cache kept FP8 at the rollout's scales; the cache), and its prefill path (a forward reading K and
// V through E4M3 at those scales), equal the CPU engine's bit for bit.
TEST(rollout_decode_logprobs_match_cpu_engine) {
    REQUIRE_GPU();
    CpuEngine cpu(kFixtures[3]);
    GpuEngine gpu(kFixtures[3], small_pages(4));
    const int V = (int)cpu.config().vocab_size;
    std::vector<GenRequest> requests = ragged_requests(3, V, 21);
    requests.push_back({requests[1].prompt, 200});  // a sibling: the decode shares its prompt's pages
    SamplingConfig s;
    s.temperature = 0.8f;
    s.top_p = 0.9f;
    s.max_new_tokens = 5;
    s.seed = 4;
    s.vocab_limit = V - 5;
    const std::vector<Generation> gen = gpu.generate(requests, 2, s, Precision::FP8, Precision::FP8, nullptr);
    std::vector<Sequence> seqs;
    TokenValues rollout_lp;
    for (size_t i = 0; i < gen.size(); i++) {
        Sequence q{requests[i].prompt, (int32_t)requests[i].prompt.size()};
        q.ids.insert(q.ids.end(), gen[i].tokens.begin(), gen[i].tokens.end());
        seqs.push_back(q);
        rollout_lp.push_back(gen[i].logprobs);
    }
    RolloutNumerics own{Precision::FP8, Precision::FP8, {}, {}};
    gpu.last_kv_scales(&own.k_scale, &own.v_scale);
    CHECK_MSG(differing_bits(gpu.decode_logprobs(seqs, s, own), rollout_lp) == 0, "teacher forcing differs from the rollout");
    RolloutNumerics weights = own, cache = own;
    weights.weights = Precision::BF16;
    cache.kv_cache = Precision::BF16, cache.k_scale.clear(), cache.v_scale.clear();
    for (const RolloutNumerics* n : {&weights, &cache}) {
        const char* name = n == &weights ? "BF16 weights" : "BF16 cache";
        const TokenValues g = gpu.decode_logprobs(seqs, s, *n);
        CHECK_MSG(differing_bits(g, rollout_lp) > 0, "%s: the same log-probs as the FP8 rollout", name);
        if (emulated) CHECK_MSG(differing_bits(g, cpu.decode_logprobs(seqs, s, *n)) == 0, "%s: differs from the CPU engine", name);
    }
    std::vector<float> k, v;
    gpu.last_kv_scales(&k, &v);
    CHECK_MSG(k == own.k_scale && v == own.v_scale, "decode_logprobs changed the rollout's KV scales");
    const TokenValues gp = gpu.prefill_logprobs(seqs, s.temperature, own);
    CHECK(differing_bits(gp, rollout_lp) > 0);
    if (emulated) CHECK_MSG(differing_bits(gp, cpu.prefill_logprobs(seqs, s.temperature, own)) == 0, "prefill path differs from the CPU engine");
}

// Bad input: one clear error each, never a hang.
// --rollout_slots 0 (the default) in an engine no memory plan resolved it for: every request of the
// call in a slot when free memory holds them (the emulation's 141 GB), more than the old default 64.
TEST(rollout_slots_0_decodes_every_request_that_fits) {
    REQUIRE_GPU();
    GpuEngine gpu(kFixtures[0]);
    const std::vector<GenRequest> requests = ragged_requests(70, (int)gpu.config().vocab_size, 13);
    SamplingConfig s;
    s.max_new_tokens = 2;
    s.temperature = 0;
    gpu.generate(requests, 0, s, Precision::BF16, Precision::BF16, nullptr);
    CHECK_EQ(gpu.rollout_stats().max_running, 70);
}

TEST(rollout_bad_input_fails_clearly) {
    REQUIRE_GPU();
    const char* dir = kFixtures[0];  // 512 positions
    SamplingConfig s;
    s.max_new_tokens = 8;
    {
        GpuEngine gpu(dir);
        CHECK_THROWS(gpu.generate({{random_ids(513, 320, 1), 0}}, 0, s, Precision::BF16, Precision::BF16, nullptr),
                     "more than the model's 512 positions");
        SamplingConfig far = s;
        far.max_new_tokens = 600;
        CHECK_THROWS(gpu.generate({{random_ids(5, 320, 1), 0}}, 0, far, Precision::BF16, Precision::BF16, nullptr),
                     "lower --max_new_tokens");
        CHECK_THROWS(gpu.generate({{{}, 0}}, 0, s, Precision::BF16, Precision::BF16, nullptr), "prompt 0 is empty");
        CHECK_THROWS(gpu.generate({{{5, 320}, 0}}, 0, s, Precision::BF16, Precision::BF16, nullptr), "outside the vocabulary");
        CHECK_THROWS(gpu.generate({{{5}, 0}}, 0, s, Precision::BF16, Precision::FP32, nullptr), "not fp32");
    }
    {
        EngineOptions o;
        o.kv_cache_mb = 0.001;  // 1 KiB: not one page of 16 tokens
        GpuEngine gpu(dir, o);
        CHECK_THROWS(gpu.generate({{{5, 6}, 0}}, 0, s, Precision::BF16, Precision::BF16, nullptr), "raise --kv_cache_mb");
    }
    {
        EngineOptions o;
        o.kv_cache_mb = 1e6;  // a terabyte: more than the device has
        GpuEngine gpu(dir, o);
        CHECK_THROWS(gpu.generate({{{5, 6}, 0}}, 0, s, Precision::BF16, Precision::BF16, nullptr), "out of GPU memory");
    }
}
