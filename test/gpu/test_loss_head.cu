// test_loss_head.cu: the fused lm_head + log-prob + entropy (loss.cuh) against the CPU engine's
// head (cpu/logprob_head.h) on ragged shapes (token counts not multiples of 8 or 16, hidden sizes
// and vocabularies not multiples of 128 or of the chunk, a last chunk that is not a multiple of 8,
// 2 and 4 chunks), at temperatures 1 and 0.7, forward and backward; the GPU backward against
// finite differences of the GPU forward; and the top-1 hits against the CPU head's and float64's.
// Every bound is derived below from the rounding of each side; none is fitted to the observed
// errors, which are printed beside them.
#include <cmath>
#include <cstring>
#include <vector>

// cpu/gemm.h sets a variable that only an OpenMP if() clause reads; nvcc's front end ignores OpenMP
// pragmas and would call it unused (an error under -Werror all-warnings).
#ifdef __CUDACC__
#pragma nv_diag_suppress 177
#endif
#include "cpu/logprob_head.h"
#ifdef __CUDACC__
#pragma nv_diag_default 177
#endif
#include "loss.cuh"
#include "test/gpu/gpu_util.cuh"
#include "test/harness.h"

using namespace fp8rl;

namespace {

constexpr double U = 0x1p-24;  // FP32 unit roundoff

// One head problem: BF16-valued x [T][C] and W [V][C] (held as floats for the CPU), targets
// (some -1, some in the last chunk) and the backward's incoming gradients a = dL/dlogprob,
// b = dL/dentropy (some zero).
struct HeadProblem {
    int T, C, V;
    float temperature;
    std::vector<float> x, W, a, b;
    std::vector<int32_t> target;

