// test_sampling_kernel.cu: cuda/rollout/sampling.cuh's sample_tokens_gpu against the host rule
// (rl/numerics/sampling.h's sample_token with u = rng_uniform(seed, step, key, position), as cpu/generate.h
// draws it), bit for bit: token, log-prob and full log-prob. On the sampling fixtures of
// test/test_sampling.cpp and on rows of the real vocabulary size (151,936) built for the rule's
// edges: exact ties at the top-k threshold and at the top-p boundary, a flat row, masked (-inf)
// logits, greedy with tied maxima, a vocabulary limit below V that cuts off the largest logit; on
// random rows of that size under several temperatures, top-k and top-p; the block's row sums
// against the host's in double; the block's prefix-tree search (the inverse CDF's parallel scan)
// against the host's walk at block sizes 32 to 512; and the kernel's inverse CDF against the host's
// on rows of that size at targets placed at and around chunk boundaries.
// Bit equality holds in emulation (the device code is the host code); on a GPU it also needs the
// device's double log to round as glibc's does (both are within 1 ulp; see cuda/rollout/sampling.cuh).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <vector>

#include "cuda/rollout/sampling.cuh"
#include "rl/io/json.h"
#include "test/gpu/gpu_util.cuh"
#include "test/harness.h"

using namespace fp8rl;

namespace {

constexpr uint64_t kSeed = 1234;
constexpr uint32_t kStep = 9;

// Samples rows [B][V] of `logits` on the device and on the host with the same uniforms; returns the
// number of rows whose token or log-prob bits differ (each one reported).
int count_mismatches(const char* what, const std::vector<float>& logits, int B, int V, int n, const SamplingParams& p,
                     uint32_t key0) {
    std::vector<uint32_t> steps(B), keys(B), positions(B);
    for (int b = 0; b < B; b++) {
        steps[b] = kStep + b % 3;  // rows of a batch may belong to different RL steps
        keys[b] = key0 + 31 * b;
        positions[b] = 5 + b;
    }
    DeviceBuffer<float> d_logits(logits), scratch((size_t)B * n);
    DeviceBuffer<uint32_t> d_steps(steps), d_keys(keys), d_positions(positions);
    DeviceBuffer<SampledToken> out(B);
    DeviceBuffer<int32_t> tokens(B);
    sample_tokens_gpu(out.ptr, tokens.ptr, d_logits.ptr, B, V, n, p, kSeed, d_steps.ptr, d_keys.ptr, d_positions.ptr,
                      scratch.ptr, 0);
    const std::vector<SampledToken> dev = out.download();
    const std::vector<int32_t> dev_tokens = tokens.download();
    std::vector<float> host_scratch(n);
    int bad = 0;
    for (int b = 0; b < B; b++) {
        const float u = rng_uniform(kSeed, steps[b], keys[b], positions[b]);
        const SampledToken h = sample_token(&logits[(size_t)b * V], n, p, u, host_scratch.data());
        const bool same = h.token == dev[b].token && dev_tokens[b] == h.token &&
                          float_bits(h.logprob) == float_bits(dev[b].logprob) &&
                          float_bits(h.logprob_full) == float_bits(dev[b].logprob_full);
        if (!same && bad++ < 5)
            CHECK_MSG(false, "%s row %d (n=%d T=%g k=%d p=%g u=%.9g): host %d %.9g %.9g, device %d (%d) %.9g %.9g", what, b,
                      n, p.temperature, p.top_k, p.top_p, u, h.token, h.logprob, h.logprob_full, dev[b].token,
                      dev_tokens[b], dev[b].logprob, dev[b].logprob_full);
    }
    return bad;
}

// out[k] = the block's mass of p [n] at key keys[k] (BlockMassAtLeast), for k < count.
__global__ void block_masses_kernel(const float* p, int n, const uint32_t* keys, int count, double* out) {
    STATIC_SHARED(double, chunk_sums, [kSampleMaxChunks]);
    for (int k = 0; k < count; k++) {
        const double mass = BlockMassAtLeast{p, n, chunk_sums}(keys[k]);
        if (threadIdx.x == 0) out[k] = mass;
    }
}

// x[i]: terms for the prefix tree, on the host and on the device.
struct DoubleTerms {
    const double* x;
    __host__ __device__ double operator()(int i) const { return x[i]; }
};

// For each target k < count: picks[k] and befores[k] from the block's prefix-tree search
// (block_tree_inverse_cdf) over terms x [n] from start.
__global__ void block_tree_kernel(const double* x, int n, double start, const double* targets, int count, int* picks,
                                  double* befores) {
    STATIC_SHARED(double, tree, [kSampleMaxChunks]);
    for (int k = 0; k < count; k++) {
        double before = -1.0;
        const int pick = block_tree_inverse_cdf(n, DoubleTerms{x}, start, targets[k], tree, &before);
        if (threadIdx.x == 0) {
            picks[k] = pick;
            befores[k] = before;
        }
    }
}

// tokens[k] = the block's inverse CDF (block_inverse_cdf, as sample_rows_kernel runs it) over the kept
// row p [n] at targets[k], with the chunk masses from the block's row sum.
__global__ void block_inverse_cdf_kernel(const float* p, int n, const double* targets, int count, int* tokens) {
    STATIC_SHARED(double, chunk_sums, [kSampleMaxChunks]);
    STATIC_SHARED(double, tree, [kSampleMaxChunks]);
    block_row_sum(n, MassTerm{p, 0u}, chunk_sums);
    for (int k = 0; k < count; k++) {
        const int token = block_inverse_cdf(p, n, chunk_sums, targets[k], tree);
        if (threadIdx.x == 0) tokens[k] = token;
    }
}

}  // namespace

