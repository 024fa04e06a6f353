// Tests of the CPU model (cpu/model.h) against HF transformers: logits, log-probs, entropy and every
// parameter's gradient in FP32 (fixtures from dev/make_model_fixtures.py on the checkpoints of
// dev/make_tiny_models.py), plus properties: finite differences, thread-count and batch invariance,
// and the bounds of the bf16 and fp8 modes against fp32.
#include <omp.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/model.h"
#include "rl/io/safetensors.h"
#include "test/harness.h"
#include "test/model_test_util.h"

using namespace fp8rl;
using namespace model_test;

namespace {

// Logits within 1e-5 relative; atol 1e-5 x the largest |logit| of the row for near-zero entries.
void check_logits(const CpuModel& m, const ModelParams& p, ForwardActs& acts, const Fixture& f) {
    std::vector<float> ref = f.get("logits");
    std::vector<float> cols = f.has("logit_cols") ? f.get("logit_cols") : std::vector<float>();
    const long T = acts.T;
    const long n = (long)ref.size() / T;
    std::vector<float> z((size_t)T * m.V);
    head_logits_chunk(z.data(), acts.xf, T, p.at(m.lm_head), 0, m.V, {m.V, m.C, 1.0f});
    double worst = 0.0;
    for (long t = 0; t < T; t++) {
        float scale = 0.0f;
        for (long j = 0; j < n; j++) scale = std::fmax(scale, std::fabs(ref[t * n + j]));
        for (long j = 0; j < n; j++) {
            long col = cols.empty() ? j : (long)cols[j];
            float ours = z[t * m.V + col], theirs = ref[t * n + j];
            CHECK_NEAR(ours, theirs, 1e-5, 1e-5 * scale);
            worst = std::fmax(worst, std::fabs(ours - theirs) / scale);
        }
    }
    CHECK(worst < 1e-5);
}

void check_model_against_hf(const std::string& name) {
    ModelWeights w = ModelWeights::load("test/fixtures/models/" + name);
    Fixture f("test/fixtures/model/" + name + ".safetensors");
    CpuModel m(w);
    ModelParams p;
    p.prepare(m, Precision::FP32);
    TokenBatch batch = f.batch();
    const long T = batch.num_tokens();
    ForwardActs acts;
    std::vector<float> lp(T), ent(T);

    model_forward(m, p, batch, 1.0f, acts, lp.data(), ent.data());
    check_logits(m, p, acts, f);
    std::vector<float> ref_lp = f.get("logprobs"), ref_ent = f.get("entropy");
    for (long t = 0; t < T; t++) {
        CHECK_NEAR(lp[t], ref_lp[t], 1e-5, 1e-6);
        CHECK_NEAR(ent[t], ref_ent[t], 1e-5, 1e-6);
    }

    // The scalar loss sum_t a_t logprob_t + b_t entropy_t at temperature tau, and its gradient.
    const float tau = f.get("temperature")[0];
    model_forward(m, p, batch, tau, acts, lp.data(), ent.data());
    std::vector<float> ref_lpt = f.get("logprobs_t"), ref_entt = f.get("entropy_t");
    for (long t = 0; t < T; t++) {
        CHECK_NEAR(lp[t], ref_lpt[t], 1e-5, 1e-6);
        CHECK_NEAR(ent[t], ref_entt[t], 1e-5, 1e-6);
    }
    std::vector<float> a = f.get("loss_a"), b = f.get("loss_b"), grad(m.num_floats(), 0.0f);
    model_backward(m, p, acts, a.data(), b.data(), grad.data());
    int checked = 0;
    for (const TensorInfo& t : w.tensors) {
        std::vector<float> ref = f.get("grad." + t.name);
        const size_t n = t.numel, k = ref.size();
        float scale = 0.0f;
        for (float g : ref) scale = std::fmax(scale, std::fabs(g));
        for (size_t i = 0; i < k; i++) {
            size_t idx = n <= kGradSamples ? i : (i * n) / kGradSamples;
            float ours = grad[t.offset + idx];
            if (!harness::close(ours, ref[i], 1e-4, 1e-5 * scale))
                CHECK_MSG(false, "%s: grad[%zu] = %.9g, HF %.9g", t.name.c_str(), idx, ours, ref[i]);
        }
        checked++;
    }
    CHECK_EQ(checked, (int)w.tensors.size());
}

}  // namespace

