// Tests of rl/objective/token_loss.h and rl/objective/loss_agg.h against torch (dev/make_loss_fixtures.py: verl's
// formulas in float64 with autograd), plus properties: ratio ≡ 1 never clips, aggregation modes
// agree where they must, and closed-form gradients match finite differences.
#include <cmath>

#include "rl/objective/advantage.h"
#include "rl/io/json.h"
#include "rl/objective/loss_agg.h"
#include "rl/objective/metrics.h"
#include "test/harness.h"

using namespace fp8rl;

namespace {

struct LossFixture {
    int B = 0, T = 0;
    std::vector<float> mask_f, old_logp, logp, ref, roll, adv, ent;
    std::vector<uint8_t> mask;
    Json doc;
};

std::vector<float> flat(const Json& rows) {
    std::vector<float> out;
    for (const Json& r : rows.items)
        for (const Json& x : r.items) out.push_back((float)x.number);
    return out;
}

const LossFixture& fixture() {
    static LossFixture f = [] {
        LossFixture f;
        f.doc = json_parse_file("test/fixtures/loss/token_losses.json");
        f.B = (int)f.doc.find("B")->integer;
        f.T = (int)f.doc.find("T")->integer;
        const Json& in = *f.doc.find("inputs");
        f.mask_f = flat(*in.find("mask"));
        f.old_logp = flat(*in.find("old"));
        f.logp = flat(*in.find("logp"));
        f.ref = flat(*in.find("ref"));
        f.roll = flat(*in.find("roll"));
        f.adv = flat(*in.find("adv"));
        f.ent = flat(*in.find("ent"));
        for (float m : f.mask_f) f.mask.push_back(m != 0.0f);
        return f;
    }();
    return f;
}

KlEstimator kl_of(const std::string& s) {
    return s == "k1" ? KlEstimator::K1 : s == "abs" ? KlEstimator::Abs : s == "k2" ? KlEstimator::K2 : KlEstimator::K3;
}

IsCorrection is_of(const std::string& s) {
    return s == "off" ? IsCorrection::Off : s == "token-tis" ? IsCorrection::TokenTis : s == "token-mis" ? IsCorrection::TokenMis
         : s == "seq-tis" ? IsCorrection::SeqTis : IsCorrection::SeqMis;
}

// The metrics of one case against torch's (names of spec-rl.md §8.2 or the fixture's own keys).
void check_metrics(const std::string& name, const StepMetrics& m, const Json& stats, double pg_loss) {
    std::vector<std::pair<std::string, double>> got = m.finalize(1);
    auto value = [&](const std::string& key) {
        for (const auto& kv : got)
            if (kv.first == key) return kv.second;
        harness::report_failure(__FILE__, __LINE__, name + ": metric " + key + " missing");
        return (double)NAN;
    };
    const std::pair<const char*, const char*> renamed[] = {
        {"actor/pg_clipfrac", "pg_clipfrac"}, {"actor/pg_clipfrac_lower", "pg_clipfrac_lower"},
        {"actor/pg_clipfrac_low", "pg_clipfrac_low"}, {"actor/pg_clipfrac_high", "pg_clipfrac_high"},
        {"actor/ppo_kl", "ppo_kl"}, {"actor/ratio_mean", "ratio_mean"}, {"actor/ratio_min", "ratio_min"},
        {"actor/ratio_max", "ratio_max"}, {"actor/entropy", "entropy_mean"}};
    size_t checked = 0;
    for (const auto& kv : stats.fields) {
        std::string key = kv.first;
        for (const auto& r : renamed)
            if (key == r.second) key = r.first;
        CHECK_MSG(harness::close(value(key), kv.second.number, 1e-9, 1e-12), "%s: %s %.12g vs torch %.12g", name.c_str(),
                  key.c_str(), value(key), kv.second.number);
        checked++;
    }
    CHECK(checked >= 25);
    CHECK_MSG(harness::close(value("actor/pg_loss"), pg_loss, 1e-9, 1e-12), "%s: actor/pg_loss", name.c_str());
}

// Two ranks holding half the sequences each, combined, give one rank's metrics.
void check_rank_split(const std::string& name, const StepMetrics& one, const StepMetrics& two) {
    std::vector<std::pair<std::string, double>> a = one.finalize(1), b = two.finalize(1);
    CHECK_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size() && i < b.size(); i++)
        CHECK_MSG(a[i].first == b[i].first && harness::close(a[i].second, b[i].second, 1e-12, 1e-15), "%s: %s split %.17g vs %.17g",
                  name.c_str(), a[i].first.c_str(), b[i].second, a[i].second);
}

}  // namespace