    HeadProblem(int T_, int C_, int V_, float temp, uint32_t seed) : T(T_), C(C_), V(V_), temperature(temp) {
        x.resize((size_t)T * C), W.resize((size_t)V * C), a.resize(T), b.resize(T), target.resize(T);
        for (size_t i = 0; i < x.size(); i++) x[i] = round_bf16(hash_uniform(i, seed));
        // rows of W with different scales, so that the softmax is neither flat nor one-hot
        for (size_t i = 0; i < W.size(); i++)
            W[i] = round_bf16((0.3f + 0.3f * (float)((i / C) % 5)) * hash_uniform(i, seed + 1) * 3.0f / std::sqrt((float)C));
        for (int t = 0; t < T; t++) {
            target[t] = (int32_t)((hash_uniform(t, seed + 2) + 1.0f) * 0.5f * V);
            if (t % 5 == 1) target[t] = V - 1 - t;  // in the last chunk
            if (t % 7 == 3) target[t] = -1;
            // a row without a target has no log-prob term: dL/dlogprob 0, as the CPU engine passes it
            a[t] = t % 6 == 2 || target[t] < 0 ? 0.0f : hash_uniform(t, seed + 3);
            b[t] = t % 4 == 1 ? 0.0f : 0.5f * hash_uniform(t, seed + 4);
        }
    }
    HeadGpuShape shape() const { return {V, C, temperature}; }
};

// What the bounds need, in double from the BF16 inputs (products exact, sums of <= 1000 terms
// within 1e-13 relative): per token z_j, p_j, mu, logZ, entropy and S_j = sum_c |x_c W_jc| / T.
struct Exact {
    int T, V;
    std::vector<double> z, p, s, lse, mu, entropy;  // z, p, s [T][V]
    explicit Exact(const HeadProblem& h) : T(h.T), V(h.V) {
        z.resize((size_t)T * V), p.resize(z.size()), s.resize(z.size()), lse.resize(T), mu.resize(T), entropy.resize(T);
        for (int t = 0; t < T; t++) {
            double zmax = -INFINITY;
            for (int j = 0; j < V; j++) {
                double dot = 0, abs_dot = 0;
                for (int c = 0; c < h.C; c++) {
                    double prod = (double)h.x[(size_t)t * h.C + c] * h.W[(size_t)j * h.C + c];
                    dot += prod, abs_dot += std::fabs(prod);
                }
                z[(size_t)t * V + j] = dot / h.temperature;
                s[(size_t)t * V + j] = abs_dot / h.temperature;
                zmax = std::fmax(zmax, dot / h.temperature);
            }
            double sum = 0, sz = 0;
            for (int j = 0; j < V; j++) sum += std::exp(z[(size_t)t * V + j] - zmax);
            for (int j = 0; j < V; j++) {
                double pj = std::exp(z[(size_t)t * V + j] - zmax) / sum;
                p[(size_t)t * V + j] = pj;
                sz += pj * z[(size_t)t * V + j];
            }
            lse[t] = zmax + std::log(sum), mu[t] = sz, entropy[t] = lse[t] - sz;
        }
    }
    double at(const std::vector<double>& m, int t, int j) const { return m[(size_t)t * V + j]; }
};

// Forward bound per token, GPU vs CPU. Logits: the CPU's FP32 FMA chain over C terms rounds C times,
// the GPU's FP32 accumulation at most C times with truncation (2 U each; the emulation rounds once),
// and the division by the temperature once on each side: |dz_j| <= (3C + 2) U S_j. Each exp term
// (rl/numerics/fast_exp.h, < 2 ulp = 4U relative, of an argument z_j - max rounded once) acts like a
// perturbation of z_j by 4U + U |z_j - max| on each side. With D = max_j of both:
//   |d logZ| <= D (a p-weighted mean of the perturbations), |d logprob| <= |dz_y| + D <= 2D,
//   |d mu| <= D + (e^{2D} - 1) sum_j p_j |z_j - mu|, |d entropy| <= |d logZ| + |d mu|,
// plus the final rounding to float on each side (2U of the value). Sums in double: negligible.
struct ForwardBound {
    std::vector<double> D, logprob, entropy;
    ForwardBound(const HeadProblem& h, const Exact& e) : D(h.T), logprob(h.T), entropy(h.T) {
        for (int t = 0; t < h.T; t++) {
            double zmax = -INFINITY, d = 0, spread = 0;
            for (int j = 0; j < h.V; j++) zmax = std::fmax(zmax, e.at(e.z, t, j));
            for (int j = 0; j < h.V; j++) {
                double zj = e.at(e.z, t, j);
                d = std::fmax(d, (3.0 * h.C + 2) * U * e.at(e.s, t, j) + 2 * (4 * U + U * (zmax - zj)));
                spread += e.at(e.p, t, j) * std::fabs(zj - e.mu[t]);
            }
            D[t] = d;
            double lp = h.target[t] >= 0 ? e.at(e.z, t, h.target[t]) - e.lse[t] : 0.0;
            logprob[t] = h.target[t] >= 0 ? 2 * d + 2 * U * std::fabs(lp) : 0.0;
            entropy[t] = 2 * d + std::expm1(2 * d) * spread + 2 * U * (std::fabs(e.entropy[t]) + std::fabs(e.mu[t]));
        }
    }
};

struct Figures {
    double worst_ratio = 0, max_err = 0;
    long outside = 0, count = 0;
    void add(double gpu, double cpu, double tol) {
        double err = std::fabs(gpu - cpu);
        worst_ratio = std::fmax(worst_ratio, err / (tol > 0 ? tol : 1e-300));
        max_err = std::fmax(max_err, err);
        outside += !(err <= tol);
        count++;
    }
    void print(const char* what) const {
        printf("      %-9s max |gpu - cpu| %.3g, worst |err|/bound %.3g, %ld of %ld outside\n", what, max_err, worst_ratio,
               outside, count);
    }
};

struct GpuHead {
    DeviceBuffer<__nv_bfloat16> x, W;
    DeviceBuffer<int32_t> target;
    DeviceBuffer<float> logprob, entropy, lse, mu;
    explicit GpuHead(const HeadProblem& h)
        : x(to_bf16(h.x)), W(to_bf16(h.W)), target(h.target), logprob(h.T), entropy(h.T), lse(h.T), mu(h.T) {}
    void forward(LogprobHeadGpu& head, const HeadProblem& h) {
        head.forward(logprob.ptr, entropy.ptr, lse.ptr, mu.ptr, x.ptr, W.ptr, target.ptr, h.T, h.shape(), 0);
    }
};

// The shapes of the CPU comparisons: T, C, V, the GPU's vocabulary chunk and token block.
struct HeadCase {
    int T, C, V, chunk, block;
    int blocks() const { return (T + block - 1) / block; }
    int padded_rows() const { return (blocks() - 1) * block + round_up8(T - (blocks() - 1) * block); }  // sum of Tb8
};
const HeadCase kHeadCases[] = {
    {37, 72, 2300, HEAD_VOCAB_CHUNK, HEAD_TOKEN_BLOCK},  // 2 chunks, the last 252 columns (not a multiple of 8)
    // 4 chunks of 256 (the CPU's stay 2048), the last 235 columns; token blocks of 8, 8, 5 (the CPU's
    // rows stay in one block: the tiles' sums must not depend on either)
    {21, 136, 1003, 256, 8},
};

// f(case, temperature, problem) for each case at temperatures 1 and 0.7; the problem's seed is seed + T.
template <class F>
void for_each_head_case(uint32_t seed, F f) {
    for (const HeadCase& hc : kHeadCases)
        for (float temperature : {1.0f, 0.7f}) {
            HeadProblem h(hc.T, hc.C, hc.V, temperature, seed + hc.T);
            f(hc, temperature, h);
        }
}

}  // namespace

TEST(gpu_head_forward_matches_cpu) {
    GemmRunner gemm;
    for_each_head_case(17, [&](const HeadCase& hc, float temperature, HeadProblem& h) {
        GpuHead g(h);
        LogprobHeadGpu head(gemm, hc.chunk, hc.block);
        g.logprob.poison(), g.entropy.poison(), g.lse.poison(), g.mu.poison();
        g.forward(head, h);
        std::vector<float> lp(h.T), ent(h.T), lse(h.T), mu(h.T);
        HeadScratch scratch;
        head_forward(lp.data(), ent.data(), lse.data(), mu.data(), h.x.data(), h.W.data(), h.target.data(), h.T,
                     {h.V, h.C, h.temperature}, scratch, false);
        Exact e(h);
        ForwardBound bound(h, e);
        std::vector<float> glp = g.logprob.download(), gent = g.entropy.download();
        Figures f_lp, f_ent;
        for (int t = 0; t < h.T; t++) {
            f_lp.add(glp[t], lp[t], bound.logprob[t]);
            f_ent.add(gent[t], ent[t], bound.entropy[t]);
        }
        printf("    T=%d C=%d V=%d chunk=%d block=%d temperature=%g (entropy %.3g .. , logprob %.3g ..):\n", h.T, h.C,
               h.V, hc.chunk, hc.block, temperature, ent[0], lp[0]);
        f_lp.print("logprob");
        f_ent.print("entropy");
        CHECK_MSG(f_lp.outside == 0 && f_ent.outside == 0, "T=%d C=%d V=%d temperature %g", h.T, h.C, h.V, temperature);
    });
    HeadProblem h(8, 12, 100, 1.0f, 1);
    GpuHead g(h);
    LogprobHeadGpu head(gemm);
    CHECK_THROWS(g.forward(head, h), "multiple of 8");
    h.C = 16, h.temperature = 0.0f;
    CHECK_THROWS(g.forward(head, h), "temperature");
    CHECK_THROWS(LogprobHeadGpu(gemm, 100), "multiple of 8");
    CHECK_THROWS(LogprobHeadGpu(gemm, 256, 12), "token block 12 must be a positive multiple of 8");
}

