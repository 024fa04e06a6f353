// Tests of rl/objective/adamw.h and rl/objective/lr_schedule.h: AdamW and gradient clipping against torch
// (fixture from dev/make_trainer_fixtures.py), the learning-rate schedule by its properties.
#include "rl/objective/adamw.h"
#include "rl/io/json.h"
#include "rl/objective/lr_schedule.h"
#include "test/harness.h"

using namespace fp8rl;

static std::vector<float> floats(const Json& a) {
    std::vector<float> out;
    for (const Json& x : a.items) out.push_back((float)x.number);
    return out;
}

TEST(trainer_adamw_matches_torch) {
    Json fx = json_parse_file("test/fixtures/trainer/adamw.json");
    std::vector<float> w = floats(*fx.find("w0"));
    AdamWConfig cfg;
    cfg.beta1 = fx.find("beta1")->number;
    cfg.beta2 = fx.find("beta2")->number;
    cfg.eps = fx.find("eps")->number;
    cfg.weight_decay = fx.find("weight_decay")->number;
    AdamW opt(w.size(), cfg);
    for (const Json& s : fx.find("steps")->items) {
        std::vector<float> g = floats(*s.find("grad"));
        opt.step(w.data(), g.data(), s.find("lr")->number);
        std::vector<float> want = floats(*s.find("w_after"));
        for (size_t i = 0; i < w.size(); i++) CHECK_NEAR(w[i], want[i], 1e-5, 1e-7);
    }
    CHECK_EQ(opt.steps_taken(), (int64_t)4);
}

TEST(trainer_clip_grad_norm_matches_torch) {
    Json fx = json_parse_file("test/fixtures/trainer/adamw.json");
    double max_norm = fx.find("max_norm")->number;
    for (const Json& s : fx.find("steps")->items) {
        std::vector<float> g = floats(*s.find("grad"));
        double norm = clip_grad_norm(g.data(), g.size(), max_norm);
        CHECK_NEAR(norm, s.find("norm")->number, 1e-6, 0);
        std::vector<float> want = floats(*s.find("clipped_grad"));
        for (size_t i = 0; i < g.size(); i++) CHECK_NEAR(g[i], want[i], 1e-6, 1e-9);
    }
}

TEST(trainer_lr_schedule_warmup_then_cosine) {
    LrSchedule s;
    s.lr = 1.0;
    s.warmup = 4;
    s.total = 14;
    CHECK_NEAR(s.at(0), 0.25, 0, 1e-12);
    CHECK_NEAR(s.at(3), 1.0, 0, 1e-12);
    CHECK_NEAR(s.at(7), 1.0, 0, 1e-12);  // constant
    s.cosine = true;
    s.min_ratio = 0.1;
    CHECK_NEAR(s.at(4), 1.0, 0, 1e-12);   // first update after warm-up: peak
    CHECK_NEAR(s.at(13), 0.1, 0, 1e-12);  // last update: floor
    CHECK_NEAR(s.at(100), 0.1, 0, 1e-12);
    double mid = s.at(8);  // update 4 of the 10 decaying ones (4..13): cos(4/9 pi)
    CHECK_NEAR(mid, 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 4.0 / 9.0)), 0, 1e-12);
    for (int64_t u = 4; u < 13; u++) CHECK(s.at(u + 1) <= s.at(u));
}
