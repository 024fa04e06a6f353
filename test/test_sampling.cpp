// Tests of rl/numerics/sampling.h: picks and log-probs against HF transformers' warpers + inverse CDF
// (dev/make_sampling_fixtures.py), and the documented tie-breaking and edge rules.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <vector>

#include "rl/io/json.h"
#include "rl/numerics/rng.h"
#include "rl/numerics/sampling.h"
#include "test/harness.h"

using namespace fp8rl;

static SampledToken sample(const std::vector<float>& logits, SamplingParams p, float u) {
    std::vector<float> scratch(logits.size());
    return sample_token(logits.data(), (int)logits.size(), p, u, scratch.data());
}

TEST(sampling_matches_hf_warpers) {
    std::istringstream lines(read_file("test/fixtures/sampling/cases.jsonl"));
    std::string line;
    int cases = 0, draws = 0;
    while (std::getline(lines, line)) {
        Json c = json_parse(line, "cases.jsonl");
        std::vector<float> logits;
        for (const Json& x : c.find("logits")->items) logits.push_back((float)x.number);
        SamplingParams p;
        p.temperature = (float)c.find("temperature")->number;
        p.top_k = (int)c.find("top_k")->integer;
        p.top_p = (float)c.find("top_p")->number;
        for (const Json& d : c.find("draws")->items) {
            SampledToken t = sample(logits, p, (float)d.find("u")->number);
            CHECK_MSG(t.token == d.find("token")->integer, "case %d (n=%zu T=%g k=%d p=%g) u=%g: token %d vs %lld",
                      cases, logits.size(), p.temperature, p.top_k, p.top_p, d.find("u")->number, t.token,
                      (long long)d.find("token")->integer);
            CHECK_NEAR(t.logprob, d.find("logprob")->number, 1e-5, 2e-6);
            CHECK_NEAR(t.logprob_full, d.find("logprob_full")->number, 1e-5, 2e-6);
            draws++;
        }
        cases++;
    }
    CHECK(cases >= 100);
    CHECK(draws >= 500);
}

// sample_offset, the departure test's distance, on the HF cases: greedy, the logit gap to the argmax;
// sampled, 0 or less for the drawn token, and for every other kept token (probability >= 1e-3) a
// uniform moved past the offset toward it draws it; +inf for a cut token (never drawn). Each token's
// offset costs a pass over the vocabulary (cases of up to 2,000 tokens); under the sanitizer every
// 5th token of each case is checked (9 s of CI there for all of them).
TEST(sampling_offset_is_the_distance_to_a_draw) {
    const int stride = harness::sanitized ? 5 : 1;
    std::istringstream lines(read_file("test/fixtures/sampling/cases.jsonl"));
    std::string line;
    int checked = 0;
    while (std::getline(lines, line)) {
        Json c = json_parse(line, "cases.jsonl");
        std::vector<float> logits;
        for (const Json& x : c.find("logits")->items) logits.push_back((float)x.number);
        const int n = (int)logits.size();
        SamplingParams p;
        p.temperature = (float)c.find("temperature")->number;
        p.top_k = (int)c.find("top_k")->integer;
        p.top_p = (float)c.find("top_p")->number;
        std::vector<float> scratch(logits.size());
        const float u = (float)c.find("draws")->items[0].find("u")->number;
        const SampledToken drawn = sample(logits, p, u);
        if (p.temperature == 0.0f) {
            float best = -INFINITY;
            for (float z : logits) best = std::max(best, z);
            for (int t = 0; t < n; t += stride) CHECK_EQ(sample_offset(logits.data(), n, p, u, t, scratch.data()), best - logits[t]);
            continue;
        }
        CHECK(sample_offset(logits.data(), n, p, u, drawn.token, scratch.data()) <= 0.0f);
        std::vector<float> kept_p(logits.size());  // each token's kept probability
        double kept, z_all;
        kept_distribution(logits.data(), n, p, kept_p.data(), &kept, &z_all);
        for (int t = 0; t < n; t += stride) {
            const float offset = sample_offset(logits.data(), n, p, u, t, scratch.data());
            CHECK_EQ(std::isinf(offset), kept_p[t] == 0.0f);
            if (t == drawn.token || kept_p[t] < 1e-3 * kept) continue;
            CHECK(offset > 0.0f);
            const float moved = t > drawn.token ? u + offset + 1e-5f : u - offset - 1e-5f;
            if (moved < 0.0f || moved >= 1.0f) continue;
            CHECK_MSG(sample(logits, p, moved).token == t, "case n=%d T=%g k=%d p=%g u=%g: offset %g of token %d, u "
                      "moved to %g draws %d", n, p.temperature, p.top_k, p.top_p, u, offset, t, moved,
                      sample(logits, p, moved).token);
            checked++;
        }
    }
    printf("    %d tokens' offsets moved to a draw\n", checked);
    CHECK(checked >= 100);
}