// Top-1 (train/mean_token_accuracy): the GPU head's hits (LogprobHeadGpu::top1) equal the CPU head's
// and the float64 logits' (the target's logit the largest of its row) on every row whose float64
// margin (target's logit less the best other's) is beyond both sides' logit error, (3C + 2) U S_j
// each (the forward bound); a third of the rows get their float64 argmax as target, so there are hits.
TEST(gpu_head_top1_matches_cpu_and_fp64) {
    GemmRunner gemm;
    for_each_head_case(29, [&](const HeadCase& hc, float temperature, HeadProblem& h) {
        Exact e(h);
        std::vector<double> margin(h.T), bound(h.T);
        for (int t = 0; t < h.T; t++) {
            int best = 0;
            for (int j = 1; j < h.V; j++) best = e.at(e.z, t, j) > e.at(e.z, t, best) ? j : best;
            if (t % 3 == 0) h.target[t] = best;
            double other = -INFINITY, err = 0;
            for (int j = 0; j < h.V; j++) {
                if (j != h.target[t]) other = std::fmax(other, e.at(e.z, t, j));
                err = std::fmax(err, (3.0 * h.C + 2) * U * e.at(e.s, t, j));
            }
            margin[t] = h.target[t] >= 0 ? e.at(e.z, t, h.target[t]) - other : -INFINITY;
            bound[t] = 4 * err;  // both sides' logits, the target's and the other's
        }
        GpuHead g(h);
        LogprobHeadGpu head(gemm, hc.chunk, hc.block);
        g.forward(head, h);
        const std::vector<float> gpu = head.top1(g.target.ptr, h.T, 0);
        std::vector<float> lp(h.T), ent(h.T), lse(h.T), mu(h.T), cpu(h.T);
        HeadScratch scratch;
        head_forward(lp.data(), ent.data(), lse.data(), mu.data(), h.x.data(), h.W.data(), h.target.data(), h.T,
                     {h.V, h.C, h.temperature}, scratch, false, cpu.data());
        int decided = 0, hits = 0;
        for (int t = 0; t < h.T; t++) {
            if (!(std::fabs(margin[t]) > bound[t])) continue;
            decided++;
            const float want = margin[t] > 0 ? 1.0f : 0.0f;
            hits += margin[t] > 0;
            CHECK_MSG(gpu[t] == want && cpu[t] == want, "T=%d V=%d temperature %g row %d: gpu %g cpu %g float64 margin %.3g",
                      h.T, h.V, temperature, t, gpu[t], cpu[t], margin[t]);
        }
        printf("    T=%d C=%d V=%d temperature=%g: %d of %d rows beyond the bound, %d hits\n", h.T, h.C, h.V, temperature,
               decided, h.T, hits);
        CHECK_MSG(decided == h.T && hits >= (h.T + 2) / 3, "%d rows decided, %d hits", decided, hits);
    });
}

