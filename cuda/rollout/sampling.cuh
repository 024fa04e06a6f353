// sampling.cuh: the next token of B sequences on the device, by the host sampler's exact rule
// (rl/numerics/sampling.h's sample_token: temperature, top-k, top-p, inverse CDF in id order) with the
// uniform cpu/generate.h draws: u = rng_uniform(seed, step_b, key_b, position_b).
//
// One block per row. Every step gives the host's bits, because each is either order-free or done in
// the host's order:
//   - the max of the scaled logits, the greedy argmax (lowest id on ties), the counts of top-k's
//     bisection and the masks: exact whatever the order, so all threads share them;
//   - every row sum (the row's mass, the kept masses, each step of top-p's bisection): sampling.h's
//     row_sum, whose chunks do not depend on the block: thread t sums chunks t, t + blockDim.x, ...
//     each as chunk_sum does, into shared memory, and every thread adds the chunk sums in chunk order;
//   - top-p's boundary tie group: its members all hold the same probability x, so the host's walk
//     in id order keeps a prefix of them whose length follows from the masses before + x + x ...;
//     every thread computes that length, then keeps the members whose rank (a prefix count over
//     contiguous spans of ids) is below it;
//   - the inverse CDF (sampling.h's inverse_cdf): its running sums are sampling.h's prefix tree,
//     whose add order depends on the number of terms alone. Over the kept mass's chunk sums (still
//     in shared memory), then over the chosen chunk's ids: the block builds the tree's block sums a
//     level at a time (log2 of the terms steps), every thread computes the prefixes of its terms
//     (one add per set bit of the term's index + 1) and tests them, and a min over the block takes
//     the first kept term whose prefix exceeds the target (a max, the last kept term, if none does).
// A row costs a pass over its logits (the max), one over the probabilities (exp and the row's mass),
// then up to 31 count passes (top-k), 31 mass passes and the tie pass (top-p) and a kept-mass pass,
// each over the row's n floats of scratch (600 KB at 151,936 ids, from L2 at batch sizes whose
// scratch fits it), then the two prefix-tree searches (over the <= 1024 chunk sums in shared memory,
// then one chunk of scratch; each a barrier a tree level, 8 or 9 at 151,936 ids, and five more for
// the min, the max and the tree's reuse). Estimated, not measured: ~7 us a pass at ~80 GB/s of L2
// reads per SM, the rows' blocks side by side, so a decode step samples in ~20 us uncut and
// ~0.5 ms with top-k and top-p, whatever the batch up to one row per SM (an earlier one-thread walk
// with 8-thread sums: 3-9 ms). Every row sum still ends in each thread adding the chunk sums in
// chunk order (297 dependent adds from shared memory at 151,936 ids), which the searches do not change.
// The elementwise math is rl/numerics/fast_exp.h's exp and unfused products (mul_rn); the log-probs'
// double log is the device's, which matches glibc's to within an ulp but is not guaranteed to
// round the same: the bits are the host's in emulation, and on a GPU wherever the two logs agree
// (bit equality there needs one FP8RL_HD log shared by host and device, as fast_exp is).
#ifndef FP8RL_CUDA_SAMPLING_CUH
#define FP8RL_CUDA_SAMPLING_CUH
#include <cstdint>

#include "cuda/kernels/block_reduce.cuh"
#include "cuda/common.cuh"
#include "rl/numerics/rng.h"
#include "rl/numerics/sampling.h"

namespace fp8rl {

// One block per row, one thread per chunk at Qwen's 151,936 ids (297 chunks): a row sum takes one
// chunk per thread (512 loads into eight sums) and then the 297 chunk additions.
constexpr int kSampleThreads = 512;
constexpr int kSampleMaxChunks = 1024;  // the chunk sums a block keeps in shared memory: n <= 524,288

// The row sum of x(i) over i < n (sampling.h's row_sum); every thread of the block calls it and gets
// the total. chunk_sums (shared, kSampleMaxChunks) keeps the chunk sums until the next call.
template <class X>
__device__ double block_row_sum(int n, const X& x, double* chunk_sums) {
    const int chunks = sum_chunks(n);
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) chunk_sums[c] = chunk_sum(n, c, x);
    __syncthreads();  // every chunk sum is written (and x's side effects, ExpTerm's row, are complete)
    double total = 0.0;
    for (int c = 0; c < chunks; c++) total += chunk_sums[c];
    __syncthreads();  // every thread has read the sums before the next call writes them
    return total;
}

// How many i < n satisfy pred(i), for every thread of the block.
template <class Pred>
__device__ int block_count(int n, Pred pred) {
    int count = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) count += pred(i) ? 1 : 0;
    return block_reduce(count, SumOp());
}

// rl/numerics/sampling.h's CountAtLeast and MassAtLeast, computed by the block (for largest_key_at_least).
struct BlockCountAtLeast {
    const float* p;
    int n;
    __device__ double operator()(uint32_t key) const {
        return block_count(n, [&](int i) { return prob_key(p[i]) >= key; });
    }
};
struct BlockMassAtLeast {
    const float* p;
    int n;
    double* chunk_sums;
    __device__ double operator()(uint32_t key) const { return block_row_sum(n, MassTerm{p, key}, chunk_sums); }
};

