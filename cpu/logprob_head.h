// logprob_head.h: the language-model head fused with the per-token log-probability and entropy,
// forward and backward, computed over the vocabulary in fixed chunks so that no [tokens x vocab]
// buffer is needed (a 151,936-word vocabulary costs kVocabChunk floats per row at a time). When
// the logits of a training batch fit in a budget (kSavedLogitsMaxBytes) the forward keeps them and
// the backward reads them instead of recomputing them: one of the head's four GEMMs saved.
//
// Per row r (final hidden state x[r], target y[r] or -1 for none), with z = (W x[r]) / temperature:
//   lse = log sum_j exp(z_j),  logprob = z_y - lse,  entropy = lse - mu,  mu = sum_j p_j z_j.
// The sums run online over the chunks in vocabulary order (rescaled on a new running max), so
// a row's result depends neither on the number of rows nor on the thread count.
// Backward, with a = dL/dlogprob, b = dL/dentropy:  dL/dz_j = a (1[j=y] - p_j) - b p_j (z_j - mu),
// rounded to BF16 with BF16 activations (HeadShape::bf16) as it meets W and x in the GPU's GEMMs.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include <omp.h>

#include "rl/numerics/bf16.h"
#include "rl/numerics/fast_exp.h"
#include "cpu/gemm.h"

namespace fp8rl {

constexpr int kVocabChunk = 2048;     // columns of logits computed at a time (fixed: results must not depend on it)
static_assert(kVocabChunk % gemm_detail::NR == 0, "a vocabulary chunk starts at a panel of the packed head");
constexpr long kHeadBufferFloats = 1L << 21;  // logits held at a time: rows per block = this / kVocabChunk

struct HeadShape {
    int V, C;
    float temperature;
    const float* packed = nullptr;  // W packed for gemm_nt_packed when the caller keeps it, else nullptr
    bool bf16 = false;  // BF16 activations: the backward rounds dL/dlogits to BF16, the GPU's GEMM operand
};

inline long head_rows_per_block() { return kHeadBufferFloats / kVocabChunk; }

// Computes logits z [rows, n] = x [rows, C] . W[v0 : v0 + n]^T / temperature (v0 a multiple of
// kVocabChunk; the same bits from W or packed W: cpu/gemm.h computes one FMA chain per output either way).
inline void head_logits_chunk(float* z, const float* x, long rows, const float* W, int v0, int n, HeadShape s) {
    if (s.packed)
        gemm_nt_packed((int)rows, n, s.C, x, s.C, packed_weight_rows(s.packed, s.C, v0), z, n, false);
    else
        gemm_nt((int)rows, n, s.C, x, s.C, W + (long)v0 * s.C, s.C, z, n, false);
    if (s.temperature == 1.0f) return;
#pragma omp parallel for schedule(static)
    for (long i = 0; i < rows * n; i++) z[i] /= s.temperature;
}

// Logits a forward pass keeps for its backward when they fit in this many bytes (a 4096-token
// batch over a 32,000-word vocabulary needs 0.5 GiB); above it the backward recomputes them.
constexpr size_t kSavedLogitsMaxBytes = size_t(1) << 30;

// Scratch of the head: one block of logits, and the running sums of a forward pass in FP64 (sums
// over 10^5 terms in FP32 would lose ~1e-5 relative, the size of the errors we test for; each
// term is an FP32 exp, rl/numerics/fast_exp.h, good to 2 ulp).
struct HeadScratch {
    std::vector<float> logits;   // [head_rows_per_block(), kVocabChunk]
    std::vector<double> sum, sz;  // [head_rows_per_block()]
    std::vector<float> exps;      // [threads, kVocabChunk] one row's exponentials
    std::vector<float> dx_full;   // [head_rows_per_block(), C] a row block's dL/dx from the full chunks (backward)
    // The forward's logits [rows, V] when kept (`saved_rows` > 0), stored chunk by chunk as the
    // passes walk them: (row block, vocabulary chunk) at r0 * V + v0 * (rows in the block).
    std::vector<float> saved;
    long saved_rows = 0;
    size_t max_saved_bytes = kSavedLogitsMaxBytes;