// Equal probabilities are ordered by ascending id: top-p 0.5 over four equal logits keeps ids 0, 1.
TEST(sampling_top_p_ties_by_id) {
    std::vector<float> logits(4, 0.25f);
    SamplingParams p;
    p.top_p = 0.5f;
    for (float u : {0.0f, 0.3f, 0.49f, 0.51f, 0.99f}) {
        SampledToken t = sample(logits, p, u);
        CHECK_EQ(t.token, u < 0.5f ? 0 : 1);
        CHECK_NEAR(t.logprob, std::log(0.5), 1e-6, 0);
        CHECK_NEAR(t.logprob_full, std::log(0.25), 1e-6, 0);
    }
    p.top_p = 1e-9f;  // a tiny p still keeps one token
    CHECK_EQ(sample(logits, p, 0.99f).token, 0);
    CHECK_EQ(sample(logits, p, 0.99f).logprob, 0.0f);
}

// On a grid of u the pick frequencies are the final distribution exactly (up to one grid step).
TEST(sampling_frequencies_follow_distribution) {
    std::vector<float> logits = {0.0f, 1.0f, -INFINITY, 2.0f, -1.0f, 0.5f};
    SamplingParams p;
    p.temperature = 0.8f;
    p.top_k = 4;
    p.top_p = 0.9f;
    const int grid = 10000;
    std::vector<int> count(logits.size(), 0);
    for (int i = 0; i < grid; i++) count[sample(logits, p, (i + 0.5f) / grid).token]++;
    // The kept set by hand: T = 0.8, top-4 = {3, 1, 5, 0}; top-p 0.9 of that mass keeps {3, 1, 5}
    // (their share is 0.946 >= 0.9; {3, 1} have 0.845 < 0.9).
    const double s[6] = {0.0 / 0.8, 1.0 / 0.8, 0, 2.0 / 0.8, 0, 0.5 / 0.8};
    const double z = std::exp(s[3]) + std::exp(s[1]) + std::exp(s[5]);
    CHECK_EQ(count[0] + count[2] + count[4], 0);
    for (int i : {1, 3, 5}) CHECK_NEAR(count[i], grid * std::exp(s[i]) / z, 0, 1.0);
    for (float u : {0.1f, 0.8f, 0.95f}) {
        SampledToken t = sample(logits, p, u);
        CHECK_NEAR(t.logprob, s[t.token] - std::log(z), 1e-6, 1e-7);
    }
}

TEST(sampling_greedy_and_masked_logits) {
    std::vector<float> logits = {1.0f, 3.0f, -INFINITY, 3.0f, 2.0f};
    SamplingParams g;
    g.temperature = 0.0f;
    for (float u : {0.0f, 0.7f}) {
        SampledToken t = sample(logits, g, u);
        CHECK_EQ(t.token, 1);  // first of the tied maxima
        CHECK_EQ(t.logprob, 0.0f);
        double z = std::exp(1.0) + 2 * std::exp(3.0) + std::exp(2.0);
        CHECK_NEAR(t.logprob_full, 3.0 - std::log(z), 1e-6, 0);
    }
    SamplingParams k1;
    k1.top_k = 1;  // keeps both tied maxima, as HF's TopK warper does
    CHECK_EQ(sample(logits, k1, 0.25f).token, 1);
    CHECK_EQ(sample(logits, k1, 0.75f).token, 3);
    CHECK_NEAR(sample(logits, k1, 0.75f).logprob, std::log(0.5), 1e-6, 0);
    SamplingParams plain;
    CHECK_EQ(sample(logits, plain, 0.99999994f).token, 4);  // u -> 1 never lands on -inf
    std::vector<float> one = {5.0f};
    CHECK_EQ(sample(one, plain, 0.5f).token, 0);
    CHECK_EQ(sample(one, plain, 0.5f).logprob, 0.0f);
}

