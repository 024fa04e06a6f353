// Tests of generation (cpu/generate.h): greedy output equals HF generate token for token, decoding
// with the KV cache equals the full forward pass, samples do not depend on batch composition or
// thread count, stopping on eos, and the bf16 / fp8 caches (their scales reduced over ranks too).
#include <omp.h>

#include <cmath>
#include <string>
#include <vector>

#include "cpu/generate.h"
#include "test/harness.h"
#include "test/model_test_util.h"

using namespace fp8rl;
using namespace model_test;

namespace {

void check_greedy_against_hf(const std::string& name) {
    ModelWeights w = ModelWeights::load("test/fixtures/models/" + name);
    Fixture f("test/fixtures/model/" + name + ".safetensors");
    CpuModel m(w);
    ModelParams p;
    p.prepare(m, Precision::FP32);
    std::vector<std::vector<int32_t>> prompts = {f.ints("gen.prompt.0"), f.ints("gen.prompt.1")};
    GenerateOptions o;
    o.sampling.temperature = 0.0f;
    o.max_new_tokens = 12;  // dev/make_model_fixtures.py GEN_TOKENS
    o.eos_ids = w.config.eos_token_ids;
    Generator gen;
    std::vector<Completion> out = gen.generate(m, p, prompts, o);
    for (int i = 0; i < 2; i++) {
        std::vector<int32_t> ref = f.ints("gen.tokens." + std::to_string(i));
        CHECK_MSG(out[i].tokens == ref, "%s prompt %d: %zu tokens generated, HF %zu", name.c_str(), i, out[i].tokens.size(),
                  ref.size());
    }
}

struct Setup {
    ModelWeights w;
    CpuModel m;
    explicit Setup(const std::string& name) : w(ModelWeights::load("test/fixtures/models/" + name)), m(w) {}
};

std::vector<std::vector<int32_t>> some_prompts() { return {{5, 6, 7, 8, 9}, {100}, {250, 3, 77}}; }

// Each prompt followed by its completion, packed: what the trainer scores after a rollout.
TokenBatch prompts_with_completions(const std::vector<std::vector<int32_t>>& prompts, const std::vector<Completion>& out) {
    TokenBatch batch;
    for (size_t i = 0; i < prompts.size(); i++) {
        std::vector<int32_t> seq = prompts[i];
        seq.insert(seq.end(), out[i].tokens.begin(), out[i].tokens.end());
        batch.add(seq);
    }
    return batch;
}

}  // namespace

TEST(generate_greedy_matches_hf_qwen3) { check_greedy_against_hf("qwen3_tiny"); }
TEST(generate_greedy_matches_hf_qwen2) { check_greedy_against_hf("qwen2_tiny"); }
TEST(generate_greedy_matches_hf_llama3) { check_greedy_against_hf("llama_tiny"); }
TEST(generate_greedy_matches_hf_gqa3) { check_greedy_against_hf("qwen3_gqa3_tiny"); }
TEST(generate_greedy_matches_hf_vocab_over_100k) { check_greedy_against_hf("qwen3_bigvocab_tiny"); }

