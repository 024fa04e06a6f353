// linear.cuh: the linear layers of the GPU engine, y = x W^T, forward and backward, in BF16 or FP8
// (DESIGN.md §3, spec-fp8.md §7), as the CPU engine's cpu/linear.h computes them:
//   bf16  the BF16 weight copy through cuBLASLt's BF16 GEMMs (TN fprop, NN dgrad, NT wgrad);
//   fp8   at --fp8_scaling block: x's FP8 1x128 operand written by the kernel that produced x
//         (cuda/kernels/fp8_rows.cuh: a norm, SwiGLU, or one pass over the attention output) into
//         LinearScratch's slot 0, dy quantized 1x128 along the reduction dimension by fp8_gemm.cuh's
//         kernels, the weight's 128x128-block copy and its transposed copy (refreshed after every
//         update), and for wgrad x^T and dy^T quantized 1x128 along tokens (x^T kept by x's
//         producer in a training forward: fp8_rows.cuh's Fp8Transposed), all three GEMMs
//         block-scaled (VEC128 x BLK128x128, VEC128 x VEC128).
//         At row and tensor scaling the same operands with one scale per row (OUTER_VEC: a token row,
//         an output channel, an input channel of W^T, a feature row of x^T and dy^T) or per tensor
//         (SCALAR). Their scales need a whole row's or tensor's amax before the first code, which a
//         producer's one-pass cast cannot know, so x is quantized here from its BF16 tensor (an amax
//         pass, then the cast: fp8_gemm.cuh's fp8_quantize_tiles_gpu), as Transformer Engine's
//         current scaling does.
// Activations are BF16; dx is BF16 or FP32 as the caller asks (every projection's dgrad is one
// GEMM, so the GEMM rounds it); dW is FP32, accumulated into the gradient buffer. Biases and the
// BF16 rounding after them are the caller's.
// FP8 needs the token count T to be a multiple of 128 (the engine pads its batches; padding rows
// are zero, which changes neither a 1x128 group's amax nor a sum) and N, K multiples of 16.
#ifndef FP8RL_LINEAR_CUH
#define FP8RL_LINEAR_CUH
#include <algorithm>

#include "cuda/common.cuh"
#include "cuda/engine/device_array.cuh"
#include "cuda/kernels/fp8_rows.cuh"
#include "fp8_gemm.cuh"
#include "rl/numerics/precision.h"

namespace fp8rl {

// One projection as the GEMMs read it.
struct LinearDevice {
    const __nv_bfloat16* w;     // [N][K] BF16 copy (bf16 precision)
    const Fp8WeightCopy* w8;    // FP8 copies (fp8 precision)
    int N, K;
};

// Device scratch for the FP8 copies of activations and output gradients: codes and scales (VEC128,
// one per row, or one) of an operand [rows][cols] and of its transpose, for rows <= max_tokens and
// cols <= max_dim, and the amax scratch of row and tensor scaling.
class LinearScratch {
  public:
    LinearScratch(int max_tokens, int max_dim, bool pow2_scales, Fp8Scaling scaling = Fp8Scaling::Block)
        : max_tokens_(max_tokens), max_dim_(max_dim), pow2_(pow2_scales), scaling_(scaling) {
        size_t codes = (size_t)max_tokens * max_dim;
        const Fp8Layout layout = fp8_rows_layout(scaling);
        size_t scales = std::max(fp8_scale_count(layout, max_tokens, max_dim), fp8_scale_count(layout, max_dim, max_tokens));
        if (scaling != Fp8Scaling::Block) amax_.resize(fp8_amax_words(scaling, max_tokens, max_dim), "FP8 amax scratch");
        for (int i = 0; i < 2; i++) {
            Storage& m = memory_[i];
            m.codes.resize(codes, "FP8 activation codes"), m.codes_t.resize(codes, "FP8 transposed activation codes");
            m.scales.resize(scales, "FP8 activation scales"), m.scales_t.resize(scales, "FP8 transposed activation scales");
            (i == 0 ? a_ : b_) = {m.codes.get(), m.codes_t.get(), m.scales.get(), m.scales_t.get()};
        }
    }

    bool pow2_scales() const { return pow2_; }
    Fp8Scaling scaling() const { return scaling_; }
    // A producer writes the FP8 operand of its output itself (rows_out, target) at block scaling only.
    bool fused_casts() const { return scaling_ == Fp8Scaling::Block; }

    // Slot `slot` as a producer's target for the FP8 operand of a [rows][cols] tensor.
    Fp8RowsOut rows_out(int slot, int rows, int cols) {
        check_fits(rows, cols);
        if (!fused_casts()) fail("LinearScratch::rows_out: a producer's one-pass cast is 1x128 (block scaling) only");
        Operand& o = slot == 0 ? a_ : b_;
        Fp8RowsOut out;
        out.codes = o.codes, out.scale_inv = o.scales, out.rows = rows, out.pow2 = pow2_;
        return out;
    }

