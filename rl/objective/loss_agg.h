// loss_agg.h: how per-token losses become the step's loss (spec-rl.md §3, verl agg_loss). Each
// valid token of sequence i gets a weight c_i, and the loss is Σ_i Σ_t c_i · ℓ_{i,t}:
//   token-mean               c = 1/N           N = valid tokens of the mini-batch on ALL ranks
//   token-sum                c = 1
//   seq-mean-token-sum       c = 1/S           S = sequences with ≥ 1 valid token, all ranks
//   seq-mean-token-mean      c = 1/(S·|y_i|)
//   seq-mean-token-sum-norm  c = 1/(S·Λ)       Λ = the configured maximum response length
// N and S are counted over the whole mini-batch across ranks before the first backward (the
// trainer all-reduces the two int64 counts of agg_counts), every micro-batch contributes its
// Σ c·ℓ, and the gradient all-reduce is a sum: micro-batching and ranks do not change the result.
#pragma once
#include <stdint.h>

#include <string>

#include "rl/common.h"
#include "rl/numerics/hostdevice.h"
#include "rl/objective/token_loss.h"

namespace fp8rl {

enum class LossAgg { TokenMean, TokenSum, SeqMeanTokenSum, SeqMeanTokenMean, SeqMeanTokenSumNorm };

inline LossAgg parse_loss_agg(const std::string& name) {
    if (name == "token-mean") return LossAgg::TokenMean;
    if (name == "token-sum") return LossAgg::TokenSum;
    if (name == "seq-mean-token-sum") return LossAgg::SeqMeanTokenSum;
    if (name == "seq-mean-token-mean") return LossAgg::SeqMeanTokenMean;
    if (name == "seq-mean-token-sum-norm") return LossAgg::SeqMeanTokenSumNorm;
    fail("unknown loss aggregation '%s'; use token-mean, token-sum, seq-mean-token-sum, seq-mean-token-mean or "
         "seq-mean-token-sum-norm", name.c_str());
}

// The global normalizers; tokens and sequences are all-reduced (summed) over ranks.
struct AggCounts {
    int64_t tokens = 0;     // N
    int64_t sequences = 0;  // S (sequences with at least one valid token)
};

// Counts of one sequence of T tokens, to be summed over the mini-batch and then over ranks.
FP8RL_HD int64_t valid_tokens(const uint8_t* mask, int T) {
    int64_t n = 0;
    for (int t = 0; t < T; t++) n += mask[t] != 0;
    return n;
}

inline AggCounts agg_counts_of(const int64_t* seq_valid_tokens, size_t num_seqs) {
    AggCounts c;
    for (size_t i = 0; i < num_seqs; i++) {
        c.tokens += seq_valid_tokens[i];
        c.sequences += seq_valid_tokens[i] > 0;
    }
    return c;
}

// c_i: the weight of every valid token of a sequence with `len` valid tokens. 0 when the global
// batch has no valid token (an all-masked batch contributes nothing rather than NaN).
FP8RL_HD double agg_token_weight(LossAgg mode, int64_t len, AggCounts global, double horizon) {
    if (len <= 0 || global.tokens <= 0) return 0.0;
    switch (mode) {
        case LossAgg::TokenMean: return 1.0 / (double)global.tokens;
        case LossAgg::TokenSum: return 1.0;
        case LossAgg::SeqMeanTokenSum: return 1.0 / (double)global.sequences;
        case LossAgg::SeqMeanTokenMean: return 1.0 / ((double)global.sequences * (double)len);
        case LossAgg::SeqMeanTokenSumNorm: return 1.0 / ((double)global.sequences * horizon);
    }
    return 0.0;
}

// One sequence's tokens as the loss needs them, each array [T]. ref_logp may be null when
// kl_coef = 0, entropy may be null when entropy_coef = 0 (then 0 is used).
struct SequenceTokens {
    int T = 0;
    const float* logp = nullptr;       // current policy ℓ^θ
    const float* old_logp = nullptr;   // ℓ^old
    const float* ref_logp = nullptr;   // ℓ^ref
    const float* adv = nullptr;        // advantage per token
    const double* is_weight = nullptr; // w_t (sequence_is_weights), detached
    const float* entropy = nullptr;    // H_t
    const uint8_t* mask = nullptr;     // 1 = valid response token
};

// The sequence's aggregated contributions (sum over its valid tokens of c·term).
struct SequenceLoss {
    double loss = 0.0;     // Σ c·ℓ
    double pg_loss = 0.0;  // Σ c·w·pg  (actor/pg_loss)
    double kl = 0.0;       // Σ c·KL    (actor/kl_loss, before β)
    double entropy = 0.0;  // Σ c·H
};

// What the engine backpropagates from a valid token of weight c: c·∂ℓ/∂logp and c·∂ℓ/∂H.
FP8RL_HD void token_gradient(double c, const TokenLoss& tl, float* dlogp, float* dentropy) {
    *dlogp = (float)(c * tl.dloss_dlogp);
    *dentropy = (float)(c * tl.dloss_dentropy);
}

// Loss of one sequence under the aggregation, and the per-token gradients the engine
// backpropagates: dlogp[t] = c·∂ℓ/∂logp_t, dentropy[t] = c·∂ℓ/∂H_t (0 on padding). Summing the
// results over all sequences of all micro-batches and ranks gives the mini-batch loss.
inline SequenceLoss sequence_loss(const SequenceTokens& s, const TokenLossConfig& cfg, LossAgg mode, AggCounts global,
                                  double horizon, float* dlogp, float* dentropy) {
    if (cfg.kl_coef != 0.0 && !s.ref_logp) fail("sequence_loss: kl_coef %g needs reference log-probs", cfg.kl_coef);
    SequenceLoss out;
    double c = agg_token_weight(mode, valid_tokens(s.mask, s.T), global, horizon);
    for (int t = 0; t < s.T; t++) {
        dlogp[t] = 0.0f;
        dentropy[t] = 0.0f;
        if (!s.mask[t]) continue;
        float h = s.entropy ? s.entropy[t] : 0.0f;
        TokenLoss tl = token_loss(s.logp[t], s.old_logp[t], s.ref_logp ? s.ref_logp[t] : s.logp[t], s.adv[t],
                                  s.is_weight[t], h, cfg);
        out.loss += c * tl.loss;
        out.pg_loss += c * s.is_weight[t] * tl.pg.loss;
        out.kl += c * tl.kl;
        out.entropy += c * h;
        token_gradient(c, tl, &dlogp[t], &dentropy[t]);
    }
    return out;
}

}  // namespace fp8rl