// Every sampled token's log-prob (at the sampling temperature) equals what a full forward pass over
// prompt + completion computes for it: fp32 with an fp32 cache, and bf16 with a bf16 cache (the
// forward pass stores K and V in BF16 too, so the cache adds no rounding). The first token comes from
// the prefill, whose attention is the training forward's: equal to FP32 rounding in both precisions.
// A decode step's attention keeps P in FP32 where the training forward rounds it to BF16 (the GPU
// kernels' difference, cpu/attention.h), so in bf16 the later tokens agree to that rounding: one
// BF16 rounding (2^-9 relative) of every attention weight moves a log-prob by far less than 0.01.
TEST(generate_decode_matches_full_forward) {
    Setup s("qwen3_gqa3_tiny");
    for (Precision pr : {Precision::FP32, Precision::BF16}) {
        ModelParams p;
        p.prepare(s.m, pr);
        GenerateOptions o;
        o.sampling.temperature = 0.8f;
        o.max_new_tokens = 9;
        o.seed = 7;
        o.kv_cache = pr;
        std::vector<std::vector<int32_t>> prompts = some_prompts();
        Generator gen;
        std::vector<Completion> out = gen.generate(s.m, p, prompts, o);
        TokenBatch batch = prompts_with_completions(prompts, out);
        ForwardActs acts;
        std::vector<float> lp(batch.num_tokens()), ent(batch.num_tokens());
        model_forward(s.m, p, batch, 0.8f, acts, lp.data(), ent.data(), false);
        for (size_t i = 0; i < prompts.size(); i++) {
            CHECK_EQ((int)out[i].tokens.size(), 9);
            for (size_t j = 0; j < out[i].tokens.size(); j++) {
                float full = lp[batch.offsets[i] + prompts[i].size() + j];
                const bool decoded_bf16 = j > 0 && pr == Precision::BF16;
                CHECK_NEAR(out[i].logprobs_full[j], full, decoded_bf16 ? 0.0 : 1e-5, decoded_bf16 ? 1e-2 : 2e-6);
                CHECK_EQ(out[i].logprobs[j], out[i].logprobs_full[j]);  // no top-k/top-p: the same distribution
            }
        }
    }
}

// Teacher forcing (GenerateOptions::forced) runs the generator's own computation: forcing a sampled
// completion returns its tokens and log-probs bit for bit, each token inside its draw (offset <= 0);
// forcing another token at one position gives that token a positive offset there (the CPU would not
// have drawn it) and scores the rest after it. Greedy and sampled, bf16 and fp8 with an FP8 cache.
TEST(generate_teacher_forcing_replays_and_scores) {
    Setup s("qwen3_gqa3_tiny");
    for (Precision pr : {Precision::BF16, Precision::FP8})
        for (float temperature : {0.0f, 0.9f}) {
            ModelParams p;
            p.prepare(s.m, pr);
            GenerateOptions o;
            o.sampling.temperature = temperature;
            o.max_new_tokens = 8;
            o.seed = 3;
            o.kv_cache = pr;
            if (pr == Precision::FP8) o.kv_k_scale = o.kv_v_scale = std::vector<float>((size_t)s.m.L, 0.01f);
            const std::vector<std::vector<int32_t>> prompts = some_prompts();
            Generator gen;
            const std::vector<Completion> out = gen.generate(s.m, p, prompts, o);
            std::vector<std::vector<int32_t>> forced;
            for (const Completion& c : out) forced.push_back(c.tokens);
            forced[1][2] = (forced[1][2] + 1) % s.m.V;  // another token at position 2 of prompt 1
            o.forced = &forced;
            const std::vector<Completion> replay = gen.generate(s.m, p, prompts, o);
            for (size_t i = 0; i < prompts.size(); i++) {
                CHECK(replay[i].tokens == forced[i]);
                const size_t same = i == 1 ? 2 : out[i].tokens.size();  // positions with the sampled prefix
                for (size_t k = 0; k < same; k++) {
                    CHECK_EQ(replay[i].logprobs_full[k], out[i].logprobs_full[k]);
                    CHECK(replay[i].sample_offsets[k] <= 0.0f);
                }
            }
            CHECK(replay[1].sample_offsets[2] > 0.0f);
            CHECK_EQ(replay[1].sample_offsets.size(), forced[1].size());
        }
}

