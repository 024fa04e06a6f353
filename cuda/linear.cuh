// linear.cuh: the linear layers of the GPU engine, y = x W^T, forward and backward, in BF16 or FP8
// (DESIGN.md §3, spec-fp8.md §7), as the CPU engine's cpu/linear.h computes them:
//   bf16  the BF16 weight copy through cuBLASLt's BF16 GEMMs (TN fprop, NN dgrad, NT wgrad);
//   fp8   x's FP8 1x128 operand written by the kernel that produced x (cuda/fp8_rows.cuh: a norm,
//         SwiGLU, or one pass over the attention output) into LinearScratch's slot 0, dy quantized
//         1x128 along the reduction dimension by fp8_gemm.cuh's kernels, the weight's 128x128-block
//         copy and its transposed copy (refreshed after every update), and for wgrad x^T and dy^T
//         quantized 1x128 along tokens, all three GEMMs block-scaled.
// Activations are BF16; dx is BF16 or FP32 as the caller asks (every projection's dgrad is one
// GEMM, so the GEMM rounds it); dW is FP32, accumulated into the gradient buffer. Biases and the
// BF16 rounding after them are the caller's.
// FP8 needs the token count T to be a multiple of 128 (the engine pads its batches; padding rows
// are zero, which changes neither a 1x128 group's amax nor a sum) and N, K multiples of 16.
#ifndef FP8RL_LINEAR_CUH
#define FP8RL_LINEAR_CUH
#include <algorithm>

#include "cuda/common.cuh"
#include "cuda/device_array.cuh"
#include "cuda/fp8_rows.cuh"
#include "fp8_gemm.cuh"
#include "rl/numerics/precision.h"

namespace fp8rl {

// One projection as the GEMMs read it.
struct LinearDevice {
    const __nv_bfloat16* w;     // [N][K] BF16 copy (bf16 precision)
    const Fp8WeightCopy* w8;    // FP8 copies (fp8 precision)
    int N, K;
};

// Device scratch for the FP8 copies of activations and output gradients: codes and VEC128 scales
// of an operand [rows][cols] and of its transpose, for rows <= max_tokens and cols <= max_dim.
class LinearScratch {
  public:
    LinearScratch(int max_tokens, int max_dim, bool pow2_scales)
        : max_tokens_(max_tokens), max_dim_(max_dim), pow2_(pow2_scales) {
        size_t codes = (size_t)max_tokens * max_dim;
        size_t scales = std::max(vec128_scale_count(max_tokens, max_dim), vec128_scale_count(max_dim, max_tokens));
        for (int i = 0; i < 2; i++) {
            Storage& m = memory_[i];
            m.codes.resize(codes, "FP8 activation codes"), m.codes_t.resize(codes, "FP8 transposed activation codes");
            m.scales.resize(scales, "FP8 activation scales"), m.scales_t.resize(scales, "FP8 transposed activation scales");
            (i == 0 ? a_ : b_) = {m.codes.get(), m.codes_t.get(), m.scales.get(), m.scales_t.get()};
        }
    }

    bool pow2_scales() const { return pow2_; }