TEST(loss_matches_torch_fixtures) {
    const LossFixture& f = fixture();
    int B = f.B, T = f.T, cases = 0;
    for (const Json& c : f.doc.find("cases")->items) {
        const Json& cfg_json = *c.find("config");
        TokenLossConfig cfg;
        cfg.bounds.low = cfg_json.find("low")->number;
        cfg.bounds.high = cfg_json.find("high")->number;
        cfg.bounds.dual_clip = cfg_json.find("dual_clip")->number;
        cfg.kl = kl_of(cfg_json.find("kl")->str);
        cfg.kl_coef = cfg_json.find("kl_coef")->number;
        cfg.entropy_coef = cfg_json.find("entropy_coef")->number;
        LossAgg mode = parse_loss_agg(cfg_json.find("agg")->str);
        double horizon = cfg_json.find("horizon")->number;
        IsCorrection is_mode = is_of(cfg_json.find("is_mode")->str);
        double cap = cfg_json.find("is_cap")->number;

        std::vector<int64_t> lens(B);
        for (int i = 0; i < B; i++) lens[i] = valid_tokens(&f.mask[i * T], T);
        AggCounts global = agg_counts_of(lens.data(), B);
        std::vector<double> w(B * T);
        std::vector<float> dlogp(B * T), dent(B * T);
        std::vector<float> want_w = flat(*c.find("is_weight")), want_g = flat(*c.find("grad_logp")),
                           want_ge = flat(*c.find("grad_entropy"));
        SequenceLoss total;
        StepMetrics metrics, rank[2];
        for (int i = 0; i < B; i++) {
            sequence_is_weights(is_mode, 0.0, cap, &f.old_logp[i * T], &f.roll[i * T], &f.mask[i * T], T, &w[i * T]);
            SequenceTokens s;
            s.T = T;
            s.logp = &f.logp[i * T];
            s.old_logp = &f.old_logp[i * T];
            s.ref_logp = &f.ref[i * T];
            s.adv = &f.adv[i * T];
            s.is_weight = &w[i * T];
            s.entropy = &f.ent[i * T];
            s.mask = &f.mask[i * T];
            SequenceLoss l = sequence_loss(s, cfg, mode, global, horizon, &dlogp[i * T], &dent[i * T]);
            for (StepMetrics* m : {&metrics, &rank[i < B / 2]}) {
                m->add_policy_sequence(s, cfg.bounds);
                m->add_sequence_loss(l);
                m->add_rollout_sequence(s.old_logp, &f.roll[i * T], s.is_weight, s.mask, T, cap);
            }
            total.loss += l.loss;
            total.pg_loss += l.pg_loss;
            total.kl += l.kl;
            total.entropy += l.entropy;
        }
        std::string name = cfg_json.find("agg")->str + "/" + cfg_json.find("is_mode")->str + "/" + cfg_json.find("kl")->str;
        for (int k = 0; k < B * T; k++) {
            CHECK_MSG(harness::close(w[k], want_w[k], 1e-6, 0), "%s: is_weight[%d] %.9g vs %.9g", name.c_str(), k, w[k], want_w[k]);
            CHECK_MSG(harness::close(dlogp[k], want_g[k], 1e-6, 0), "%s: grad_logp[%d] %.9g vs %.9g", name.c_str(), k,
                      dlogp[k], want_g[k]);
            CHECK_MSG(harness::close(dent[k], want_ge[k], 1e-6, 0), "%s: grad_entropy[%d] %.9g vs %.9g", name.c_str(), k, dent[k],
                      want_ge[k]);
        }
        CHECK_MSG(harness::close(total.loss, c.find("loss")->number, 1e-6, 1e-9), "%s: loss %.12g vs %.12g", name.c_str(),
                  total.loss, c.find("loss")->number);
        CHECK_MSG(harness::close(total.pg_loss, c.find("pg_loss")->number, 1e-6, 1e-9), "%s: pg_loss %.12g vs %.12g",
                  name.c_str(), total.pg_loss, c.find("pg_loss")->number);
        CHECK_MSG(harness::close(total.kl, c.find("kl_loss")->number, 1e-6, 1e-9), "%s: kl %.12g vs %.12g", name.c_str(),
                  total.kl, c.find("kl_loss")->number);
        CHECK_MSG(harness::close(total.entropy, c.find("entropy")->number, 1e-6, 1e-9), "%s: entropy %.12g vs %.12g",
                  name.c_str(), total.entropy, c.find("entropy")->number);
        check_metrics(name, metrics, *c.find("stats"), c.find("pg_loss")->number);
        rank[0].merge(rank[1]);
        check_rank_split(name, metrics, rank[0]);
        cases++;
    }
    CHECK(cases >= 10);
}

