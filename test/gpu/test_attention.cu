// test_attention.cu: the FlashAttention-2 kernels of cuda/kernels/attention.cuh against the CPU engine's
// attention (cpu/attention.h) on ragged packed batches: a one-token sequence, lengths that are not
// multiples of 16 or 64, one longer than a 64-row tile; GQA ratios 1 to 4; head dims 8, 16, 32
// (those of the fixture models), 64 and 128; ten short sequences in one batch. Inputs are BF16 values.
//
// Bounds (first order, per element): BF16's unit roundoff is u = 2^-8. mag is the sum of the
// magnitudes of the terms an output sums, in double precision on the host from the CPU's lse; e_s
// bounds the relative error of a probability from FP32 score sums in another order, D 2^-24
// sum|q k| scale (about 5e-4 at D = 128 for these inputs).
//   forward  O: the CPU (bf16 mode) rounds the normalised P to BF16 before P V, the GPU the
//            unnormalised P: u mag each; both round O: u |O| each. So
//            |O_gpu - O_cpu| <= (2u + 2 e_s) (mag + |O|), mag = sum_j p_j |v_j|.
//            lse: both FP32, the score sums differ by at most e_s; plus 1e-5 for the sum and exp.
//   backward dq, dk, dv: the CPU backward (FP32 throughout) gets the GPU's O and lse, so only the
//            backward differs. The GPU rounds one factor of each product to BF16 (P for dV, dS for
//            dK and dQ) and the result: (u + e_s) (mag + |g|), plus 1e-5 for FP32 sums in another
//            order (dP - delta cancels).
//   finite differences of the CPU forward (FP32) of L = sum dO * O at a few points: the backward
//            bound doubled (the GPU's delta uses the BF16 O) plus 2e-3 for the O(h^2) error and the
//            FP32 noise of a central difference with h = 1e-2. This checks the gradient's formula
//            (a missing scale or a transposed product is off by O(1)), not its last bits.
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#ifdef __CUDACC__
#pragma nv_diag_suppress 177  // cpu/gemm.h: a variable only an OpenMP if() clause reads (see test_fp8_gemm.cu)
#endif
#include "cpu/attention.h"
#ifdef __CUDACC__
#pragma nv_diag_default 177
#endif
#include "cuda/kernels/attention.cuh"
#include "test/gpu/gpu_util.cuh"
#include "test/harness.h"

using namespace fp8rl;

#define REQUIRE_GPU_FOR_ATTENTION()                  \
    do {                                             \
        std::string why_not = no_gpu_reason();       \
        if (!why_not.empty()) SKIP(why_not.c_str()); \
    } while (0)

