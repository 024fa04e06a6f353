// loss.cuh: the language-model head fused with the per-token log-probability and entropy at
// temperature T, forward and backward, as a fused linear cross-entropy head (Liger's FLCE, Apple's
// Cut Cross-Entropy; spec-gpu.md §3.5), two ways:
//   forward_backward  the training step's (Engine::forward_backward_train): token blocks of
//       HEAD_FUSED_TOKEN_BLOCK = 1,024 (the CPU head's row block), each block's logits computed ONCE
//       for the whole vocabulary into one workspace (1,024 x V FP32: 622 MB at V = 151,936), its
//       rows' statistics, then the loss's gradients of those rows (asked of the caller: they depend
//       on each token's log-prob and entropy and on what is known before the forward), then the
//       block's dlogits in one launch (BF16, in place over its logits), one dX GEMM and one dW GEMM
//       over the full chunks' columns (and one each over a narrower last chunk's); none recomputed.
//   forward / backward  the passes without a known gradient (old, reference and shadow log-probs;
//       a loss whose gradient needs a whole sequence first): tiles of (HEAD_TOKEN_BLOCK = 16,384
//       tokens) x (2,048 columns) in a workspace every tile reuses, the backward computing each
//       tile's logits again. 1,024-token tiles would stay in L2; the performance model prices them
//       slower (16x the launches cost more than L2 saves passes their instructions bound).
// Both give the same bits from the same token blocks (the logits are one chain over C each,
// whichever GEMM computes them). It is the GPU twin of cpu/logprob_head.h, the oracle, and
// follows its math and operation order:
//   per token t (final hidden state x[t], target y[t] or -1), z = (W x[t]) / T:
//   logZ = max + log sum_j exp(z_j - max),  mu = sum_j p_j z_j,  entropy = logZ - mu,
//   logprob = z_y - logZ;  backward with a = dL/dlogprob, b = dL/dentropy:
//   dL/dlogits_j = (a (1[j = y] - p_j) - b p_j (z_j - mu)) / T,  dX += dlogits W,  dW += dlogits^T X.
// The running max, sum exp and sum z exp of a token are merged chunk by chunk in vocabulary order
// (an online log-sum-exp; sums in double, each term rl/numerics/fast_exp.h's FP32 exp, as on the
// CPU). dW's sum over tokens is a block's product, then its add (beta = 1): with blocks of 1,024,
// the CPU head's row blocks (head_rows_per_block()), it splits where the CPU's does. dX's sum over
// the vocabulary: forward_backward's is one chain over the full chunks' columns, added, then the last
// chunk's, as the CPU head's; backward's tiles add each chunk's product (the same bits where the
// vocabulary has at most one full chunk; within gpu_head_backward_matches_cpu's bound otherwise).
// Precision (DESIGN.md §3): X and W are BF16, logits FP32 (GemmRunner's BF16 GEMM with FP32
// output), statistics FP32/FP64, dX and dW accumulate in FP32; dlogits enter the backward GEMMs
// rounded to BF16 (the tensor-core operand type), as the CPU engine rounds them with BF16
// activations (HeadShape::bf16).
//
// The loops of forward / backward: vocabulary chunks outside (a chunk's W rows, and in the backward
// its dW rows, stay in L2 while the token blocks pass), token blocks inside; of forward_backward
// the other way round (the block's logits, X and dX rows are what stays). The GEMMs of a tile (GemmRunner's BF16
// layouts, D [n][m]; m and k multiples of 8, n too for NT), with Tb the block's tokens:
//   logits [Tb][n8]  = X [Tb][C] . Wc [n8][C]^T          TN  m = n8, n = Tb,  k = C
//   dX     [Tb][C]  += dlogits [Tb][n8] . Wc [n8][C]     NN  m = C,  n = Tb,  k = n8
//   dWc    [n8][C]  += dlogits [Tb8][n8]^T . X [Tb8][C]  NT  m = C,  n = n8,  k = Tb8
// with Wc the chunk's n rows of W (forward_backward's dX and dW GEMMs: all the full chunks' rows at
// once, k or n = their columns; its dlogits are the block's, read at their row stride),
// n8 = n rounded up to 8 and Tb8 = Tb rounded up to 8; dX and dW
// accumulate in the GEMMs (beta = 1). C must be a multiple of 8 (every model's hidden size is a
// multiple of 128). The padding the rules still force, all zero: the last chunk's Wc gets n8 - n
// rows when n is not a multiple of 8 (m of logits, k of dX), and for the NT GEMM the last block's
// X and dlogits get Tb8 - Tb rows (k) and the last chunk's dW rows are staged in an n8-row copy (n).
#ifndef FP8RL_LOSS_CUH
#define FP8RL_LOSS_CUH
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "cuda/element.cuh"
#include "cuda/kernels/block_reduce.cuh"
#include "cuda/engine/device_array.cuh"
#include "fp8_gemm.cuh"
#include "rl/numerics/bf16.h"
#include "rl/numerics/fast_exp.h"

