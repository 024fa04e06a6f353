// environment.h: --env_cmd, a multi-turn environment as the user's program. It runs on the worker
// pool of rl/tasks/worker_pool.h (--env_workers processes per rank, --env_timeout, the failure rules
// of --reward_cmd). After each assistant turn the driver (rl/driver/multi_turn.h) sends one line
//   {"id": int, "turn": int, "messages": [{"role", "content"}, ...], "truncated": bool,
//    "answer": str, "data": {...}}
// (messages: the conversation so far, ending with the assistant turn just written; turn counts the
// assistant turns from 1; truncated: that turn was cut at its token budget) and reads one line
//   {"id": int, "observation": str|null, "role": "tool"|"user", "done": bool, "reward": number?}
// ("role" defaults to "tool"; a reply that is not done must carry an observation). A reply is
// taken as a pure function of its request, as a scorer's is (docs/rewards-and-tasks.md).
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "rl/common.h"
#include "rl/io/json.h"
#include "rl/tasks/worker_pool.h"

namespace fp8rl {

struct EnvConfig {
    std::string cmd;         // --env_cmd; empty = single-turn
    int workers = 2;         // --env_workers
    double timeout_s = 60;   // --env_timeout
    int max_turns = 4;       // --max_turns: assistant turns of a trajectory
    int max_turn_tokens = 0;   // --max_turn_tokens: tokens of one assistant turn (0 = --max_new_tokens)
    int max_total_tokens = 0;  // --max_total_tokens: response tokens of a trajectory, model's and observations' (0 = --max_new_tokens)
    bool enabled() const { return !cmd.empty(); }
};

struct EnvRequest {
    int64_t id = 0;    // the trajectory's sequence id (the same on any rank count)
    int turn = 1;
    std::vector<std::pair<std::string, std::string>> messages;  // (role, content)
    bool truncated = false;
    std::string answer;
    std::string data = "{}";
};

struct EnvReply {
    bool has_observation = false;
    std::string observation;
    std::string role = "tool";
    bool done = false;
    bool has_reward = false;
    double reward = 0;
};

inline std::string env_request_json(const EnvRequest& r) {
    std::string s = "{\"id\":" + std::to_string(r.id) + ",\"turn\":" + std::to_string(r.turn) + ",\"messages\":[";
    for (size_t i = 0; i < r.messages.size(); i++) {
        s += i ? ",{\"role\":" : "{\"role\":";
        json_append_string(s, r.messages[i].first);
        s += ",\"content\":";
        json_append_string(s, r.messages[i].second);
        s += "}";
    }
    s += std::string("],\"truncated\":") + (r.truncated ? "true" : "false") + ",\"answer\":";
    json_append_string(s, r.answer);
    return s + ",\"data\":" + r.data + "}";
}

// The EnvReply of one reply line to request `id`; `who` names the worker for errors.
inline EnvReply parse_env_reply(const std::string& line, int64_t id, const std::string& who) {
    const std::string head = line.size() > 200 ? line.substr(0, 200) + "..." : line;
    const char* shape = "a reply is {\"id\": int, \"observation\": str|null, \"role\": \"tool\"|\"user\", \"done\": bool, \"reward\": number?}";
    Json j;
    try {
        j = json_parse(line, "reply");
    } catch (const Error& e) {
        fail("%s: request id %lld: the reply is not JSON (%s): '%s'", who.c_str(), (long long)id, e.what(), head.c_str());
    }
    if (!j.is_object()) fail("%s: request id %lld: the reply is %s, not an object; %s", who.c_str(), (long long)id, json_type_name(j.type), shape);
    const Json* rid = j.find("id");
    if (!rid || !rid->is_int()) fail("%s: request id %lld: the reply has no integer \"id\": '%s'; %s", who.c_str(), (long long)id, head.c_str(), shape);
    if (rid->integer != id)
        fail("%s: a reply for unknown id %lld (the worker holds request id %lld): '%s'", who.c_str(), (long long)rid->integer,
             (long long)id, head.c_str());
    EnvReply r;
    const Json* done = j.find("done");
    if (!done || !done->is_bool()) fail("%s: request id %lld: the reply has no boolean \"done\": '%s'; %s", who.c_str(), (long long)id, head.c_str(), shape);
    r.done = done->boolean;
    if (const Json* o = j.find("observation"); o && !o->is_null()) {
        if (!o->is_string()) fail("%s: request id %lld: \"observation\" must be a string or null", who.c_str(), (long long)id);
        r.has_observation = true;
        r.observation = o->str;
    }
    if (!r.done && !r.has_observation)
        fail("%s: request id %lld: a reply that is not done needs an \"observation\": '%s'", who.c_str(), (long long)id, head.c_str());
    if (const Json* role = j.find("role"); role && !role->is_null()) {
        if (!role->is_string() || (role->str != "tool" && role->str != "user"))
            fail("%s: request id %lld: \"role\" must be \"tool\" or \"user\", got %s", who.c_str(), (long long)id, json_dump(*role).c_str());
        r.role = role->str;
    }
    if (const Json* reward = j.find("reward"); reward && !reward->is_null()) {
        if (!reward->is_number()) fail("%s: request id %lld: \"reward\" must be a number", who.c_str(), (long long)id);
        r.has_reward = true;
        r.reward = reward->number;
    }
    return r;
}

// The environment's workers of one rank.
class EnvWorkers {
public:
    explicit EnvWorkers(const EnvConfig& c) : pool_(pool_config(c)) {}

    // One reply per request, in order; a failure is an Error naming the worker and the request.
    std::vector<EnvReply> step(const std::vector<EnvRequest>& requests) {
        std::vector<EnvReply> out(requests.size());
        std::vector<std::string> lines;
        std::vector<int64_t> ids;
        for (const EnvRequest& r : requests) {
            lines.push_back(env_request_json(r));
            ids.push_back(r.id);
        }
        pool_.exchange(lines, ids, [&](size_t i, const std::string& line, const std::string& who) { out[i] = parse_env_reply(line, ids[i], who); });
        return out;
    }

private:
    WorkerPool pool_;

    static WorkerPoolConfig pool_config(const EnvConfig& c) {
        return worker_pool_config("env", "environment worker", c.cmd, c.workers, c.timeout_s);
    }
};

}  // namespace fp8rl
