// Tests of rl/numerics/rng.h against known-answer vectors from an independent Philox implementation
// (randomgen, itself checked against Random123's KAT; dev/make_rng_fixtures.py).
#include <cstdlib>

#include "rl/io/json.h"
#include "rl/numerics/rng.h"
#include "test/harness.h"

using namespace fp8rl;

static const char* kPhiloxFixture = "test/fixtures/rng/philox.json";

static uint32_t word(const Json& v, size_t i) { return (uint32_t)v.items.at(i).integer; }

TEST(rng_philox_known_answers) {
    Json fx = json_parse_file(kPhiloxFixture);
    const Json& raw = *fx.find("raw");
    CHECK(raw.items.size() >= 40);
    for (const Json& c : raw.items) {
        const uint32_t counter[4] = {word(*c.find("counter"), 0), word(*c.find("counter"), 1),
                                     word(*c.find("counter"), 2), word(*c.find("counter"), 3)};
        const uint32_t key[2] = {word(*c.find("key"), 0), word(*c.find("key"), 1)};
        Philox4 out = philox4x32_10(counter, key);
        for (int i = 0; i < 4; i++)
            CHECK_MSG(out.w[i] == word(*c.find("out"), i), "counter %08x.. word %d: %08x vs %08x", counter[0], i,
                      out.w[i], word(*c.find("out"), i));
    }
}

TEST(rng_keyed_draws_match_layout) {
    Json fx = json_parse_file(kPhiloxFixture);
    const Json& keyed = *fx.find("keyed");
    CHECK(keyed.items.size() >= 40);
    for (const Json& c : keyed.items) {
        const uint64_t seed = strtoull(c.find("seed")->str.c_str(), nullptr, 16);
        const uint32_t step = (uint32_t)c.find("step")->integer, seq = (uint32_t)c.find("sequence")->integer;
        const uint32_t pos = (uint32_t)c.find("position")->integer, stream = (uint32_t)c.find("stream")->integer;
        Philox4 out = rng_bits(seed, step, seq, pos, stream);
        for (int i = 0; i < 4; i++) CHECK_EQ(out.w[i], word(*c.find("out"), i));
        CHECK_EQ(rng_uniform(seed, step, seq, pos, stream), (float)c.find("uniform")->number);
    }
}

TEST(rng_uniform_construction) {
    CHECK_EQ(uniform_from_bits(0u), 0.0f);
    CHECK_EQ(uniform_from_bits(0xFFu), 0.0f);  // the low 8 bits are dropped
    CHECK_EQ(uniform_from_bits(0x100u), 1.0f / 16777216.0f);
    CHECK_EQ(uniform_from_bits(0xFFFFFFFFu), 1.0f - 1.0f / 16777216.0f);  // never 1.0
    // 16 equal buckets over 64k consecutive positions: each within 5% of its expected count.
    int bucket[16] = {0};
    const int draws = 1 << 16;
    for (int p = 0; p < draws; p++) bucket[(int)(rng_uniform(7, 3, 1, (uint32_t)p) * 16)]++;
    for (int b = 0; b < 16; b++) CHECK_NEAR(bucket[b], draws / 16, 0.05, 0);
}
