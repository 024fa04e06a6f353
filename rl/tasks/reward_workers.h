// reward_workers.h: --reward_cmd. --reward_workers persistent processes of the user's scorer per
// rank, each speaking JSON Lines: one request line in (scorer.h, score_request_json), one reply line
// out, {"id": int, "reward": number} with optional "correct": 0|1, "extracted": str|null and
// "metrics": {name: number}, on the worker pool of rl/tasks/worker_pool.h (its failure rules). A
// reply is matched by id; a reply that is not JSON, lacks "reward" or has an unknown id is an Error
// naming the worker. With --reward_on_timeout R, a request past --reward_timeout gets reward R
// instead (counted) and its worker is restarted.
#pragma once
#include <string>
#include <vector>

#include "rl/common.h"
#include "rl/io/json.h"
#include "rl/tasks/scorer.h"
#include "rl/tasks/worker_pool.h"

namespace fp8rl {

// The ScoreResult of one reply line to request `id`; `who` names the worker for errors.
inline ScoreResult parse_worker_reply(const std::string& line, int64_t id, const std::string& who) {
    auto head = [&] { return line.size() > 200 ? line.substr(0, 200) + "..." : line; };
    Json j;
    try {
        j = json_parse(line, "reply");
    } catch (const Error& e) {
        fail("%s: request id %lld: the reply is not JSON (%s): '%s'", who.c_str(), (long long)id, e.what(), head().c_str());
    }
    const char* shape = "a reply is {\"id\": int, \"reward\": number} with optional \"correct\", \"extracted\", \"metrics\"";
    if (!j.is_object()) fail("%s: request id %lld: the reply is %s, not an object; %s", who.c_str(), (long long)id, json_type_name(j.type), shape);
    const Json* rid = j.find("id");
    if (!rid || !rid->is_int()) fail("%s: request id %lld: the reply has no integer \"id\": '%s'; %s", who.c_str(), (long long)id, head().c_str(), shape);
    if (rid->integer != id)
        fail("%s: a reply for unknown id %lld (the worker holds request id %lld): '%s'", who.c_str(), (long long)rid->integer,
             (long long)id, head().c_str());
    const Json* reward = j.find("reward");
    if (!reward || !reward->is_number())
        fail("%s: request id %lld: the reply has no numeric \"reward\": '%s'; %s", who.c_str(), (long long)id, head().c_str(), shape);
    ScoreResult r;
    r.verdict.reward = reward->number;
    r.verdict.correct = r.verdict.reward > 0;  // without "correct": a positive reward counts as correct
    if (const Json* c = j.find("correct")) {
        if (c->is_bool()) r.verdict.correct = c->boolean;
        else if (c->is_int() && (c->integer == 0 || c->integer == 1)) r.verdict.correct = c->integer == 1;
        else fail("%s: request id %lld: \"correct\" must be 0 or 1, got %s", who.c_str(), (long long)id, json_dump(*c).c_str());
    }
    if (const Json* e = j.find("extracted"); e && !e->is_null()) {
        if (!e->is_string()) fail("%s: request id %lld: \"extracted\" must be a string or null", who.c_str(), (long long)id);
        r.verdict.has_extracted = true;
        r.verdict.extracted = e->str;
    }
    if (const Json* m = j.find("metrics")) {
        if (!m->is_object()) fail("%s: request id %lld: \"metrics\" must be an object of numbers", who.c_str(), (long long)id);
        for (const auto& kv : m->fields) {
            if (!kv.second.is_number())
                fail("%s: request id %lld: metric \"%s\" must be a number, got %s", who.c_str(), (long long)id, kv.first.c_str(),
                     json_type_name(kv.second.type));
            r.metrics.emplace_back(kv.first, kv.second.number);
        }
    }
    return r;
}

class RewardWorkers : public Scorer {
public:
    explicit RewardWorkers(const RewardConfig& c) : cfg_(c), pool_(pool_config(c)) {}

    bool external() const override { return true; }

    std::vector<ScoreResult> score(const std::vector<ScoreRequest>& requests) override {
        std::vector<ScoreResult> out(requests.size());
        std::vector<std::string> lines;
        std::vector<int64_t> ids;
        for (const ScoreRequest& r : requests) {
            lines.push_back(score_request_json(r));
            ids.push_back(r.id);
        }
        pool_.exchange(
            lines, ids, [&](size_t i, const std::string& line, const std::string& who) { out[i] = parse_worker_reply(line, ids[i], who); },
            [&](size_t i) {
                if (!cfg_.has_timeout_reward) return false;
                out[i].verdict.reward = cfg_.timeout_reward;
                out[i].verdict.correct = cfg_.timeout_reward > 0;
                out[i].timed_out = true;
                return true;
            });
        return out;
    }

private:
    RewardConfig cfg_;
    WorkerPool pool_;

    static WorkerPoolConfig pool_config(const RewardConfig& c) {
        WorkerPoolConfig p = worker_pool_config("reward", "reward worker", c.cmd, c.workers, c.timeout_s);
        p.timeout_advice = " (or give --reward_on_timeout R)";
        return p;
    }
};

}  // namespace fp8rl