    // An operand x [rows][cols] quantized 1x128 along cols (codes [rows][cols], scales [L_cols][rows])
    // and along rows (codes_t [cols][rows], scales_t [L_rows][cols]), in slot 0 or 1.
    struct Operand {
        uint8_t *codes = nullptr, *codes_t = nullptr;
        float *scales = nullptr, *scales_t = nullptr;
    };
    const Operand& operand(int slot) const { return slot == 0 ? a_ : b_; }
    // The amax scratch a row- or tensor-scaled tile quantization of an operand needs (null at block).
    uint32_t* amax() { return amax_.get(); }
    // Slot `slot` as the target of a producer that writes both FP8 operands of a [rows][cols] output
    // gradient (rowwise and transposed), e.g. cuda/kernels/swiglu.cuh's swiglu_backward_fp8.
    const Operand& target(int slot, int rows, int cols) const {
        check_fits(rows, cols);
        return operand(slot);
    }
    // Which of the operand's two copies quantize() writes.
    enum class Copies { Both, Rows, Transposed };
    // Transposed: x^T alone (a weight gradient's activation operand); Rows: x alone (a GEMM input at
    // row or tensor scaling); the other copy left as it is.
    const Operand& quantize(int slot, const __nv_bfloat16* x, int rows, int cols, cudaStream_t stream,
                            Copies copies = Copies::Both) {
        check_fits(rows, cols);
        Operand& o = slot == 0 ? a_ : b_;
        const bool rows_copy = copies != Copies::Transposed, transposed = copies != Copies::Rows;
        fp8_quantize_rowwise_gpu(x, rows, cols, pow2_, rows_copy ? o.codes : nullptr, rows_copy ? o.scales : nullptr,
                                 transposed ? o.codes_t : nullptr, transposed ? o.scales_t : nullptr, stream, scaling_,
                                 amax_.get());
        return o;
    }

