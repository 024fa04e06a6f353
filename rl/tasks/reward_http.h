// reward_http.h: --reward_url, OpenRLHF's remote reward format. Each batch of --reward_batch
// responses is one POST of {"query": [prompt + response, ...], "prompts": [prompt, ...],
// "labels": [answer or null, ...]}; the reply must be {"rewards": [number, ...]} of the same length
// (other keys are ignored). A reward above 0 counts as correct. An HTTP error, a malformed reply or
// no reply within --reward_timeout is an Error naming the URL and the batch's request ids, unless
// --reward_on_timeout R gives the batch's responses that reward (counted as timeouts).
#pragma once
#include <algorithm>
#include <string>
#include <vector>

#include "rl/common.h"
#include "rl/io/http_client.h"
#include "rl/io/json.h"
#include "rl/tasks/scorer.h"

namespace fp8rl {

// The body of one POST in OpenRLHF's format.
inline std::string openrlhf_reward_body(const std::vector<ScoreRequest>& requests, size_t b, size_t e) {
    std::string query = "[", prompts = "[", labels = "[";
    for (size_t i = b; i < e; i++) {
        const char* sep = i > b ? "," : "";
        query += sep;
        prompts += sep;
        labels += sep;
        json_append_string(query, requests[i].prompt + requests[i].response);
        json_append_string(prompts, requests[i].prompt);
        if (requests[i].has_answer) json_append_string(labels, requests[i].answer);
        else labels += "null";
    }
    return "{\"query\":" + query + "],\"prompts\":" + prompts + "],\"labels\":" + labels + "]}";
}

class RewardHttp : public Scorer {
public:
    explicit RewardHttp(const RewardConfig& c) : cfg_(c) {
        parse_http_url(cfg_.url);  // a malformed URL fails now, not at the first step
        if (cfg_.batch < 1) fail("--reward_batch %d: must be at least 1", cfg_.batch);
    }

    bool external() const override { return true; }

    std::vector<ScoreResult> score(const std::vector<ScoreRequest>& requests) override {
        std::vector<ScoreResult> out(requests.size());
        for (size_t b = 0; b < requests.size(); b += (size_t)cfg_.batch) {
            const size_t e = std::min(requests.size(), b + (size_t)cfg_.batch);
            const std::string who = strfmt("--reward_url %s: request ids %lld..%lld", cfg_.url.c_str(), (long long)requests[b].id,
                                           (long long)requests[e - 1].id);
            HttpResponse r;
            try {
                r = http_post_json(cfg_.url, openrlhf_reward_body(requests, b, e), cfg_.timeout_s);
            } catch (const Error& err) {
                const bool timeout = std::string(err.what()).find("(--reward_timeout)") != std::string::npos;
                if (!timeout || !cfg_.has_timeout_reward) fail("%s: %s", who.c_str(), err.what());
                for (size_t i = b; i < e; i++) {
                    out[i].verdict.reward = cfg_.timeout_reward;
                    out[i].verdict.correct = cfg_.timeout_reward > 0;
                    out[i].timed_out = true;
                }
                continue;
            }
            const std::string head = r.body.size() > 200 ? r.body.substr(0, 200) + "..." : r.body;
            if (r.status != 200) fail("%s: HTTP status %d: '%s'", who.c_str(), r.status, head.c_str());
            Json j;
            try {
                j = json_parse(r.body, "reply");
            } catch (const Error& err) {
                fail("%s: the reply is not JSON (%s): '%s'", who.c_str(), err.what(), head.c_str());
            }
            const Json* rewards = j.find("rewards");
            if (!rewards || !rewards->is_array() || rewards->items.size() != e - b)
                fail("%s: expected {\"rewards\": [%zu numbers]}, got '%s'", who.c_str(), e - b, head.c_str());
            for (size_t i = b; i < e; i++) {
                const Json& x = rewards->items[i - b];
                if (!x.is_number()) fail("%s: rewards[%zu] is %s, not a number", who.c_str(), i - b, json_type_name(x.type));
                out[i].verdict.reward = x.number;
                out[i].verdict.correct = x.number > 0;
            }
        }
        return out;
    }

private:
    RewardConfig cfg_;
};

}  // namespace fp8rl