    void reserve() {
        logits.resize((size_t)head_rows_per_block() * kVocabChunk);
        exps.resize((size_t)omp_get_max_threads() * kVocabChunk);
        sum.resize(head_rows_per_block());
        sz.resize(head_rows_per_block());
    }
};

// Forward. x [rows, C]; W [V, C]; target [rows] (-1: no target, logprob left 0).
// Outputs per row: logprob, entropy, and the softmax statistics lse, mu the backward needs.
// for_backward: keep the logits for head_backward when they fit (scratch.max_saved_bytes), which
// then skips recomputing them (the same bits: one GEMM either way). top1 (when given): 1 where the
// target's logit is the row's largest (ties included), else 0 (train/mean_token_accuracy).
inline void head_forward(float* logprob, float* entropy, float* lse, float* mu, const float* x, const float* W,
                         const int32_t* target, long rows, HeadShape s, HeadScratch& scratch, bool for_backward,
                         float* top1 = nullptr) {
    scratch.reserve();
    const size_t all = (size_t)rows * s.V;
    scratch.saved_rows = for_backward && all * sizeof(float) <= scratch.max_saved_bytes ? rows : 0;
    if (scratch.saved_rows && scratch.saved.size() < all) scratch.saved.resize(all);
    const long block = head_rows_per_block();
    for (long r0 = 0; r0 < rows; r0 += block) {
        const long nr = rows - r0 < block ? rows - r0 : block;
        // running state per row: max m (kept in lse), sum exp(z - m), sum exp(z - m) z
        for (long i = 0; i < nr; i++) {
            lse[r0 + i] = -INFINITY;
            logprob[r0 + i] = 0.0f;
            scratch.sum[i] = scratch.sz[i] = 0.0;
        }
        for (int v0 = 0; v0 < s.V; v0 += kVocabChunk) {
            const int n = s.V - v0 < kVocabChunk ? s.V - v0 : kVocabChunk;
            float* const logits = scratch.saved_rows ? scratch.saved.data() + r0 * s.V + (long)v0 * nr
                                                     : scratch.logits.data();
            head_logits_chunk(logits, x + r0 * s.C, nr, W, v0, n, s);
#pragma omp parallel for schedule(static)
            for (long i = 0; i < nr; i++) {
                const float* z = logits + i * n;
                const long r = r0 + i;
                float m = lse[r];
                for (int j = 0; j < n; j++) m = z[j] > m ? z[j] : m;
                double rescale = std::exp((double)lse[r] - m);  // exp(-inf) = 0 on the first chunk
                double sum = scratch.sum[i] * rescale, sz = scratch.sz[i] * rescale;
                float* e = scratch.exps.data() + (long)omp_get_thread_num() * kVocabChunk;
                fast_exp_shifted(e, z, m, n);
                for (int j = 0; j < n; j++) {
                    sum += e[j];
                    sz += (double)e[j] * z[j];
                }
                lse[r] = m;
                scratch.sum[i] = sum;
                scratch.sz[i] = sz;
                int y = target[r] - v0;
                if (y >= 0 && y < n) logprob[r] = z[y];  // z_y for now; lse subtracted at the end
            }
        }
        for (long i = 0; i < nr; i++) {
            const long r = r0 + i;
            double l = lse[r] + std::log(scratch.sum[i]), m = scratch.sz[i] / scratch.sum[i];
            if (top1) top1[r] = target[r] >= 0 && logprob[r] == lse[r] ? 1.0f : 0.0f;  // z_y against the running max
            lse[r] = (float)l;
            mu[r] = (float)m;
            entropy[r] = (float)(l - m);
            logprob[r] = target[r] >= 0 ? (float)(logprob[r] - l) : 0.0f;
        }
    }
}

// Backward. dlogprob, dentropy [rows]; adds dL/dx into dx [rows, C] and dL/dW into dW [V, C].
// dx: per row block, the full chunks' products as ONE chain over their columns in vocabulary order
// (gemm_nn's accumulate continues a chain across chunks, in scratch.dx_full: 8 MiB at C = 2,048,
// whatever V), added to dx once; a narrower last chunk's product added after it: the GPU's fused head
// computes each of the two as one GEMM over its columns with beta = 1 (issue 59: 2 dX GEMMs a block,
// not one a chunk). dW: each chunk's product added, as the GPU's GEMMs with beta = 1.
inline void head_backward(float* dx, float* dW, const float* dlogprob, const float* dentropy, const float* lse,
                          const float* mu, const float* x, const float* W, const int32_t* target, long rows,
                          HeadShape s, HeadScratch& scratch) {
    scratch.reserve();
    float* buffer = scratch.logits.data();
    const long block = head_rows_per_block();
    const float inv_t = 1.0f / s.temperature;
    const int full_cols = s.V / kVocabChunk * kVocabChunk;  // the full chunks' columns
    if (full_cols) scratch.dx_full.resize((size_t)block * s.C);
    for (long r0 = 0; r0 < rows; r0 += block) {
        const long nr = rows - r0 < block ? rows - r0 : block;
        for (int v0 = 0; v0 < s.V; v0 += kVocabChunk) {
            const int n = s.V - v0 < kVocabChunk ? s.V - v0 : kVocabChunk;
            const float* logits = buffer;
            if (scratch.saved_rows == rows)
                logits = scratch.saved.data() + r0 * s.V + (long)v0 * nr;
            else
                head_logits_chunk(buffer, x + r0 * s.C, nr, W, v0, n, s);
#pragma omp parallel for schedule(static)
            for (long i = 0; i < nr; i++) {
                const float* z = logits + i * n;
                float* g = buffer + i * n;  // dL/dlogits (the 1/temperature of dz/dlogits folded in); may alias z
                const long r = r0 + i;
                const float a = dlogprob[r], b = dentropy[r], l = lse[r], m = mu[r];
                float* p = scratch.exps.data() + (long)omp_get_thread_num() * kVocabChunk;
                fast_exp_shifted(p, z, l, n);
                for (int j = 0; j < n; j++) g[j] = (-a * p[j] - b * p[j] * (z[j] - m)) * inv_t;
                int y = target[r] - v0;
                if (y >= 0 && y < n) g[y] += a * inv_t;
                if (s.bf16)
                    for (int j = 0; j < n; j++) g[j] = round_bf16(g[j]);
            }
            if (n == kVocabChunk) {  // the chain of the full chunks' product continued, added after the last of them
                gemm_nn((int)nr, s.C, n, buffer, n, W + (long)v0 * s.C, s.C, scratch.dx_full.data(), s.C, v0 > 0);
                if (v0 + n == full_cols) add_product((int)nr, s.C, dx + r0 * s.C, s.C, scratch.dx_full);
            } else {
                gemm_nn_then_add((int)nr, s.C, n, buffer, n, W + (long)v0 * s.C, s.C, dx + r0 * s.C, s.C);
            }
            gemm_tn_then_add(n, s.C, (int)nr, buffer, n, x + r0 * s.C, s.C, dW + (long)v0 * s.C, s.C);
        }
    }
}

}  // namespace fp8rl
