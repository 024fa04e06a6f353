// rmsnorm.cuh: RMSNorm over rows of n values (spec-model.md §2.3), forward and backward, as
// cpu/model_layers.h's rmsnorm_forward / rmsnorm_backward:
//   y = w * (x * rstd), rstd = 1 / sqrt(mean(x^2) + eps) per row;
//   dx (+)= rstd * (w * dy) - x * rstd^3 / n * sum(w * dy * x), dw += sum over rows of dy * x * rstd.
// Also Qwen3's per-head q/k norm: q [T][H][D] is T*H rows of D with one weight vector of D.
// A BF16 output rounds as HF (and the CPU's bf16 flag): x * rstd to BF16, times w, to BF16 again.
// Both run a warp per row with 16-byte loads; the row's sum of squares and the backward's dot
// product add in one fixed order, the CPU engine's (rl/numerics/reduction_order.h's block_sum over
// norm_threads(n) threads, lane by lane: see the forward kernel).
// The weight gradient is a deterministic column sum (cuda/kernels/column_sum.cuh), no atomics.
#ifndef FP8RL_CUDA_RMSNORM_CUH
#define FP8RL_CUDA_RMSNORM_CUH
#include "cuda/kernels/column_sum.cuh"
#include "cuda/kernels/fp8_rows.cuh"
#include "rl/numerics/bf16.h"
#include "rl/numerics/hostdevice.h"
#include "rl/numerics/reduction_order.h"

#include <algorithm>
#include <climits>

