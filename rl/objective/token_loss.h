// token_loss.h: the per-token RL loss and its closed-form gradient with respect to the token's
// log-probability under the current policy (spec-rl.md §2, §4, §5, §7). Host and device code
// (FP8RL_HD): the GPU loss kernel and the CPU engine call these very functions.
//
// Per valid token t, with importance weight w_t (detached) and the aggregation weight c_t of
// loss_agg.h, the step's loss is  Σ_t c_t · ℓ_t  with
//     ℓ_t = w_t · pg_t + β · KL_t − c_ent · H_t
// and the engine backpropagates  c_t · ∂ℓ_t/∂logp_t  into the log-prob and  c_t · ∂ℓ_t/∂H_t = −c_t·c_ent
// into the entropy. Gradients follow torch autograd through verl's formulas exactly, including
// clamp (gradient passes on the closed interval) and max/min (ties share the gradient equally).
// Log-probs come in as FP32 (what the engines produce); the per-token arithmetic is FP64, because
// the terms of ℓ_t can cancel (e.g. w·A·r against β·∂KL) and one FP32 rounding in a ratio or
// weight would then cost several digits. It is a handful of operations per token, next to the
// thousands of the softmax over the vocabulary, so the cost does not matter on either engine.
#pragma once
#include <math.h>
#include <stdint.h>

#include "rl/numerics/hostdevice.h"

