// bench_attention.cu: our causal attention (cuda/kernels/attention.cuh, FlashAttention-2 on mma.sync) against
// a baseline of the same math on cuBLASLt: per head, S = Q K^T as a BF16 GEMM with FP32 output, a
// causal softmax kernel writing P in BF16, O = P V as a BF16 GEMM; its backward recomputes S and P,
// then dV += P^T dO, dP = dO V^T, dS = P (dP - rowsum(P dP)) / sqrt(D), dQ = dS K, dK += dS^T Q.
// Shapes: one sequence of 512 to 16k tokens, Qwen3-0.6B/1.7B's 16 query heads and 8 kv heads of
// head dim 128 (--tiny: 128 tokens, 2 / 1 heads). TFLOP/s count the causal half only (forward 2
// products, backward 5, FA2's convention) for both, though the GEMM baseline computes every score.
// Both get the same random inputs; their outputs must agree within a relative Frobenius distance of
// 2e-2 (each rounds P to BF16 once, ~4e-3 per element: 5x margin; a wrong index is off by ~1).
// Forward rows print FlashAttention-2's and -3's published H100 rates at the lengths they were
// measured at (/work/shared/docs/perf-anchors.md: d 128, causal forward, 512 to 4k tokens).
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "cuda/kernels/attention.cuh"
#include "cuda/kernels/block_reduce.cuh"
#include "test/gpu/bench_util.cuh"

using namespace fp8rl;

namespace {

using bf16 = __nv_bfloat16;
constexpr double kTolerance = 2e-2;

// y [heads][T][D] = x [T][heads][D]: the baseline's GEMMs take one head's rows contiguous.
static __global__ void to_head_major_kernel(const bf16* x, bf16* y, long T, int heads, int D) {
    const long n = T * heads * D;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const long t = i / ((long)heads * D), h = i / D % heads, d = i % D;
        y[(h * T + t) * D + d] = x[i];
    }
}

// p[q][0..n) = softmax over keys 0..q of scale * s[q][..], 0 for later keys; one block per query row.
static __global__ void causal_softmax_kernel(const float* s, bf16* p, int n, float scale) {
    const long q = blockIdx.x;
    const float* row = s + q * n;
    float m = -FLT_MAX, l = 0.0f;
    for (int j = threadIdx.x; j <= q; j += blockDim.x) m = fmaxf(m, row[j]);
    m = block_reduce(m, MaxOp());
    for (int j = threadIdx.x; j <= q; j += blockDim.x) l += expf(scale * (row[j] - m));
    l = block_reduce(l, SumOp());
    for (int j = threadIdx.x; j < n; j += blockDim.x)
        p[q * n + j] = __float2bfloat16_rn(j <= q ? expf(scale * (row[j] - m)) / l : 0.0f);
}

// ds[q][j] = scale * p (dp - sum_j p dp) over keys 0..q, 0 for later keys (softmax's backward).
static __global__ void causal_softmax_backward_kernel(const bf16* p, const float* dp, bf16* ds, int n, float scale) {
    const long q = blockIdx.x;
    float delta = 0.0f;
    for (int j = threadIdx.x; j <= q; j += blockDim.x) delta += __bfloat162float(p[q * n + j]) * dp[q * n + j];
    delta = block_reduce(delta, SumOp());
    for (int j = threadIdx.x; j < n; j += blockDim.x)
        ds[q * n + j] = __float2bfloat16_rn(j <= q ? scale * __bfloat162float(p[q * n + j]) * (dp[q * n + j] - delta) : 0.0f);
}

struct Problem {
    int N, H, KV, D;
};

// The baseline's operands (head-major copies of the inputs) and its N x N work buffers of one head.
struct Baseline {
    const Problem& P;
    GemmRunner& gemm;
    DeviceBuffer<bf16> q, k, v, dout, o, dq, p, ds;
    DeviceBuffer<float> s, dp, dk, dv;
    Baseline(const Problem& pr, GemmRunner& g)
        : P(pr), gemm(g), q(rows(P.H)), k(rows(P.KV)), v(rows(P.KV)), dout(rows(P.H)), o(rows(P.H)), dq(rows(P.H)),
          p((size_t)P.N * P.N), ds((size_t)P.N * P.N), s((size_t)P.N * P.N), dp((size_t)P.N * P.N), dk(rows(P.KV)),
          dv(rows(P.KV)) {}
    size_t rows(int heads) const { return (size_t)P.N * heads * P.D; }
    size_t head(int h) const { return (size_t)h * P.N * P.D; }
    float scale() const { return 1.0f / std::sqrt((float)P.D); }