// A sequence's samples depend only on (seed, step, sequence key, position): the same with other
// prompts in the batch, and with 1 or 2 threads.
TEST(generate_batch_and_thread_invariant) {
    Setup s("llama_tiny");
    ModelParams p;
    p.prepare(s.m, Precision::BF16);
    GenerateOptions o;
    o.sampling = {0.9f, 20, 0.9f};
    o.max_new_tokens = 10;
    o.seed = 99;
    o.step = 3;
    o.kv_cache = Precision::BF16;
    Generator gen;
    omp_set_num_threads(2);
    std::vector<Completion> all = gen.generate(s.m, p, some_prompts(), o);
    omp_set_num_threads(1);
    GenerateOptions one = o;
    one.sequence_keys = {2};
    std::vector<Completion> alone = gen.generate(s.m, p, {some_prompts()[2]}, one);
    omp_set_num_threads(2);
    CHECK(alone[0].tokens == all[2].tokens);
    CHECK(alone[0].logprobs == all[2].logprobs);
    CHECK(alone[0].logprobs_full == all[2].logprobs_full);
    // top-k/top-p renormalize: the drawn distribution's log-prob is at least the full one
    for (size_t j = 0; j < all[2].tokens.size(); j++) CHECK(all[2].logprobs[j] >= all[2].logprobs_full[j] - 1e-6f);
    GenerateOptions other = o;
    other.seed = 100;
    CHECK(gen.generate(s.m, p, some_prompts(), other)[2].tokens != all[2].tokens);
}

TEST(generate_stops_on_eos_and_budget) {
    Setup s("llama_tiny");
    ModelParams p;
    p.prepare(s.m, Precision::FP32);
    GenerateOptions o;
    o.sampling.temperature = 0.0f;
    o.max_new_tokens = 8;
    Generator gen;
    std::vector<Completion> free_run = gen.generate(s.m, p, some_prompts(), o);
    for (const Completion& c : free_run) CHECK_EQ((int)c.tokens.size(), 8);
    o.eos_ids = {free_run[0].tokens[2]};
    std::vector<Completion> out = gen.generate(s.m, p, some_prompts(), o);
    CHECK(out[0].stopped_on_eos);
    CHECK(out[0].tokens.size() <= 3);
    CHECK(out[0].tokens.back() == free_run[0].tokens[2]);
    CHECK(std::vector<int32_t>(free_run[0].tokens.begin(), free_run[0].tokens.begin() + out[0].tokens.size()) == out[0].tokens);
}

// The FP8 cache (scales from a calibration forward pass over the prompts) changes the log-probs a
// little and only a little: against a bf16 full forward over the same tokens, E4M3's 2^-4 relative
// step on K and V moves attention scores by a few percent of their spread, so <= 0.05 nats; and
// not at all would mean the cache is not quantizing. With one scale per layer and with one per KV
// head (--kv_scales head), each scale 1.05 amax / 448 of the values it covers, the amax taken here
// from the calibration forward's K and V directly.
TEST(generate_fp8_kv_cache) {
    Setup s("qwen2_tiny");
    ModelParams p;
    p.prepare(s.m, Precision::BF16);
    std::vector<std::vector<int32_t>> prompts = some_prompts();
    TokenBatch calib;
    for (const auto& pr : prompts) calib.add(pr);
    for (const bool per_head : {false, true}) {
        ForwardActs acts;
        std::vector<float> lp(calib.num_tokens()), ent(calib.num_tokens());
        model_forward(s.m, p, calib, 1.0f, acts, lp.data(), ent.data(), /*for_backward=*/true);  // keeps every layer's K, V
        GenerateOptions o;
        o.sampling.temperature = 1.0f;
        o.max_new_tokens = 10;
        o.kv_cache = Precision::FP8;
        kv_scales_from_forward(acts, s.m.KV, per_head, o.kv_k_scale, o.kv_v_scale);
        const int groups = per_head ? s.m.KV : 1;
        CHECK_EQ(o.kv_k_scale.size(), (size_t)s.m.L * groups);
        for (int l = 0; l < s.m.L && o.kv_k_scale.size() == (size_t)s.m.L * groups; l++)
            for (int g = 0; g < groups; g++) {
                float k_amax = 0.0f, v_amax = 0.0f;
                const LayerActs& A = acts.layer(l);
                for (long t = 0; t < calib.num_tokens(); t++)
                    for (int h = 0; h < s.m.KV; h++)
                        for (int d = 0; d < s.m.D && (!per_head || h == g); d++) {
                            k_amax = std::fmax(k_amax, std::fabs(A.k[(t * s.m.KV + h) * s.m.D + d]));
                            v_amax = std::fmax(v_amax, std::fabs(A.v[(t * s.m.KV + h) * s.m.D + d]));
                        }
                CHECK_EQ(o.kv_k_scale[(size_t)l * groups + g], 1.05f * k_amax / 448.0f);
                CHECK_EQ(o.kv_v_scale[(size_t)l * groups + g], 1.05f * v_amax / 448.0f);
            }
        Generator gen;
        std::vector<Completion> out = gen.generate(s.m, p, prompts, o);
        TokenBatch batch = prompts_with_completions(prompts, out);
        lp.resize(batch.num_tokens()), ent.resize(batch.num_tokens());
        model_forward(s.m, p, batch, 1.0f, acts, lp.data(), ent.data(), false);
        double worst = 0.0;
        for (size_t i = 0; i < prompts.size(); i++)
            for (size_t j = 0; j < out[i].tokens.size(); j++)
                worst = std::fmax(worst, std::fabs(out[i].logprobs_full[j] - lp[batch.offsets[i] + prompts[i].size() + j]));
        CHECK_MSG(worst > 0.0 && worst <= 0.05, "fp8 cache (scales per %s) moved log-probs by %.4g",
                  per_head ? "KV head" : "layer", worst);
    }
}