TEST(model_matches_hf_qwen3) { check_model_against_hf("qwen3_tiny"); }
TEST(model_matches_hf_qwen2_biases) { check_model_against_hf("qwen2_tiny"); }
TEST(model_matches_hf_llama3_rope_untied) { check_model_against_hf("llama_tiny"); }
TEST(model_matches_hf_qwen3_gqa3_untied) { check_model_against_hf("qwen3_gqa3_tiny"); }
TEST(model_matches_hf_vocab_over_100k) { check_model_against_hf("qwen3_bigvocab_tiny"); }

// Central finite differences of L = sum a_t logprob_t + b_t entropy_t on a few parameters of every
// tensor kind, in FP32: the analytic gradient must agree to 2% where it is well above FD noise.
TEST(model_finite_differences) {
    ModelWeights w = ModelWeights::load("test/fixtures/models/qwen2_tiny");
    CpuModel m(w);
    ModelParams p;
    p.prepare(m, Precision::FP32);
    TokenBatch batch;
    batch.add({5, 17, 99, 3, 250, 41});
    batch.add({8, 8, 300});
    const long T = batch.num_tokens();
    std::vector<float> a(T), b(T), lp(T), ent(T), grad(m.num_floats(), 0.0f);
    for (long t = 0; t < T; t++) a[t] = 0.5f + 0.1f * (float)t, b[t] = 0.3f - 0.05f * (float)t;
    ForwardActs acts;
    auto loss = [&]() {
        p.prepare(m, Precision::FP32);
        model_forward(m, p, batch, 0.9f, acts, lp.data(), ent.data(), false);
        double L = 0.0;
        for (long t = 0; t < T; t++) L += (double)a[t] * lp[t] + (double)b[t] * ent[t];
        return L;
    };
    model_forward(m, p, batch, 0.9f, acts, lp.data(), ent.data());
    model_backward(m, p, acts, a.data(), b.data(), grad.data());
    int compared = 0;
    for (const TensorInfo& t : w.tensors) {
        // the element with the largest gradient of the tensor: its FD estimate is least noisy
        size_t best = 0;
        for (size_t i = 1; i < t.numel; i++)
            if (std::fabs(grad[t.offset + i]) > std::fabs(grad[t.offset + best])) best = i;
        float* x = w.master.data() + t.offset + best;
        const float x0 = *x, h = 1e-2f * std::fmax(1.0f, std::fabs(x0));
        *x = x0 + h;
        double up = loss();
        *x = x0 - h;
        double down = loss();
        *x = x0;
        double fd = (up - down) / (2.0 * (double)h), g = grad[t.offset + best];
        if (std::fabs(g) < 1e-3) continue;  // FP32 loss noise (~1e-6) / h would dominate
        CHECK_MSG(harness::close(g, fd, 2e-2, 1e-4), "%s[%zu]: analytic %.6g, finite difference %.6g", t.name.c_str(), best,
                  g, fd);
        compared++;
    }
    CHECK(compared >= (int)w.tensors.size() - 2);
}

// Forward + backward give bitwise the same results with 1 and 2 threads, in every precision.
// Runs 0 and 1: 1 and 2 threads. Run 2: 2 threads with the head's logits recomputed in the
// backward instead of kept from the forward (the path of batches over the saved-logits budget).
TEST(model_threads_bitwise_identical) {
    ModelWeights w = ModelWeights::load("test/fixtures/models/qwen3_gqa3_tiny");
    CpuModel m(w);
    TokenBatch batch;
    batch.add({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13});
    batch.add({200, 100, 50});
    const long T = batch.num_tokens();
    std::vector<float> a(T, 1.0f), b(T, -0.5f);
    for (Precision pr : {Precision::FP32, Precision::BF16, Precision::FP8}) {
        std::vector<float> lp[3], ent[3], grad[3];
        for (int run = 0; run < 3; run++) {
            omp_set_num_threads(run == 0 ? 1 : 2);
            ModelParams p;
            p.prepare(m, pr);
            ForwardActs acts;
            if (run == 2) acts.head.max_saved_bytes = 0;
            lp[run].resize(T), ent[run].resize(T), grad[run].assign(m.num_floats(), 0.0f);
            model_forward(m, p, batch, 0.7f, acts, lp[run].data(), ent[run].data());
            CHECK_EQ(acts.head.saved_rows, run == 2 ? 0L : T);
            model_backward(m, p, acts, a.data(), b.data(), grad[run].data());
        }
        omp_set_num_threads(2);
        for (int run = 1; run < 3; run++) {
            CHECK(lp[0] == lp[run]);
            CHECK(ent[0] == ent[run]);
            CHECK(grad[0] == grad[run]);
        }
    }
}