    // P of query head h (kv head kv): S = Q K^T (TN: m = keys, n = queries), then the softmax.
    void probabilities(int h, int kv) {
        gemm.bf16("S = Q K^T", P.N, P.N, P.D, k.ptr + head(kv), q.ptr + head(h), s.ptr, GemmOut::F32, 0);
        LAUNCH_KERNEL(causal_softmax_kernel, P.N, 256, 0, 0, s.ptr, p.ptr, P.N, scale());
    }
    void forward() {
        for (int h = 0; h < P.H; h++) {
            const int kv = h / (P.H / P.KV);
            probabilities(h, kv);
            gemm.bf16("O = P V", P.D, P.N, P.N, v.ptr + head(kv), p.ptr, o.ptr + head(h), GemmOut::BF16, 0, GemmOps::NN);
        }
    }
    void backward() {
        CUDA_CHECK(cudaMemsetAsync(dk.ptr, 0, dk.count * sizeof(float), 0));
        CUDA_CHECK(cudaMemsetAsync(dv.ptr, 0, dv.count * sizeof(float), 0));
        for (int h = 0; h < P.H; h++) {
            const int kv = h / (P.H / P.KV);
            probabilities(h, kv);
            gemm.bf16("dV += P^T dO", P.D, P.N, P.N, dout.ptr + head(h), p.ptr, dv.ptr + head(kv), GemmOut::F32, 0,
                      GemmOps::NT, true);
            gemm.bf16("dP = dO V^T", P.N, P.N, P.D, v.ptr + head(kv), dout.ptr + head(h), dp.ptr, GemmOut::F32, 0);
            LAUNCH_KERNEL(causal_softmax_backward_kernel, P.N, 256, 0, 0, p.ptr, dp.ptr, ds.ptr, P.N, scale());
            gemm.bf16("dQ = dS K", P.D, P.N, P.N, k.ptr + head(kv), ds.ptr, dq.ptr + head(h), GemmOut::BF16, 0, GemmOps::NN);
            gemm.bf16("dK += dS^T Q", P.D, P.N, P.N, q.ptr + head(h), ds.ptr, dk.ptr + head(kv), GemmOut::F32, 0,
                      GemmOps::NT, true);
        }
    }
};

template <class T>
float value(T x) {
    if constexpr (std::is_same<T, bf16>::value) return __bfloat162float(x);
    else return x;
}

// ||ours - base|| / ||base||, ours [N][heads][D], base [heads][N][D].
template <class T>
double distance(const DeviceBuffer<bf16>& ours, const DeviceBuffer<T>& base, int N, int heads, int D) {
    const std::vector<bf16> a = ours.download();
    const std::vector<T> b = base.download();
    double d = 0, r = 0;
    for (long t = 0; t < N; t++)
        for (int h = 0; h < heads; h++)
            for (int i = 0; i < D; i++) {
                const double x = value(a[((size_t)t * heads + h) * D + i]), y = value(b[((size_t)h * N + t) * D + i]);
                d += (x - y) * (x - y), r += y * y;
            }
    return std::sqrt(d / std::max(r, 1e-300));
}

void to_head_major(const DeviceBuffer<bf16>& x, DeviceBuffer<bf16>& y, int N, int heads, int D) {
    LAUNCH_KERNEL(to_head_major_kernel, 1024, 256, 0, 0, x.ptr, y.ptr, (long)N, heads, D);
}

// FlashAttention-2 and -3 forward TFLOP/s on an H100 (d 128, causal) at T tokens; 0 where not published.
struct FlashAnchor {
    int T;
    double fa2, fa3;
};
constexpr FlashAnchor kFlashAnchors[] = {{512, 191, 292}, {1024, 260, 423}, {2048, 298, 521}, {4096, 319, 579}};

// "191" or "-" for the anchor `which` (FA2 or FA3) of the forward at T tokens.
std::string anchor_text(int T, bool forward, double FlashAnchor::*which) {
    for (const FlashAnchor& a : kFlashAnchors)
        if (forward && a.T == T) {
            char text[16];
            snprintf(text, sizeof text, "%.0f", a.*which);
            return text;
        }
    return "-";
}