// The block's prefix-tree search is the host's tree_inverse_cdf bit for bit (the pick and the prefix
// before it, in double), whatever the block size: term counts from 1 to kSampleMaxChunks, zero
// terms among them (and last), targets at prefixes of the tree and one ulp either side.
TEST(sampling_kernel_prefix_tree_matches_host) {
    REQUIRE_GPU();
    int bad = 0, checked = 0;
    for (int n : {1, 2, 3, 7, 297, 512, 1024}) {
        std::vector<double> x(n);
        for (int i = 0; i < n; i++) {
            const float r = 0.5f * (hash_uniform(i, 50 + n) + 1.0f);  // [0, 1)
            x[i] = r < 0.25f ? 0.0 : std::ldexp((double)r, -(int)(40 * r)) / 3.0;  // all 53 bits: sums round
        }
        if (n > 2) x[n - 1] = 0.0;
        for (double start : {0.0, 0.75}) {
            std::vector<double> targets = {0.0, 1e9};
            PrefixTreeScan scan;
            for (int m = 1; m <= n; m++) {
                scan.push(x[m - 1]);
                if (m % (n / 40 + 1) == 0 || m > n - 3) {  // about 40 prefixes a row, and the last ones
                    const double q = scan.prefix(start);
                    targets.insert(targets.end(), {q, std::nextafter(q, 0.0), std::nextafter(q, INFINITY)});
                }
            }
            DeviceBuffer<double> d_x(x), d_targets(targets), d_befores(targets.size());
            DeviceBuffer<int> d_picks(targets.size());
            for (int threads : {32, 96, kSampleThreads}) {
                LAUNCH_KERNEL(block_tree_kernel, 1, threads, 0, 0, d_x.ptr, n, start, d_targets.ptr,
                              (int)targets.size(), d_picks.ptr, d_befores.ptr);
                const std::vector<int> picks = d_picks.download();
                const std::vector<double> befores = d_befores.download();
                for (size_t k = 0; k < targets.size(); k++) {
                    double before = -1.0;
                    const int pick = tree_inverse_cdf(n, DoubleTerms{x.data()}, start, targets[k], &before);
                    if ((pick != picks[k] || before != befores[k]) && bad++ < 5)
                        CHECK_MSG(false, "n %d start %g, %d threads, target %.17g: host %d %.17g, device %d %.17g", n,
                                  start, threads, targets[k], pick, before, picks[k], befores[k]);
                    checked++;
                }
            }
        }
    }
    printf("    %d prefix-tree searches at block sizes 32, 96 and %d: %d differ from the host\n", checked,
           kSampleThreads, bad);
    CHECK_MSG(bad == 0, "%d of %d searches differ", bad, checked);
}