namespace fp8rl {

constexpr double log_ratio_clamp = 20.0;  // verl / OpenRLHF: log-ratios clamped to ±20
constexpr double k3_output_clamp = 10.0;  // verl low_var_kl: result clamped to ±10

// Defaults (spec-rl.md §2, §4, §6, §7, §11).
constexpr double default_clip_low = 0.2;         // ε_low: lower ratio bound 1 − 0.2
constexpr double default_clip_high_grpo = 0.24;  // ε_high, Calibrated Clipping's GRPO reference 1.24
constexpr double default_clip_high_dapo = 0.28;  // DAPO clip-higher 1.28
constexpr double default_dual_clip = 3.0;        // verl clip_ratio_c; DAPO recipes use 10
constexpr double default_dual_clip_dapo = 10.0;
constexpr double default_kl_coef = 0.001;        // when KL is enabled (off by default: β = 0)
constexpr double default_is_cap = 2.0;           // TIS / MIS threshold C

// Ratio bounds of the clipped surrogate: clip(r, low, high) with low = 1 − ε_low, high = 1 + ε_high
// (or the calibrated bounds); dual_clip = c > 1 caps negative-advantage losses at −A·c, 0 = off.
struct ClipBounds {
    double low = 1.0 - default_clip_low;
    double high = 1.0 + default_clip_high_grpo;
    double dual_clip = default_dual_clip;
};

// Which branch each token took; the metrics count these.
enum TokenClipFlags : uint32_t {
    kClipped = 1u,       // verl pg_clipfrac: the clipped branch won (L2 > L1)
    kDualClipped = 2u,   // verl pg_clipfrac_lower: A < 0 and the dual-clip cap bound (Lc > L3)
    kClipLow = 4u,       // A < 0 and r < low (fp8rl actor/pg_clipfrac_low)
    kClipHigh = 8u,      // A > 0 and r > high (fp8rl actor/pg_clipfrac_high)
};

struct PolicyTokenLoss {
    double ratio;  // exp(clamp(logp − old_logp, ±20))
    double loss;   // clipped surrogate, before the IS weight
    double grad;   // ∂loss/∂logp
    uint32_t flags;
};

// r = exp(clamp(logp − old, ±20)) and ∂r/∂logp (0 where the clamp is active, as torch.clamp).
FP8RL_HD void clamped_ratio(float logp, float old_logp, double* ratio, double* dratio) {
    double d = (double)logp - (double)old_logp;
    *ratio = exp(fmin(fmax(d, -log_ratio_clamp), log_ratio_clamp));
    *dratio = (d >= -log_ratio_clamp && d <= log_ratio_clamp) ? *ratio : 0.0;
}

// verl compute_policy_loss_vanilla for one token (spec-rl.md §2.1–2.2):
//   L1 = −A·r, L2 = −A·clip(r, low, high), Lc = max(L1, L2); for A < 0 with dual clip c:
//   L = min(Lc, −A·c).
FP8RL_HD PolicyTokenLoss policy_token_loss(float logp, float old_logp, float adv, ClipBounds b) {
    PolicyTokenLoss out;
    double dr, a = adv;
    clamped_ratio(logp, old_logp, &out.ratio, &dr);
    double r = out.ratio;
    double l1 = -a * r;
    double l2 = -a * fmin(fmax(r, b.low), b.high);
    // max(L1, L2): L2 > L1 only when r is outside [low, high], where clip() has no gradient; a tie
    // means r is inside (or A = 0), where both branches have gradient −A·∂r.
    double lc = fmax(l1, l2);
    double gc = l1 >= l2 ? -a * dr : 0.0;
    out.flags = (l2 > l1 ? kClipped : 0u) | (adv < 0.0f && r < b.low ? kClipLow : 0u) |
                (adv > 0.0f && r > b.high ? kClipHigh : 0u);
    out.loss = lc;
    out.grad = gc;
    if (adv < 0.0f && b.dual_clip > 0.0) {
        double l3 = -a * b.dual_clip;
        if (lc > l3) out.flags |= kDualClipped;
        out.loss = fmin(lc, l3);
        out.grad = lc < l3 ? gc : lc == l3 ? 0.5 * gc : 0.0;
    }
    return out;
}

// KL(π_θ ‖ π_ref) estimators of spec-rl.md §4 with δ = logp − ref_logp (verl spellings).
enum class KlEstimator { K1, Abs, K2, K3 };

struct KlTerm {
    double value;
    double grad;  // ∂value/∂logp
};

FP8RL_HD KlTerm kl_token(float logp, float ref_logp, KlEstimator est) {
    double d = (double)logp - (double)ref_logp;
    switch (est) {
        case KlEstimator::K1: return {d, 1.0};
        case KlEstimator::Abs: return {fabs(d), d > 0.0 ? 1.0 : d < 0.0 ? -1.0 : 0.0};
        case KlEstimator::K2: return {0.5 * d * d, d};
        case KlEstimator::K3: break;
    }
    // low_var_kl: x = clamp(ref − logp, ±20), k = e^x − x − 1 clamped to ±10; ∂k/∂logp = 1 − e^x.
    double x = -d;
    double xc = fmin(fmax(x, -log_ratio_clamp), log_ratio_clamp);
    double ex = exp(xc);
    double k = ex - xc - 1.0;
    double kc = fmin(fmax(k, -k3_output_clamp), k3_output_clamp);
    bool passes = x >= -log_ratio_clamp && x <= log_ratio_clamp && k >= -k3_output_clamp && k <= k3_output_clamp;
    return {kc, passes ? 1.0 - ex : 0.0};
}

// Rollout/train mismatch correction (spec-rl.md §7): ρ_t = exp(clamp(old − rollout, ±20)).
enum class IsCorrection { Off, TokenTis, TokenMis, SeqTis, SeqMis, IcePop, GeoMask };

// Token TIS: min(ρ, C); token MIS: ρ·1{ρ ≤ C}. Also used on a sequence's ρ = exp(Σ log ρ_t)
// for the sequence variants (the sum clamped to ±20 as well).
FP8RL_HD double is_weight_from_log_rho(double log_rho, bool mask_instead_of_truncate, double cap) {
    double rho = exp(fmin(fmax(log_rho, -log_ratio_clamp), log_ratio_clamp));
    if (mask_instead_of_truncate) return rho <= cap ? rho : 0.0;
    return fmin(rho, cap);
}

// IS weights of one sequence's T tokens (0 on padding), as verl's rollout_corr_helper
// (compute_rollout_correction_weights, compute_rollout_rejection_mask):
//   token variants   each token by its own ρ_t, truncated (TokenTis) or masked (TokenMis) at C;
//   sequence variants every token ρ = exp(clamp(Σ_valid log ρ_t, ±20)) truncated (SeqTis) or
//                     masked (SeqMis) at C. A product over tokens saturates on long responses: a
//                     per-token drift of 0.01 is a factor e over 100 tokens, so long answers are
//                     truncated or masked whatever their tokens look like;
//   IcePop           ρ_t where floor ≤ ρ_t ≤ C, else 0 (two-sided token mask, verl's token RS);
//   GeoMask          the sequence is masked when exp(clamp(mean_valid log ρ_t, ±20)) lies outside
//                    [1/C, C] (verl's geometric RS with its default lower bound 1/C); kept tokens
//                    take token-TIS weights min(ρ_t, C).
// A masked token keeps its place in the loss normalizers (weight 0), unlike verl, whose rejection
// also removes it from the response mask.
FP8RL_HD void sequence_is_weights(IsCorrection mode, double floor, double cap, const float* old_logp,
                                  const float* rollout_logp, const uint8_t* mask, int T, double* w) {
    bool seq = mode == IsCorrection::SeqTis || mode == IsCorrection::SeqMis;
    bool masking = mode == IsCorrection::TokenMis || mode == IsCorrection::SeqMis;
    double log_rho_sum = 0.0;
    int valid = 0;
    for (int t = 0; t < T; t++)
        if (mask[t]) {
            log_rho_sum += (double)old_logp[t] - (double)rollout_logp[t];
            valid++;
        }
    double seq_weight = seq ? is_weight_from_log_rho(log_rho_sum, masking, cap) : 0.0;
    bool geo_kept = true;
    if (mode == IsCorrection::GeoMask && valid > 0) {
        double g = exp(fmin(fmax(log_rho_sum / valid, -log_ratio_clamp), log_ratio_clamp));
        geo_kept = g >= 1.0 / cap && g <= cap;
    }
    for (int t = 0; t < T; t++) {
        double log_rho = (double)old_logp[t] - (double)rollout_logp[t];
        if (!mask[t]) w[t] = 0.0;
        else if (mode == IsCorrection::Off) w[t] = 1.0;
        else if (seq) w[t] = seq_weight;
        else if (mode == IsCorrection::IcePop) {
            double rho = exp(fmin(fmax(log_rho, -log_ratio_clamp), log_ratio_clamp));
            w[t] = rho >= floor && rho <= cap ? rho : 0.0;
        } else if (mode == IsCorrection::GeoMask) w[t] = geo_kept ? is_weight_from_log_rho(log_rho, false, cap) : 0.0;
        else w[t] = is_weight_from_log_rho(log_rho, masking, cap);
    }
}

// The token's total loss ℓ = w·pg + β·KL − c_ent·H and its derivatives.
struct TokenLossConfig {
    ClipBounds bounds;
    double kl_coef = 0.0;  // β (0 = no KL term, spec-rl.md §4's default)
    KlEstimator kl = KlEstimator::K3;
    double entropy_coef = 0.0;
};

struct TokenLoss {
    PolicyTokenLoss pg;
    double kl;              // KL_t (0 when β = 0)
    double loss;            // ℓ_t
    double dloss_dlogp;     // ∂ℓ_t/∂logp_t
    double dloss_dentropy;  // ∂ℓ_t/∂H_t
};

FP8RL_HD TokenLoss token_loss(float logp, float old_logp, float ref_logp, float adv, double is_weight, float entropy,
                              const TokenLossConfig& cfg) {
    TokenLoss t;
    t.pg = policy_token_loss(logp, old_logp, adv, cfg.bounds);
    KlTerm kl = cfg.kl_coef != 0.0 ? kl_token(logp, ref_logp, cfg.kl) : KlTerm{0.0, 0.0};
    t.kl = kl.value;
    t.loss = is_weight * t.pg.loss + cfg.kl_coef * kl.value - cfg.entropy_coef * (double)entropy;
    t.dloss_dlogp = is_weight * t.pg.grad + cfg.kl_coef * kl.grad;
    t.dloss_dentropy = -cfg.entropy_coef;
    return t;
}

}  // namespace fp8rl
