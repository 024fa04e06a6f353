// loss.cuh: the language-model head fused with the per-token log-probability and entropy at
// temperature T, forward and backward, tiled as a fused linear cross-entropy head (Liger's FLCE,
// Apple's Cut Cross-Entropy; spec-gpu.md §3.5): the logits exist for one tile at a time, (token
// block) x (vocabulary chunk), in a workspace every tile reuses, and the backward recomputes each
// tile's logits. Tiles of 1,024 tokens (the CPU head's row block) x 2,048 columns make 8 MiB of FP32
// logits (+4 MiB of BF16 dlogits in the backward), which stay in L2 (50 MB on an H100) between the
// GEMM that writes them and the kernel that reads them: no logits round trip through HBM. The
// engine runs tiles of HEAD_TOKEN_BLOCK = 16,384 tokens (W1's and W2's micro-batches in one block)
// all the same: the performance model prices the 1,024-token tiles slower (16x the launches, 6 a
// tile, cost more than L2 saves the softmax passes, which their instructions bound more than their
// bytes; docs/perf-model.md), and bench_train_step times both on a GPU. The win needs the
// statistics in the GEMM's epilogue. It is the GPU twin of cpu/logprob_head.h, the oracle, and
// follows its math and operation order:
//   per token t (final hidden state x[t], target y[t] or -1), z = (W x[t]) / T:
//   logZ = max + log sum_j exp(z_j - max),  mu = sum_j p_j z_j,  entropy = logZ - mu,
//   logprob = z_y - logZ;  backward with a = dL/dlogprob, b = dL/dentropy:
//   dL/dlogits_j = (a (1[j = y] - p_j) - b p_j (z_j - mu)) / T,  dX += dlogits W,  dW += dlogits^T X.
// The running max, sum exp and sum z exp of a token are merged chunk by chunk in vocabulary order
// (an online log-sum-exp; sums in double, each term rl/numerics/fast_exp.h's FP32 exp, as on the
// CPU). dW's sum over tokens is a block's product, then its add (beta = 1): with blocks of 1,024,
// the CPU head's row blocks (head_rows_per_block()), it splits where the CPU's does.
// Precision (DESIGN.md §3): X and W are BF16, logits FP32 (GemmRunner's BF16 GEMM with FP32
// output), statistics FP32/FP64, dX and dW accumulate in FP32; dlogits enter the backward GEMMs
// rounded to BF16 (the tensor-core operand type), as the CPU engine rounds them with BF16
// activations (HeadShape::bf16).
//
// The loops: vocabulary chunks outside (a chunk's W rows, and in the backward its dW rows, stay in
// L2 while the token blocks pass), token blocks inside. The GEMMs of a tile (GemmRunner's BF16
// layouts, D [n][m]; m and k multiples of 8, n too for NT), with Tb the block's tokens:
//   logits [Tb][n8]  = X [Tb][C] . Wc [n8][C]^T          TN  m = n8, n = Tb,  k = C
//   dX     [Tb][C]  += dlogits [Tb][n8] . Wc [n8][C]     NN  m = C,  n = Tb,  k = n8
//   dWc    [n8][C]  += dlogits [Tb8][n8]^T . X [Tb8][C]  NT  m = C,  n = n8,  k = Tb8
// with Wc the chunk's n rows of W, n8 = n rounded up to 8 and Tb8 = Tb rounded up to 8; dX and dW
// accumulate in the GEMMs (beta = 1). C must be a multiple of 8 (every model's hidden size is a
// multiple of 128). The padding the rules still force, all zero: the last chunk's Wc gets n8 - n
// rows when n is not a multiple of 8 (m of logits, k of dX), and for the NT GEMM the last block's
// X and dlogits get Tb8 - Tb rows (k) and the last chunk's dW rows are staged in an n8-row copy (n).
#ifndef FP8RL_LOSS_CUH
#define FP8RL_LOSS_CUH
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cuda/kernels/block_reduce.cuh"
#include "cuda/engine/device_array.cuh"
#include "fp8_gemm.cuh"
#include "rl/numerics/bf16.h"
#include "rl/numerics/fast_exp.h"