// Data-parallel calibration (rl/numerics/kv_scales.h): forwards over two parts of the prompts, one
// part's amaxes reduced with the other's by the max (what two ranks do), give bit for bit the scales
// of one forward over all of them: each row's K and V do not depend on the other rows (in bf16 and in
// fp8, whose activation groups are 1x128 along a row), and the max is exact. Per layer and per KV
// head; the first part alone gives other scales, so the reduction is seen.
TEST(generate_fp8_kv_scales_reduced_over_parts_equal_whole) {
    Setup s("qwen2_tiny");
    const std::vector<std::vector<int32_t>> prompts = some_prompts();
    for (const Precision pr : {Precision::BF16, Precision::FP8}) {
        ModelParams p;
        p.prepare(s.m, pr);
        auto forward = [&](size_t begin, size_t end, ForwardActs& acts) {
            TokenBatch b;
            for (size_t i = begin; i < end; i++) b.add(prompts[i]);
            std::vector<float> lp(b.num_tokens()), ent(b.num_tokens());
            model_forward(s.m, p, b, 1.0f, acts, lp.data(), ent.data(), false);
        };
        ForwardActs all, first, second;
        forward(0, prompts.size(), all), forward(0, 1, first), forward(1, prompts.size(), second);
        for (const bool per_head : {false, true}) {
            std::vector<float> k, v, k1, v1, k2, v2, other;
            kv_scales_from_forward(all, s.m.KV, per_head, k, v);
            kv_scales_from_forward(second, s.m.KV, per_head, k2, v2, [&](std::vector<float>& a) { other = a; });
            int calls = 0;
            kv_scales_from_forward(first, s.m.KV, per_head, k1, v1, [&](std::vector<float>& a) {
                calls++;
                CHECK_EQ(a.size(), other.size());
                for (size_t i = 0; i < a.size() && i < other.size(); i++) a[i] = std::max(a[i], other[i]);
            });
            CHECK_EQ(calls, 1);
            CHECK_MSG(k1 == k && v1 == v, "%s, per %s: reduced scales differ from the whole's", precision_name(pr),
                      per_head ? "KV head" : "layer");
            std::vector<float> k_alone, v_alone;
            kv_scales_from_forward(first, s.m.KV, per_head, k_alone, v_alone);
            CHECK(k_alone != k || v_alone != v);
        }
    }
}

TEST(generate_rejects_bad_input) {
    Setup s("qwen3_tiny");
    ModelParams p;
    p.prepare(s.m, Precision::FP32);
    GenerateOptions o;
    Generator gen;
    CHECK_THROWS(gen.generate(s.m, p, {{1, 2}, {}}, o), "prompt 1 is empty");
    CHECK_THROWS(gen.generate(s.m, p, {{1, 400}}, o), "outside the vocabulary");
    o.kv_cache = Precision::FP8;
    CHECK_THROWS(gen.generate(s.m, p, {{1, 2}}, o), "scales");
}
