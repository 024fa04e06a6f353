// kept_turns.h: a multi-turn rollout over kept KV caches (Engine::start_turns, next_turns) driven
// the same way on any engine, for the tests that compare engines and paths (test/test_environment.cpp,
// test/gpu/test_rollout.cu): three turns, rows ending after each, observations of 0 to 3 tokens.
#pragma once
#include <cstdint>
#include <vector>

#include "rl/driver/engine.h"

namespace kept_turns {

struct Run {
    std::vector<std::vector<fp8rl::Generation>> turns;  // [turn][listed row]
    std::vector<std::vector<size_t>> rows;              // [turn] the rows listed (turn 0: every request)
    std::vector<std::vector<int32_t>> sequences;        // [request] prompt, then every token after it
    std::vector<std::vector<uint8_t>> model;            // [request] per token after the prompt: 1 = drawn
    std::vector<std::vector<float>> logprobs;           // [request] per drawn token
    std::vector<int64_t> fed;                           // [turn 1, 2] turn_fed_tokens() after the turn
    std::vector<float> k_scale, v_scale;                // last_kv_scales() after start_turns
    std::vector<float> k_scale_end, v_scale_end;        // and after the last turn
};

// The observation a row gets after turn t (0..3 tokens, below the vocabulary's 64th id).
inline std::vector<int32_t> observation(size_t row, int t) {
    std::vector<int32_t> obs;
    for (size_t k = 0; k < (row + (size_t)t) % 4; k++) obs.push_back((int32_t)(17 + 5 * row + 3 * k + (size_t)t) % 64);
    return obs;
}

// Turn 1 (max_new_tokens of s), then turns 2 and 3 of `budget` tokens: turn 2 lists every row but
// row 2, turn 3 the even rows of those (a row without room for its observation and budget in
// `total`, the tokens a trajectory holds after its prompt, ends instead).
inline Run run(fp8rl::Engine& e, const std::vector<fp8rl::GenRequest>& requests, uint32_t step, const fp8rl::SamplingConfig& s,
               fp8rl::Precision weights, fp8rl::Precision kv, int budget, int total) {
    Run r;
    r.turns.push_back(e.start_turns(requests, total, step, s, weights, kv, nullptr));
    e.last_kv_scales(&r.k_scale, &r.v_scale);
    r.rows.emplace_back();
    for (size_t i = 0; i < requests.size(); i++) {
        r.rows[0].push_back(i);
        r.sequences.push_back(requests[i].prompt);
        r.model.emplace_back();
        r.logprobs.emplace_back();
    }
    for (int t = 0;; t++) {
        for (size_t k = 0; k < r.rows[(size_t)t].size(); k++) {
            const size_t i = r.rows[(size_t)t][k];
            const fp8rl::Generation& g = r.turns[(size_t)t][k];
            r.sequences[i].insert(r.sequences[i].end(), g.tokens.begin(), g.tokens.end());
            r.model[i].insert(r.model[i].end(), g.tokens.size(), 1);
            r.logprobs[i].insert(r.logprobs[i].end(), g.logprobs.begin(), g.logprobs.end());
        }
        if (t == 2) break;
        std::vector<fp8rl::TurnRequest> next;
        std::vector<size_t> rows;
        for (size_t i : r.rows[(size_t)t]) {
            if (t == 0 ? i == 2 : i % 2 == 1) continue;
            std::vector<int32_t> obs = observation(i, t);
            const long used = (long)(r.sequences[i].size() - requests[i].prompt.size()) + (long)obs.size();
            if (used + budget > total) continue;
            r.sequences[i].insert(r.sequences[i].end(), obs.begin(), obs.end());
            r.model[i].insert(r.model[i].end(), obs.size(), 0);
            next.push_back({i, obs, budget});
            rows.push_back(i);
        }
        r.rows.push_back(rows);
        r.turns.push_back(e.next_turns(next));
        r.fed.push_back(e.turn_fed_tokens());
    }
    e.end_turns();
    e.last_kv_scales(&r.k_scale_end, &r.v_scale_end);
    return r;
}

// The tokens turn t's next_turns fed before drawing: each listed row's last token and its observation's.
inline int64_t expected_fed(const Run& r, int t) {
    int64_t n = 0;
    for (size_t i : r.rows[(size_t)t]) n += 1 + (int64_t)observation(i, t - 1).size();
    return n;
}

}  // namespace kept_turns