namespace fp8rl {

constexpr int HEAD_VOCAB_CHUNK = 2048;  // columns of logits at a time (cpu/logprob_head.h's kVocabChunk)
constexpr int HEAD_TOKEN_BLOCK = 16384;  // tokens of logits at a time (see above: 1,024 is the L2-resident tile)
// tokens of the fused head's blocks (forward_backward), whose logits span the whole vocabulary:
// the CPU head's row block (head_rows_per_block()), where its dW sums split
constexpr int HEAD_FUSED_TOKEN_BLOCK = 1024;
constexpr int HEAD_THREADS = 256;       // one block per token row of a chunk
constexpr int HEAD_LOADS = 8;           // a thread's columns of a chunk (2,048 = 256 x 8), loaded at once
// chunks head_row_stats_kernel merges a pass (issue 59): their loads issued together, their maxima
// and sums reduced together (8 take 144 registers and a stack frame)
constexpr int HEAD_ROW_CHUNKS_IN_FLIGHT = 4;

inline int round_up8(int n) { return (n + 7) / 8 * 8; }

// A token's softmax state over the vocabulary chunks merged so far: the running max, sum
// exp(z - max) and sum z exp(z - max), and z at the target (every thread of the row's block holds it).
struct HeadRowState {
    float max;
    double sum, sz;
    float z_target;
};

// Loads a thread's logits of one chunk's n <= HEAD_THREADS x HEAD_LOADS columns `row`: its columns
// j = threadIdx.x + u HEAD_THREADS, all issued before the first is used (the loads in flight).
// kFull: n is HEAD_THREADS x HEAD_LOADS (every thread's columns in the chunk: no column tests).
template <bool kFull = false>
__device__ __forceinline__ void head_load_chunk(float (&z)[HEAD_LOADS], const float* row, int n) {
    FP8RL_UNROLL
    for (int u = 0; u < HEAD_LOADS; u++) {
        const int j = threadIdx.x + u * HEAD_THREADS;
        z[u] = kFull || j < n ? row[j] : 0.0f;
    }
}

// Merges one chunk's n <= HEAD_THREADS x HEAD_LOADS logits `row` (vocabulary v0 ..), the thread's
// z[] of them from head_load_chunk, into a token's state, the block's HEAD_THREADS threads together.
// first: the chunk at v0 = 0 starts the sums. kDivide false: temperature is 1 and the logits are not
// divided by it, as the CPU head skips it (IEEE division by 1 is exact: the same bits, 8 fewer
// divisions a thread a chunk). kFull: as head_load_chunk's. The logits are read once for both
// passes; the operations in the order of a loop over j.
template <bool kDivide = true, bool kFull = false>
__device__ __forceinline__ void head_merge_loaded(HeadRowState& s, float (&z)[HEAD_LOADS], const float* row, int n,
                                                  int v0, float temperature, int32_t target, bool first) {
    float chunk_max = -INFINITY;
    FP8RL_UNROLL
    for (int u = 0; u < HEAD_LOADS; u++)
        if (kFull || (int)threadIdx.x + u * HEAD_THREADS < n) {
            if (kDivide) z[u] = __fdiv_rn(z[u], temperature);
            chunk_max = MaxOp()(chunk_max, z[u]);
        }
    chunk_max = block_reduce(chunk_max, MaxOp());
    const float old_max = first ? -INFINITY : s.max;
    const float m = MaxOp()(old_max, chunk_max);
    double sum = 0.0, sz = 0.0;
    FP8RL_UNROLL
    for (int u = 0; u < HEAD_LOADS; u++)
        if (kFull || (int)threadIdx.x + u * HEAD_THREADS < n) {
            const float e = fast_exp(z[u] - m);
            sum += e;
            sz += (double)e * z[u];
        }
    sum = block_reduce(sum, SumOp());
    sz = block_reduce(sz, SumOp());
    const double rescale = exp((double)old_max - m);  // exp(-inf) = 0 on the first chunk
    s.sum = (first ? 0.0 : s.sum) * rescale + sum;
    s.sz = (first ? 0.0 : s.sz) * rescale + sz;
    s.max = m;
    if (first) s.z_target = 0.0f;
    const int y = target - v0;
    if (y >= 0 && y < n) s.z_target = kDivide ? __fdiv_rn(row[y], temperature) : row[y];
}

// head_load_chunk, then head_merge_loaded: one chunk's loads in flight at a time.
template <bool kDivide = true, bool kFull = false>
__device__ __forceinline__ void head_merge_chunk(HeadRowState& s, const float* row, int n, int v0, float temperature,
                                                 int32_t target, bool first) {
    float z[HEAD_LOADS];
    head_load_chunk<kFull>(z, row, n);
    head_merge_loaded<kDivide, kFull>(s, z, row, n, v0, temperature, target, first);
}

// logZ, mu, entropy and logprob of token t from its merged state (cpu/logprob_head.h's last loop).
__device__ __forceinline__ void head_finish_row(const HeadRowState& s, int t, const int32_t* target, float* logprob,
                                                float* entropy, float* lse, float* mu) {
    const double l = s.max + log(s.sum), m = s.sz / s.sum;
    lse[t] = (float)l;
    mu[t] = (float)m;
    entropy[t] = (float)(l - m);
    logprob[t] = target[t] >= 0 ? (float)(s.z_target - l) : 0.0f;
}

// One tile of the forward: logits [T][ld] (a token block's T rows, the chunk's n columns starting
// at vocabulary index v0) merged into each token's running state, kept in memory between tiles.
static __global__ void __launch_bounds__(HEAD_THREADS)
    head_chunk_stats_kernel(const float* logits, int ld, int n, int v0, float temperature, const int32_t* target,
                            bool first, float* run_max, double* run_sum, double* run_sz, float* z_target) {
    const int t = blockIdx.x;
    HeadRowState s{};
    if (!first) s = {run_max[t], run_sum[t], run_sz[t], z_target[t]};
    head_merge_chunk(s, logits + (size_t)t * ld, n, v0, temperature, target[t], first);
    if (threadIdx.x != 0) return;
    run_sum[t] = s.sum, run_sz[t] = s.sz, run_max[t] = s.max, z_target[t] = s.z_target;
}

// logZ, mu, entropy and logprob per token [T] from the merged sums.
static __global__ void head_finish_kernel(int T, const int32_t* target, const float* run_max, const double* run_sum,
                                   const double* run_sz, const float* z_target, float* logprob, float* entropy,
                                   float* lse, float* mu) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) return;
    head_finish_row({run_max[t], run_sum[t], run_sz[t], z_target[t]}, t, target, logprob, entropy, lse, mu);
}

