// reward_workers.h: --reward_cmd. --reward_workers persistent processes of the user's scorer per
// rank, each speaking JSON Lines: one request line in (scorer.h, score_request_json), one reply line
// out, {"id": int, "reward": number} with optional "correct": 0|1, "extracted": str|null and
// "metrics": {name: number}. Each worker holds one request at a time, so the workers answer in
// any order and a slow one delays only its own requests. A reply is matched by id.
//
// Failure is never silent and never a hang: a worker that exits, a reply that is not JSON or lacks
// "reward", an unknown id, or no reply within --reward_timeout seconds of the request is an Error
// naming the worker, the request id and the tail of the worker's stderr. With --reward_on_timeout
// R, a request past the timeout gets reward R instead (counted) and its worker is restarted.
#pragma once
#include <poll.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "rl/common.h"
#include "rl/io/json.h"
#include "rl/io/subprocess.h"
#include "rl/tasks/scorer.h"

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
    static constexpr size_t kMaxLine = 16u << 20;  // a reply line longer than this is an error, not unbounded memory

    explicit RewardWorkers(const RewardConfig& c) : cfg_(c) {
        if (cfg_.workers < 1) fail("--reward_workers %d: must be at least 1", cfg_.workers);
        for (int k = 0; k < cfg_.workers; k++) workers_.push_back(std::make_unique<Worker>(cfg_.cmd));
    }

    // Every worker gets its end of input at once, then up to half a second in all to exit before it is killed.
    ~RewardWorkers() override {
        for (auto& w : workers_) w->proc->close_stdin();
        const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
        for (auto& w : workers_) w->proc->stop(std::max(0.0, std::chrono::duration<double>(until - std::chrono::steady_clock::now()).count()));
    }

    bool external() const override { return true; }

    std::vector<ScoreResult> score(const std::vector<ScoreRequest>& requests) override {
        using clock = std::chrono::steady_clock;
        std::vector<ScoreResult> out(requests.size());
        size_t next = 0, done = 0;
        while (done < requests.size()) {
            for (auto& w : workers_)  // each idle worker takes the next request
                if (w->request < 0 && next < requests.size()) {
                    w->request = (int64_t)next;
                    w->pending = score_request_json(requests[next++]) + "\n";
                    w->sent_at = clock::now();
                }
            std::vector<pollfd> fds;
            for (auto& w : workers_) {
                fds.push_back({w->proc->stdout_fd(), POLLIN, 0});
                fds.push_back({w->proc->stderr_fd(), POLLIN, 0});
                fds.push_back({w->pending.empty() ? -1 : w->proc->stdin_fd(), POLLOUT, 0});
            }
            double wait_s = 3600;
            for (auto& w : workers_)
                if (w->request >= 0) wait_s = std::min(wait_s, cfg_.timeout_s - seconds_since(w->sent_at));
            int ms = (int)std::ceil(std::max(0.0, wait_s) * 1000);
            if (poll(fds.data(), fds.size(), ms) < 0 && errno != EINTR) fail("--reward_cmd: poll failed: %s", strerror(errno));
            for (size_t k = 0; k < workers_.size(); k++) {
                Worker& w = *workers_[k];
                const int64_t id = w.request >= 0 ? requests[(size_t)w.request].id : -1;
                if (fds[k * 3 + 1].revents) w.proc->drain_stderr();
                if (fds[k * 3 + 2].revents && !w.pending.empty()) {
                    ssize_t n = w.proc->write_some(w.pending.data(), w.pending.size());
                    if (n < 0) died(k, id, "closed its stdin");
                    w.pending.erase(0, (size_t)n);
                }
                if (fds[k * 3].revents) {
                    const bool open = w.proc->read_stdout(w.line);
                    for (size_t nl; (nl = w.line.find('\n')) != std::string::npos;) {
                        std::string line = w.line.substr(0, nl);
                        w.line.erase(0, nl + 1);
                        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
                        if (w.request < 0)
                            fail("%s: a reply while it holds no request: '%.200s'; %s", who(k).c_str(), line.c_str(),
                                 w.proc->stderr_tail().c_str());
                        try {
                            out[(size_t)w.request] = parse_worker_reply(line, id, who(k));
                        } catch (const Error& e) {
                            fail("%s; %s", e.what(), w.proc->stderr_tail().c_str());
                        }
                        w.request = -1;
                        done++;
                    }
                    if (w.line.size() > kMaxLine) fail("%s: request id %lld: a reply line over %zu bytes", who(k).c_str(), (long long)id, kMaxLine);
                    if (!open) died(k, id, "closed its stdout");
                }
            }
            for (size_t k = 0; k < workers_.size(); k++) {
                Worker& w = *workers_[k];
                if (w.request < 0 || seconds_since(w.sent_at) < cfg_.timeout_s) continue;
                const int64_t id = requests[(size_t)w.request].id;
                if (!cfg_.has_timeout_reward)
                    fail("%s: request id %lld: no reply within --reward_timeout %g s (or give --reward_on_timeout R); %s", who(k).c_str(),
                         (long long)id, cfg_.timeout_s, w.proc->stderr_tail().c_str());
                ScoreResult& r = out[(size_t)w.request];
                r.verdict.reward = cfg_.timeout_reward;
                r.verdict.correct = cfg_.timeout_reward > 0;
                r.timed_out = true;
                done++;
                w.proc->stop(0);
                workers_[k] = std::make_unique<Worker>(cfg_.cmd);  // its late reply must not answer another request
            }
        }
        return out;
    }

private:
    struct Worker {
        std::unique_ptr<Subprocess> proc;
        int64_t request = -1;  // index of the request it holds, -1 = idle
        std::string pending;   // the request's bytes not yet written
        std::string line;      // reply bytes after the last newline
        std::chrono::steady_clock::time_point sent_at;
        explicit Worker(const std::string& cmd) : proc(std::make_unique<Subprocess>(cmd)) {}
    };
    RewardConfig cfg_;
    std::vector<std::unique_ptr<Worker>> workers_;

    static double seconds_since(std::chrono::steady_clock::time_point t) {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
    }

    std::string who(size_t k) const {
        return strfmt("reward worker %zu of %zu (pid %d, --reward_cmd '%s')", k + 1, workers_.size(), workers_[k]->proc->pid(),
                      cfg_.cmd.c_str());
    }

    [[noreturn]] void died(size_t k, int64_t id, const char* what) {
        Subprocess& p = *workers_[k]->proc;
        std::string ended = p.how_it_ended(1.0);
        fail("%s %s (it %s)%s; %s", who(k).c_str(), what, ended.c_str(),
             id >= 0 ? strfmt(" while holding request id %lld", (long long)id).c_str() : "", p.stderr_tail().c_str());
    }
};

}  // namespace fp8rl