namespace {

struct AttentionCase {
    const char* name;
    std::vector<int> lengths;
    int H, KV, D;
};

// Small enough for emulation (about 4 us per emulated thread), ragged enough to hit every edge.
const AttentionCase kAttentionCases[] = {
    {"D16 H4 KV1", {1, 17, 70, 5}, 4, 1, 16},
    {"D32 H3 KV1", {33, 1, 64, 9}, 3, 1, 32},
    {"D64 H2 KV2", {70, 1, 20}, 2, 2, 64},
    {"D128 H4 KV2", {3, 66, 1, 16}, 4, 2, 128},
    {"D8 H2 KV1", {40, 1, 6}, 2, 1, 8},
    {"D16 H2 KV1, 10 sequences", {2, 7, 1, 15, 16, 3, 31, 1, 9, 12}, 2, 1, 16},
};

// A packed batch: BF16 values held as floats (what the CPU engine reads), and the device layout.
struct Batch {
    PackedAttentionShape shape;
    std::vector<int64_t> offsets;      // the CPU's seq_offsets
    std::vector<int> cu_seqlens;       // the same, int32, for the device
    std::vector<float> q, k, v, dout;  // q, dout [T][H][D]; k, v [T][KV][D]
};

// Scores q.k / sqrt(D) with q in [-3, 3), k in [-2, 2) have a standard deviation of 2: peaked
// softmax rows, not uniform ones. v and dO in [-1, 1).
Batch make_batch(const AttentionCase& c) {
    Batch b;
    b.offsets = {0};
    int longest = 0;
    for (int len : c.lengths) {
        b.offsets.push_back(b.offsets.back() + len);
        longest = len > longest ? len : longest;
    }
    for (int64_t o : b.offsets) b.cu_seqlens.push_back((int)o);
    const long T = b.offsets.back();
    b.shape = {T, c.H, c.KV, c.D, (int)c.lengths.size(), longest};
    b.q = bf16_values((size_t)T * c.H * c.D, 11, 3.0f);
    b.k = bf16_values((size_t)T * c.KV * c.D, 12, 2.0f);
    b.v = bf16_values((size_t)T * c.KV * c.D, 13, 1.0f);
    b.dout = bf16_values((size_t)T * c.H * c.D, 14, 1.0f);
    return b;
}

// A device buffer of n elements filled with all-ones bytes (NaN in BF16 and FP32), so an element
// the kernels do not write fails every comparison.
template <class T>
std::unique_ptr<DeviceBuffer<T>> nan_buffer(size_t n) {
    auto b = std::make_unique<DeviceBuffer<T>>(n);
    CUDA_CHECK(cudaMemset(b->ptr, 0xFF, n * sizeof(T)));
    return b;
}

struct GpuResults {
    std::vector<float> out, lse, dq, dk, dv;
};

// The GPU forward, and with `backward` the backward of dO = batch.dout on the forward's O and lse.
GpuResults run_gpu(const Batch& b, bool backward) {
    const PackedAttentionShape& s = b.shape;
    DeviceBuffer<__nv_bfloat16> q(to_bf16(b.q)), k(to_bf16(b.k)), v(to_bf16(b.v)), dout(to_bf16(b.dout));
    DeviceBuffer<int> cu(b.cu_seqlens);
    auto out = nan_buffer<__nv_bfloat16>(b.q.size());
    auto lse = nan_buffer<float>((size_t)s.T * s.H);
    attention_forward(out->ptr, lse->ptr, q.ptr, k.ptr, v.ptr, cu.ptr, s, 0);
    GpuResults r;
    r.out = to_float(out->download());
    r.lse = lse->download();
    if (!backward) return r;
    auto dq = nan_buffer<__nv_bfloat16>(b.q.size()), dk = nan_buffer<__nv_bfloat16>(b.k.size()),
         dv = nan_buffer<__nv_bfloat16>(b.v.size());
    auto delta = nan_buffer<float>((size_t)s.T * s.H);
    attention_backward(dq->ptr, dk->ptr, dv->ptr, delta->ptr, dout.ptr, out->ptr, lse->ptr, q.ptr, k.ptr, v.ptr, cu.ptr,
                       s, 0);
    r.dq = to_float(dq->download());
    r.dk = to_float(dk->download());
    r.dv = to_float(dv->download());
    return r;
}

// mag (see the header) of every output: o from p_ij |v_j|, dq from |ds_ij| |k_j|, dk from
// |ds_ij| |q_i| (over the group's heads), dv from p_ij |dO_i|; p from the given lse, ds from the
// given O (delta = dO . O).
struct Magnitudes {
    std::vector<double> o, dq, dk, dv;
};

Magnitudes magnitudes(const Batch& b, const std::vector<float>& lse, const std::vector<float>& out) {
    const PackedAttentionShape& s = b.shape;
    const int group = s.H / s.KV, D = s.D;
    const long ldq = (long)s.H * D, ldk = (long)s.KV * D;
    const double scale = 1.0 / std::sqrt((double)D);
    Magnitudes m{std::vector<double>(b.q.size()), std::vector<double>(b.q.size()), std::vector<double>(b.k.size()),
                 std::vector<double>(b.v.size())};
    for (size_t si = 0; si + 1 < b.offsets.size(); si++)
        for (int h = 0; h < s.H; h++) {
            const int kvh = h / group;
            for (long i = b.offsets[si]; i < b.offsets[si + 1]; i++) {
                const float *qi = &b.q[i * ldq + h * D], *doi = &b.dout[i * ldq + h * D], *oi = &out[i * ldq + h * D];
                double delta = 0;
                for (int d = 0; d < D; d++) delta += (double)doi[d] * oi[d];
                for (long j = b.offsets[si]; j <= i; j++) {
                    const float *kj = &b.k[j * ldk + kvh * D], *vj = &b.v[j * ldk + kvh * D];
                    double score = 0, dp = 0;
                    for (int d = 0; d < D; d++) score += (double)qi[d] * kj[d], dp += (double)doi[d] * vj[d];
                    const double p = std::exp(score * scale - lse[i * s.H + h]),
                                 ds = std::fabs(p * (dp - delta) * scale);
                    for (int d = 0; d < D; d++) {
                        m.o[i * ldq + h * D + d] += p * std::fabs(vj[d]);
                        m.dq[i * ldq + h * D + d] += ds * std::fabs(kj[d]);
                        m.dk[j * ldk + kvh * D + d] += ds * std::fabs(qi[d]);
                        m.dv[j * ldk + kvh * D + d] += p * std::fabs(doi[d]);
                    }
                }
            }
        }
    return m;
}

// e_s: D 2^-24 sum|q k| scale for |q| <= 3, |k| <= 2 (make_batch).
double score_error(const PackedAttentionShape& s) { return s.D * 0x1p-24 * (s.D * 3.0 * 2.0) / std::sqrt((double)s.D); }

// Counts elements with |got - want| > rel (mag + |want|) + abs_tol; prints the largest error and
// the largest ratio of error to bound.
int count_outside(const char* what, const std::vector<float>& got, const std::vector<float>& want,
                  const std::vector<double>& mag, double rel, double abs_tol) {
    int bad = 0;
    double worst = 0, worst_ratio = 0;
    for (size_t i = 0; i < want.size(); i++) {
        const double err = std::fabs((double)got[i] - want[i]), bound = rel * (mag[i] + std::fabs(want[i])) + abs_tol;
        if (!(err <= bound)) {  // NaN counts as outside
            if (bad++ < 3)
                CHECK_MSG(false, "%s[%zu] = %.7g, expected %.7g (bound %.3g)", what, i, got[i], want[i], bound);
            worst_ratio = INFINITY;
        }
        worst = err > worst ? err : worst;
        worst_ratio = err / bound > worst_ratio ? err / bound : worst_ratio;
    }
    printf("    %-4s max |err| %.3g, max err/bound %.3g, %d / %zu outside\n", what, worst, worst_ratio, bad,
           want.size());
    return bad;
}

}  // namespace