// The fused head's statistics merge a row's chunks HEAD_ROW_CHUNKS_IN_FLIGHT at a time (a pass):
// the pass's loads issued together, then its chunks' maxima in one block reduction (each value
// through block_reduce's tree: the warp's butterfly, then the warps' in order), then every chunk's
// exponentials with the running max after that chunk, then the warps' sums of all its chunks in one
// butterfly (warp_reduce_spread: warp_reduce's bits) and written for warp 0, which combines them in
// warp order and merges them chunk by chunk in vocabulary order after the NEXT pass's barrier (or the
// row's last one): the operations and order of head_merge_loaded, one barrier a pass where it takes
// 6 a chunk. The shared memory the block exchanges, double-buffered by the pass's parity: a pass
// writes one half while warp 0 reads the previous pass's sums from the other.
constexpr int HEAD_WARPS = HEAD_THREADS / 32;
constexpr int HEAD_PASS_SUMS = 2 * HEAD_ROW_CHUNKS_IN_FLIGHT;  // a chunk's sum exp and sum z exp
struct HeadPassExchange {
    float max[2][HEAD_WARPS][HEAD_ROW_CHUNKS_IN_FLIGHT];  // each warp's max of each chunk of the pass
    double sums[2][HEAD_WARPS][HEAD_PASS_SUMS];          // each warp's sum exp, sum z exp of each chunk
};

// A row's state between passes: the running max (every thread); warp 0's merged sums (lane 0 sum
// exp(z - max), lane 1 sum z exp(z - max)); the pass whose sums are still to merge: its running max
// before its chunks (pending_max[0]) and after each, its chunk count (0: none), whether it starts the row.
struct HeadRowPasses {
    float max = -INFINITY;
    double merged = 0.0;
    float pending_max[HEAD_ROW_CHUNKS_IN_FLIGHT + 1];
    int pending = 0, parity = 0;
    bool pending_first = false;
};

// Warp 0, every lane: merges the pending pass's sums (sums: the warps' of its chunks) into the row's
// sums: head_merge_loaded's s.sum = s.sum rescale + sum of each chunk in order, its block sums in
// warp order, its rescale exp(old max - max); lane k < HEAD_PASS_SUMS combines value k, lane c <
// HEAD_ROW_CHUNKS_IN_FLIGHT computes chunk c's rescale.
__device__ __forceinline__ void head_merge_pending(HeadRowPasses& s, const double (&sums)[HEAD_WARPS][HEAD_PASS_SUMS]) {
    if (!s.pending) return;
    const int lane = threadIdx.x % 32, k = lane % HEAD_PASS_SUMS, c = lane % HEAD_ROW_CHUNKS_IN_FLIGHT;
    double sum = sums[0][k];
    FP8RL_UNROLL
    for (int w = 1; w < HEAD_WARPS; w++) sum = SumOp()(sum, sums[w][k]);
    float old_max = s.pending_max[0], max = s.pending_max[1];
    FP8RL_UNROLL
    for (int i = 1; i < HEAD_ROW_CHUNKS_IN_FLIGHT; i++)
        if (c == i) old_max = s.pending_max[i], max = s.pending_max[i + 1];
    const double rescale = exp((double)old_max - max);  // exp(-inf) = 0 on the row's first chunk
    FP8RL_UNROLL
    for (int i = 0; i < HEAD_ROW_CHUNKS_IN_FLIGHT; i++) {
        if (i >= s.pending) break;
        const double chunk_rescale = __shfl_sync(0xFFFFFFFFu, rescale, i);
        const double chunk_sum = __shfl_sync(0xFFFFFFFFu, sum, 2 * i + lane % 2);
        s.merged = (s.pending_first && i == 0 ? 0.0 : s.merged) * chunk_rescale + chunk_sum;
    }
    s.pending = 0;
}

