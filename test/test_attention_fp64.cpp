// The CPU engine's packed attention (cpu/attention.h, FP32 mode: it rounds nowhere but in FP32) against
// causal softmax attention evaluated in double precision from its definition, on ragged sequences that
// cross key tiles, GQA, and the K and V scales of --train_kv_replay. This checks the oracle's own
// accuracy independently of the GPU kernels it stands for: the exp2-domain softmax (rl/numerics/exp2.h)
// with its folded scale must stay at FP32 rounding.
//
// Bound (first order, per row; u = 2^-24, scores s = q . k before the scale, m their max): the FP32
// dot product carries u D sum_d |q_d k_d|, e_s = that times scale in the exponent; the exp2 argument
// s c - m c (c = scale log2 e from an FP32 scale: 4 roundings) adds u (5 |s c| + 6 |m c|) in base 2
// (c's error on both terms, the product m c, the FMA), ln 2 times that in base e; exp2 adds 2^-23.5
// (test_exp2). So each p_j is off by e_p = e_s + ln 2 u (5 |s c| + 6 |m c|) + 2^-23.5, relative, and
// O = sum p_j v_j / sum p_j by 2 max e_p (mag + |O|), mag = sum p_j |v_j| / sum p_j, plus (n + 3) u
// (mag + |O|) for its sums, the rescales and the division; lse = fma(m, scale, log(sum)) by max e_p +
// (n + 3) u + u (3 |m scale| + 2 |lse|).
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "cpu/attention.h"
#include "rl/common.h"
#include "test/harness.h"

using namespace fp8rl;

namespace {

struct Fp64Case {
    std::vector<int64_t> lengths;
    int H, KV, D;
    bool kv_scales;
};

void check_against_fp64(const Fp64Case& c, uint32_t seed) {
    std::vector<int64_t> offsets{0};
    for (int64_t n : c.lengths) offsets.push_back(offsets.back() + n);
    const long T = offsets.back();
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    std::vector<float> q((size_t)T * c.H * c.D), k((size_t)T * c.KV * c.D), v(k.size());
    for (float& x : q) x = 3.0f * uniform(rng);  // scaled scores spread over about +-8: exps far below 1
    for (float& x : k) x = uniform(rng);
    for (float& x : v) x = uniform(rng);
    std::vector<float> k_scale(c.KV), v_scale(c.KV);
    for (int h = 0; h < c.KV; h++) k_scale[h] = 0.75f + 0.5f * (float)h, v_scale[h] = 1.25f - 0.25f * (float)h;
    std::vector<float> out(q.size()), lse((size_t)T * c.H);
    attention_forward_packed(out.data(), lse.data(), q.data(), k.data(), v.data(), offsets, {c.H, c.KV, c.D}, false,
                             c.kv_scales ? k_scale.data() : nullptr, c.kv_scales ? v_scale.data() : nullptr);
    const double u = std::ldexp(1.0, -24), exp2_err = std::ldexp(1.0, -23.5);
    double worst_o = 0, worst_lse = 0;
    int bad = 0;
    for (size_t s = 0; s + 1 < offsets.size(); s++)
        for (long t = offsets[s]; t < offsets[s + 1]; t++)
            for (int h = 0; h < c.H; h++) {
                const int kvh = h / (c.H / c.KV);
                const double scale = 1.0 / std::sqrt((double)c.D) * (c.kv_scales ? k_scale[kvh] : 1.0);
                const double cf = (double)exp2_domain((float)(1.0f / std::sqrt((float)c.D) * (c.kv_scales ? k_scale[kvh] : 1.0f)));
                const int n = (int)(t - offsets[s]) + 1;
                std::vector<double> sc(n), bound_s(n);
                double m = -INFINITY;
                for (int j = 0; j < n; j++) {
                    const float *qr = &q[((size_t)t * c.H + h) * c.D], *kr = &k[((size_t)(offsets[s] + j) * c.KV + kvh) * c.D];
                    double dot = 0, abs_dot = 0;
                    for (int d = 0; d < c.D; d++) dot += (double)qr[d] * kr[d], abs_dot += std::fabs((double)qr[d] * kr[d]);
                    sc[j] = dot * scale, bound_s[j] = u * c.D * abs_dot * scale;
                    m = std::max(m, dot);
                }
                const double mc = std::fabs(m * cf);
                double sum = 0, e_p = 0, lse_max = -INFINITY;
                for (int j = 0; j < n; j++) lse_max = std::max(lse_max, sc[j]);
                for (int j = 0; j < n; j++) sum += std::exp(sc[j] - lse_max);
                for (int j = 0; j < n; j++)
                    e_p = std::max(e_p, bound_s[j] + std::log(2.0) * u * (5 * std::fabs(sc[j] / scale * cf) + 6 * mc) + exp2_err);
                const double want_lse = lse_max + std::log(sum), got_lse = lse[(size_t)t * c.H + h];
                const double lse_bound = e_p + (n + 3) * u + u * (3 * std::fabs(m * scale) + 2 * std::fabs(want_lse));
                worst_lse = std::max(worst_lse, std::fabs(got_lse - want_lse) / lse_bound);
                if (!(std::fabs(got_lse - want_lse) <= lse_bound)) bad++;
                for (int d = 0; d < c.D; d++) {
                    double o = 0, mag = 0;
                    for (int j = 0; j < n; j++) {
                        const double p = std::exp(sc[j] - lse_max) / sum, vj = v[((size_t)(offsets[s] + j) * c.KV + kvh) * c.D + d];
                        o += p * vj, mag += p * std::fabs(vj);
                    }
                    const double vs = c.kv_scales ? v_scale[kvh] : 1.0;
                    o *= vs, mag *= vs;
                    const double got = out[((size_t)t * c.H + h) * c.D + d], err = std::fabs(got - o);
                    const double bound = (2 * e_p + (n + 3) * u) * (mag + std::fabs(o));
                    worst_o = std::max(worst_o, err / bound);
                    if (!(err <= bound)) bad++;
                }
            }
    CHECK_MSG(bad == 0, "%d outputs outside the bound", bad);
    printf("  H %d KV %d D %d%s: max err/bound O %.3g, lse %.3g\n", c.H, c.KV, c.D, c.kv_scales ? " (K, V scales)" : "",
           worst_o, worst_lse);
}

}  // namespace

TEST(cpu_attention_forward_within_fp32_rounding_of_fp64) {
    const Fp64Case cases[] = {
        {{1, 70, 133, 9}, 4, 2, 16, false},
        {{65, 130}, 2, 1, 64, true},
        {{129}, 1, 1, 128, false},
    };
    uint32_t seed = 1;
    for (const Fp64Case& c : cases) check_against_fp64(c, seed++);
}