// Backward bound, GPU vs CPU, per element of dlogits g_j = (a (1[j=y] - p_j) - b p_j (z_j - mu)) / T:
//   before rounding to BF16 the two sides' g_j differ by at most dg_j, from their logits (dz_j, the
//   forward bound), their lse and mu (forward bound + 2U rounding), the exp (4U + U |z_j - lse|),
//   and the FP32 evaluation of g (4 roundings: 4U of each term, counted as 8U per side);
//   the GPU rounds g to BF16 (8 significant bits, round to nearest): 2^-8 (|g_j| + dg_j);
//   the sums: dX[c] = sum_j g_j W_jc over V terms: the CPU's chains (the full chunks' columns, then
//   the last chunk's) round V times plus 2 adds, the GPU's chunk GEMMs at most 2 U per term
//   (truncating tensor-core accumulation) plus one add per chunk; dW[j][c] = sum_t g_tj x_tc over T
//   terms likewise (on the GPU a token block's Tb8 terms, one add per block);
// plus one rounding of the result on each side (2U |dX|): the buffers start non-zero.
// DlogitsBound holds |g_j| + dg_j and its tolerance 2^-8 (|g_j| + dg_j) + dg_j per (t, j) for the
// problem's a and b.
namespace {
struct DlogitsBound {
    std::vector<double> abs, tol;  // [T][V]
    DlogitsBound(const HeadProblem& h, const Exact& e, const ForwardBound& fb) : abs((size_t)h.T * h.V), tol(abs.size()) {
        const double inv_t = 1.0 / h.temperature;
        for (int t = 0; t < h.T; t++) {
            double a = std::fabs(h.a[t]), b = std::fabs(h.b[t]), dl = fb.D[t] + 2 * U * std::fabs(e.lse[t]);
            double dmu = fb.entropy[t] + fb.D[t];  // |d mu| <= |d entropy| + |d logZ|
            for (int j = 0; j < h.V; j++) {
                double p = e.at(e.p, t, j), zc = std::fabs(e.at(e.z, t, j) - e.mu[t]);
                double dz = (3.0 * h.C + 2) * U * e.at(e.s, t, j);
                double dp = p * std::expm1(dz + dl + 2 * (4 * U + U * std::fabs(e.at(e.z, t, j) - e.lse[t])));
                bool y = j == h.target[t];
                double gj = std::fabs(h.a[t] * ((y ? 1.0 : 0.0) - p) - h.b[t] * p * (e.at(e.z, t, j) - e.mu[t])) * inv_t;
                double dg = (a * dp + b * (dp * zc + (p + dp) * (dz + dmu)) + 16 * U * (a * p + b * p * zc + (y ? a : 0))) * inv_t;
                abs[(size_t)t * h.V + j] = gj + dg;
                tol[(size_t)t * h.V + j] = std::ldexp(gj + dg, -8) + dg;
            }
        }
    }
    // dX[t][c]'s tolerance, its sums' roundings gamma (relative to sum_j |g_j| |W_jc|), ref the CPU's value
    double dx(const HeadProblem& h, int t, int c, double gamma, double ref) const {
        double sum_tol = 0, mag = 0;
        for (int j = 0; j < h.V; j++) {
            double w = std::fabs(h.W[(size_t)j * h.C + c]);
            sum_tol += tol[(size_t)t * h.V + j] * w, mag += abs[(size_t)t * h.V + j] * w;
        }
        return sum_tol + gamma * mag * (1 + 0x1p-8) + 2 * U * std::fabs(ref);
    }
};

// The CPU head's dX (cpu/logprob_head.h: a row block's full chunks' product as one chain, added, then
// the last chunk's) from the given lse, mu and gradients a, b, dlogits rounded to BF16 as the GPU's,
// for a GPU head's chunks of `chunk` columns: with kVocabChunk the CPU head as it is; with fewer
// (when their full chunks' columns are at most kVocabChunk: one CPU chain) the CPU head over those
// columns, then over the last chunk's (W's rows and the targets shifted to it).
std::vector<float> cpu_head_dx(const HeadProblem& h, int chunk, const std::vector<float>& lse, const std::vector<float>& mu,
                               const std::vector<float>& a, const std::vector<float>& b, std::vector<float> dx) {
    const int main_cols = chunk == (int)kVocabChunk ? h.V : h.V / chunk * chunk, tail = h.V - main_cols;
    if (main_cols > (int)kVocabChunk && chunk != (int)kVocabChunk)
        fail("cpu_head_dx: %d full columns of chunks of %d are more than one CPU chunk", main_cols, chunk);
    std::vector<int32_t> shifted(h.target);
    for (int32_t& y : shifted) y -= main_cols;
    for (int part = 0; part < 2; part++) {
        const int v0 = part ? main_cols : 0, n = part ? tail : main_cols;
        if (n == 0) continue;
        HeadShape cs{n, h.C, h.temperature};
        cs.bf16 = true;
        HeadScratch scratch;
        std::vector<float> dW((size_t)n * h.C, 0.0f);
        head_backward(dx.data(), dW.data(), a.data(), b.data(), lse.data(), mu.data(), h.x.data(), h.W.data() + (size_t)v0 * h.C,
                      (part ? shifted : h.target).data(), h.T, cs, scratch);
    }
    return dx;
}
}  // namespace

TEST(gpu_head_backward_matches_cpu) {
    GemmRunner gemm;
    for_each_head_case(29, [&](const HeadCase& hc, float temperature, HeadProblem& h) {
        GpuHead g(h);
        LogprobHeadGpu head(gemm, hc.chunk, hc.block);
        g.forward(head, h);
        std::vector<float> dx0((size_t)h.T * h.C), dW0((size_t)h.V * h.C);
        for (size_t i = 0; i < dx0.size(); i++) dx0[i] = 0.01f * hash_uniform(i, 5);
        for (size_t i = 0; i < dW0.size(); i++) dW0[i] = 0.01f * hash_uniform(i, 6);
        DeviceBuffer<float> dx(dx0), dW(dW0), da(h.a), db(h.b);
        head.backward(dx.ptr, dW.ptr, da.ptr, db.ptr, g.lse.ptr, g.mu.ptr, g.x.ptr, g.W.ptr, g.target.ptr, h.T, h.shape(), 0);

        std::vector<float> lp(h.T), ent(h.T), lse(h.T), mu(h.T), cdx = dx0, cdW = dW0;
        HeadScratch scratch;
        HeadShape cs{h.V, h.C, h.temperature};
        head_forward(lp.data(), ent.data(), lse.data(), mu.data(), h.x.data(), h.W.data(), h.target.data(), h.T, cs,
                     scratch, true);
        head_backward(cdx.data(), cdW.data(), h.a.data(), h.b.data(), lse.data(), mu.data(), h.x.data(), h.W.data(),
                      h.target.data(), h.T, cs, scratch);

        Exact e(h);
        ForwardBound fb(h, e);
        const DlogitsBound gb(h, e, fb);
        const int chunks = (h.V + hc.chunk - 1) / hc.chunk;
        const double gamma_dx = (2.0 * hc.chunk + chunks + h.V + 2) * U;
        const double gamma_dw = (2.0 * hc.padded_rows() + hc.blocks() + h.T + 2) * U;
        std::vector<float> gdx = dx.download(), gdW = dW.download();
        Figures f_dx, f_dw;
        for (int t = 0; t < h.T; t++)
            for (int c = 0; c < h.C; c++) {
                double ref = cdx[(size_t)t * h.C + c];
                f_dx.add(gdx[(size_t)t * h.C + c], ref, gb.dx(h, t, c, gamma_dx, ref));
            }
        for (int j = 0; j < h.V; j++)
            for (int c = 0; c < h.C; c++) {
                double tol = 0, mag = 0;
                for (int t = 0; t < h.T; t++) {
                    double xv = std::fabs(h.x[(size_t)t * h.C + c]);
                    tol += gb.tol[(size_t)t * h.V + j] * xv, mag += gb.abs[(size_t)t * h.V + j] * xv;
                }
                double ref = cdW[(size_t)j * h.C + c];
                f_dw.add(gdW[(size_t)j * h.C + c], ref, tol + gamma_dw * mag * (1 + 0x1p-8) + 2 * U * std::fabs(ref));
            }
        printf("    T=%d C=%d V=%d chunk=%d block=%d temperature=%g:\n", h.T, h.C, h.V, hc.chunk, hc.block, temperature);
        f_dx.print("dX");
        f_dw.print("dW");
        CHECK_MSG(f_dx.outside == 0 && f_dw.outside == 0, "T=%d C=%d V=%d temperature %g", h.T, h.C, h.V, temperature);
    });
}