TEST(attention_forward_matches_cpu_bf16) {
    REQUIRE_GPU_FOR_ATTENTION();
    for (const AttentionCase& c : kAttentionCases) {
        Batch b = make_batch(c);
        const PackedAttentionShape& s = b.shape;
        std::vector<float> out(b.q.size()), lse((size_t)s.T * s.H);
        attention_forward_packed(out.data(), lse.data(), b.q.data(), b.k.data(), b.v.data(), b.offsets,
                                 {s.H, s.KV, s.D}, true);
        GpuResults g = run_gpu(b, false);
        Magnitudes m = magnitudes(b, lse, out);
        printf("  %s, T = %ld:\n", c.name, s.T);
        const double e_s = score_error(s);
        CHECK_EQ(count_outside("O", g.out, out, m.o, 0x1p-7 + 2 * e_s, 0.0), 0);
        CHECK_EQ(count_outside("lse", g.lse, lse, std::vector<double>(lse.size(), 0.0), 0.0, e_s + 1e-5), 0);
    }
}

TEST(attention_backward_matches_cpu) {
    REQUIRE_GPU_FOR_ATTENTION();
    for (const AttentionCase& c : kAttentionCases) {
        Batch b = make_batch(c);
        const PackedAttentionShape& s = b.shape;
        GpuResults g = run_gpu(b, true);
        std::vector<float> dq(b.q.size()), dk(b.k.size()), dv(b.v.size()), delta((size_t)s.T * s.H);
        attention_backward_packed(dq.data(), dk.data(), dv.data(), delta.data(), b.dout.data(), g.out.data(),
                                  g.lse.data(), b.q.data(), b.k.data(), b.v.data(), b.offsets, s.T, {s.H, s.KV, s.D},
                                  true);
        Magnitudes m = magnitudes(b, g.lse, g.out);
        printf("  %s, T = %ld:\n", c.name, s.T);
        const double rel = 0x1p-8 + score_error(s);
        CHECK_EQ(count_outside("dq", g.dq, dq, m.dq, rel, 1e-5), 0);
        CHECK_EQ(count_outside("dk", g.dk, dk, m.dk, rel, 1e-5), 0);
        CHECK_EQ(count_outside("dv", g.dv, dv, m.dv, rel, 1e-5), 0);
    }
}