// One pass over the HEAD_ROW_CHUNKS_IN_FLIGHT chunks of `chunk` columns from vocabulary v0 of a row
// whose first main_cols columns are main_row's and the rest tail_row's (a chunk past V: none).
// kFull: every chunk full and in main_row (no column tests); kDivide: as head_merge_loaded's.
template <bool kDivide, bool kFull>
__device__ __forceinline__ void head_row_pass(HeadRowPasses& s, HeadPassExchange& x, const float* main_row, int main_cols,
                                              const float* tail_row, int V, int chunk, int v0, float temperature) {
    constexpr int kChunks = HEAD_ROW_CHUNKS_IN_FLIGHT;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, b = s.parity;
    float z[kChunks][HEAD_LOADS];
    int n[kChunks];
    FP8RL_UNROLL
    for (int c = 0; c < kChunks; c++) {
        const int vc = v0 + c * chunk;
        n[c] = kFull ? chunk : max(0, min(chunk, V - vc));
        head_load_chunk<kFull>(z[c], kFull || vc < main_cols ? main_row + vc : tail_row, n[c]);
    }
    auto in_chunk = [&](int c, int u) { return kFull || (int)threadIdx.x + u * HEAD_THREADS < n[c]; };
    float chunk_max[kChunks];
    FP8RL_UNROLL
    for (int c = 0; c < kChunks; c++) {
        chunk_max[c] = -INFINITY;
        FP8RL_UNROLL
        for (int u = 0; u < HEAD_LOADS; u++)
            if (in_chunk(c, u)) {
                if (kDivide) z[c][u] = __fdiv_rn(z[c][u], temperature);
                chunk_max[c] = MaxOp()(chunk_max[c], z[c][u]);
            }
        chunk_max[c] = warp_reduce(chunk_max[c], MaxOp());
    }
    if (lane == 0) {
        FP8RL_UNROLL
        for (int c = 0; c < kChunks; c++) x.max[b][warp][c] = chunk_max[c];
    }
    __syncthreads();  // this pass's maxima written; every warp's sums of the previous pass too
    if (warp == 0) head_merge_pending(s, x.sums[b ^ 1]);
    // the running max after each chunk (a chunk past V: -inf, which leaves it)
    s.pending_max[0] = v0 == 0 ? -INFINITY : s.max;
    FP8RL_UNROLL
    for (int c = 0; c < kChunks; c++) {
        float m = x.max[b][0][c];
        FP8RL_UNROLL
        for (int w = 1; w < HEAD_WARPS; w++) m = MaxOp()(m, x.max[b][w][c]);
        s.pending_max[c + 1] = MaxOp()(s.pending_max[c], m);
    }
    double sums[HEAD_PASS_SUMS];
    FP8RL_UNROLL
    for (int c = 0; c < kChunks; c++) {
        double sum = 0.0, sz = 0.0;
        FP8RL_UNROLL
        for (int u = 0; u < HEAD_LOADS; u++)
            if (in_chunk(c, u)) {
                // fast_exp's bits: z - max <= 0 (or NaN), within fast_exp_unbranched's domain
                const float e = fast_exp_unbranched(z[c][u] - s.pending_max[c + 1]);
                sum += e;
                sz += (double)e * z[c][u];
            }
        sums[2 * c] = sum, sums[2 * c + 1] = sz;
    }
    const double warp_sum = warp_reduce_spread(sums, SumOp());  // value lane / (32 / HEAD_PASS_SUMS)
    if (lane % (32 / HEAD_PASS_SUMS) == 0) x.sums[b][warp][lane / (32 / HEAD_PASS_SUMS)] = warp_sum;
    s.max = s.pending_max[kChunks];
    s.pending = kFull ? kChunks : min(kChunks, (V - v0 + chunk - 1) / chunk);
    s.pending_first = v0 == 0;
    s.parity = b ^ 1;
}

// The fused head's forward of a token block, one block per row: the row's whole vocabulary of
// logits, chunk by chunk in vocabulary order (the same merges as head_chunk_stats_kernel's tiles, in
// passes: head_row_pass), then its statistics. The first main_cols columns are in `main`
// [T][main_cols], the rest (a last chunk narrower than the others) in `tail` [T][tail_ld]. Keeps the
// running max and the target's logit (top1) besides. kDivide: as head_merge_chunk's (false only at
// temperature 1).
template <bool kDivide>
static __global__ void __launch_bounds__(HEAD_THREADS)
    head_row_stats_kernel(const float* main, int main_cols, const float* tail, int tail_ld, int V, int chunk,
                          float temperature, const int32_t* target, float* run_max, float* z_target, float* logprob,
                          float* entropy, float* lse, float* mu) {
    STATIC_SHARED(HeadPassExchange, exchange, [1]);
    const int t = blockIdx.x, pass_cols = HEAD_ROW_CHUNKS_IN_FLIGHT * chunk;
    const float* main_row = main + (size_t)t * main_cols;
    const float* tail_row = tail + (size_t)t * tail_ld;
    HeadRowPasses s;
    int v0 = 0;
    if (chunk == HEAD_THREADS * HEAD_LOADS)  // HEAD_VOCAB_CHUNK's full chunks without column tests
        for (; v0 + pass_cols <= main_cols; v0 += pass_cols)
            head_row_pass<kDivide, true>(s, exchange[0], main_row, main_cols, tail_row, V, chunk, v0, temperature);
    for (; v0 < V; v0 += pass_cols)
        head_row_pass<kDivide, false>(s, exchange[0], main_row, main_cols, tail_row, V, chunk, v0, temperature);
    __syncthreads();  // the last pass's sums written
    if (threadIdx.x >= 32) return;
    head_merge_pending(s, exchange[0].sums[s.parity ^ 1]);
    const double sz = __shfl_sync(0xFFFFFFFFu, s.merged, 1);
    if (threadIdx.x != 0) return;
    // the target's logit (0 without one), as the merge of its chunk keeps it
    const int y = target[t];
    float zy = 0.0f;
    if (y >= 0 && y < V) {
        zy = y < main_cols ? main_row[y] : tail_row[y - main_cols];
        if (kDivide) zy = __fdiv_rn(zy, temperature);
    }
    const HeadRowState row{s.max, s.merged, sz, zy};
    run_max[t] = row.max, z_target[t] = row.z_target;
    head_finish_row(row, t, target, logprob, entropy, lse, mu);
}