// Finite differences of the GPU forward: L = sum_t a_t logprob_t + b_t entropy_t, perturbed at a few
// elements of x and W by +-h and +-2h, with the element set to a value for which x +- h, x +- 2h are
// exact in BF16. Central differences err by c h^2 + O(h^4): the estimate |D(2h) - D(h)| / 3 of that
// is counted twice. Rounding: each L has the GPU forward's error, at most the per-token forward
// bound (which covers GPU vs CPU, so GPU vs exact by the same argument) times |a|, |b|: divided by
// 2h for each of the two evaluations. The backward's own error vs exact: the BF16 rounding of
// dlogits, 2^-8 sum |g| |W| (or |x|), plus the FP32 sums' (V or T8 terms, 2U each). The points are
// where the gradient is large (W at target columns), so that the bound means something.
TEST(gpu_head_backward_matches_finite_differences) {
    GemmRunner gemm;
    HeadProblem h(13, 24, 2100, 0.7f, 41);  // 2 chunks, the last 52 columns
    struct Point {
        bool in_x;
        int row, col;
        float value;
    };
    const Point points[] = {{true, 2, 5, 0.5f},           {true, 6, 23, -0.25f},          {true, 12, 0, 0.75f},
                            {true, 9, 11, -1.0f},         {false, h.target[0], 5, 0.25f}, {false, h.target[4], 3, -0.75f},
                            {false, h.target[1], 20, 0.5f}, {false, h.target[6], 23, -0.5f}};  // 1, 6: the last chunk
    for (const Point& pt : points) (pt.in_x ? h.x[(size_t)pt.row * h.C + pt.col] : h.W[(size_t)pt.row * h.C + pt.col]) = pt.value;
    LogprobHeadGpu head(gemm, HEAD_VOCAB_CHUNK, 8);  // token blocks of 8 and 5
    GpuHead g(h);
    g.forward(head, h);
    DeviceBuffer<float> dx(std::vector<float>((size_t)h.T * h.C, 0.0f)), dW(std::vector<float>((size_t)h.V * h.C, 0.0f));
    DeviceBuffer<float> da(h.a), db(h.b);
    head.backward(dx.ptr, dW.ptr, da.ptr, db.ptr, g.lse.ptr, g.mu.ptr, g.x.ptr, g.W.ptr, g.target.ptr, h.T, h.shape(), 0);
    std::vector<float> gdx = dx.download(), gdW = dW.download();
    Exact e(h);
    ForwardBound fb(h, e);
    auto loss = [&](const HeadProblem& p) {
        GpuHead gp(p);
        gp.forward(head, p);
        std::vector<float> lp = gp.logprob.download(), ent = gp.entropy.download();
        double L = 0;
        for (int t = 0; t < p.T; t++) L += (double)p.a[t] * lp[t] + (double)p.b[t] * ent[t];
        return L;
    };
    for (const Point& pt : points) {
        const float step = std::fabs(pt.value) / 8;  // x +- step, x +- 2 step: at most 5 significant bits
        double central[2];
        for (int k = 0; k < 2; k++) {
            HeadProblem plus = h, minus = h;
            float hk = step * (1 << k);
            float* ep = pt.in_x ? &plus.x[(size_t)pt.row * h.C + pt.col] : &plus.W[(size_t)pt.row * h.C + pt.col];
            float* em = pt.in_x ? &minus.x[(size_t)pt.row * h.C + pt.col] : &minus.W[(size_t)pt.row * h.C + pt.col];
            *ep += hk, *em -= hk;
            central[k] = (loss(plus) - loss(minus)) / (2.0 * hk);
        }
        double truncation = std::fabs(central[1] - central[0]) / 3;
        double noise = 0;  // |L_gpu - L_exact| from the tokens the perturbation reaches (x: its row; W: all)
        for (int t = 0; t < h.T; t++)
            if (!pt.in_x || t == pt.row) noise += std::fabs(h.a[t]) * fb.logprob[t] + std::fabs(h.b[t]) * fb.entropy[t];
        double grad = pt.in_x ? gdx[(size_t)pt.row * h.C + pt.col] : gdW[(size_t)pt.row * h.C + pt.col];
        double abs_sum = 0;  // sum |g| |W_jc| (x) or sum_t |g_tj| |x_tc| (W)
        for (int t = 0; t < h.T; t++)
            for (int j = 0; j < h.V; j++) {
                if (pt.in_x ? t != pt.row : j != pt.row) continue;
                double p = e.at(e.p, t, j);
                double gj = std::fabs(h.a[t] * ((j == h.target[t] ? 1.0 : 0.0) - p) - h.b[t] * p * (e.at(e.z, t, j) - e.mu[t])) / h.temperature;
                abs_sum += gj * std::fabs(pt.in_x ? h.W[(size_t)j * h.C + pt.col] : h.x[(size_t)t * h.C + pt.col]);
            }
        double tol = 2 * truncation + 2 * noise / (2.0 * step) + (0x1p-8 + 2 * (h.V + 16) * U) * abs_sum;
        printf("    d/d%s[%d][%d]: backward %.7g, central difference %.7g (2h: %.7g), |diff| %.3g, bound %.3g\n",
               pt.in_x ? "x" : "W", pt.row, pt.col, grad, central[0], central[1], std::fabs(grad - central[0]), tol);
        CHECK_MSG(std::fabs(grad - central[0]) <= tol, "d/d%s[%d][%d]", pt.in_x ? "x" : "W", pt.row, pt.col);
    }
}

