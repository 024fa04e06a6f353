// test_token_loss.cu: the per-token RL loss functions (rl/objective/token_loss.h, FP8RL_HD) run on the device
// give what the host gives on the torch fixture's inputs (test/fixtures/loss/token_losses.json):
// same branch flags, values and gradients within a few FP64 ulps (device and host exp() may
// differ in the last bit). The host results are checked against torch by test/test_loss.cpp.
#include <cmath>

#include "rl/io/json.h"
#include "rl/objective/token_loss.h"
#include "test/gpu/gpu_util.cuh"
#include "test/harness.h"

using namespace fp8rl;

namespace {

// Per token: the policy loss (ratio, loss, grad, flags), the four KL estimators (value, grad) and
// the combined token loss under `cfg`.
struct TokenOut {
    double ratio, pg_loss, pg_grad, kl_value[4], kl_grad[4], loss, dlogp;
    uint32_t flags;
};

__host__ __device__ TokenOut token_out(float logp, float old_logp, float ref_logp, float adv, double w, float ent,
                                       const TokenLossConfig& cfg) {
    TokenOut o;
    PolicyTokenLoss pg = policy_token_loss(logp, old_logp, adv, cfg.bounds);
    o.ratio = pg.ratio;
    o.pg_loss = pg.loss;
    o.pg_grad = pg.grad;
    o.flags = pg.flags;
    const KlEstimator kls[4] = {KlEstimator::K1, KlEstimator::Abs, KlEstimator::K2, KlEstimator::K3};
    for (int k = 0; k < 4; k++) {
        KlTerm t = kl_token(logp, ref_logp, kls[k]);
        o.kl_value[k] = t.value;
        o.kl_grad[k] = t.grad;
    }
    TokenLoss tl = token_loss(logp, old_logp, ref_logp, adv, w, ent, cfg);
    o.loss = tl.loss;
    o.dlogp = tl.dloss_dlogp;
    return o;
}

__global__ void token_loss_kernel(const float* logp, const float* old_logp, const float* ref_logp, const float* roll,
                                  const float* adv, const float* ent, const uint8_t* mask, int B, int T,
                                  TokenLossConfig cfg, IsCorrection is_mode, double cap, double* w, TokenOut* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= B) return;  // one thread per sequence: IS weights need the whole sequence
    sequence_is_weights(is_mode, 0.5, cap, old_logp + i * T, roll + i * T, mask + i * T, T, w + i * T);
    for (int t = i * T; t < (i + 1) * T; t++) out[t] = token_out(logp[t], old_logp[t], ref_logp[t], adv[t], w[t], ent[t], cfg);
}

std::vector<float> flat(const Json& rows) {
    std::vector<float> out;
    for (const Json& r : rows.items)
        for (const Json& x : r.items) out.push_back((float)x.number);
    return out;
}

bool near(double a, double b) { return harness::close(a, b, 1e-13, 1e-300); }

}  // namespace

TEST(gpu_token_loss_matches_host) {
    REQUIRE_GPU();
    Json doc = json_parse_file("test/fixtures/loss/token_losses.json");
    int B = (int)doc.find("B")->integer, T = (int)doc.find("T")->integer;
    const Json& in = *doc.find("inputs");
    std::vector<float> logp = flat(*in.find("logp")), old_logp = flat(*in.find("old")), ref = flat(*in.find("ref")),
                       roll = flat(*in.find("roll")), adv = flat(*in.find("adv")), ent = flat(*in.find("ent")),
                       mask_f = flat(*in.find("mask"));
    std::vector<uint8_t> mask;
    for (float m : mask_f) mask.push_back(m != 0.0f);
    DeviceBuffer<float> d_logp(logp), d_old(old_logp), d_ref(ref), d_roll(roll), d_adv(adv), d_ent(ent);
    DeviceBuffer<uint8_t> d_mask(mask);
    DeviceBuffer<double> d_w((size_t)B * T);
    DeviceBuffer<TokenOut> d_out((size_t)B * T);
    const IsCorrection modes[] = {IsCorrection::Off,   IsCorrection::TokenTis, IsCorrection::TokenMis, IsCorrection::SeqTis,
                                  IsCorrection::SeqMis, IsCorrection::IcePop,  IsCorrection::GeoMask};
    int compared = 0;
    for (int variant = 0; variant < 10; variant++) {
        TokenLossConfig cfg;
        cfg.bounds.low = variant % 2 ? 0.6 : 0.8;
        cfg.bounds.high = variant % 3 ? 1.28 : 1.6;
        cfg.bounds.dual_clip = variant % 4 == 0 ? 0.0 : 3.0;
        cfg.kl = (KlEstimator)(variant % 4);
        cfg.kl_coef = variant % 2 ? 0.1 : 0.0;
        cfg.entropy_coef = 0.01 * (variant % 3);
        IsCorrection is_mode = modes[variant % 7];
        LAUNCH_KERNEL(token_loss_kernel, 1, 64, 0, 0, d_logp.ptr, d_old.ptr, d_ref.ptr, d_roll.ptr, d_adv.ptr, d_ent.ptr,
                      d_mask.ptr, B, T, cfg, is_mode, 2.0, d_w.ptr, d_out.ptr);
        std::vector<TokenOut> dev = d_out.download();
        std::vector<double> dev_w = d_w.download(), host_w((size_t)B * T);
        for (int i = 0; i < B; i++) sequence_is_weights(is_mode, 0.5, 2.0, &old_logp[i * T], &roll[i * T], &mask[i * T], T, &host_w[i * T]);
        for (int k = 0; k < B * T; k++) {
            TokenOut h = token_out(logp[k], old_logp[k], ref[k], adv[k], host_w[k], ent[k], cfg);
            const TokenOut& d = dev[k];
            bool same = d.flags == h.flags && near(d.ratio, h.ratio) && near(d.pg_loss, h.pg_loss) &&
                        near(d.pg_grad, h.pg_grad) && near(d.loss, h.loss) && near(d.dlogp, h.dlogp) && near(dev_w[k], host_w[k]);
            for (int e = 0; e < 4; e++) same = same && near(d.kl_value[e], h.kl_value[e]) && near(d.kl_grad[e], h.kl_grad[e]);
            CHECK_MSG(same, "variant %d token %d: device ratio %.17g loss %.17g grad %.17g flags %u; host %.17g %.17g %.17g %u",
                      variant, k, d.ratio, d.loss, d.dlogp, d.flags, h.ratio, h.loss, h.dlogp, h.flags);
            compared++;
        }
    }
    CHECK_EQ(compared, 10 * B * T);
}