namespace {

// L = sum dO * O of the CPU forward in FP32, summed in double.
double forward_loss(const Batch& b) {
    const PackedAttentionShape& s = b.shape;
    std::vector<float> out(b.q.size()), lse((size_t)s.T * s.H);
    attention_forward_packed(out.data(), lse.data(), b.q.data(), b.k.data(), b.v.data(), b.offsets, {s.H, s.KV, s.D},
                             false);
    double loss = 0;
    for (size_t i = 0; i < out.size(); i++) loss += (double)b.dout[i] * out[i];
    return loss;
}

// (L(x + h) - L(x - h)) / 2h for element i of the input `x` points at (a member of b).
double central_difference(Batch& b, std::vector<float>& x, size_t i) {
    const double h = 1e-2;
    const float saved = x[i];
    x[i] = (float)(saved + h);
    const double up = forward_loss(b);
    x[i] = (float)(saved - h);
    const double down = forward_loss(b);
    x[i] = saved;
    return (up - down) / (2 * h);
}

}  // namespace

TEST(attention_backward_matches_finite_differences) {
    REQUIRE_GPU_FOR_ATTENTION();
    for (const AttentionCase& c : kAttentionCases) {
        Batch b = make_batch(c);
        const PackedAttentionShape& s = b.shape;
        GpuResults g = run_gpu(b, true);
        Magnitudes m = magnitudes(b, g.lse, g.out);
        struct Input {
            const char* name;
            std::vector<float>* x;
            const std::vector<float>* grad;
            const std::vector<double>* mag;
        } inputs[] = {{"q", &b.q, &g.dq, &m.dq}, {"k", &b.k, &g.dk, &m.dk}, {"v", &b.v, &g.dv, &m.dv}};
        double worst_ratio = 0;
        int points = 0;
        for (const Input& in : inputs)
            for (int p = 0; p < 4; p++) {
                // Rows spread over the batch (the first row is the start of a sequence), heads and dims.
                const size_t row_len = in.x->size() / s.T, i = (size_t)(p * s.T / 4) * row_len + (p * 7 + 3) % row_len;
                const double fd = central_difference(b, *in.x, i), got = (*in.grad)[i];
                const double rel = 2 * (0x1p-8 + score_error(s));
                const double bound = rel * ((*in.mag)[i] + std::fabs(fd)) + 2e-3, err = std::fabs(got - fd);
                CHECK_MSG(err <= bound, "%s: d%s[%zu] = %.6g, finite difference %.6g (bound %.3g)", c.name, in.name, i,
                          got, fd, bound);
                worst_ratio = err / bound > worst_ratio ? err / bound : worst_ratio;
                points++;
            }
        printf("  %s: %d points, max err/bound %.3g\n", c.name, points, worst_ratio);
    }
}

// Every output has one writer and a fixed summation order (no atomics): two runs agree bit for bit.
TEST(attention_backward_is_deterministic) {
    REQUIRE_GPU_FOR_ATTENTION();
    Batch b = make_batch(kAttentionCases[0]);
    GpuResults first = run_gpu(b, true), second = run_gpu(b, true);
    CHECK(memcmp(first.dq.data(), second.dq.data(), first.dq.size() * sizeof(float)) == 0);
    CHECK(memcmp(first.dk.data(), second.dk.data(), first.dk.size() * sizeof(float)) == 0);
    CHECK(memcmp(first.dv.data(), second.dv.data(), first.dv.size() * sizeof(float)) == 0);
}