// The host's vector loop computes what the scalar code (the device's) computes, element by element
// and in the row sum's order, wherever the row starts and whatever its length (within one chunk,
// at a chunk's end, across several).
TEST(sampling_row_exp_vector_equals_scalar) {
    std::vector<float> logits(2007);  // rows of up to 2000 starting at up to 7
    for (size_t i = 0; i < logits.size(); i++) logits[i] = 9.0f * std::sin(0.37f * (float)i) + 1e-3f * (float)(i % 11);
    logits[17] = -INFINITY;
    for (int start : {0, 1, 3, 7})
        for (int n : {1, 7, 8, 9, 64, 511, 512, 513, 1000, 2000}) {
            const float* row = logits.data() + start;
            std::vector<float> scratch(n), want(n);
            double z;
            const float inv_t = 1.0f / 0.7f, s_max = exp_shifted_row(row, n, inv_t, scratch.data(), &z);
            float want_max = -INFINITY;
            for (int i = 0; i < n; i++) want_max = std::fmax(want_max, row[i] * inv_t);
            int differ = 0;
            for (int i = 0; i < n; i++) {
                want[i] = fast_exp(row[i] * inv_t - want_max);
                differ += std::memcmp(&want[i], &scratch[i], sizeof want[i]) != 0;
            }
            const double want_z = row_sum(n, [&](int i) { return (double)want[i]; });
            CHECK_MSG(s_max == want_max && differ == 0 && z == want_z,
                      "start %d, n %d: max %.9g vs %.9g, %d entries differ, sum %.17g vs %.17g", start, n, s_max,
                      want_max, differ, z, want_z);
        }
}

// The row sum is LaneSum within each chunk of kSumChunk ids and the chunk sums added in order: by
// hand on a row of three chunks, and within 1e-15 of an exact (long double) sum on a vocabulary row.
TEST(sampling_row_sum_is_chunked) {
    const int n = 2 * kSumChunk + 5;
    std::vector<double> x(n);
    for (int i = 0; i < n; i++) x[i] = 1.0 + std::ldexp(1.0, -40) * (i % 13) + (i % 3 == 0 ? 1e6 : 0.0);
    double want = 0.0;
    for (int c = 0; c < 3; c++) {
        LaneSum chunk;
        for (int i = c * kSumChunk; i < std::min(n, (c + 1) * kSumChunk); i++) chunk.add(i, x[i]);
        want += chunk.total();
    }
    const auto term = [&](int i) { return x[i]; };
    CHECK_EQ(sum_chunks(n), 3);
    CHECK_EQ(row_sum(n, term), want);
    CHECK_EQ(chunk_sum(n, 2, term), ((x[1024] + x[1028]) + x[1025]) + (x[1026] + x[1027]));  // ids 1024-1028: lanes 0-4
    const int V = 151936;
    std::vector<float> p(V);
    long double exact = 0;
    for (int i = 0; i < V; i++) exact += p[i] = std::exp(8.0f * rng_uniform(5, 0, 0, (uint32_t)i));
    CHECK_NEAR(row_sum(V, MassTerm{p.data(), 0u}), (double)exact, 1e-15, 0);
}

// The inverse CDF over chunks draws what a plain running sum in id order (long double) draws, on
// vocabulary rows under temperature, top-k and top-p, wherever the target is not within 1e-12 of
// the kept mass from a step; the drawn token's sample_offset (its interval by the chunked rule)
// holds the uniform.
TEST(sampling_inverse_cdf_over_chunks_is_the_running_sum) {
    const int V = 151936;
    const SamplingParams settings[] = {{1.0f, 0, 1.0f}, {0.6f, 0, 0.9f}, {1.2f, 500, 1.0f}, {0.8f, 40, 0.8f}};
    std::vector<float> logits(V), kept_p(V), scratch(V);
    int draws = 0, near = 0, key = 0;
    for (const SamplingParams& p : settings) {
        for (int i = 0; i < V; i++) logits[i] = 10.0f * rng_uniform(7, 1, (uint32_t)key, (uint32_t)i);
        double kept, z_all;
        kept_distribution(logits.data(), V, p, kept_p.data(), &kept, &z_all);
        for (int d = 0; d < 25; d++) {
            const float u = rng_uniform(7, 2, (uint32_t)key, (uint32_t)d);
            const long double target = (long double)u * kept;
            long double cum = 0;
            int want = -1;
            bool close = false;
            for (int i = 0; i < V && want < 0; i++) {
                if (kept_p[i] == 0.0f) continue;
                cum += kept_p[i];
                close = close || std::fabs((double)(cum - target)) < 1e-12 * kept;
                if (cum > target) want = i;
            }
            if (close) {
                near++;
                continue;
            }
            const SampledToken t = sample_token(logits.data(), V, p, u, scratch.data());
            CHECK_MSG(t.token == want, "T=%g k=%d p=%g u=%.9g: chunked %d, running sum %d", p.temperature, p.top_k,
                      p.top_p, u, t.token, want);
            CHECK(sample_offset(logits.data(), V, p, u, t.token, scratch.data()) <= 0.0f);
            draws++;
        }
        key++;
    }
    printf("    %d draws on 151,936-id rows are the running sum's; %d within 1e-12 of a step not compared\n", draws, near);
    CHECK_EQ(draws + near, 100);
    CHECK(near <= 2);
}