    // Slot `slot` as a producer's target for the FP8 operand of a [rows][cols] tensor.
    Fp8RowsOut rows_out(int slot, int rows, int cols) {
        check_fits(rows, cols);
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
    // Slot `slot` as the target of a producer that writes both FP8 operands of a [rows][cols] output
    // gradient (rowwise and transposed), e.g. cuda/swiglu.cuh's swiglu_backward_fp8.
    const Operand& target(int slot, int rows, int cols) const {
        check_fits(rows, cols);
        return operand(slot);
    }
    // transposed_only: x^T alone (a weight gradient's activation operand), codes left as they are.
    const Operand& quantize(int slot, const __nv_bfloat16* x, int rows, int cols, cudaStream_t stream,
                            bool transposed_only = false) {
        check_fits(rows, cols);
        Operand& o = slot == 0 ? a_ : b_;
        fp8_quantize_rowwise_gpu(x, rows, cols, pow2_, transposed_only ? nullptr : o.codes,
                                 transposed_only ? nullptr : o.scales, o.codes_t, o.scales_t, stream);
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
    Storage memory_[2];  // what a_ and b_ point into
    Operand a_, b_;
};

inline void check_linear(const char* what, Precision p, const LinearDevice& W, int T) {
    if (p == Precision::FP32) fail("%s: the GPU engine's linear layers run in bf16 or fp8, not fp32", what);
    if (p == Precision::BF16 && !W.w) fail("%s: bf16 needs the weight's BF16 copy", what);
    if (p == Precision::FP8) {
        if (!W.w8) fail("%s: fp8 needs the weight's FP8 copies", what);
        if (T % 128) fail("%s: fp8 needs the token count padded to a multiple of 128 (got %d)", what, T);
    }
}

// y [T][N] = x [T][K] . W^T, BF16 or FP32 (out): bf16 reads x, fp8 the operand x's producer wrote
// into the scratch's slot 0 (LinearScratch::rows_out).
inline void linear_forward_gpu(GemmRunner& gemm, const LinearScratch& scratch, Precision p, const LinearDevice& W,
                               const __nv_bfloat16* x, int T, void* y, GemmOut out, cudaStream_t stream) {
    check_linear("linear_forward_gpu", p, W, T);
    if (p == Precision::BF16) return gemm.bf16("fprop", W.N, T, W.K, W.w, x, y, out, stream, GemmOps::TN);
    const LinearScratch::Operand& xq = scratch.operand(0);
    gemm.fp8("fprop", W.N, T, W.K, W.w8->codes, W.w8->scale_inv, Fp8ScaleMode::BLK128x128, xq.codes, xq.scales,
             Fp8ScaleMode::VEC128, y, out, stream);
}

// dx [T][K] = dy [T][N] . W (BF16 or FP32: dx_out); dW [N][K] += dy^T . x. In fp8 a null dy means
// its producer wrote both its FP8 operands into the scratch's slot 0 (LinearScratch::target).
inline void linear_backward_gpu(GemmRunner& gemm, LinearScratch& scratch, Precision p, const LinearDevice& W,
                                const __nv_bfloat16* dy, const __nv_bfloat16* x, int T, void* dx, GemmOut dx_out,
                                float* dW, cudaStream_t stream) {
    if (!dy && p != Precision::FP8) fail("linear_backward_gpu: bf16 needs dy");
    check_linear("linear_backward_gpu", p, W, T);
    if (p == Precision::BF16) {
        gemm.bf16("dgrad", W.K, T, W.N, W.w, dy, dx, dx_out, stream, GemmOps::NN);
        gemm.bf16("wgrad", W.K, W.N, T, x, dy, dW, GemmOut::F32, stream, GemmOps::NT, true);
        return;
    }
    const LinearScratch::Operand& dyq = dy ? scratch.quantize(0, dy, T, W.N, stream)  // 1x128 along N and along T
                                           : scratch.target(0, T, W.N);
    const LinearScratch::Operand& xq = scratch.quantize(1, x, T, W.K, stream, true);  // x^T 1x128 along T
    gemm.fp8("dgrad", W.K, T, W.N, W.w8->codes_t, W.w8->scale_inv_t, Fp8ScaleMode::BLK128x128, dyq.codes, dyq.scales,
             Fp8ScaleMode::VEC128, dx, dx_out, stream);
    gemm.fp8("wgrad", W.K, W.N, T, xq.codes_t, xq.scales_t, Fp8ScaleMode::VEC128, dyq.codes_t, dyq.scales_t,
             Fp8ScaleMode::VEC128, dW, GemmOut::F32, stream, true);
}

}  // namespace fp8rl

#endif  // FP8RL_LINEAR_CUH