// At D = 128 the forward writes its output's FP8 1x128 operand for the O projection (a head's row is
// one group) as the CPU quantizes the BF16 output it wrote (fp8_quantize_rowwise: codes and scales
// byte for byte), the padding rows up to the GEMM's 256 as zeros over garbage: 130 rows (a whole
// 128-row block and 2) and 141 (sequences of 100, 1 and 40), power-of-two scales in one. The BF16
// output is the one written without the operand.
TEST(attention_forward_writes_fp8_operand_bit_for_bit) {
    REQUIRE_GPU_FOR_ATTENTION();
    const AttentionCase cases[] = {{"130 rows", {66, 64}, 2, 1, 128}, {"141 rows", {100, 1, 40}, 2, 1, 128}};
    const int padded = 256;
    for (const AttentionCase& c : cases)
        for (bool pow2 : {false, true}) {
            if (pow2 && c.lengths.size() == 2) continue;
            const Batch b = make_batch(c);
            const PackedAttentionShape& s = b.shape;
            const int cols = s.H * s.D;
            DeviceBuffer<__nv_bfloat16> q(to_bf16(b.q)), k(to_bf16(b.k)), v(to_bf16(b.v));
            DeviceBuffer<int> cu(b.cu_seqlens);
            DeviceBuffer<uint8_t> codes(std::vector<uint8_t>((size_t)padded * cols, 0xAB));
            DeviceBuffer<float> scales(std::vector<float>(vec128_scale_count(padded, cols), NAN));
            const Fp8RowsOut q8{codes.ptr, scales.ptr, padded, pow2};
            auto out = nan_buffer<__nv_bfloat16>(b.q.size());
            auto lse = nan_buffer<float>((size_t)s.T * s.H);
            attention_forward(out->ptr, lse->ptr, q.ptr, k.ptr, v.ptr, cu.ptr, s, 0, nullptr, nullptr, q8);
            std::vector<float> o((size_t)padded * cols, 0.0f);
            const std::vector<float> got = to_float(out->download());
            std::copy(got.begin(), got.end(), o.begin());
            const Fp8Tensor want = fp8_quantize_rowwise(o.data(), padded, cols, pow2);
            const int bad = fp8_operand_differences(codes, scales, want);
            printf("  %s%s: %d of %zu codes and scales differ\n", c.name, pow2 ? ", pow2 scales" : "", bad,
                   want.data.size() + want.scale_inv.size());
            CHECK_EQ(bad, 0);
            const GpuResults plain = run_gpu(b, false);
            CHECK(memcmp(plain.out.data(), got.data(), got.size() * sizeof(float)) == 0);
        }
    // what it refuses: a head dim whose rows are not one group, too few operand rows
    DeviceBuffer<uint8_t> codes(64 * 64);
    DeviceBuffer<float> scales(64);
    PackedAttentionShape s{10, 1, 1, 64, 1, 10};
    CHECK_THROWS(attention_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, s, 0, nullptr, nullptr,
                                   Fp8RowsOut{codes.ptr, scales.ptr, 64, false}),
                 "needs head dim D = 128");
    s = {70, 1, 1, 128, 1, 70};
    CHECK_THROWS(attention_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, s, 0, nullptr, nullptr,
                                   Fp8RowsOut{codes.ptr, scales.ptr, 64, false}),
                 "70 real rows in an FP8 operand of 64 rows");
}