// Block sum B_k[j] (k >= 1) of the prefix tree over `count` terms, as block_tree_inverse_cdf lays
// them out in tree: level 1 first, then each level after the one below it.
template <class X>
struct BlockTreeSums {
    const X& x;
    const double* tree;
    int count;
    __device__ double operator()(int k, int j) const {
        if (k == 0) return x(j);
        int offset = 0;
        for (int l = 1; l < k; l++) offset += count >> l;
        return tree[offset + j];
    }
};

// rl/numerics/sampling.h's tree_inverse_cdf on the block (every thread calls it and gets the pick and
// *before): the level-k block sums B_k (k >= 1) into tree (shared, count - 1 doubles at least), a
// level a step, each the sum of two of the level below as sampling.h's prefix tree defines them;
// then every thread computes the prefix through each of its kept terms from those sums and tests it,
// and a min over the block takes the first that exceeds target, else a max the last kept term.
// x(i) must be readable by every thread (shared memory, or global memory the block has finished).
template <class X>
__device__ int block_tree_inverse_cdf(int count, const X& x, double start, double target, double* tree,
                                      double* before) {
    for (int k = 1, offset = 0; count >> k > 0; k++) {
        const int below = offset - (count >> (k - 1));  // level k - 1's offset (k >= 2)
        for (int j = threadIdx.x; j < count >> k; j += blockDim.x)
            tree[offset + j] = k == 1 ? x(2 * j) + x(2 * j + 1) : tree[below + 2 * j] + tree[below + 2 * j + 1];
        __syncthreads();  // level k is complete before level k + 1 or the prefixes read it
        offset += count >> k;
    }
    const BlockTreeSums<X> sums{x, tree, count};
    int first = count, last = -1;
    for (int i = threadIdx.x; i < count; i += blockDim.x) {
        if (!(x(i) > 0.0)) continue;
        last = i;
        if (first == count && tree_prefix(start, i + 1, sums) > target) first = i;
    }
    first = block_reduce(first, [](int a, int b) { return b < a ? b : a; });
    last = block_reduce(last, MaxOp());
    const int pick = first < count ? first : last;
    if (pick >= 0) *before = tree_prefix(start, pick, sums);
    __syncthreads();  // every thread has read tree before a next call writes it
    return pick;
}

// rl/numerics/sampling.h's inverse_cdf on the block, for every thread: the token for target over the
// kept row p [n] whose chunk masses are chunk_sums (shared); tree: shared, kSampleMaxChunks doubles.
__device__ inline int block_inverse_cdf(const float* p, int n, const double* chunk_sums, double target, double* tree) {
    double before = 0.0, unused = 0.0;
    const int c = block_tree_inverse_cdf(sum_chunks(n), [&](int chunk) { return chunk_sums[chunk]; }, 0.0, target,
                                         tree, &before);
    const int lo = c * kSumChunk;
    return lo + block_tree_inverse_cdf(chunk_hi(n, c) - lo, ProbTerm{p + lo}, before, target, tree, &unused);
}

// rl/numerics/sampling.h's apply_top_p on the block.
__device__ inline void block_apply_top_p(float* scratch, int n, float top_p, double kept_mass, double* chunk_sums) {
    const double target = (double)top_p * kept_mass;
    const BlockMassAtLeast mass{scratch, n, chunk_sums};
    const uint32_t key = largest_key_at_least(0u, prob_key(1.0f), mass, target);
    const double before = key == prob_key(1.0f) ? 0.0 : mass(key + 1);
    const int ties = block_count(n, [&](int i) { return prob_key(scratch[i]) == key; });
    int keep = 0;  // the host's walk: keep while the mass before is < target, and never keep nothing
    for (double mass = before; keep < ties && (mass < target || (keep == 0 && !(before > 0.0))); keep++)
        mass += bits_float(key);
    STATIC_SHARED(int, span_ties, [kSampleThreads]);  // tie members per contiguous span of ids
    const int span = (n + blockDim.x - 1) / blockDim.x, lo = min(n, (int)threadIdx.x * span), hi = min(n, lo + span);
    int rank = 0;
    for (int i = lo; i < hi; i++) rank += prob_key(scratch[i]) == key;
    span_ties[threadIdx.x] = rank;
    __syncthreads();  // every span's count is written
    rank = 0;
    for (unsigned t = 0; t < threadIdx.x; t++) rank += span_ties[t];
    for (int i = lo; i < hi; i++) {
        const uint32_t b = prob_key(scratch[i]);
        if (b < key || (b == key && rank++ >= keep)) scratch[i] = 0.0f;
    }
    __syncthreads();  // the cut row is complete
}