// The prefix tree's prefixes are the documented add order: against an independent definition (each
// block of the binary decomposition summed by halves, recursively, the blocks added to the start
// largest first), for every prefix of several lengths, from 0 and from a nonzero start; by hand for
// m = 7; and on terms where the order shows (the tree's prefixes are not all a running sum's).
namespace {
double halves_sum(const std::vector<double>& x, int lo, int size) {
    return size == 1 ? x[lo] : halves_sum(x, lo, size / 2) + halves_sum(x, lo + size / 2, size / 2);
}
double tree_prefix_by_halves(const std::vector<double>& x, double start, int m) {
    int size = 1;
    while (size * 2 <= m) size *= 2;
    double sum = start;
    for (int lo = 0; size >= 1; size /= 2)
        if (m - lo >= size) {
            sum += halves_sum(x, lo, size);
            lo += size;
        }
    return sum;
}
}  // namespace

TEST(sampling_prefix_tree_is_the_documented_order) {
    int checked = 0, differ_from_running = 0;
    for (int count : {1, 2, 3, 5, 8, 31, 64, 100, 297, 512, 1000, 1024}) {
        std::vector<double> x(count);
        for (int i = 0; i < count; i++)  // magnitudes 2^-30 .. 2^10 and zeros, so that the order shows
            x[i] = i % 7 == 3 ? 0.0 : std::ldexp(1.0 + rng_uniform(3, 1, (uint32_t)count, (uint32_t)i), (i * 37) % 41 - 30);
        for (double start : {0.0, 1234.5678}) {
            PrefixTreeScan scan;
            double running = start;
            for (int m = 0; m <= count; m++) {
                if (m > 0) {
                    scan.push(x[m - 1]);
                    running += x[m - 1];
                }
                const double want = tree_prefix_by_halves(x, start, m);
                if (scan.prefix(start) != want)
                    CHECK_MSG(false, "count %d start %g m %d: scan %.17g, by halves %.17g", count, start, m,
                              scan.prefix(start), want);
                differ_from_running += want != running;
                checked++;
            }
        }
    }
    printf("    %d prefixes are the documented tree's; %d differ from a running sum's bits\n", checked, differ_from_running);
    CHECK(differ_from_running > 100);
    std::vector<double> x = {1.0, 1e-17, 3.0, 1e-16, 5.0, 7e-17, 9e-16};
    PrefixTreeScan scan;
    for (double v : x) scan.push(v);
    const double s = 0.25;
    CHECK_EQ(scan.prefix(s), ((s + ((x[0] + x[1]) + (x[2] + x[3]))) + (x[4] + x[5])) + x[6]);
    CHECK_EQ(tree_prefix(s, 6, [&](int k, int j) { return halves_sum(x, j << k, 1 << k); }),
             (s + ((x[0] + x[1]) + (x[2] + x[3]))) + (x[4] + x[5]));
}

// tree_inverse_cdf's pick is the documented rule, by brute force over the tree's prefixes: the first
// kept term (> 0) whose prefix through it exceeds the target, else the last kept term; never a zero
// term; *before the prefix before the pick. Targets at every prefix and one ulp either side.
TEST(sampling_tree_inverse_cdf_is_the_rule) {
    int checked = 0;
    for (int count : {1, 2, 7, 64, 297, 512}) {
        std::vector<double> x(count);
        for (int i = 0; i < count; i++) {
            const float r = rng_uniform(4, 2, (uint32_t)count, (uint32_t)i);
            x[i] = r < 0.3f ? 0.0 : std::ldexp((double)r, -(int)(40 * r)) / 3.0;  // all 53 bits: sums round
        }
        if (count > 2) x[count - 1] = 0.0;  // a zero term last: the fallback must not take it
        for (double start : {0.0, 0.5}) {
            std::vector<double> targets = {0.0, start, 1e9};
            for (int m = 1; m <= count; m++) {
                const double p = tree_prefix_by_halves(x, start, m);
                targets.insert(targets.end(), {p, std::nextafter(p, 0.0), std::nextafter(p, INFINITY)});
            }
            for (double target : targets) {
                int want = -1, last = -1;
                for (int i = 0; i < count; i++) {
                    if (!(x[i] > 0.0)) continue;
                    last = i;
                    if (want < 0 && tree_prefix_by_halves(x, start, i + 1) > target) want = i;
                }
                if (want < 0) want = last;
                double before = -1.0;
                const int got = tree_inverse_cdf(count, [&](int i) { return x[i]; }, start, target, &before);
                CHECK_MSG(got == want && (want < 0 || before == tree_prefix_by_halves(x, start, want)),
                          "count %d start %g target %.17g: pick %d (before %.17g), want %d", count, start, target, got,
                          before, want);
                checked++;
            }
        }
    }
    CHECK(checked > 2000);
}