// The L2-resident tiles, of 1,024 tokens (the CPU head's row block): 1,030 tokens make a block of
// 1,024 and a ragged one of 6. The emulated tensor cores sum each output in the CPU
// engine's order (exact BF16 products, one FP32 chain), dW's per block then added as the CPU adds
// its row blocks', and dlogits round to BF16 as the CPU's (HeadShape::bf16): from the same lse and
// mu, dX and dW are the CPU head's bits (dX: of one chunk here; from 2 full chunks on, the CPU head
// sums them in one chain where the tiles add each chunk's product: the fused head's order, checked
// by gpu_head_fused_equals_forward_then_backward); the forward's statistics agree within the forward
// bound (the GPU's block reductions sum the doubles in another order). On a GPU, the bounds of
// gpu_head_backward_matches_cpu hold these shapes instead.
TEST(gpu_head_token_blocks_keep_cpu_bits) {
    GemmRunner gemm;
    const int cpu_rows = (int)head_rows_per_block();
    HeadProblem h(1030, 16, 300, 0.7f, 53);  // one chunk of 300 columns (304 with its padding)
    CHECK(h.T > cpu_rows && h.T % cpu_rows % 8 != 0);  // two blocks, the last ragged
    GpuHead g(h);
    LogprobHeadGpu head(gemm, HEAD_VOCAB_CHUNK, cpu_rows);
    g.forward(head, h);
    std::vector<float> lp(h.T), ent(h.T), lse(h.T), mu(h.T), dx0((size_t)h.T * h.C), dW0((size_t)h.V * h.C);
    for (size_t i = 0; i < dx0.size(); i++) dx0[i] = 0.01f * hash_uniform(i, 7);
    for (size_t i = 0; i < dW0.size(); i++) dW0[i] = 0.01f * hash_uniform(i, 8);
    std::vector<float> cdx = dx0, cdW = dW0;
    HeadScratch scratch;
    HeadShape cs{h.V, h.C, h.temperature};
    cs.bf16 = true;
    head_forward(lp.data(), ent.data(), lse.data(), mu.data(), h.x.data(), h.W.data(), h.target.data(), h.T, cs, scratch, true);
    head_backward(cdx.data(), cdW.data(), h.a.data(), h.b.data(), lse.data(), mu.data(), h.x.data(), h.W.data(),
                  h.target.data(), h.T, cs, scratch);
    Exact e(h);
    ForwardBound fb(h, e);
    const std::vector<float> glp = g.logprob.download(), gent = g.entropy.download();
    Figures f_lp, f_ent;
    for (int t = 0; t < h.T; t++) f_lp.add(glp[t], lp[t], fb.logprob[t]), f_ent.add(gent[t], ent[t], fb.entropy[t]);
    f_lp.print("logprob");
    f_ent.print("entropy");
    CHECK(f_lp.outside == 0 && f_ent.outside == 0);
    DeviceBuffer<float> dx(dx0), dW(dW0), da(h.a), db(h.b), clse(lse), cmu(mu);
    head.backward(dx.ptr, dW.ptr, da.ptr, db.ptr, clse.ptr, cmu.ptr, g.x.ptr, g.W.ptr, g.target.ptr, h.T, h.shape(), 0);
    const std::vector<float> gdx = dx.download(), gdW = dW.download();
#ifdef FP8RL_EMU
    auto differing = [](const std::vector<float>& a, const std::vector<float>& b) {
        long n = 0;
        for (size_t i = 0; i < a.size(); i++) n += memcmp(&a[i], &b[i], sizeof(float)) != 0;
        return n;
    };
    const long dx_diff = differing(gdx, cdx), dw_diff = differing(gdW, cdW);
    printf("    T=%d (blocks of %d) C=%d V=%d: %ld of %zu dX and %ld of %zu dW elements differ from the CPU head's bits\n",
           h.T, cpu_rows, h.C, h.V, dx_diff, gdx.size(), dw_diff, gdW.size());
    CHECK(dx_diff == 0 && dw_diff == 0);
#else
    SKIP("the tensor cores sum in their own order on a GPU: gpu_head_backward_matches_cpu bounds the tiles");
#endif
}