// dlogits (BF16) of a token block's rows over the vocabulary columns [v_begin, v_end), one launch,
// written IN PLACE over their logits: one block per row t < T8, chunk by chunk. Columns below
// main_cols are in main [T8][main_cols], the others (one chunk of at most `chunk` columns) in tail
// [T8][tail_ld] from its column 0 (forward_backward: main the full chunks' logits of the whole
// vocabulary, tail the last chunk's; backward: one tile, main_cols 0). A row's dlogits are BF16 over
// the first half of its FP32 row, at the chunk's column (a row stride of 2 main_cols, or 2 tail_ld,
// BF16): chunk c's stores land on FP32 columns [c chunk / 2, (c + 1) chunk / 2) of the row, chunk
// c / 2's, which this block read in that chunk's pass, before a barrier every thread passed. So each
// chunk: its loads (16 bytes, all issued before the first is used), a barrier, its stores.
// The n columns of rows t < T get dL/dlogits in cpu/logprob_head.h's operation order (products
// unfused), the padding columns and rows t >= T get 0 (the dX and dW GEMMs' k).
static __global__ void __launch_bounds__(HEAD_THREADS)
    head_dlogits_kernel(float* main, int main_cols, float* tail, int tail_ld, int T, int v_begin, int v_end, int chunk,
                        float temperature, const int32_t* target, const float* dlogprob, const float* dentropy,
                        const float* lse, const float* mu) {
    constexpr int kQuads = HEAD_LOADS / 4;  // a thread's groups of 4 adjacent columns of a chunk
    const int t = blockIdx.x;
    for (int v0 = v_begin; v0 < v_end; v0 += chunk) {
        const bool in_main = v0 < main_cols;
        float* z = in_main ? main + (size_t)t * main_cols + v0 : tail + (size_t)t * tail_ld;
        __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(in_main ? main + (size_t)t * main_cols : z) + (in_main ? v0 : 0);
        const int n = min(chunk, v_end - v0), ld = (n + 7) / 8 * 8;
        if (t >= T) {
            for (int q = threadIdx.x; q < ld / 4; q += HEAD_THREADS) store_vector<uint2>(out + 4 * q, make_uint2(0, 0));
            continue;
        }
        float4 z4[kQuads];
        FP8RL_UNROLL
        for (int u = 0; u < kQuads; u++) {
            const int q = threadIdx.x + u * HEAD_THREADS;
            if (4 * q < ld) z4[u] = load_vector_written<float4>(z + 4 * q);
        }
        __syncthreads();  // every thread's loads of this chunk before any store over it
        const float a = dlogprob[t], b = dentropy[t], l = lse[t], m = mu[t], inv_t = 1.0f / temperature;
        const int y = target[t] - v0;
        FP8RL_UNROLL
        for (int u = 0; u < kQuads; u++) {
            const int q = threadIdx.x + u * HEAD_THREADS;
            if (4 * q >= ld) continue;
            const float v[4] = {z4[u].x, z4[u].y, z4[u].z, z4[u].w};
            uint32_t bits[4];
            for (int e = 0; e < 4; e++) {
                const int j = 4 * q + e;
                float g = 0.0f;
                if (j < n) {
                    const float zj = __fdiv_rn(v[e], temperature), p = fast_exp(zj - l);
                    g = mul_rn(mul_rn(-a, p) - mul_rn(mul_rn(b, p), zj - m), inv_t);
                    if (j == y) g += mul_rn(a, inv_t);
                }
                bits[e] = float_to_bf16(g);
            }
            store_vector<uint2>(out + 4 * q, make_uint2(bits[0] | bits[1] << 16, bits[2] | bits[3] << 16));
        }
    }
}

// A device array that grows to the largest size asked for (the head's scratch).
template <class T>
class DeviceScratch {
  public:
    T* get(size_t count) {
        if (count > array_.size()) array_.resize(count, "LM head scratch");
        return array_.get();
    }
    void release() { array_.release(); }

  private:
    DeviceArray<T> array_;
};

struct HeadGpuShape {
    int V, C;  // vocabulary, hidden size (a multiple of 8)
    float temperature;
};

// The head on one device. Owns its scratch: one tile of FP32 logits and of BF16 dlogits (the
// L2-resident workspace), the padded copies (the last chunk of W and of dW, the last token block
// of X), and per token the running max, the two running sums and the target's logit.
class LogprobHeadGpu {
  public:
    explicit LogprobHeadGpu(GemmRunner& gemm, int vocab_chunk = HEAD_VOCAB_CHUNK, int token_block = HEAD_TOKEN_BLOCK,
                            int fused_block = HEAD_FUSED_TOKEN_BLOCK)
        : gemm_(gemm), chunk_(vocab_chunk), block_(token_block), fused_block_(fused_block) {
        if (vocab_chunk <= 0 || vocab_chunk % 8 || vocab_chunk > HEAD_THREADS * HEAD_LOADS)
            fail("LogprobHeadGpu: vocabulary chunk %d must be a positive multiple of 8, at most %d (a row's block holds "
                 "a chunk in registers)", vocab_chunk, HEAD_THREADS * HEAD_LOADS);
        if (token_block <= 0 || token_block % 8)
            fail("LogprobHeadGpu: token block %d must be a positive multiple of 8 (only the last block is padded)",
                 token_block);
        if (fused_block <= 0 || fused_block % 8)
            fail("LogprobHeadGpu: fused token block %d must be a positive multiple of 8 (only the last block is padded)",
                 fused_block);
    }

