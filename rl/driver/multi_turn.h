// multi_turn.h: the rollout of --env_cmd (rl/tasks/environment.h). Each trajectory alternates
// assistant turns and observations on any Engine:
//
//   turn k: the engine generates from prompt + everything so far, at most --max_turn_tokens (and
//           what --max_total_tokens leaves); the turn ends on the end-of-turn token or is cut
//   -> the environment gets the conversation and answers {observation, role, done, reward}
//   -> until done, --max_turns or --max_total_tokens, the observation is rendered by the chat template
//      (ChatTemplate::continuation; a plain-text prompt gets the observation's text as it is), its
//      tokens appended with loss mask 0, and the trajectory goes on with turn k + 1.
//
// The rows keep their KV cache between turns (Engine::start_turns, next_turns): after a turn, a row's
// observation tokens (with the turn's last token, which no step fed) are fed into its kept cache and
// decoding continues; no turn computes the conversation before it again. Rows continue
// independently of each other (each with its own budget, a done one's cache freed), and a sampled
// token's random key is its absolute position in the sequence, as in a single-turn rollout (the
// single-turn path is not touched). An FP8 cache keeps the scales turn 1 calibrated on the prompts.
#pragma once
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "rl/driver/engine.h"
#include "rl/tasks/environment.h"

namespace fp8rl {

// One trajectory: every response token, the model's and the observations'.
struct Trajectory {
    Generation gen;  // tokens and logprobs (NaN at observation tokens); finished: its last turn ended on the end-of-turn token
    std::vector<uint8_t> loss_mask;  // [gen.tokens.size()] 1 = written by the model, 0 = an observation's
    int turns = 0;                   // assistant turns
    int64_t observation_tokens = 0;
    bool truncated = false;  // ended by --max_turns or --max_total_tokens, not by the environment's done
    bool has_reward = false;  // the environment gave a reward (its last one stands)
    double reward = 0;
};

// What a multi-turn rollout needs besides the engine.
struct TrajectoryContext {
    EnvWorkers* env = nullptr;
    int max_turns = 1, max_turn_tokens = 1, max_total_tokens = 1;
    // Tokens of an observation after a turn (ended_on_eos: the turn's last token is its end of turn).
    std::function<std::vector<int32_t>(const std::string& role, const std::string& content, bool ended_on_eos)> render;
    std::function<std::string(const std::vector<int32_t>&)> decode;  // a turn's text, special tokens left out
};

// Runs every request's trajectory to its end. first[i] is request i's environment request before
// its first turn: id, the conversation so far (the prompt), answer and data.
inline std::vector<Trajectory> run_trajectories(Engine& engine, const std::vector<GenRequest>& requests, std::vector<EnvRequest> first,
                                               uint32_t step, SamplingConfig sampling, Precision weights, Precision kv_cache,
                                               Progress* progress, const TrajectoryContext& ctx) {
    const size_t n = requests.size();
    std::vector<Trajectory> out(n);
    std::vector<size_t> active(n);
    for (size_t i = 0; i < n; i++) active[i] = i;
    std::vector<TurnRequest> next_turns;  // of the rows in `active`, in order (turn 2 on)
    for (int turn = 1; !active.empty(); turn++) {
        std::vector<size_t> turn_start(n, 0);
        for (size_t i : active) turn_start[i] = out[i].gen.tokens.size();
        sampling.max_new_tokens = std::min(ctx.max_turn_tokens, ctx.max_total_tokens);
        std::vector<Generation> done =
            turn == 1 ? engine.start_turns(requests, ctx.max_total_tokens, step, sampling, weights, kv_cache, progress)
                      : engine.next_turns(next_turns);
        for (size_t k = 0; k < active.size(); k++) {
            Trajectory& t = out[active[k]];
            t.gen.tokens.insert(t.gen.tokens.end(), done[k].tokens.begin(), done[k].tokens.end());
            t.gen.logprobs.insert(t.gen.logprobs.end(), done[k].logprobs.begin(), done[k].logprobs.end());
            t.loss_mask.insert(t.loss_mask.end(), done[k].tokens.size(), 1);
            t.gen.finished = done[k].finished;
            t.turns = turn;
        }
        std::vector<EnvRequest> asks;
        for (size_t i : active) {
            const Trajectory& t = out[i];
            first[i].messages.push_back(
                {"assistant", ctx.decode(std::vector<int32_t>(t.gen.tokens.begin() + (long)turn_start[i], t.gen.tokens.end()))});
            EnvRequest r = first[i];
            r.turn = turn;
            r.truncated = !t.gen.finished;
            asks.push_back(std::move(r));
        }
        const std::vector<EnvReply> replies = ctx.env->step(asks);
        std::vector<size_t> next;
        next_turns.clear();
        for (size_t k = 0; k < active.size(); k++) {
            const size_t i = active[k];
            Trajectory& t = out[i];
            const EnvReply& r = replies[k];
            if (r.has_reward) {
                t.has_reward = true;
                t.reward = r.reward;
            }
            if (r.done) continue;
            std::vector<int32_t> obs = ctx.render(r.role, r.observation, t.gen.finished);
            // another turn needs a token of room after the observation
            if (turn >= ctx.max_turns || (int64_t)(t.gen.tokens.size() + obs.size()) >= ctx.max_total_tokens) {
                t.truncated = true;
                continue;
            }
            t.gen.tokens.insert(t.gen.tokens.end(), obs.begin(), obs.end());
            t.gen.logprobs.insert(t.gen.logprobs.end(), obs.size(), NAN);
            t.loss_mask.insert(t.loss_mask.end(), obs.size(), 0);
            t.observation_tokens += (int64_t)obs.size();
            first[i].messages.push_back({r.role, r.observation});
            next.push_back(i);
            next_turns.push_back({i, std::move(obs), std::min(ctx.max_turn_tokens, ctx.max_total_tokens - (int)t.gen.tokens.size())});
        }
        active.swap(next);
    }
    engine.end_turns();
    return out;
}

}  // namespace fp8rl