TEST(loss_advantages_match_torch) {
    for (const Json& g : fixture().doc.find("advantages")->items) {
        std::vector<double> r;
        for (const Json& x : g.find("rewards")->items) r.push_back(x.number);
        struct { const char* key; AdvantageEstimator est; bool unbiased; } kinds[] = {
            {"grpo", AdvantageEstimator::Grpo, true}, {"grpo_population_std", AdvantageEstimator::Grpo, false},
            {"drgrpo", AdvantageEstimator::DrGrpo, true}, {"rloo", AdvantageEstimator::Rloo, true}};
        for (const auto& k : kinds) {
            std::vector<double> got = batch_advantages(r, r.size(), k.est, k.unbiased);
            const Json& want = *g.find(k.key);
            for (size_t i = 0; i < r.size(); i++)
                CHECK_MSG(harness::close(got[i], want.items[i].number, 1e-12, 1e-15), "%s[%zu]: %.17g vs %.17g", k.key, i,
                          got[i], want.items[i].number);
        }
    }
}

TEST(loss_ratio_one_never_clips) {
    StepMetrics m;
    ClipBounds b;
    b.dual_clip = 3.0;
    for (int k = 0; k < 200; k++) {
        float logp = -0.05f * (float)k, adv = (float)((k % 7) - 3) * 0.7f;
        PolicyTokenLoss pg = policy_token_loss(logp, logp, adv, b);
        CHECK_EQ(pg.ratio, 1.0);
        CHECK_EQ(pg.flags, 0u);
        CHECK_EQ(pg.grad, -(double)adv);  // the unclipped gradient −A·r
        m.add_policy_token(pg, logp, logp, 0.5f);
    }
    std::vector<std::pair<std::string, double>> got = m.finalize(1);
    for (const auto& kv : got)
        if (kv.first.find("clipfrac") != std::string::npos) CHECK_MSG(kv.second == 0.0, "%s = %g", kv.first.c_str(), kv.second);
}

// Equal-length sequences: token-mean = seq-mean-token-mean = seq-mean-token-sum-norm (Λ = length),
// seq-mean-token-sum = length × token-mean, token-sum = N × token-mean; gradients likewise.
TEST(loss_aggregation_modes_agree_on_equal_lengths) {
    const int B = 5, T = 9;
    std::vector<float> logp(B * T), old(B * T), adv(B * T), ent(B * T);
    std::vector<double> w(B * T, 1.0);
    std::vector<uint8_t> mask(B * T, 1);
    for (int k = 0; k < B * T; k++) {
        old[k] = -1.0f - 0.01f * (float)k;
        logp[k] = old[k] + 0.3f * std::sin(1.7f * (float)k);
        adv[k] = (float)(k / T) - 2.0f;
        ent[k] = 1.0f + 0.1f * (float)(k % 5);
    }
    TokenLossConfig cfg;
    cfg.entropy_coef = 0.01;
    AggCounts global{B * T, B};
    auto run = [&](LossAgg mode, std::vector<float>* grads) {
        double loss = 0;
        grads->assign(B * T, 0.0f);
        std::vector<float> dent(B * T);
        for (int i = 0; i < B; i++) {
            SequenceTokens s;
            s.T = T;
            s.logp = &logp[i * T];
            s.old_logp = &old[i * T];
            s.adv = &adv[i * T];
            s.is_weight = &w[i * T];
            s.entropy = &ent[i * T];
            s.mask = &mask[i * T];
            loss += sequence_loss(s, cfg, mode, global, T, &(*grads)[i * T], &dent[i * T]).loss;
        }
        return loss;
    };
    std::vector<float> g_tm, g_smtm, g_norm, g_smts, g_ts;
    double tm = run(LossAgg::TokenMean, &g_tm), smtm = run(LossAgg::SeqMeanTokenMean, &g_smtm),
           norm = run(LossAgg::SeqMeanTokenSumNorm, &g_norm), smts = run(LossAgg::SeqMeanTokenSum, &g_smts),
           ts = run(LossAgg::TokenSum, &g_ts);
    CHECK(tm != 0.0);
    CHECK_NEAR(smtm, tm, 1e-12, 0);
    CHECK_NEAR(norm, tm, 1e-12, 0);
    CHECK_NEAR(smts, T * tm, 1e-12, 0);
    CHECK_NEAR(ts, B * T * tm, 1e-12, 0);
    for (int k = 0; k < B * T; k++) {
        CHECK_NEAR(g_smtm[k], g_tm[k], 1e-6, 0);
        CHECK_NEAR(g_norm[k], g_tm[k], 1e-6, 0);
        CHECK_NEAR(g_smts[k], T * g_tm[k], 1e-6, 0);
    }
    // An all-masked batch contributes nothing (and no NaN).
    CHECK_EQ(agg_token_weight(LossAgg::TokenMean, 0, AggCounts{0, 0}, 1.0), 0.0);
    CHECK_EQ(agg_token_weight(LossAgg::SeqMeanTokenMean, 3, AggCounts{0, 0}, 1.0), 0.0);
    CHECK_THROWS(parse_loss_agg("sum"), "unknown loss aggregation 'sum'");
}