// The fused head (forward_backward: a token block's logits computed once, over the whole vocabulary)
// against forward then backward with the same token blocks: the same operations on the same values,
// so the log-probs, entropies, statistics, top-1 and dW have the same bits (on a GPU too: the logits
// GEMMs do not split k, so each logit is one chain over C whatever the GEMM's m). dX is the CPU
// head's order (issue 59: a block's one chain over the full chunks' columns, added, then the last
// chunk's; backward's tiles add each chunk's, the same bits only with at most one full chunk): the
// CPU head's bits from the same lse, mu and gradients in emulation (cpu_head_dx), within the bound
// of gpu_head_backward_matches_cpu on a GPU. The loss's gradients come from the block's own log-probs
// (a_t scaled by 1 + logprob_t / 8, b_t by entropy_t), asked for block by block: a block's
// statistics must be final when asked, and every row asked once. Shapes: vocabulary chunks of 256
// with a last one of 235 columns (the tail GEMM and its padded rows), a vocabulary of one chunk of
// 300 (no full chunk), one of 2 whole chunks (no tail); token blocks of 8 with a ragged last one;
// temperature 0.7, and 1 (the statistics kernel that skips the division) where the block is ragged;
// HEAD_VOCAB_CHUNK's chunks of 2,048 (the statistics' loop without column tests) with and without a tail,
// and with HEAD_ROW_CHUNKS_IN_FLIGHT of them merged a pass (a pass, a single chunk and a tail; a pass alone;
// 2 passes, then one of a chunk and a tail; chunks of 256 in 2 passes, the second of 3 chunks and a tail).
TEST(gpu_head_fused_equals_forward_then_backward) {
    GemmRunner gemm;
    struct Case { int T, C, V, chunk, block; float temperature; };
    for (const Case& k : {Case{21, 136, 1003, 256, 8, 0.7f}, Case{13, 24, 300, HEAD_VOCAB_CHUNK, 8, 0.7f},
                          Case{16, 32, 512, 256, 16, 0.7f}, Case{11, 16, 600, 256, 8, 1.0f},
                          Case{9, 16, 4500, HEAD_VOCAB_CHUNK, 8, 1.0f}, Case{10, 16, 4096, HEAD_VOCAB_CHUNK, 8, 0.7f},
                          Case{5, 16, 5 * HEAD_VOCAB_CHUNK + 100, HEAD_VOCAB_CHUNK, 8, 1.0f},
                          Case{3, 16, 4 * HEAD_VOCAB_CHUNK, HEAD_VOCAB_CHUNK, 8, 0.7f},
                          Case{3, 16, 9 * HEAD_VOCAB_CHUNK + 100, HEAD_VOCAB_CHUNK, 8, 0.7f},
                          Case{6, 16, 7 * 256 + 7, 256, 8, 1.0f}}) {
        HeadProblem h(k.T, k.C, k.V, k.temperature, 61 + k.T);
        auto a_of = [&](int t, float lp) { return h.a[t] * (1.0f + lp / 8); };
        auto b_of = [&](int t, float ent) { return h.b[t] * ent; };
        std::vector<float> dx0((size_t)h.T * h.C), dW0((size_t)h.V * h.C);
        for (size_t i = 0; i < dx0.size(); i++) dx0[i] = 0.01f * hash_uniform(i, 9);
        for (size_t i = 0; i < dW0.size(); i++) dW0[i] = 0.01f * hash_uniform(i, 10);
        // forward, then backward with the gradients of its log-probs
        GpuHead g(h);
        LogprobHeadGpu head(gemm, k.chunk, k.block, k.block);
        g.forward(head, h);
        const std::vector<float> lp = g.logprob.download(), ent = g.entropy.download();
        std::vector<float> a(h.T), b(h.T);
        for (int t = 0; t < h.T; t++) a[t] = a_of(t, lp[t]), b[t] = b_of(t, ent[t]);
        DeviceBuffer<float> dx(dx0), dW(dW0), da(a), db(b);
        head.backward(dx.ptr, dW.ptr, da.ptr, db.ptr, g.lse.ptr, g.mu.ptr, g.x.ptr, g.W.ptr, g.target.ptr, h.T, h.shape(), 0);
        const std::vector<float> top1 = head.top1(g.target.ptr, h.T, 0);
        // fused
        GpuHead f(h);
        f.logprob.poison(), f.entropy.poison(), f.lse.poison(), f.mu.poison();
        LogprobHeadGpu fused(gemm, k.chunk, HEAD_TOKEN_BLOCK, k.block);
        DeviceBuffer<float> fdx(dx0), fdW(dW0), fda(h.T), fdb(h.T);
        std::vector<int> asked(h.T, 0);
        bool stale = false;
#ifdef FP8RL_EMU
        emu::start_stats();
#endif
        fused.forward_backward(f.logprob.ptr, f.entropy.ptr, f.lse.ptr, f.mu.ptr, fda.ptr, fdb.ptr, fdx.ptr, fdW.ptr, f.x.ptr,
                               f.W.ptr, f.target.ptr, h.T, h.shape(), [&](int t0, int tb) {
                                   std::vector<float> blp(tb), bent(tb), ba(tb), bb(tb);
                                   CUDA_CHECK(cudaMemcpy(blp.data(), f.logprob.ptr + t0, tb * sizeof(float), cudaMemcpyDeviceToHost));
                                   CUDA_CHECK(cudaMemcpy(bent.data(), f.entropy.ptr + t0, tb * sizeof(float), cudaMemcpyDeviceToHost));
                                   for (int i = 0; i < tb; i++) {
                                       asked[t0 + i]++;
                                       stale |= memcmp(&blp[i], &lp[t0 + i], sizeof(float)) != 0;
                                       ba[i] = a_of(t0 + i, blp[i]), bb[i] = b_of(t0 + i, bent[i]);
                                   }
                                   CUDA_CHECK(cudaMemcpy(fda.ptr + t0, ba.data(), tb * sizeof(float), cudaMemcpyHostToDevice));
                                   CUDA_CHECK(cudaMemcpy(fdb.ptr + t0, bb.data(), tb * sizeof(float), cudaMemcpyHostToDevice));
                               }, 0);
#ifdef FP8RL_EMU
        // Per token block: the logits, dX and dW as one GEMM over the whole chunks' columns and one over
        // a narrower last chunk, one dlogits launch (issue 59: not a dX GEMM or dlogits launch a chunk).
        emu::stop_stats();
        const emu::RangeStats counted = emu::total_stats();
        const int blocks = (h.T + k.block - 1) / k.block;
        const int wide = (h.V >= k.chunk) + (h.V % k.chunk != 0);
        const auto dlogits = counted.kernels.find("head_dlogits_kernel");
        const uint64_t dlogits_launches = dlogits == counted.kernels.end() ? 0 : dlogits->second;
        printf("    fused: %llu GEMM calls (want %d), %llu dlogits launches (want %d)\n", (unsigned long long)counted.gemm_calls,
               blocks * 3 * wide, (unsigned long long)dlogits_launches, blocks);
        CHECK_EQ(counted.gemm_calls, (uint64_t)(blocks * 3 * wide));
        CHECK_EQ(dlogits_launches, (uint64_t)blocks);
#endif
        auto differing = [](const std::vector<float>& x, const std::vector<float>& y) {
            long n = x.size() != y.size() ? 1 : 0;
            for (size_t i = 0; i < x.size() && i < y.size(); i++) n += memcmp(&x[i], &y[i], sizeof(float)) != 0;
            return n;
        };
        const long d_lp = differing(f.logprob.download(), lp), d_ent = differing(f.entropy.download(), ent);
        const long d_stats = differing(f.lse.download(), g.lse.download()) + differing(f.mu.download(), g.mu.download());
        const std::vector<float> fused_dx = fdx.download();
        const long d_dw = differing(fdW.download(), dW.download()), d_tiles_dx = differing(fused_dx, dx.download());
        const long d_top1 = differing(fused.top1(f.target.ptr, h.T, 0), top1);
        long once = 0;
        for (int t = 0; t < h.T; t++) once += asked[t] == 1;
        // dX: the CPU head's, from the GPU's lse and mu and the same gradients
        const std::vector<float> cdx = cpu_head_dx(h, k.chunk, g.lse.download(), g.mu.download(), a, b, dx0);
#ifdef FP8RL_EMU
        const bool emulated = true;
        const long d_dx = differing(fused_dx, cdx);
#else  // the fused GEMMs' chains (2U a term, at most V) and 2 adds; the CPU's V roundings and 2 adds
        const bool emulated = false;
        HeadProblem hp = h;
        hp.a = a, hp.b = b;
        const Exact e(hp);
        const ForwardBound fb(hp, e);
        const DlogitsBound gb(hp, e, fb);
        long d_dx = 0;
        for (int t = 0; t < h.T; t++)
            for (int c = 0; c < h.C; c++) {
                const double ref = cdx[(size_t)t * h.C + c];
                d_dx += !(std::fabs(fused_dx[(size_t)t * h.C + c] - ref) <= gb.dx(hp, t, c, (3.0 * h.V + 4) * U, ref));
            }
#endif
        printf("    T=%d C=%d V=%d chunk=%d block=%d temperature=%g: differing logprob %ld, entropy %ld, lse/mu %ld, dW %ld of "
               "%zu, top1 %ld; dX %s the CPU head's %ld of %zu (the tiles' %ld); rows asked once %ld of %d\n",
               h.T, h.C, h.V, k.chunk, k.block, k.temperature, d_lp, d_ent, d_stats, d_dw, dW0.size(), d_top1,
               emulated ? "differing from" : "outside the bound of", d_dx, dx0.size(), d_tiles_dx, once, h.T);
        CHECK(d_lp == 0 && d_ent == 0 && d_stats == 0 && d_dw == 0 && d_top1 == 0 && d_dx == 0);
        if (emulated && h.V / k.chunk <= 1) CHECK(d_tiles_dx == 0);  // one chain a chunk either way
        CHECK(once == h.T && !stale);
    }
    CHECK_THROWS(LogprobHeadGpu(gemm, 256, 8, 12), "fused token block 12 must be a positive multiple of 8");
    CHECK_THROWS(LogprobHeadGpu(gemm, 4096), "at most 2048");
}