// In an fp8 training step the backward's delta kernel also writes the O wgrad's operand, out^T
// quantized 1x128 along tokens, as the CPU quantizes the BF16 output (fp8_quantize_rowwise_transposed
// of out with zero rows up to the GEMM's 256: codes and scales byte for byte, over garbage), and delta
// as the CPU engine's attention_backward_packed sums it (dot_in_order, bit for bit); dq, dk, dv are
// those of the backward without the operand. 130 rows (a whole 128-token tile and 2) and 141
// (sequences of 100, 1 and 40) at D = 128 (a head a tile), power-of-two scales in one; D = 32, H = 3
// (three heads a tile, 96 of its 128 columns).
TEST(attention_backward_writes_fp8_att_t_bit_for_bit) {
    REQUIRE_GPU_FOR_ATTENTION();
    const AttentionCase cases[] = {{"130 rows", {66, 64}, 2, 1, 128},
                                   {"141 rows", {100, 1, 40}, 2, 1, 128},
                                   {"141 rows, D32 H3", {100, 1, 40}, 3, 1, 32}};
    const int padded = 256;
    for (const AttentionCase& c : cases)
        for (bool pow2 : {false, true}) {
            if (pow2 && c.lengths.size() == 2) continue;
            const Batch b = make_batch(c);
            const PackedAttentionShape& s = b.shape;
            const int cols = s.H * s.D;
            DeviceBuffer<__nv_bfloat16> q(to_bf16(b.q)), k(to_bf16(b.k)), v(to_bf16(b.v)), dout(to_bf16(b.dout));
            DeviceBuffer<int> cu(b.cu_seqlens);
            auto out = nan_buffer<__nv_bfloat16>(b.q.size());
            auto lse = nan_buffer<float>((size_t)s.T * s.H);
            attention_forward(out->ptr, lse->ptr, q.ptr, k.ptr, v.ptr, cu.ptr, s, 0);
            DeviceBuffer<uint8_t> codes(std::vector<uint8_t>((size_t)padded * cols, 0xAB));
            DeviceBuffer<float> scales(std::vector<float>(vec128_scale_count(cols, padded), NAN));
            auto dq = nan_buffer<__nv_bfloat16>(b.q.size()), dk = nan_buffer<__nv_bfloat16>(b.k.size()),
                 dv = nan_buffer<__nv_bfloat16>(b.v.size());
            auto delta = nan_buffer<float>((size_t)s.T * s.H);
            attention_backward(dq->ptr, dk->ptr, dv->ptr, delta->ptr, dout.ptr, out->ptr, lse->ptr, q.ptr, k.ptr, v.ptr,
                               cu.ptr, s, 0, Fp8TransposedOut{codes.ptr, scales.ptr, padded, pow2});
            const std::vector<float> o = to_float(out->download());
            std::vector<float> o_padded((size_t)padded * cols, 0.0f);
            std::copy(o.begin(), o.end(), o_padded.begin());
            const Fp8Tensor want = fp8_quantize_rowwise_transposed(o_padded.data(), padded, cols, pow2);
            const int bad = fp8_operand_differences(codes, scales, want);
            const std::vector<float> got_delta = delta->download();
            int bad_delta = 0;
            for (long t = 0; t < s.T; t++)
                for (int h = 0; h < s.H; h++) {
                    const size_t at = (size_t)t * cols + (size_t)h * s.D;
                    bad_delta += float_bits(got_delta[t * s.H + h]) != float_bits(dot_in_order(&b.dout[at], &o[at], s.D));
                }
            printf("  %s%s: %d of %zu codes and scales differ, %d of %ld deltas\n", c.name, pow2 ? ", pow2 scales" : "",
                   bad, want.data.size() + want.scale_inv.size(), bad_delta, s.T * s.H);
            CHECK_EQ(bad, 0);
            CHECK_EQ(bad_delta, 0);
            const GpuResults plain = run_gpu(b, true);
            const std::vector<float> got[3] = {to_float(dq->download()), to_float(dk->download()), to_float(dv->download())};
            const std::vector<float>* want_grads[3] = {&plain.dq, &plain.dk, &plain.dv};
            for (int i = 0; i < 3; i++)
                CHECK(memcmp(got[i].data(), want_grads[i]->data(), got[i].size() * sizeof(float)) == 0);
        }
    // what it refuses: too few operand rows, out or dout not 16-byte aligned
    DeviceBuffer<uint8_t> codes(128 * 128);
    DeviceBuffer<float> scales(128);
    PackedAttentionShape s{130, 1, 1, 128, 1, 130};
    CHECK_THROWS(attention_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                    nullptr, nullptr, s, 0, Fp8TransposedOut{codes.ptr, scales.ptr, 128, false}),
                 "130 real rows in a transposed FP8 operand of 128 rows");
    s = {100, 1, 1, 128, 1, 100};
    const __nv_bfloat16* unaligned = reinterpret_cast<const __nv_bfloat16*>(codes.ptr + 2);
    CHECK_THROWS(attention_backward(nullptr, nullptr, nullptr, nullptr, unaligned, unaligned, nullptr, nullptr, nullptr,
                                    nullptr, nullptr, s, 0, Fp8TransposedOut{codes.ptr, scales.ptr, 128, false}),
                 "not 16-byte aligned");
}

TEST(attention_rejects_unsupported_shapes) {
    PackedAttentionShape s{10, 4, 2, 48, 1, 10};
    CHECK_THROWS(attention_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, s, 0), "head dim D = 48");
    s = {10, 4, 3, 64, 1, 10};
    CHECK_THROWS(attention_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                    nullptr, nullptr, s, 0),
                 "kv heads KV = 3");
    s = {10, 4, 2, 64, 2, 11};
    CHECK_THROWS(attention_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, s, 0), "max_seqlen = 11");
    s = {10, 4, 2, 64, 2, 0};
    CHECK_THROWS(attention_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, s, 0), "max_seqlen = 0");
}