namespace fp8rl {

constexpr int HEAD_VOCAB_CHUNK = 2048;  // columns of logits at a time (cpu/logprob_head.h's kVocabChunk)
constexpr int HEAD_TOKEN_BLOCK = 16384;  // tokens of logits at a time (see above: 1,024 is the L2-resident tile)
constexpr int HEAD_THREADS = 256;       // one block per token row of a chunk

inline int round_up8(int n) { return (n + 7) / 8 * 8; }

__device__ __forceinline__ __nv_bfloat16 bf16_from_float(float x) {
    __nv_bfloat16_raw r;
    r.x = float_to_bf16(x);
    return r;
}

// One tile of the forward: logits [T][ld] (a token block's T rows, the chunk's n columns starting
// at vocabulary index v0) merged into each token's running max, sum exp(z - max) and sum
// z exp(z - max), and z at the target kept when the target falls in the chunk. first: the chunk at
// v0 = 0 starts the sums.
static __global__ void __launch_bounds__(HEAD_THREADS)
    head_chunk_stats_kernel(const float* logits, int ld, int n, int v0, float temperature, const int32_t* target,
                            bool first, float* run_max, double* run_sum, double* run_sz, float* z_target) {
    const int t = blockIdx.x;
    const float* row = logits + (size_t)t * ld;  // [n]
    float chunk_max = -INFINITY;
    for (int j = threadIdx.x; j < n; j += blockDim.x) chunk_max = MaxOp()(chunk_max, __fdiv_rn(row[j], temperature));
    chunk_max = block_reduce(chunk_max, MaxOp());
    const float old_max = first ? -INFINITY : run_max[t];
    const float m = MaxOp()(old_max, chunk_max);
    double sum = 0.0, sz = 0.0;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const float z = __fdiv_rn(row[j], temperature), e = fast_exp(z - m);
        sum += e;
        sz += (double)e * z;
    }
    sum = block_reduce(sum, SumOp());
    sz = block_reduce(sz, SumOp());
    if (threadIdx.x != 0) return;
    const double rescale = exp((double)old_max - m);  // exp(-inf) = 0 on the first chunk
    run_sum[t] = (first ? 0.0 : run_sum[t]) * rescale + sum;
    run_sz[t] = (first ? 0.0 : run_sz[t]) * rescale + sz;
    run_max[t] = m;
    if (first) z_target[t] = 0.0f;
    const int y = target[t] - v0;
    if (y >= 0 && y < n) z_target[t] = __fdiv_rn(row[y], temperature);
}

// logZ, mu, entropy and logprob per token [T] from the merged sums (cpu/logprob_head.h's last loop).
static __global__ void head_finish_kernel(int T, const int32_t* target, const float* run_max, const double* run_sum,
                                   const double* run_sz, const float* z_target, float* logprob, float* entropy,
                                   float* lse, float* mu) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) return;
    const double l = run_max[t] + log(run_sum[t]), m = run_sz[t] / run_sum[t];
    lse[t] = (float)l;
    mu[t] = (float)m;
    entropy[t] = (float)(l - m);
    logprob[t] = target[t] >= 0 ? (float)(z_target[t] - l) : 0.0f;
}