// bf16 and fp8 stay within bounds of fp32, and fp8 is visibly coarser than bf16 (so its GEMMs do
// run in FP8). Bounds: BF16 keeps 8 significant bits (unit roundoff u = 2^-9); a logit is a sum of
// rounded products after ~10 rounded kernels, so its error is a few u times the logit scale (~1
// here): |dlogprob| <= 0.01 nats, gradient relative L2 error <= 0.02. E4M3 keeps 4 bits (u = 2^-4)
// on each GEMM operand; the errors of the K products partly cancel (~u/sqrt(3) per output), so
// |dlogprob| <= 0.06 nats and gradient relative error <= 0.15. Measured (2 models x 57 tokens):
// bf16 <= 0.004 nats and 0.010; fp8 <= 0.025 nats and 0.077.
TEST(model_reduced_precision_bounds) {
    for (const char* name : {"qwen3_tiny", "llama_tiny"}) {
        ModelWeights w = ModelWeights::load(std::string("test/fixtures/models/") + name);
        CpuModel m(w);
        TokenBatch batch;
        std::vector<int32_t> s1, s2;
        for (int i = 0; i < 40; i++) s1.push_back((i * 37 + 11) % 320);
        for (int i = 0; i < 17; i++) s2.push_back((i * 91 + 5) % 320);
        batch.add(s1);
        batch.add(s2);
        const long T = batch.num_tokens();
        std::vector<float> a(T), b(T);
        for (long t = 0; t < T; t++) a[t] = std::sin((float)t), b[t] = 0.3f * std::cos((float)t);
        std::vector<float> lp[3], ent[3], grad[3];
        for (int i = 0; i < 3; i++) {
            ModelParams p;
            p.prepare(m, (Precision)i);
            ForwardActs acts;
            lp[i].resize(T), ent[i].resize(T), grad[i].assign(m.num_floats(), 0.0f);
            model_forward(m, p, batch, 1.0f, acts, lp[i].data(), ent[i].data());
            model_backward(m, p, acts, a.data(), b.data(), grad[i].data());
            // deterministic: a second run gives the same bits
            std::vector<float> lp2(T), ent2(T);
            model_forward(m, p, batch, 1.0f, acts, lp2.data(), ent2.data(), false);
            CHECK(lp2 == lp[i]);
        }
        double dlp[3] = {}, gerr[3] = {};
        for (int i = 1; i < 3; i++) {
            double num = 0.0, den = 0.0;
            for (long t = 0; t < T; t++) dlp[i] = std::fmax(dlp[i], std::fabs(lp[i][t] - lp[0][t]));
            for (size_t k = 0; k < grad[0].size(); k++) {
                num += std::pow((double)grad[i][k] - grad[0][k], 2);
                den += std::pow((double)grad[0][k], 2);
            }
            gerr[i] = std::sqrt(num / den);
        }
        CHECK_MSG(dlp[1] <= 0.01 && gerr[1] <= 0.02, "%s bf16: |dlogprob| %.4f, grad error %.4f", name, dlp[1], gerr[1]);
        CHECK_MSG(dlp[2] <= 0.06 && gerr[2] <= 0.15, "%s fp8: |dlogprob| %.4f, grad error %.4f", name, dlp[2], gerr[2]);
        CHECK_MSG(dlp[2] > dlp[1] && gerr[2] > 2 * gerr[1], "%s: fp8 (%.4f, %.4f) not coarser than bf16 (%.4f, %.4f)", name,
                  dlp[2], gerr[2], dlp[1], gerr[1]);
    }
}