    // Forward. x [T][C], W [V][C] (BF16, device); target [T] (-1: none, logprob 0). Writes per token
    // [T]: logprob, entropy, and the softmax statistics lse, mu that backward reads.
    void forward(float* logprob, float* entropy, float* lse, float* mu, const __nv_bfloat16* x, const __nv_bfloat16* W,
                 const int32_t* target, int T, HeadGpuShape s, cudaStream_t stream) {
        check_shape("LogprobHeadGpu::forward", T, s);
        float* run_max = run_max_.get(T);
        float* z_target = z_target_.get(T);
        double* run_sum = run_sum_.get(T);
        double* run_sz = run_sz_.get(T);
        for (int v0 = 0; v0 < s.V; v0 += chunk_) {
            const int n = std::min(chunk_, s.V - v0), ld = round_up8(n);
            const __nv_bfloat16* rows = chunk_rows(W, v0, n, s, stream);  // [ld][C]
            for (int t0 = 0; t0 < T; t0 += block_) {
                const int tb = std::min(block_, T - t0);
                const float* logits = tile_logits(x + (size_t)t0 * s.C, rows, tb, n, s, stream);
                LAUNCH_KERNEL(head_chunk_stats_kernel, tb, HEAD_THREADS, 0, stream, logits, ld, n, v0, s.temperature,
                              target + t0, v0 == 0, run_max + t0, run_sum + t0, run_sz + t0, z_target + t0);
            }
        }
        LAUNCH_KERNEL(head_finish_kernel, (T + 255) / 256, 256, 0, stream, T, target, (const float*)run_max,
                      (const double*)run_sum, (const double*)run_sz, (const float*)z_target, logprob, entropy, lse, mu);
    }

    // Backward of forward (same x, W, target, shape). dlogprob, dentropy, lse, mu [T]; adds dL/dx
    // into dx [T][C] and dL/dW into dW [V][C] (FP32, device). A row without a target must come with
    // dlogprob 0 (its log-prob is the constant 0), as the CPU engine passes it.
    void backward(float* dx, float* dW, const float* dlogprob, const float* dentropy, const float* lse, const float* mu,
                  const __nv_bfloat16* x, const __nv_bfloat16* W, const int32_t* target, int T, HeadGpuShape s,
                  cudaStream_t stream) {
        check_shape("LogprobHeadGpu::backward", T, s);
        const int C = s.C, last0 = (T - 1) / block_ * block_, last_tb = T - last0;
        const __nv_bfloat16* x_last = x + (size_t)last0 * C;  // [Tb8][C] for the NT GEMM's k
        if (last_tb % 8) x_last = padded_rows(x_last, last_tb, C, stream);
        for (int v0 = 0; v0 < s.V; v0 += chunk_) {
            const int n = std::min(chunk_, s.V - v0), ld = round_up8(n);
            const __nv_bfloat16* rows = chunk_rows(W, v0, n, s, stream);  // [ld][C]
            for (int t0 = 0; t0 < T; t0 += block_) {
                const int tb = std::min(block_, T - t0), tb8 = round_up8(tb);
                float* logits = tile_logits(x + (size_t)t0 * C, rows, tb, n, s, stream);
                // the tile's dlogits [tb8][ld] over its logits, at a row stride of 2 ld
                LAUNCH_KERNEL(head_dlogits_kernel, tb8, HEAD_THREADS, 0, stream, (float*)nullptr, 0, logits, ld, tb, v0,
                              v0 + n, chunk_, s.temperature, target + t0, dlogprob + t0, dentropy + t0, lse + t0, mu + t0);
                const __nv_bfloat16* dlogits = reinterpret_cast<const __nv_bfloat16*>(logits);
                gemm_.bf16("head dX", C, tb, ld, rows, dlogits, dx + (size_t)t0 * C, GemmOut::F32, stream, GemmOps::NN, true,
                           2 * ld);
                dw_gemm(dW, v0, n, t0 == last0 ? x_last : x + (size_t)t0 * C, tb8, dlogits, C, stream, 2 * ld);
            }
        }
    }