// The device's per-row draw (block_inverse_cdf, the kernel's inverse CDF) is the host's inverse_cdf on
// rows of 151,936 kept probabilities, at targets placed at and around chunk boundaries (the tree's
// prefix through a chunk, exactly and one ulp and 1e-12 of the mass either side), at the first and
// last kept ids of chunks, at 0, near and at the kept mass and beyond it. Rows: smooth; whole chunks
// and the ids at chunk edges cut (probability 0); one chunk holding all the mass.
TEST(sampling_kernel_inverse_cdf_matches_host_at_chunk_boundaries) {
    REQUIRE_GPU();
    const int V = 151936, chunks = sum_chunks(V);
    int bad = 0, checked = 0;
    for (int shape = 0; shape < 3; shape++) {
        std::vector<float> p(V);
        for (int i = 0; i < V; i++) {
            const int c = i / kSumChunk, in = i % kSumChunk;
            p[i] = std::exp(10.0f * hash_uniform(i, 60 + shape) - 10.0f);
            if (shape == 1 && (c % 5 == 2 || in < 3 || in > kSumChunk - 4 || i % 7 == 0)) p[i] = 0.0f;
            if (shape == 2 && c != 150) p[i] = 0.0f;
        }
        const double kept = MassAtLeast{p.data(), V}(0u);
        std::vector<double> targets = {0.0, kept, kept * (1.0 - std::ldexp(1.0, -24)), std::nextafter(kept, 0.0),
                                       2.0 * kept};
        PrefixTreeScan scan;
        for (int c = 0; c < chunks; c++) {
            const double before = scan.prefix(0.0);
            scan.push(ChunkMass{p.data(), V}(c));
            if (c % 7 != 0 && c < chunks - 3 && c != 149 && c != 150) continue;  // every 7th chunk, the last, 150
            const double q = scan.prefix(0.0);
            targets.insert(targets.end(), {q, std::nextafter(q, 0.0), std::nextafter(q, INFINITY), q - 1e-12 * kept,
                                           q + 1e-12 * kept});
            // inside the chunk: the prefixes through its first two and last two kept ids
            PrefixTreeScan in;
            std::vector<double> kept_prefixes;
            for (int i = c * kSumChunk; i < chunk_hi(V, c); i++) {
                in.push(p[i]);
                if (p[i] > 0.0f) kept_prefixes.push_back(in.prefix(before));
            }
            const size_t k = kept_prefixes.size();
            for (size_t j = 0; j < k; j++)
                if (j < 2 || j + 2 >= k)
                    targets.insert(targets.end(), {kept_prefixes[j], std::nextafter(kept_prefixes[j], 0.0),
                                                   std::nextafter(kept_prefixes[j], INFINITY)});
        }
        DeviceBuffer<float> d_p(p);
        DeviceBuffer<double> d_targets(targets);
        DeviceBuffer<int> d_tokens(targets.size());
        LAUNCH_KERNEL(block_inverse_cdf_kernel, 1, kSampleThreads, 0, 0, d_p.ptr, V, d_targets.ptr,
                      (int)targets.size(), d_tokens.ptr);
        const std::vector<int> tokens = d_tokens.download();
        for (size_t k = 0; k < targets.size(); k++) {
            const int host = inverse_cdf(p.data(), V, targets[k]);
            CHECK_MSG(p[host] > 0.0f, "shape %d target %.17g: host drew %d, a cut id", shape, targets[k], host);
            if (host != tokens[k] && bad++ < 5)
                CHECK_MSG(false, "shape %d target %.17g (kept %.17g): host %d, device %d", shape, targets[k], kept, host,
                          tokens[k]);
            checked++;
        }
    }
    printf("    %d draws at chunk-boundary targets on 151,936-id rows: %d differ from the host\n", checked, bad);
    CHECK_MSG(bad == 0, "%d of %d draws differ", bad, checked);
}

// The block's row sums are the host's row_sum bit for bit (in double: a token or a float log-prob
// would hide most orders), whatever the block size, at chunk edges and on a vocabulary row, for the
// whole row and for top-p's masses at keys through the row's probabilities.
TEST(sampling_kernel_row_sums_match_host) {
    REQUIRE_GPU();
    int bad = 0, checked = 0;
    for (int n : {1, 511, 512, 513, 5000, 151936}) {
        std::vector<float> p(n);
        for (int i = 0; i < n; i++) p[i] = std::exp(12.0f * hash_uniform(i, 21) - 12.0f);
        std::vector<uint32_t> keys = {0u};
        for (int q : {7, 100, 2000}) keys.push_back(prob_key(p[(size_t)q % n]));
        DeviceBuffer<float> d_p(p);
        DeviceBuffer<uint32_t> d_keys(keys);
        DeviceBuffer<double> d_out(keys.size());
        for (int threads : {32, kSampleThreads}) {
            LAUNCH_KERNEL(block_masses_kernel, 1, threads, 0, 0, d_p.ptr, n, d_keys.ptr, (int)keys.size(), d_out.ptr);
            const std::vector<double> dev = d_out.download();
            for (size_t k = 0; k < keys.size(); k++) {
                const double host = MassAtLeast{p.data(), n}(keys[k]);
                if (host != dev[k] && bad++ < 5)
                    CHECK_MSG(false, "n %d, %d threads, key %u: host %.17g, device %.17g", n, threads, keys[k], host, dev[k]);
                checked++;
            }
        }
    }
    printf("    %d row sums at block sizes 32 and %d: %d differ from the host's bits\n", checked, kSampleThreads, bad);
    CHECK_EQ(checked, 48);
    CHECK_MSG(bad == 0, "%d of %d row sums differ", bad, checked);
}