// A sequence's log-probs do not depend on what else is in the batch (the GEMMs reduce every
// output in one fixed order), so old and new log-probs of the trainer agree exactly.
TEST(model_batch_invariant) {
    ModelWeights w = ModelWeights::load("test/fixtures/models/llama_tiny");
    CpuModel m(w);
    ModelParams p;
    p.prepare(m, Precision::FP32);
    std::vector<int32_t> seq = {3, 14, 15, 92, 65, 35, 89, 79};
    TokenBatch alone, mixed;
    alone.add(seq);
    mixed.add({7, 7, 7, 7});
    mixed.add(seq);
    mixed.add({1, 2});
    ForwardActs acts;
    std::vector<float> lp1(alone.num_tokens()), e1(alone.num_tokens()), lp2(mixed.num_tokens()), e2(mixed.num_tokens());
    model_forward(m, p, alone, 1.0f, acts, lp1.data(), e1.data(), false);
    model_forward(m, p, mixed, 1.0f, acts, lp2.data(), e2.data(), false);
    for (size_t i = 0; i < seq.size(); i++) {
        CHECK_EQ(lp1[i], lp2[4 + i]);
        CHECK_EQ(e1[i], e2[4 + i]);
    }
}

TEST(model_rejects_bad_batches) {
    ModelWeights w = ModelWeights::load("test/fixtures/models/qwen3_tiny");
    CpuModel m(w);
    ModelParams p;
    p.prepare(m, Precision::FP32);
    ForwardActs acts;
    std::vector<float> lp(4), ent(4);
    TokenBatch bad;
    bad.add({1, 2, 320});
    CHECK_THROWS(model_forward(m, p, bad, 1.0f, acts, lp.data(), ent.data()), "outside the vocabulary");
    TokenBatch empty;
    empty.add({1});
    empty.add({});
    CHECK_THROWS(model_forward(m, p, empty, 1.0f, acts, lp.data(), ent.data()), "sequence 1 is empty");
    TokenBatch ok;
    ok.add({1, 2});
    CHECK_THROWS(model_forward(m, p, ok, 0.0f, acts, lp.data(), ent.data()), "temperature");
}

// SwiGLU's AVX2 loops compute the scalar formula's bits at every position (vector body or tail, any
// row length), and stay within float rounding of the double-precision function. Rows of the fused
// [gate|up] output: g = gu[t][0, I), u = gu[t][I, 2I).
TEST(model_swiglu_vector_equals_scalar) {
    const long T = 3;
    const int I = 1367;  // vector body and a tail per row
    const long n = T * I;
    std::vector<float> gu(2 * n), da(n), a(n), dgu(2 * n);
    auto g = [&](long i) -> float& { return gu[(i / I) * 2 * I + i % I]; };
    auto u = [&](long i) -> float& { return gu[(i / I) * 2 * I + I + i % I]; };
    for (long i = 0; i < n; i++) {
        g(i) = 12.0f * std::sin(0.61f * (float)i);  // covers both tails of the sigmoid
        u(i) = std::cos(0.23f * (float)i);
        da[i] = std::sin(0.11f * (float)i + 1.0f);
    }
    g(5) = -100.0f;  // exp(-g) overflows: silu -> -0
    g(6) = 100.0f;
    swiglu_forward(a.data(), gu.data(), T, I, false);
    swiglu_backward(dgu.data(), da.data(), gu.data(), T, I);
    long differ = 0;
    double worst = 0.0;
    for (long i = 0; i < n; i++) {
        const float gi = g(i), ui = u(i);
        const float dg = dgu[(i / I) * 2 * I + i % I], du = dgu[(i / I) * 2 * I + I + i % I];
        const float want = gi / (1.0f + fast_exp(-gi)) * ui;
        const float sig = 1.0f / (1.0f + fast_exp(-gi));
        const float want_dg = da[i] * ui * sig * (1.0f + gi * (1.0f - sig)), want_du = da[i] * gi * sig;
        differ += std::memcmp(&want, &a[i], 4) != 0 || std::memcmp(&want_dg, &dg, 4) != 0 ||
                  std::memcmp(&want_du, &du, 4) != 0;
        const double s = 1.0 / (1.0 + std::exp(-(double)gi));
        const double ref = (double)gi * s * ui;
        worst = std::fmax(worst, std::fabs(a[i] - ref) / std::fmax(std::fabs(ref), 1e-30));
    }
    CHECK_MSG(differ == 0, "%ld positions differ from the scalar formula", differ);
    CHECK_MSG(worst < 1e-6, "worst relative error against double %.3g", worst);
}
