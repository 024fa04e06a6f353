// scorer.h: who scores responses. One interface for training, evaluation and --score: a batch of
// requests (prompt, response, answer, the data row's other fields) in, one result per request out,
// in request order. Three scorers: the built-in verifier of --task (rl/tasks/reward.h), the
// user's worker programs over JSON Lines (--reward_cmd, rl/tasks/reward_workers.h) and an HTTP
// server in OpenRLHF's remote reward format (--reward_url, rl/tasks/reward_http.h). An external
// reply is taken as a pure function of its request, and a request holds nothing that depends on the
// rank count, so N ranks score what one rank scores and a resumed run what an unbroken one does.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "rl/common.h"
#include "rl/io/json.h"
#include "rl/tasks/reward.h"

namespace fp8rl {

// What one response is scored on.
struct ScoreRequest {
    int64_t id = 0;        // unique within one call; training: the response's index in the step's generation
    std::string task;      // --task
    std::string prompt;    // the prompt text as the model saw it (messages rendered by the chat template)
    std::string response;  // decoded response tokens up to, not including, the end-of-turn token
    bool has_answer = true;
    std::string answer;
    std::string data = "{}";  // JSON object: the data row's fields other than prompt, messages and answer
    int64_t step = 0;         // training step (0-based)
    int64_t sample = 0;       // the response's index in its group
};

struct ScoreResult {
    Verdict verdict;
    std::vector<std::pair<std::string, double>> metrics;  // the reply's "metrics", in its order
    bool timed_out = false;                                // --reward_on_timeout's reward stands in
};

// Where rewards come from, from the flags.
struct RewardConfig {
    std::string cmd, url;  // --reward_cmd, --reward_url; both empty = the built-in verifier
    int workers = 2;       // --reward_workers: worker processes per rank
    int batch = 64;        // --reward_batch: responses per HTTP request
    double timeout_s = 60;
    bool has_timeout_reward = false;  // --reward_on_timeout given
    double timeout_reward = 0;
    bool external() const { return !cmd.empty() || !url.empty(); }
};

class Scorer {
public:
    virtual ~Scorer() = default;
    // One result per request, in order; a failure of the scorer is an Error naming it.
    virtual std::vector<ScoreResult> score(const std::vector<ScoreRequest>& requests) = 0;
    // True for --reward_cmd and --reward_url (their latency and timeouts are logged).
    virtual bool external() const = 0;
};

// The built-in verifier of the request's task.
class BuiltinScorer : public Scorer {
public:
    std::vector<ScoreResult> score(const std::vector<ScoreRequest>& requests) override {
        std::vector<ScoreResult> out(requests.size());
        for (size_t i = 0; i < requests.size(); i++) {
            const ScoreRequest& r = requests[i];
            if (!r.has_answer)
                fail("request %lld: no answer; the built-in verifier of --task %s needs one (or score with --reward_cmd / --reward_url)",
                     (long long)r.id, r.task.c_str());
            out[i].verdict = score_response(r.task, r.response, r.answer);
        }
        return out;
    }
    bool external() const override { return false; }
};

// The JSON Lines request of --reward_cmd (docs/rewards-and-tasks.md), without the newline.
inline std::string score_request_json(const ScoreRequest& r) {
    std::string s = "{\"id\":" + std::to_string(r.id) + ",\"task\":";
    json_append_string(s, r.task);
    s += ",\"prompt\":";
    json_append_string(s, r.prompt);
    s += ",\"response\":";
    json_append_string(s, r.response);
    s += ",\"answer\":";
    if (r.has_answer) json_append_string(s, r.answer);
    else s += "null";
    s += ",\"data\":" + r.data + ",\"step\":" + std::to_string(r.step) + ",\"sample\":" + std::to_string(r.sample) + "}";
    return s;
}

}  // namespace fp8rl