  private:
    void check_fits(int rows, int cols) const {
        if (rows > max_tokens_ || cols > max_dim_)
            fail("LinearScratch: an operand [%d][%d] exceeds the scratch's [%d][%d]", rows, cols, max_tokens_, max_dim_);
    }
    struct Storage {
        DeviceArray<uint8_t> codes, codes_t;
        DeviceArray<float> scales, scales_t;
    };
    int max_tokens_, max_dim_;
    bool pow2_;
    Fp8Scaling scaling_;
    Storage memory_[2];  // what a_ and b_ point into
    DeviceArray<uint32_t> amax_;  // [fp8_amax_words] row and tensor scaling
    Operand a_, b_;
};

// The granularity of an fp8 call: the scratch's and the weight copy's, which must agree.
inline Fp8Scaling check_scaling(const char* what, const LinearScratch& scratch, const LinearDevice& W) {
    if (W.w8->scaling != scratch.scaling())
        fail("%s: the weight's FP8 copy is %s-scaled, the activations' scratch %s-scaled", what,
             fp8_scaling_name(W.w8->scaling), fp8_scaling_name(scratch.scaling()));
    return scratch.scaling();
}

inline void check_linear(const char* what, Precision p, const LinearDevice& W, int T) {
    if (p == Precision::FP32) fail("%s: the GPU engine's linear layers run in bf16 or fp8, not fp32", what);
    if (p == Precision::BF16 && !W.w) fail("%s: bf16 needs the weight's BF16 copy", what);
    if (p == Precision::FP8) {
        if (!W.w8) fail("%s: fp8 needs the weight's FP8 copies", what);
        if (T % 128) fail("%s: fp8 needs the token count padded to a multiple of 128 (got %d)", what, T);
    }
}

// y [T][N] = x [T][K] . W^T, BF16 or FP32 (out): bf16 reads x; fp8 at block scaling the operand x's
// producer wrote into the scratch's slot 0 (LinearScratch::rows_out), at row and tensor scaling x
// quantized here into slot 0. kernel: which runs the FP8 GEMM (GemmRunner::fp8; the trainer's: Own).
inline void linear_forward_gpu(GemmRunner& gemm, LinearScratch& scratch, Precision p, const LinearDevice& W,
                               const __nv_bfloat16* x, int T, void* y, GemmOut out, cudaStream_t stream,
                               Fp8GemmKernel kernel = Fp8GemmKernel::Cublaslt) {
    check_linear("linear_forward_gpu", p, W, T);
    if (p == Precision::BF16) return gemm.bf16("fprop", W.N, T, W.K, W.w, x, y, out, stream, GemmOps::TN);
    const Fp8Scaling s = check_scaling("linear_forward_gpu", scratch, W);
    const LinearScratch::Operand& xq =
        scratch.fused_casts() ? scratch.operand(0) : scratch.quantize(0, x, T, W.K, stream, LinearScratch::Copies::Rows);
    gemm.fp8("fprop", W.N, T, W.K, W.w8->codes, W.w8->scale_inv, weight_scale_mode(s), xq.codes, xq.scales,
             rows_scale_mode(s), y, out, stream, false, kernel);
}

// dx [T][K] = dy [T][N] . W (BF16 or FP32: dx_out). In fp8 dy is quantized into the scratch's slot
// 0, along N for this GEMM and along T for the wgrad (linear_wgrad_gpu reads it there); a null dy
// means its producer wrote both operands there (LinearScratch::target). kernel: as linear_forward_gpu's.
inline void linear_dgrad_gpu(GemmRunner& gemm, LinearScratch& scratch, Precision p, const LinearDevice& W,
                             const __nv_bfloat16* dy, int T, void* dx, GemmOut dx_out, cudaStream_t stream,
                             Fp8GemmKernel kernel = Fp8GemmKernel::Cublaslt) {
    if (!dy && p != Precision::FP8) fail("linear_dgrad_gpu: bf16 needs dy");
    check_linear("linear_dgrad_gpu", p, W, T);
    if (p == Precision::BF16) return gemm.bf16("dgrad", W.K, T, W.N, W.w, dy, dx, dx_out, stream, GemmOps::NN);
    const Fp8Scaling s = check_scaling("linear_dgrad_gpu", scratch, W);
    const LinearScratch::Operand& dyq = dy ? scratch.quantize(0, dy, T, W.N, stream)  // along N and along T
                                           : scratch.target(0, T, W.N);
    gemm.fp8("dgrad", W.K, T, W.N, W.w8->codes_t, W.w8->scale_inv_t, weight_scale_mode(s), dyq.codes, dyq.scales,
             rows_scale_mode(s), dx, dx_out, stream, false, kernel);
}

// dW [N][K] += dy^T . x, after linear_dgrad_gpu of the same dy: bf16 reads dy; fp8 dy^T's operand in
// the scratch's slot 0 (which nothing may overwrite in between) and x^T: x_t when given (fp8 at
// block scaling: x's transposed operand its producer wrote; x then unread), else x quantized along T
// into slot 1.
inline void linear_wgrad_gpu(GemmRunner& gemm, LinearScratch& scratch, Precision p, const LinearDevice& W,
                             const __nv_bfloat16* dy, const __nv_bfloat16* x, int T, float* dW, cudaStream_t stream,
                             const Fp8Transposed& x_t = {}, Fp8GemmKernel kernel = Fp8GemmKernel::Cublaslt) {
    if (!dy && p != Precision::FP8) fail("linear_wgrad_gpu: bf16 needs dy");
    if (x_t && (p != Precision::FP8 || !scratch.fused_casts()))
        fail("linear_wgrad_gpu: a kept transposed FP8 operand of x is 1x128 (fp8, block scaling) only");
    if (!x && !x_t) fail("linear_wgrad_gpu: needs x or its kept transposed FP8 operand");
    check_linear("linear_wgrad_gpu", p, W, T);
    if (p == Precision::BF16) return gemm.bf16("wgrad", W.K, W.N, T, x, dy, dW, GemmOut::F32, stream, GemmOps::NT, true);
    const Fp8ScaleMode rows = rows_scale_mode(check_scaling("linear_wgrad_gpu", scratch, W));
    const LinearScratch::Operand& dyq = scratch.target(0, T, W.N);
    Fp8Transposed xq = x_t;  // x^T along T
    if (!xq) {
        const LinearScratch::Operand& o = scratch.quantize(1, x, T, W.K, stream, LinearScratch::Copies::Transposed);
        xq.codes = o.codes_t, xq.scale_inv = o.scales_t;
    }
    gemm.fp8("wgrad", W.K, W.N, T, xq.codes, xq.scale_inv, rows, dyq.codes_t, dyq.scales_t, rows, dW, GemmOut::F32, stream,
             true, kernel);
}

// Both: dx [T][K] = dy [T][N] . W (BF16 or FP32: dx_out); dW [N][K] += dy^T . x.
inline void linear_backward_gpu(GemmRunner& gemm, LinearScratch& scratch, Precision p, const LinearDevice& W,
                                const __nv_bfloat16* dy, const __nv_bfloat16* x, int T, void* dx, GemmOut dx_out,
                                float* dW, cudaStream_t stream, const Fp8Transposed& x_t = {},
                                Fp8GemmKernel kernel = Fp8GemmKernel::Cublaslt) {
    linear_dgrad_gpu(gemm, scratch, p, W, dy, T, dx, dx_out, stream, kernel);
    linear_wgrad_gpu(gemm, scratch, p, W, dy, x, T, dW, stream, x_t, kernel);
}

}  // namespace fp8rl

#endif  // FP8RL_LINEAR_CUH