// dlogits [T8][ld] (BF16) of one tile from its logits [T][ld] (a token block's T rows), one block
// per row: the n columns of rows t < T get dL/dlogits in cpu/logprob_head.h's operation order (products unfused), the
// other columns and rows get 0 (the padding of the dX and dW GEMMs' k).
static __global__ void __launch_bounds__(HEAD_THREADS)
    head_dlogits_kernel(const float* logits, int T, int ld, int n, int v0, float temperature, const int32_t* target,
                        const float* dlogprob, const float* dentropy, const float* lse, const float* mu,
                        __nv_bfloat16* dlogits) {
    const int t = blockIdx.x;
    __nv_bfloat16* out = dlogits + (size_t)t * ld;
    if (t >= T) {
        for (int j = threadIdx.x; j < ld; j += blockDim.x) out[j] = bf16_from_float(0.0f);
        return;
    }
    const float a = dlogprob[t], b = dentropy[t], l = lse[t], m = mu[t], inv_t = 1.0f / temperature;
    const int y = target[t] - v0;
    for (int j = threadIdx.x; j < ld; j += blockDim.x) {
        float g = 0.0f;
        if (j < n) {
            const float z = __fdiv_rn(logits[(size_t)t * ld + j], temperature), p = fast_exp(z - l);
            g = mul_rn(mul_rn(-a, p) - mul_rn(mul_rn(b, p), z - m), inv_t);
            if (j == y) g += mul_rn(a, inv_t);
        }
        out[j] = bf16_from_float(g);
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
    explicit LogprobHeadGpu(GemmRunner& gemm, int vocab_chunk = HEAD_VOCAB_CHUNK, int token_block = HEAD_TOKEN_BLOCK)
        : gemm_(gemm), chunk_(vocab_chunk), block_(token_block) {
        if (vocab_chunk <= 0 || vocab_chunk % 8)
            fail("LogprobHeadGpu: vocabulary chunk %d must be a positive multiple of 8", vocab_chunk);
        if (token_block <= 0 || token_block % 8)
            fail("LogprobHeadGpu: token block %d must be a positive multiple of 8 (only the last block is padded)",
                 token_block);
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
        // the last block's X [Tb8][C] with its padding rows zero (the NT GEMM's k)
        const __nv_bfloat16* x_last = x + (size_t)last0 * C;
        if (last_tb % 8) {
            __nv_bfloat16* padded = x_pad_.get((size_t)round_up8(last_tb) * C);
            CUDA_CHECK(cudaMemcpyAsync(padded, x_last, (size_t)last_tb * C * sizeof(__nv_bfloat16), cudaMemcpyDeviceToDevice, stream));
            CUDA_CHECK(cudaMemsetAsync(padded + (size_t)last_tb * C, 0, (size_t)(round_up8(last_tb) - last_tb) * C * sizeof(__nv_bfloat16), stream));
            x_last = padded;
        }
        __nv_bfloat16* dlogits = dlogits_.get((size_t)round_up8(std::min(block_, T)) * chunk_);  // [Tb8][ld]
        for (int v0 = 0; v0 < s.V; v0 += chunk_) {
            const int n = std::min(chunk_, s.V - v0), ld = round_up8(n);
            const __nv_bfloat16* rows = chunk_rows(W, v0, n, s, stream);  // [ld][C]
            // the NT GEMM writes ld rows of dW: the last chunk's n rows go through an ld-row copy
            // whose extra rows only get zero terms added and are not copied back
            float* dw = dW + (size_t)v0 * C;
            const size_t dw_bytes = (size_t)n * C * sizeof(float);
            if (ld != n) {
                dw = dw_pad_.get((size_t)ld * C);
                CUDA_CHECK(cudaMemcpyAsync(dw, dW + (size_t)v0 * C, dw_bytes, cudaMemcpyDeviceToDevice, stream));
            }
            for (int t0 = 0; t0 < T; t0 += block_) {
                const int tb = std::min(block_, T - t0), tb8 = round_up8(tb);
                const float* logits = tile_logits(x + (size_t)t0 * C, rows, tb, n, s, stream);
                LAUNCH_KERNEL(head_dlogits_kernel, tb8, HEAD_THREADS, 0, stream, logits, tb, ld, n, v0, s.temperature,
                              target + t0, dlogprob + t0, dentropy + t0, lse + t0, mu + t0, dlogits);
                gemm_.bf16("head dX", C, tb, ld, rows, dlogits, dx + (size_t)t0 * C, GemmOut::F32, stream, GemmOps::NN, true);
                const __nv_bfloat16* x8 = t0 == last0 ? x_last : x + (size_t)t0 * C;  // [tb8][C]
                gemm_.bf16("head dW", C, ld, tb8, x8, dlogits, dw, GemmOut::F32, stream, GemmOps::NT, true);
            }
            if (ld != n)
                CUDA_CHECK(cudaMemcpyAsync(dW + (size_t)v0 * C, dw, dw_bytes, cudaMemcpyDeviceToDevice, stream));
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
        for (DeviceScratch<__nv_bfloat16>* a : {&w_pad_, &x_pad_, &dlogits_}) a->release();
    }

  private:
    GemmRunner& gemm_;
    int chunk_, block_;
    DeviceScratch<float> logits_, dw_pad_, run_max_, z_target_;
    DeviceScratch<double> run_sum_, run_sz_;
    DeviceScratch<__nv_bfloat16> w_pad_, x_pad_, dlogits_;

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

    // logits [Tb][round_up8(n)] (FP32, unscaled) of a block's x [Tb][C] and the chunk's rows
    // [round_up8(n)][C], in the workspace every tile reuses (so that it stays in L2); the padding
    // columns are 0.
    const float* tile_logits(const __nv_bfloat16* x, const __nv_bfloat16* rows, int tb, int n, HeadGpuShape s,
                             cudaStream_t stream) {
        float* logits = logits_.get((size_t)tb * chunk_);  // the first block is the largest
        gemm_.bf16("head logits", round_up8(n), tb, s.C, rows, x, logits, GemmOut::F32, stream);
        return logits;
    }
};

}  // namespace fp8rl

#endif  // FP8RL_LOSS_CUH