// Every case of test/fixtures/sampling/cases.jsonl, two rows each (two uniforms).
TEST(sampling_kernel_matches_host_on_fixtures) {
    REQUIRE_GPU();
    std::istringstream lines(read_file("test/fixtures/sampling/cases.jsonl"));
    std::string line;
    int cases = 0, bad = 0;
    while (std::getline(lines, line)) {
        const Json c = json_parse(line, "cases.jsonl");
        std::vector<float> row;
        for (const Json& x : c.find("logits")->items) row.push_back((float)x.number);
        SamplingParams p;
        p.temperature = (float)c.find("temperature")->number;
        p.top_k = (int)c.find("top_k")->integer;
        p.top_p = (float)c.find("top_p")->number;
        const int B = 2, V = (int)row.size();
        std::vector<float> logits;
        for (int b = 0; b < B; b++) logits.insert(logits.end(), row.begin(), row.end());
        bad += count_mismatches("fixture", logits, B, V, V, p, (uint32_t)cases);
        cases++;
    }
    CHECK(cases >= 100);
    CHECK_MSG(bad == 0, "%d of %d fixture rows differ", bad, 2 * cases);
}

// Rows of the real vocabulary size, two per setting (different uniforms).
TEST(sampling_kernel_matches_host_on_vocabulary_rows) {
    REQUIRE_GPU();
    const int V = 151936, B = 2;
    struct Setting {
        const char* name;
        SamplingParams p;
        int n;       // vocabulary limit
        int shape;   // 0: smooth, 1: quantised to 1/4 (many exact ties), 2: flat, 3: tied maxima, 4: masked
    };
    const Setting settings[] = {
        {"T=1, no cut", {1.0f, 0, 1.0f}, V, 0},
        {"top-k 50 on quantised logits (ties at the k-th)", {0.8f, 50, 1.0f}, V, 1},
        {"top-p 0.9 on quantised logits (a tie group at the boundary)", {1.0f, 0, 0.9f}, V, 1},
        {"top-k 40 + top-p 0.7", {0.7f, 40, 0.7f}, V, 0},
        {"flat row, top-p 0.5", {1.0f, 0, 0.5f}, V, 2},
        {"greedy, tied maxima", {0.0f, 0, 1.0f}, V, 3},
        {"top-k 1", {1.3f, 1, 1.0f}, V, 3},
        {"masked logits, top-p 0.95", {1.0f, 0, 0.95f}, V, 4},
        {"vocabulary limit below the largest logit", {1.0f, 0, 1.0f}, 151665, 0},
    };
    int key = 0;
    for (const Setting& s : settings) {
        std::vector<float> logits((size_t)B * V);
        for (int b = 0; b < B; b++)
            for (int i = 0; i < V; i++) {
                const float x = 4.0f * hash_uniform((uint64_t)b * V + i, 3 + key);
                float& l = logits[(size_t)b * V + i];
                l = s.shape == 1 ? std::round(x * 4.0f) / 4.0f : s.shape == 2 ? 0.5f : x;
                if (s.shape == 3 && i % 9973 == 17) l = 6.0f;                  // the maximum at several ids
                if (s.shape == 4 && i % 3 != 0) l = -INFINITY;                 // two thirds masked
                if (i == V - 3) l = s.n < V ? 30.0f : l;                       // beyond the limit: never drawn
            }
        CHECK_MSG(count_mismatches(s.name, logits, B, V, s.n, s.p, 1000u * ++key) == 0, "%s", s.name);
    }
}