// Closed-form ∂ℓ/∂logp against central differences on the FP64 per-token math, away from kinks.
TEST(loss_gradient_matches_finite_differences) {
    TokenLossConfig cfg;
    cfg.kl_coef = 0.3;
    int checked = 0;
    for (KlEstimator kl : {KlEstimator::K1, KlEstimator::Abs, KlEstimator::K2, KlEstimator::K3})
        for (int k = 0; k < 60; k++) {
            cfg.kl = kl;
            float old = -1.5f + 0.02f * (float)k, logp = old + 0.6f * std::sin(0.9f * (float)k);
            float ref = old + 0.5f * std::cos(1.3f * (float)k), adv = 1.2f * std::sin(2.1f * (float)k + 0.3f);
            double w = 0.5 + 0.02 * k, h = 1.0 / 1024;  // h and logp ± h are exact in float
            double r = std::exp((double)logp - old);
            bool near_kink = std::fabs(r - cfg.bounds.low) < 0.01 || std::fabs(r - cfg.bounds.high) < 0.01 ||
                             std::fabs(r - cfg.bounds.dual_clip) < 0.01 || std::fabs((double)logp - ref) < 0.01;
            if (near_kink) continue;
            TokenLoss t = token_loss(logp, old, ref, adv, w, 1.0f, cfg);
            double up = token_loss(logp + (float)h, old, ref, adv, w, 1.0f, cfg).loss;
            double down = token_loss(logp - (float)h, old, ref, adv, w, 1.0f, cfg).loss;
            CHECK_NEAR(t.dloss_dlogp, (up - down) / (2 * h), 1e-4, 1e-7);
            checked++;
        }
    CHECK(checked > 150);
}

// IcePop and the geometric sequence mask against float64 weights from verl's rollout_corr
// definitions (dev/make_is_fixtures.py), and rollout_corr/rollout_rs_masked_fraction from them.
TEST(loss_icepop_and_geo_mask_match_fixtures) {
    Json doc = json_parse_file("test/fixtures/loss/is_corrections.json");
    const int B = (int)doc.find("B")->integer, T = (int)doc.find("T")->integer;
    const Json& in = *doc.find("inputs");
    std::vector<float> old_logp, roll;
    std::vector<uint8_t> mask;
    for (const Json& x : in.find("old")->items) old_logp.push_back((float)x.number);
    for (const Json& x : in.find("roll")->items) roll.push_back((float)x.number);
    for (const Json& x : in.find("mask")->items) mask.push_back(x.number != 0.0);
    int cases = 0, masked = 0, kept = 0;
    for (const Json& c : doc.find("cases")->items) {
        const std::string mode = c.find("mode")->str;
        const double floor = c.find("floor")->number, cap = c.find("cap")->number;
        std::vector<double> w((size_t)B * T);
        StepMetrics m;
        for (int i = 0; i < B; i++) {
            sequence_is_weights(mode == "icepop" ? IsCorrection::IcePop : IsCorrection::GeoMask, floor, cap, &old_logp[i * T],
                                &roll[i * T], &mask[i * T], T, &w[i * T]);
            m.add_rollout_sequence(&old_logp[i * T], &roll[i * T], &w[i * T], &mask[i * T], T, cap);
        }
        const std::vector<Json>& want = c.find("is_weight")->items;
        CHECK_EQ(want.size(), w.size());
        for (size_t k = 0; k < w.size() && k < want.size(); k++) {
            CHECK_MSG(harness::close(w[k], want[k].number, 1e-12, 0), "%s [%g, %g]: w[%zu] %.17g vs %.17g", mode.c_str(), floor, cap, k,
                      w[k], want[k].number);
            masked += mask[k] && w[k] == 0.0;
            kept += mask[k] && w[k] != 0.0;
        }
        double fraction = NAN;
        for (const auto& kv : m.finalize(0))
            if (kv.first == "rollout_corr/rollout_rs_masked_fraction") fraction = kv.second;
        CHECK_NEAR(fraction, c.find("rollout_rs_masked_fraction")->number, 1e-15, 0);
        cases++;
    }
    CHECK_EQ(cases, 7);
    CHECK(masked > 100 && kept > 100);  // both branches of every mask are exercised
}