// Row blockIdx.x of logits [B][V] sampled over ids < n into out (and tokens, if not null).
static __global__ void __launch_bounds__(kSampleThreads)
    sample_rows_kernel(SampledToken* out, int32_t* tokens, const float* logits, long V, int n, SamplingParams params,
                       uint64_t seed, const uint32_t* steps, const uint32_t* keys, const uint32_t* positions, float* scratch) {
    const long row = blockIdx.x;
    logits += row * V;
    scratch += row * n;
    const bool greedy = params.temperature == 0.0f;
    const float inv_t = greedy ? 1.0f : 1.0f / params.temperature;
    // exp_shifted_row: s_max, scratch[i] = exp(s_i - s_max), z_all; and for greedy the argmax, as
    // (value's order bits, ~id) so that the max of the keys is the lowest id of the largest logit
    float s_max = -INFINITY;
    unsigned long long best = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        s_max = fmaxf(s_max, mul_rn(logits[i], inv_t));
        const uint32_t bits = float_bits(logits[i]), order = bits >> 31 ? ~bits : bits | 0x80000000u;
        const unsigned long long candidate = (unsigned long long)order << 32 | (0xFFFFFFFFu - (uint32_t)i);
        best = candidate > best ? candidate : best;
    }
    s_max = block_reduce(s_max, [](float a, float b) { return fmaxf(a, b); });
    STATIC_SHARED(double, chunk_sums, [kSampleMaxChunks]);
    const double z_all = block_row_sum(n, ExpTerm{logits, inv_t, s_max, scratch}, chunk_sums);
    if (greedy) {
        best = block_reduce(best, MaxOp());
        const int token = (int)(0xFFFFFFFFu - (uint32_t)(best & 0xFFFFFFFFu));
        if (threadIdx.x == 0) {
            out[row] = SampledToken{token, 0.0f, (float)-log(z_all)};
            if (tokens) tokens[row] = token;
        }
        return;
    }
    double kept = z_all;
    if (params.top_k > 0 && params.top_k < n) {
        const uint32_t key = largest_key_at_least(0u, prob_key(1.0f), BlockCountAtLeast{scratch, n}, params.top_k);
        for (int i = threadIdx.x; i < n; i += blockDim.x)
            if (prob_key(scratch[i]) < key) scratch[i] = 0.0f;
        __syncthreads();  // the cut row is complete
        kept = BlockMassAtLeast{scratch, n, chunk_sums}(0u);
    }
    if (params.top_p < 1.0f) {
        block_apply_top_p(scratch, n, params.top_p, kept, chunk_sums);
        kept = BlockMassAtLeast{scratch, n, chunk_sums}(0u);
    }
    // chunk_sums holds the chunk masses of the kept row (the last row sum: kept, or z_all uncut)
    const float u = rng_uniform(seed, steps[row], keys[row], positions[row]);
    STATIC_SHARED(double, tree, [kSampleMaxChunks]);
    const int token = block_inverse_cdf(scratch, n, chunk_sums, (double)u * kept, tree);
    if (threadIdx.x == 0) {
        const SampledToken t = sampled_token(logits, token, inv_t, s_max, kept, z_all);
        out[row] = t;
        if (tokens) tokens[row] = t.token;
    }
}

// For rows b < B of logits [B][V] (FP32, device): out[b] = sample_token(logits_b, n, params, u_b,
// ...) with u_b = rng_uniform(seed, steps[b], keys[b], positions[b]) (steps, keys, positions: device
// [B], so a captured graph samples for whatever RL step its buffers hold);
// tokens (device int32 [B], may be null) gets the tokens too, to feed the next decode step. n <= V
// is the vocabulary limit (SamplingConfig.vocab_limit: only ids < n are drawn). scratch: device
// FP32 [B][n]. Logits must not be NaN; at least one per row must be finite. No host sync, no
// allocation: capturable in a CUDA graph.
inline void sample_tokens_gpu(SampledToken* out, int32_t* tokens, const float* logits, int B, int V, int n,
                              const SamplingParams& params, uint64_t seed, const uint32_t* steps, const uint32_t* keys,
                              const uint32_t* positions, float* scratch, cudaStream_t stream) {
    if (B < 0 || n < 1 || n > V || sum_chunks(n) > kSampleMaxChunks)
        fail("sample_tokens_gpu: B = %d rows, vocabulary limit n = %d, V = %d: need B >= 0 and 1 <= n <= V, n <= %d",
             B, n, V, kSampleMaxChunks * kSumChunk);
    if (!(params.temperature >= 0.0f) || !(params.top_p > 0.0f))
        fail("sample_tokens_gpu: temperature %g, top_p %g: need temperature >= 0 (0 = greedy) and top_p > 0",
             params.temperature, params.top_p);
    if (B == 0) return;
    LAUNCH_KERNEL(sample_rows_kernel, (unsigned)B, kSampleThreads, 0, stream, out, tokens, logits, (long)V, n, params,
                  seed, steps, keys, positions, scratch);
}

}  // namespace fp8rl

#endif  // FP8RL_CUDA_SAMPLING_CUH