namespace fp8rl {

// A warp per row, kNormRowsPerBlock rows per block (issue 47: the decode step's norms at
// bandwidth). x, y [rows][n]; rstd [rows]. Lane l reads the row in chunks of kNormChunk values,
// 8 at a time (one 16-byte load of BF16 when aligned): values 256 j + 8 l .. 256 j + 8 l + 7 of
// chunk j. These are the terms of block_sum's (rl/numerics/reduction_order.h) threads 8 l .. 8 l + 7
// over norm_threads(n) threads, in the order each of those threads adds them (n > 224: 256
// threads, term t + 256 j at step j; smaller n: one term each), so the lane keeps those 8 threads'
// partial sums; the butterfly's offsets 16 and 8 are lane xors 2 and 1, offsets 4, 2, 1 are within
// the lane, and the warps' sums (lanes 4 w) add in warp order: the CPU engine's sum, bit for bit.
// Fused around the norm (issue 28):
//   branch  the residual add of the sublayer before: the row is sum = x + branch rounded to BF16,
//           written to `sum` (the residual stream), as cpu/model_layers.h's residual_add;
//   q       the FP8 1x128 operand of y for the next GEMM (cuda/kernels/fp8_rows.cuh): the half
//           warps of chunk j hold groups 2 j and 2 j + 1, as quantize_group8 wants them; in a
//           training forward (y_t) instead RmsnormTile's tiles after the statistics, which also
//           write the transposed operand the weight gradient reads (issue 59).
// Rows from `valid` to `rows` (a GEMM's padding rows) get zeros in y and zero codes in q, so the
// buffers need no zeroing before. y may be null when only the FP8 operand is read. The output pass
// reads the row (and adds the residual) again, from L2: a register copy of the row (64 floats at
// C = 2,048) went to the stack (320 bytes of local memory in the sm_90 build).
constexpr int kNormRowsPerBlock = 4;
constexpr int kNormChunk = 32 * 8;
static_assert(kNormChunk == kNormMaxThreads, "a chunk is one pass of block_sum's threads");

// The row's sum in block_sum's order (see above) from this lane's partial sums part[e] of block_sum's
// threads 8 lane + e (chunks added in order); every lane gets it. Every lane of the warp must call it.
__device__ __forceinline__ float warp_row_sum(float part[8], int n) {
    for (int e = 0; e < 8; e++) part[e] += __shfl_xor_sync(0xFFFFFFFFu, part[e], 2);  // offset 16
    for (int e = 0; e < 8; e++) part[e] += __shfl_xor_sync(0xFFFFFFFFu, part[e], 1);  // offset 8
    for (int e = 0; e < 4; e++) part[e] += part[e + 4];
    for (int e = 0; e < 2; e++) part[e] += part[e + 2];
    part[0] += part[1];
    float sum = 0.0f;
    for (int warp = 0; warp < norm_threads(n) / 32; warp++) {
        const float warp_sum = __shfl_sync(0xFFFFFFFFu, part[0], 4 * warp);
        sum = warp == 0 ? warp_sum : sum + warp_sum;
    }
    return sum;
}

// Chunk j's 8 values of this lane (zeros past n), after the residual add (written to sum).
template <class In>
__device__ __forceinline__ void rmsnorm_chunk(float v[8], const In* x, const In* branch, In* sum, size_t row, int c,
                                              int n, bool write_sum) {
    const int count = c < n ? min(8, n - c) : 0;
    load8(x + row + c, count, v);
    if (!branch) return;
    float b[8];
    load8(branch + row + c, count, b);
    for (int e = 0; e < 8; e++) v[e] = round_bf16(v[e] + b[e]);
    if (write_sum) store8(sum + row + c, count, v);
}

template <class In, class W, class Out>
__global__ void __launch_bounds__(kNormRowsPerBlock * 32)
    rmsnorm_forward_kernel(Out* y, float* rstd, const In* x, const In* branch, In* sum, const W* w, int n, float eps,
                           Fp8RowsOut q, int valid, int rows) {
    const int lane = threadIdx.x % 32, r = blockIdx.x * kNormRowsPerBlock + threadIdx.x / 32;
    if (r >= rows) return;  // the whole warp
    const size_t row = (size_t)r * n;
    const bool real = r < valid;
    const int chunks = (n + kNormChunk - 1) / kNormChunk;
    float s = 0.0f;
    if (real) {
        float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // block_sum's threads 8 lane + e
        for (int j = 0; j < chunks; j++) {
            float v[8];
            rmsnorm_chunk(v, x, branch, sum, row, j * kNormChunk + 8 * lane, n, true);
            for (int e = 0; e < 8; e++) part[e] += mul_rn(v[e], v[e]);
        }
        s = 1.0f / sqrtf(warp_row_sum(part, n) / (float)n + eps);
        if (lane == 0) rstd[r] = s;
    }
    if (!y && !q) return;  // the statistics only (RmsnormTile writes the output's FP8 operands)
    for (int j = 0; j < chunks; j++) {
        const int c = j * kNormChunk + 8 * lane, count = c < n ? min(8, n - c) : 0;
        float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (real) {
            float wv[8];
            rmsnorm_chunk(v, x, branch, sum, row, c, n, false);  // again (from L2), the same bits
            load8(w + c, count, wv);
            for (int e = 0; e < 8; e++) v[e] = is_bf16<Out> ? round_bf16(wv[e] * round_bf16(v[e] * s)) : wv[e] * (v[e] * s);
        }
        if (y) store8(y + row + c, count, v);
        if (q) quantize_group8(v, r, 2 * j + lane / kGroupLanes, n, q);  // every lane: its shuffles are warp-wide
    }
}

// dx [rows][n] (+)= the row's input gradient (before any rounding of the sum): a warp per row, the
// forward's layout (lane l holds values 256 j + 8 l .. + 7 of chunk j, 16-byte loads), so the dot
// product adds in block_sum's order over norm_threads(n) threads, the CPU engine's bits. The output
// pass reads the row again (from L2), as the forward does.
template <class In, class W, class Dx>
__global__ void __launch_bounds__(kNormRowsPerBlock * 32)
    rmsnorm_backward_dx_kernel(Dx* dx, const In* dy, const In* x, const W* w, const float* rstd, int n, bool accumulate,
                               int rows) {
    const int lane = threadIdx.x % 32, r = blockIdx.x * kNormRowsPerBlock + threadIdx.x / 32;
    if (r >= rows) return;  // the whole warp
    const size_t row = (size_t)r * n;
    const int chunks = (n + kNormChunk - 1) / kNormChunk;
    float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // block_sum's threads 8 lane + e
    for (int j = 0; j < chunks; j++) {
        const int c = j * kNormChunk + 8 * lane, count = c < n ? min(8, n - c) : 0;
        float wv[8], dv[8], xv[8];
        load8(w + c, count, wv);
        load8(dy + row + c, count, dv);
        load8(x + row + c, count, xv);
        for (int e = 0; e < 8; e++) part[e] += mul_rn(mul_rn(wv[e], dv[e]), xv[e]);
    }
    const float s = rstd[r], k = warp_row_sum(part, n) * s * s * s / (float)n;
    for (int j = 0; j < chunks; j++) {
        const int c = j * kNormChunk + 8 * lane, count = c < n ? min(8, n - c) : 0;
        if (count == 0) continue;
        float wv[8], dv[8], xv[8], out[8];
        load8(w + c, count, wv);
        load8(dy + row + c, count, dv);
        load8(x + row + c, count, xv);
        if (accumulate) load8_written(dx + row + c, count, out);
        for (int e = 0; e < 8; e++) {
            const float g = mul_rn(mul_rn(s, wv[e]), dv[e]) - mul_rn(xv[e], k);
            out[e] = accumulate ? out[e] + g : g;
        }
        store8(dx + row + c, count, out);
    }
}

// dw's terms at row r, columns c .. c + count - 1 (count <= 8; zeros past it): dy * x * rstd[r],
// the CPU's product order.
template <class In>
struct RmsnormWeightGradTerm {
    const In* dy;
    const In* x;
    const float* rstd;
    int n;
    __device__ void operator()(long r, int c, int count, float out[8]) const {
        float xv[8];
        load8(dy + (size_t)r * n + c, count, out);
        load8(x + (size_t)r * n + c, count, xv);
        const float s = rstd[r];
        for (int e = 0; e < 8; e++) out[e] = mul_rn(mul_rn(out[e], xv[e]), s);
    }
};

// In fp8 training the norm's output y [padded][n] goes to the GEMMs only: fp8_gemm.cuh's tile
// quantizer computes each tile of it from the norm's input x (the residual sum when the add is fused)
// and rstd, which the norm kernel wrote in its statistics pass, rounded as the BF16 y is (x * rstd,
// then times w, each to BF16), and writes the next GEMM's rowwise operand and the weight gradient's
// transposed one (Fp8Transposed) from the same tile, with no BF16 y between. Rows from `valid`: zeros.
struct RmsnormTile {
    const __nv_bfloat16 *x, *w;
    const float* rstd;
    int valid;
    __device__ void stage(int rows, int cols, int r0, int c0, float* tile) const {
        stage_computed_tile(rows, cols, valid, r0, c0, tile, [&](int r, int c, int count, float out[8]) {
            float xv[8], wv[8];
            load8(x + (size_t)r * cols + c, count, xv);
            load8(w + c, count, wv);
            const float s = rstd[r];
            for (int e = 0; e < count; e++) out[e] = round_bf16(wv[e] * round_bf16(xv[e] * s));
        });
    }
};

inline void check_rmsnorm_shape(const char* who, long rows, int n) {
    if (rows < 0 || rows > INT_MAX) fail("%s: row count %ld outside [0, 2^31)", who, rows);
    if (n <= 0) fail("%s: row length n = %d must be positive", who, n);
}

// rows: the real rows; padded_rows (>= rows, q.rows with q): the rows written. With y_t (a training
// forward in fp8, 1x128 blocks; y null, q given) the kernel writes the statistics only and
// RmsnormTile's tiles both FP8 operands.
template <class In, class W, class Out>
void launch_rmsnorm_forward(const char* who, Out* y, float* rstd, const In* x, const In* branch, In* sum, const W* w,
                            long rows, long padded_rows, int n, float eps, const Fp8RowsOut& q, const Fp8Transposed& y_t,
                            cudaStream_t stream) {
    check_rmsnorm_shape(who, rows, n);
    if (!(eps > 0.0f)) fail("%s: eps = %g must be positive", who, (double)eps);
    const long blocks = std::max(rows, padded_rows);
    if (q) check_fp8_rows_out(who, rows, n, q);
    if (q && q.rows != blocks) fail("%s: an FP8 operand of %d rows for %ld padded rows", who, q.rows, blocks);
    if (y_t && (y || !q)) fail("%s: the transposed FP8 output comes with the rowwise one and without a BF16 y", who);
    constexpr bool bf16 = is_bf16<In> && is_bf16<W> && is_bf16<Out>;
    if (y_t && !bf16) fail("%s: the transposed FP8 output is a BF16 norm's (a training forward's)", who);
    if (blocks == 0) return;
    if (blocks > INT_MAX) fail("%s: %ld rows is too many for one launch", who, blocks);
    const long stats = y_t ? rows : blocks;  // the statistics pass alone: the real rows
    if (stats > 0)
        LAUNCH_KERNEL((rmsnorm_forward_kernel<In, W, Out>), dim3((unsigned)((stats + kNormRowsPerBlock - 1) / kNormRowsPerBlock)),
                      kNormRowsPerBlock * 32, 0, stream, y, rstd, x, branch, sum, w, n, eps, y_t ? Fp8RowsOut{} : q,
                      (int)rows, (int)stats);
    if constexpr (bf16)
        if (y_t)
            fp8_quantize_tiles_gpu(who, RmsnormTile{branch ? sum : x, w, rstd, (int)rows}, (int)blocks, n, q.pow2, q.codes,
                                   q.scale_inv, y_t.codes, y_t.scale_inv, stream);
}

// y [rows][n] = RMSNorm(x [rows][n]) with weight w [n]; rstd [rows] kept for the backward pass;
// with q, also y's FP8 operand (y may then be null), and with y_t its transposed one (y null).
// Rows from `rows` to padded_rows: zeros.
template <class In, class W, class Out>
void rmsnorm_forward(Out* y, float* rstd, const In* x, const W* w, long rows, int n, float eps, cudaStream_t stream,
                     const Fp8RowsOut& q = {}, long padded_rows = 0, const Fp8Transposed& y_t = {}) {
    launch_rmsnorm_forward<In, W, Out>("rmsnorm_forward", y, rstd, x, nullptr, nullptr, w, rows, padded_rows, n, eps, q,
                                       y_t, stream);
}

// sum = x + branch (the residual stream, BF16 rounding), then y = RMSNorm(sum) as rmsnorm_forward.
template <class In, class W, class Out>
void residual_rmsnorm_forward(Out* y, float* rstd, In* sum, const In* x, const In* branch, const W* w, long rows, int n,
                              float eps, cudaStream_t stream, const Fp8RowsOut& q = {}, long padded_rows = 0,
                              const Fp8Transposed& y_t = {}) {
    if (!branch || !sum) fail("residual_rmsnorm_forward: needs the branch and the sum's buffer");
    if (sum == x || sum == branch) fail("residual_rmsnorm_forward: the sum's buffer must not be x or the branch (the kernel reads them twice)");
    launch_rmsnorm_forward<In, W, Out>("residual_rmsnorm_forward", y, rstd, x, branch, sum, w, rows, padded_rows, n, eps,
                                       q, y_t, stream);
}

// FP32 scratch rmsnorm_backward needs for rows x n.
inline long rmsnorm_backward_scratch_floats(long rows, int n) { return column_sum_scratch_floats(rows, n); }

// dw [n] += dL/dw, the column sums of dy * x * rstd over the rows.
template <class In>
void rmsnorm_weight_grad(float* dw, const In* dy, const In* x, const float* rstd, long rows, int n, float* scratch,
                         long scratch_floats, cudaStream_t stream) {
    column_sum_add("rmsnorm_backward (weight gradient)", dw, RmsnormWeightGradTerm<In>{dy, x, rstd, n}, rows, n, scratch,
                   scratch_floats, stream);
}

// dx [rows][n] (+)= dL/dx, dw [n] += dL/dw from dy [rows][n], the forward's x, w and rstd.
template <class In, class W, class Dx>
void rmsnorm_backward(Dx* dx, float* dw, const In* dy, const In* x, const W* w, const float* rstd, long rows, int n,
                      bool accumulate_dx, float* scratch, long scratch_floats, cudaStream_t stream) {
    check_rmsnorm_shape("rmsnorm_backward", rows, n);
    check_column_sum("rmsnorm_backward (weight gradient)", rows, n, scratch_floats);  // before anything runs
    if (rows == 0) return;
    LAUNCH_KERNEL((rmsnorm_backward_dx_kernel<In, W, Dx>), dim3((unsigned)((rows + kNormRowsPerBlock - 1) / kNormRowsPerBlock)),
                  kNormRowsPerBlock * 32, 0, stream, dx, dy, x, w, rstd, n, accumulate_dx, (int)rows);
    rmsnorm_weight_grad(dw, dy, x, rstd, rows, n, scratch, scratch_floats, stream);
}

}  // namespace fp8rl

#endif  // FP8RL_CUDA_RMSNORM_CUH
