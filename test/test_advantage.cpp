// Tests of rl/objective/advantage.h by properties: definitions restated in another form (RLOO as a
// leave-one-out mean, GRPO as unit unbiased std), invariants, and DAPO's shaping ramp. The values
// against torch are in test_loss.cpp's fixture (dev/make_loss_fixtures.py).
#include "rl/objective/advantage.h"
#include "test/harness.h"

using namespace fp8rl;

TEST(advantage_constant_group_is_zero) {
    for (AdvantageEstimator est : {AdvantageEstimator::Grpo, AdvantageEstimator::DrGrpo, AdvantageEstimator::Rloo})
        for (double r : {0.0, 0.1, 1.0, -1.0, 1e300}) {
            std::vector<double> adv = batch_advantages({r, r, r, r, r, r, r}, 7, est);
            for (double a : adv) CHECK_EQ(a, 0.0);
        }
}

TEST(advantage_grpo_standardizes_and_rloo_leaves_one_out) {
    std::vector<double> r = {0.0, 1.0, 1.0, 0.5, 0.0, 0.25};
    std::vector<double> grpo = batch_advantages(r, 6, AdvantageEstimator::Grpo);
    std::vector<double> rloo = batch_advantages(r, 6, AdvantageEstimator::Rloo);
    std::vector<double> dr = batch_advantages(r, 6, AdvantageEstimator::DrGrpo);
    std::vector<double> pop = batch_advantages(r, 6, AdvantageEstimator::Grpo, false);
    double sum = 0, sq = 0, sum_dr = 0, sq_pop = 0;
    for (size_t i = 0; i < r.size(); i++) {
        sum += grpo[i];
        sq += grpo[i] * grpo[i];
        sum_dr += dr[i];
        sq_pop += pop[i] * pop[i];
        double others = 0;
        for (size_t j = 0; j < r.size(); j++)
            if (j != i) others += r[j];
        CHECK_NEAR(rloo[i], r[i] - others / 5.0, 1e-12, 1e-15);
        CHECK_NEAR(grpo[i] / dr[i], grpo[0] / dr[0], 1e-12, 0);
    }
    CHECK_NEAR(sum, 0.0, 0, 1e-12);
    CHECK_NEAR(sum_dr, 0.0, 0, 1e-12);
    CHECK_NEAR(sq / 5.0, 1.0, 1e-5, 0);      // unbiased std 1 (up to eps = 1e-6)
    CHECK_NEAR(sq_pop / 6.0, 1.0, 1e-5, 0);  // population std 1
    // Groups are independent.
    std::vector<double> two = r;
    two.insert(two.end(), {3.0, 3.0, 3.0, 3.0, 3.0, 4.0});
    std::vector<double> adv2 = batch_advantages(two, 6, AdvantageEstimator::Grpo);
    for (size_t i = 0; i < 6; i++) CHECK_EQ(adv2[i], grpo[i]);
    CHECK(adv2[11] > 0 && adv2[6] < 0);
}

TEST(advantage_rejects_bad_groups) {
    CHECK_THROWS(batch_advantages({1.0, 2.0, 3.0}, 2, AdvantageEstimator::Grpo), "do not form groups of 2");
    CHECK_THROWS(batch_advantages({1.0}, 1, AdvantageEstimator::Grpo), "at least 2");
    CHECK_THROWS(parse_advantage_estimator("ppo"), "unknown advantage estimator 'ppo'");
    CHECK(parse_advantage_estimator("dapo") == AdvantageEstimator::Grpo);
}

TEST(advantage_dynamic_sampling_filter) {
    GroupFilter f = filter_informative_groups({1, 1, 1, 0, 1, 0, 0, 0, 0, 0.5, 0.5, 0.25}, 3);
    CHECK_EQ(f.dropped, (size_t)2);
    CHECK(f.kept == std::vector<size_t>({1, 3}));
    CHECK_THROWS(filter_informative_groups({1, 1}, 3), "do not form groups");
}

TEST(advantage_overlong_shaping_ramp) {
    // DAPO eq. 13 with L_max = 100, L_cache = 20, factor 1: 0 up to 80 tokens, then (80 - |y|) / 20.
    CHECK_EQ(overlong_penalty(50, 100, 20, 1.0), 0.0);
    CHECK_EQ(overlong_penalty(80, 100, 20, 1.0), 0.0);
    CHECK_NEAR(overlong_penalty(81, 100, 20, 1.0), -0.05, 1e-15, 0);
    CHECK_NEAR(overlong_penalty(90, 100, 20, 1.0), -0.5, 1e-15, 0);
    CHECK_EQ(overlong_penalty(100, 100, 20, 1.0), -1.0);
    CHECK_EQ(overlong_penalty(120, 100, 20, 0.5), -0.5);
    CHECK_EQ(overlong_penalty(100, 100, 0, 1.0), 0.0);
    CHECK_THROWS(overlong_penalty(10, 100, 200, 1.0), "exceeds the length budget");
}