// One problem: times and agreement of both passes; returns false when an output disagrees.
bool bench_problem(GemmRunner& gemm, const Problem& P) {
    const PackedAttentionShape shape{P.N, P.H, P.KV, P.D, 1, P.N};
    const size_t qn = (size_t)P.N * P.H * P.D, kn = (size_t)P.N * P.KV * P.D;
    DeviceBuffer<bf16> q(qn), k(kn), v(kn), dout(qn), o(qn), dq(qn), dk(kn), dv(kn);
    DeviceBuffer<float> lse((size_t)P.N * P.H), delta((size_t)P.N * P.H);
    DeviceBuffer<int> cu(std::vector<int>{0, P.N});
    fill_uniform(q.ptr, qn, 11, 1.5f), fill_uniform(k.ptr, kn, 12, 1.5f), fill_uniform(v.ptr, kn, 13, 1.0f);
    fill_uniform(dout.ptr, qn, 14, 1.0f);
    Baseline base(P, gemm);
    to_head_major(q, base.q, P.N, P.H, P.D), to_head_major(k, base.k, P.N, P.KV, P.D);
    to_head_major(v, base.v, P.N, P.KV, P.D), to_head_major(dout, base.dout, P.N, P.H, P.D);

    auto forward = [&] { attention_forward(o.ptr, lse.ptr, q.ptr, k.ptr, v.ptr, cu.ptr, shape, 0); };
    auto backward = [&] {
        attention_backward(dq.ptr, dk.ptr, dv.ptr, delta.ptr, dout.ptr, o.ptr, lse.ptr, q.ptr, k.ptr, v.ptr, cu.ptr, shape, 0);
    };
    const double ours_fwd = median_ms(forward, 5, 2), base_fwd = median_ms([&] { base.forward(); }, 5, 2);
    const double ours_bwd = median_ms(backward, 5, 2), base_bwd = median_ms([&] { base.backward(); }, 5, 2);
    const double d_out = distance(o, base.o, P.N, P.H, P.D);
    const double d_grad = std::max({distance(dq, base.dq, P.N, P.H, P.D), distance(dk, base.dk, P.N, P.KV, P.D),
                                    distance(dv, base.dv, P.N, P.KV, P.D)});
    const double pairs = 0.5 * P.N * (P.N + 1.0) * P.H;  // causal (query, key) pairs over the heads
    // cuda/perf/kernel_perf_model.h's price of our kernels on this GPU (what their SASS issues, their bytes
    // at the datasheet bandwidth: forward q, k, v in, o and the LSE out; backward those and dO, dQ, dK, dV)
    const double N = P.N, io = N * P.D * 2.0 * (P.H + 2 * P.KV);
    auto price = [&](bool backward) {
        return training_attention_price(bench_gpu(), backward, {N}, P.H, P.D,
                                        backward ? 2 * io + 2 * N * P.H * P.D * 2.0 + N * P.H * 8.0 : io + N * P.H * (P.D * 2.0 + 4),
                                        backward ? 3 : 1);
    };
    auto predicted_ms = [&](bool backward) { return price(backward).seconds() * 1e3; };
    for (bool backward : {false, true})
        record_calibration("bench_attention", strfmt("attention %s N=%d H=%d KV=%d D=%d", backward ? "backward" : "forward", P.N, P.H, P.KV, P.D),
                           (backward ? ours_bwd : ours_fwd) * 1e-3, price(backward).seconds(), price(backward).bound());
    struct Row {
        const char* pass;
        double ours, base, flop, dist, predicted;
    } rows[] = {{"forward", ours_fwd, base_fwd, 4.0 * P.D * pairs, d_out, predicted_ms(false)},
                {"backward", ours_bwd, base_bwd, 10.0 * P.D * pairs, d_grad, predicted_ms(true)}};
    bool ok = true;
    for (const Row& r : rows) {
        const bool fwd = r.flop == rows[0].flop;
        printf("| %d | %d / %d | %s | %.3f (%.3f) | %.0f (%.0f) | %s | %s | %.3f | %.0f | %.2f | %.2e |\n", P.N, P.H, P.KV,
               r.pass, r.ours, r.predicted, tflops(r.flop, r.ours), tflops(r.flop, r.predicted),
               anchor_text(P.N, fwd, &FlashAnchor::fa2).c_str(), anchor_text(P.N, fwd, &FlashAnchor::fa3).c_str(), r.base,
               tflops(r.flop, r.base), r.base / r.ours, r.dist);
        if (!(r.dist <= kTolerance)) {
            printf("| %d | | %s | ERROR: ours and the baseline differ by %.2e > %.0e |\n", P.N, r.pass, r.dist, kTolerance);
            ok = false;
        }
    }
    fflush(stdout);
    return ok;
}

}  // namespace

int main(int argc, char** argv) {
    const bool tiny = bench_tiny(argc, argv, "bench_attention");
    std::string why_not = bench_unavailable_reason();
    if (!why_not.empty()) {
        printf("bench_attention: SKIPPED: %s\n", why_not.c_str());
        return 0;
    }
    print_bench_header("bench_attention", tiny);
    printf("causal, one sequence of T tokens, head dim 128; TFLOP/s = causal FLOPs (forward 4 D pairs, backward 10 D "
           "pairs) / median time; speedup = baseline time / ours; diff = relative distance of the outputs (forward: O; "
           "backward: the worst of dQ, dK, dV); in parentheses cuda/perf/kernel_perf_model.h's prediction for this GPU "
           "(what the kernels' SASS issues at the SM's rates, or their bytes at the datasheet bandwidth)\n\n");
    printf("| T | heads q / kv | pass | ours ms | ours TF/s | FA2 TF/s | FA3 TF/s | cuBLASLt+softmax ms | baseline TF/s | "
           "speedup | diff |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
    std::vector<Problem> problems = {{512, 16, 8, 128},  {1024, 16, 8, 128}, {2048, 16, 8, 128},
                                     {4096, 16, 8, 128}, {8192, 16, 8, 128}, {16384, 16, 8, 128}};
    if (tiny) problems = {{128, 2, 1, 128}};
    GemmRunner gemm;
    int failures = 0;
    for (const Problem& P : problems) {
        try {
            if (!bench_problem(gemm, P)) failures++;
        } catch (const Error& e) {
            printf("| %d | ERROR: %s |\n", P.N, e.what());
            failures++;
            cudaGetLastError();  // clear a sticky launch error so the next problem can run
        }
    }
    printf("\nbench_attention: %d problem(s) failed\n", failures);
    return failures ? 1 : 0;
}