// Random rows of the real vocabulary size, from flat to peaked, under temperatures, top-k and top-p
// (alone and together): the chunked row sums, the block's thresholds and the inverse CDF over chunks
// draw the host's tokens and log-probs bit for bit.
TEST(sampling_kernel_matches_host_on_random_vocabulary_rows) {
    REQUIRE_GPU();
    const int V = 151936, B = 2;
    const SamplingParams settings[] = {{0.6f, 0, 1.0f}, {1.0f, 0, 0.95f}, {1.5f, 0, 0.6f}, {1.0f, 50, 1.0f},
                                       {0.7f, 2000, 1.0f}, {0.9f, 100, 0.9f}, {1.2f, 20, 0.3f}, {1.0f, 0, 0.999f}};
    int key = 0, bad = 0;
    for (const SamplingParams& p : settings) {
        std::vector<float> logits((size_t)B * V);
        for (int b = 0; b < B; b++) {
            const float scale = b == 0 ? 4.0f : 16.0f;  // flat, peaked
            for (int i = 0; i < V; i++)
                logits[(size_t)b * V + i] = scale * (hash_uniform((uint64_t)b * V + i, 40 + key) +
                                                     hash_uniform((uint64_t)b * V + i, 80 + key));
        }
        bad += count_mismatches("random", logits, B, V, V, p, 7000u + 100u * key++);
    }
    const int rows = B * (int)(sizeof settings / sizeof settings[0]);
    printf("    %d random rows of %d ids: %d differ from the host in token or log-prob bits\n", rows, V, bad);
    CHECK_MSG(bad == 0, "%d of %d random vocabulary rows differ", bad, rows);
}

// Captured in a CUDA graph and replayed after new logits, keys and positions are uploaded to the same
// buffers: the host's draws on the new inputs.
TEST(sampling_kernel_replays_in_a_graph) {
    REQUIRE_GPU();
    const int B = 3, V = 1000, n = 990;
    const SamplingParams p = {0.9f, 20, 0.9f};
    std::vector<float> logits((size_t)B * V);
    DeviceBuffer<float> d_logits(logits.size()), scratch((size_t)B * n);
    DeviceBuffer<uint32_t> steps(B), keys(B), positions(B);
    DeviceBuffer<SampledToken> out(B);
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    sample_tokens_gpu(out.ptr, nullptr, d_logits.ptr, B, V, n, p, kSeed, steps.ptr, keys.ptr, positions.ptr, scratch.ptr,
                      stream);
    CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (size_t i = 0; i < logits.size(); i++) logits[i] = 3.0f * hash_uniform(i, 8);
    const std::vector<uint32_t> st = {kStep, kStep + 1, kStep}, k = {7, 8, 9}, pos = {1, 2, 3};
    d_logits.upload(logits);
    steps.upload(st);
    keys.upload(k);
    positions.upload(pos);
    CUDA_CHECK(cudaGraphLaunch(exec, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    const std::vector<SampledToken> dev = out.download();
    std::vector<float> host_scratch(n);
    for (int b = 0; b < B; b++) {
        const SampledToken h = sample_token(&logits[(size_t)b * V], n, p, rng_uniform(kSeed, st[b], k[b], pos[b]),
                                            host_scratch.data());
        CHECK_MSG(h.token == dev[b].token && float_bits(h.logprob) == float_bits(dev[b].logprob) &&
                      float_bits(h.logprob_full) == float_bits(dev[b].logprob_full),
                  "row %d: host %d %.9g, replayed %d %.9g", b, h.token, h.logprob, dev[b].token, dev[b].logprob);
    }
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
    CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(sampling_kernel_rejects_bad_input) {
    REQUIRE_GPU();
    SamplingParams p;
    CHECK_THROWS((sample_tokens_gpu(nullptr, nullptr, nullptr, 1, 10, 11, p, 0, nullptr, nullptr, nullptr, nullptr, 0)),
                 "vocabulary limit n = 11, V = 10");
    CHECK_THROWS((sample_tokens_gpu(nullptr, nullptr, nullptr, 1, 10, 0, p, 0, nullptr, nullptr, nullptr, nullptr, 0)),
                 "vocabulary limit n = 0, V = 10");
    CHECK_THROWS((sample_tokens_gpu(nullptr, nullptr, nullptr, 1, 600000, 524289, p, 0, nullptr, nullptr, nullptr, nullptr, 0)),
                 "n <= 524288");
    p.temperature = -1.0f;
    CHECK_THROWS((sample_tokens_gpu(nullptr, nullptr, nullptr, 1, 10, 10, p, 0, nullptr, nullptr, nullptr, nullptr, 0)),
                 "temperature -1, top_p 1: need temperature >= 0");
}