    // The fused head (the training step's): forward and backward in one pass over token blocks of
    // fused_block tokens, each block's logits computed once, for the whole vocabulary, and kept until
    // its backward has read them. Per block: the logits GEMM(s), the rows' statistics (logprob,
    // entropy, lse, mu [T] written as forward writes them), then token_grads(t0, tb), which must
    // write dlogprob and dentropy of rows [t0, t0 + tb) (device, ordered on `stream`) from the
    // block's logprob and entropy, then the block's dlogits in one launch (in place over its logits),
    // the dX GEMM and the dW GEMM over the full chunks' columns, then over a narrower last chunk's.
    // The logits, statistics and dW take the operations of forward and backward (the logits are the
    // same bits whichever GEMM computes them: one chain over C each; a dW element is one chain over
    // the block's tokens whichever GEMM's n it is in, as no GEMM splits k), so they change no bit of
    // theirs with token_block = fused_block; dW's sums split at the token blocks, as the CPU head's do
    // at its row blocks (head_rows_per_block(), HEAD_FUSED_TOKEN_BLOCK). dX is a block's one chain
    // over the full chunks' columns (k = their count), added (beta = 1), then the last chunk's: the
    // CPU head's order (cpu/logprob_head.h, issue 59), 2 GEMMs a block where backward's tiles run one
    // a chunk and add each (their bits differ once the vocabulary has 2 full chunks).
    // Workspace: round_up8(fused_block) x V logits (FP32), whose first halves then hold the dlogits.
    using TokenGrads = std::function<void(int t0, int tb)>;
    void forward_backward(float* logprob, float* entropy, float* lse, float* mu, float* dlogprob, float* dentropy,
                          float* dx, float* dW, const __nv_bfloat16* x, const __nv_bfloat16* W, const int32_t* target,
                          int T, HeadGpuShape s, const TokenGrads& token_grads, cudaStream_t stream) {
        check_shape("LogprobHeadGpu::forward_backward", T, s);
        const int C = s.C, fb = fused_block_, rows8 = round_up8(std::min(fb, T));
        // the full chunks' columns by one GEMM into main [tb8][main_cols]; a narrower last chunk's into tail
        const int main_cols = s.V / chunk_ * chunk_, tail_n = s.V - main_cols, tail_ld = round_up8(tail_n);
        float* main = logits_.get((size_t)rows8 * (main_cols + tail_ld));
        float* tail = main + (size_t)rows8 * main_cols;
        // the dlogits over them: [tb8][main_cols] at a row stride of 2 main_cols, [tb8][tail_ld] at 2 tail_ld
        const __nv_bfloat16* dmain = reinterpret_cast<const __nv_bfloat16*>(main);
        const __nv_bfloat16* dtail = reinterpret_cast<const __nv_bfloat16*>(tail);
        float* run_max = run_max_.get(T);
        float* z_target = z_target_.get(T);
        const __nv_bfloat16* tail_rows = tail_n ? chunk_rows(W, main_cols, tail_n, s, stream) : nullptr;  // [tail_ld][C]
        const auto head_row_stats = s.temperature == 1.0f ? head_row_stats_kernel<false> : head_row_stats_kernel<true>;
        for (int t0 = 0; t0 < T; t0 += fb) {
            const int tb = std::min(fb, T - t0), tb8 = round_up8(tb);
            const __nv_bfloat16* xb = x + (size_t)t0 * C;
            if (main_cols) gemm_.bf16("head logits", main_cols, tb, C, W, xb, main, GemmOut::F32, stream);
            if (tail_n) gemm_.bf16("head logits", tail_ld, tb, C, tail_rows, xb, tail, GemmOut::F32, stream);
            LAUNCH_KERNEL(head_row_stats, tb, HEAD_THREADS, 0, stream, (const float*)main, main_cols,
                          (const float*)tail, tail_ld, s.V, chunk_, s.temperature, target + t0, run_max + t0,
                          z_target + t0, logprob + t0, entropy + t0, lse + t0, mu + t0);
            token_grads(t0, tb);
            LAUNCH_KERNEL(head_dlogits_kernel, tb8, HEAD_THREADS, 0, stream, main, main_cols, tail, tail_ld, tb, 0, s.V,
                          chunk_, s.temperature, target + t0, (const float*)dlogprob + t0, (const float*)dentropy + t0,
                          (const float*)lse + t0, (const float*)mu + t0);
            // dX [tb][C] += dlogits [tb][main_cols] . W [main_cols][C], then the last chunk's
            if (main_cols)
                gemm_.bf16("head dX", C, tb, main_cols, W, dmain, dx + (size_t)t0 * C, GemmOut::F32, stream, GemmOps::NN,
                           true, 2 * main_cols);
            if (tail_n)
                gemm_.bf16("head dX", C, tb, tail_ld, tail_rows, dtail, dx + (size_t)t0 * C, GemmOut::F32, stream,
                           GemmOps::NN, true, 2 * tail_ld);
            // the block's X [tb8][C] with its padding rows zero (the NT GEMM's k)
            const __nv_bfloat16* x8 = tb % 8 ? padded_rows(xb, tb, C, stream) : xb;
            if (main_cols)
                gemm_.bf16("head dW", C, main_cols, tb8, x8, dmain, dW, GemmOut::F32, stream, GemmOps::NT, true,
                           2 * main_cols);
            if (tail_n) dw_gemm(dW, main_cols, tail_n, x8, tb8, dtail, C, stream, 2 * tail_ld);
        }
    }

    // After forward (target [T] its targets): per token, on the host, 1 where the target's logit is
    // the row's largest (ties included), else 0: cpu/logprob_head.h's top1, from the running max and
    // the target's logit that forward kept.
    std::vector<float> top1(const int32_t* target, int T, cudaStream_t stream) {
        std::vector<float> max((size_t)T), z((size_t)T), out((size_t)T);
        std::vector<int32_t> y((size_t)T);
        CUDA_CHECK(cudaMemcpyAsync(max.data(), run_max_.get(T), T * sizeof(float), cudaMemcpyDeviceToHost, stream));
        CUDA_CHECK(cudaMemcpyAsync(z.data(), z_target_.get(T), T * sizeof(float), cudaMemcpyDeviceToHost, stream));
        CUDA_CHECK(cudaMemcpyAsync(y.data(), target, T * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
        CUDA_CHECK(cudaStreamSynchronize(stream));
        for (int t = 0; t < T; t++) out[(size_t)t] = y[(size_t)t] >= 0 && z[(size_t)t] == max[(size_t)t] ? 1.0f : 0.0f;
        return out;
    }

    // Frees the scratch (the rollout phase: GpuEngine::enter_phase); the next pass allocates it again.
    void release() {
        for (DeviceScratch<float>* a : {&logits_, &dw_pad_, &run_max_, &z_target_}) a->release();
        for (DeviceScratch<double>* a : {&run_sum_, &run_sz_}) a->release();
        for (DeviceScratch<__nv_bfloat16>* a : {&w_pad_, &x_pad_}) a->release();
    }

  private:
    GemmRunner& gemm_;
    int chunk_, block_, fused_block_;
    DeviceScratch<float> logits_, dw_pad_, run_max_, z_target_;
    DeviceScratch<double> run_sum_, run_sz_;
    DeviceScratch<__nv_bfloat16> w_pad_, x_pad_;

    void check_shape(const char* what, int T, HeadGpuShape s) const {
        if (T <= 0) fail("%s: token count %d must be positive", what, T);
        if (s.V <= 0) fail("%s: vocabulary size %d must be positive", what, s.V);
        if (s.C <= 0 || s.C % 8)
            fail("%s: hidden size %d must be a positive multiple of 8 (16-byte BF16 rows for the GEMMs)", what, s.C);
        if (!(s.temperature > 0.0f)) fail("%s: temperature must be > 0 (got %g)", what, s.temperature);
    }

    // Vocabulary rows v0 .. v0 + n - 1 of W as [round_up8(n)][C]: W itself, or for a last chunk
    // with n not a multiple of 8 a copy with zero rows appended.
    const __nv_bfloat16* chunk_rows(const __nv_bfloat16* W, int v0, int n, HeadGpuShape s, cudaStream_t stream) {
        const int ld = round_up8(n);
        const __nv_bfloat16* rows = W + (size_t)v0 * s.C;
        if (ld == n) return rows;
        __nv_bfloat16* padded = w_pad_.get((size_t)ld * s.C);
        CUDA_CHECK(cudaMemcpyAsync(padded, rows, (size_t)n * s.C * sizeof(__nv_bfloat16), cudaMemcpyDeviceToDevice, stream));
        CUDA_CHECK(cudaMemsetAsync(padded + (size_t)n * s.C, 0, (size_t)(ld - n) * s.C * sizeof(__nv_bfloat16), stream));
        return padded;
    }

    // rows [round_up8(n)][C]: x's n rows, then zero rows (the NT GEMM's k), in the padded copy.
    const __nv_bfloat16* padded_rows(const __nv_bfloat16* x, int n, int C, cudaStream_t stream) {
        __nv_bfloat16* padded = x_pad_.get((size_t)round_up8(n) * C);
        CUDA_CHECK(cudaMemcpyAsync(padded, x, (size_t)n * C * sizeof(__nv_bfloat16), cudaMemcpyDeviceToDevice, stream));
        CUDA_CHECK(cudaMemsetAsync(padded + (size_t)n * C, 0, (size_t)(round_up8(n) - n) * C * sizeof(__nv_bfloat16), stream));
        return padded;
    }

    // dW's rows v0 .. v0 + n - 1 [n][C] += dlogits [k8][round_up8(n)]^T . x8 [k8][C] (dlogits' row
    // stride ld_dlogits, 0: packed). The NT GEMM writes round_up8(n) rows: a last chunk with n not a
    // multiple of 8 goes through a copy whose extra rows only get zero terms added and are not copied back.
    void dw_gemm(float* dW, int v0, int n, const __nv_bfloat16* x8, int k8, const __nv_bfloat16* dlogits, int C,
                 cudaStream_t stream, int ld_dlogits = 0) {
        const int ld = round_up8(n);
        const size_t bytes = (size_t)n * C * sizeof(float);
        float* dw = dW + (size_t)v0 * C;
        if (ld != n) {
            dw = dw_pad_.get((size_t)ld * C);
            CUDA_CHECK(cudaMemcpyAsync(dw, dW + (size_t)v0 * C, bytes, cudaMemcpyDeviceToDevice, stream));
        }
        gemm_.bf16("head dW", C, ld, k8, x8, dlogits, dw, GemmOut::F32, stream, GemmOps::NT, true, ld_dlogits);
        if (ld != n) CUDA_CHECK(cudaMemcpyAsync(dW + (size_t)v0 * C, dw, bytes, cudaMemcpyDeviceToDevice, stream));
    }

    // logits [Tb][round_up8(n)] (FP32, unscaled) of a block's x [Tb][C] and the chunk's rows
    // [round_up8(n)][C], in the workspace every tile reuses (so that it stays in L2; round_up8(Tb)
    // rows, the backward's dlogits over them); the padding columns are 0.
    float* tile_logits(const __nv_bfloat16* x, const __nv_bfloat16* rows, int tb, int n, HeadGpuShape s,
                       cudaStream_t stream) {
        float* logits = logits_.get((size_t)round_up8(tb) * chunk_);  // the first block is the largest
        gemm_.bf16("head logits", round_up8(n), tb, s.C, rows, x, logits, GemmOut::F32, stream);
        return logits;
    }
};

}  // namespace fp8rl

#endif  // FP8RL_LOSS_CUH
