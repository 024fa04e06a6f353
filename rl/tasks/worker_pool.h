// worker_pool.h: persistent worker processes of a user's program (`/bin/sh -c CMD`) speaking JSON
// Lines: one request line in, one reply line out. The scorer of --reward_cmd
// (rl/tasks/reward_workers.h) and the environment of --env_cmd (rl/tasks/environment.h) both run on
// it, so both follow one set of failure rules. Each worker holds one request at a time, so the
// workers answer in any order and a slow one delays only its own requests.
//
// Failure is never silent and never a hang: a worker that exits or closes a pipe, a reply while it
// holds no request, a line over kMaxLine bytes, a reply its caller refuses (not JSON, a wrong id,
// missing fields), or no reply within the timeout is an Error naming the worker, the request id
// and the tail of the worker's stderr. A caller may instead take a stand-in for a timed-out
// request (--reward_on_timeout); the worker is then restarted, so its late reply answers nothing.
#pragma once
#include <poll.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "rl/common.h"
#include "rl/io/subprocess.h"

namespace fp8rl {

struct WorkerPoolConfig {
    std::string cmd;
    int workers = 2;
    double timeout_s = 60;
    std::string role = "reward worker";          // names a worker in errors: "reward worker 1 of 2 (...)"
    std::string cmd_flag = "--reward_cmd";       // the flag that gave cmd
    std::string timeout_flag = "--reward_timeout";
    std::string timeout_advice;                  // appended to the timeout error, e.g. " (or give --reward_on_timeout R)"
};

// The pool of --<kind>_cmd, --<kind>_workers and --<kind>_timeout (kind "reward" or "env"); `role`
// names a worker in errors.
inline WorkerPoolConfig worker_pool_config(const char* kind, const std::string& role, const std::string& cmd, int workers,
                                           double timeout_s) {
    if (workers < 1) fail("--%s_workers %d: must be at least 1", kind, workers);
    WorkerPoolConfig p;
    p.cmd = cmd;
    p.workers = workers;
    p.timeout_s = timeout_s;
    p.role = role;
    p.cmd_flag = strfmt("--%s_cmd", kind);
    p.timeout_flag = strfmt("--%s_timeout", kind);
    return p;
}

class WorkerPool {
public:
    static constexpr size_t kMaxLine = 16u << 20;  // a reply line longer than this is an error, not unbounded memory

    // Called with a request's index, its reply line and the worker's name; it parses the reply (an
    // Error it throws stops the run, with the worker's stderr tail appended).
    using OnReply = std::function<void(size_t request, const std::string& line, const std::string& who)>;
    // Called for a request past the timeout: true = the caller took a stand-in result for it.
    using OnTimeout = std::function<bool(size_t request)>;

    explicit WorkerPool(WorkerPoolConfig c) : cfg_(std::move(c)) {
        if (cfg_.workers < 1) fail("%s: %d workers; need at least 1", cfg_.cmd_flag.c_str(), cfg_.workers);
        for (int k = 0; k < cfg_.workers; k++) workers_.push_back(std::make_unique<Worker>(cfg_.cmd));
    }

    // Every worker gets its end of input at once, then up to half a second in all to exit before it is killed.
    ~WorkerPool() {
        for (auto& w : workers_) w->proc->close_stdin();
        const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
        for (auto& w : workers_) w->proc->stop(std::max(0.0, std::chrono::duration<double>(until - std::chrono::steady_clock::now()).count()));
    }

    // Sends lines[i] (without its newline; ids[i] names it in errors) to the workers and hands each
    // reply to on_reply; returns when every request has its reply (or a stand-in).
    void exchange(const std::vector<std::string>& lines, const std::vector<int64_t>& ids, const OnReply& on_reply,
                  const OnTimeout& on_timeout = nullptr) {
        using clock = std::chrono::steady_clock;
        size_t next = 0, done = 0;
        while (done < lines.size()) {
            for (auto& w : workers_)  // each idle worker takes the next request
                if (w->request < 0 && next < lines.size()) {
                    w->request = (int64_t)next;
                    w->pending = lines[next++] + "\n";
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
            if (poll(fds.data(), fds.size(), ms) < 0 && errno != EINTR) fail("%s: poll failed: %s", cfg_.cmd_flag.c_str(), strerror(errno));
            for (size_t k = 0; k < workers_.size(); k++) {
                Worker& w = *workers_[k];
                const int64_t id = w.request >= 0 ? ids[(size_t)w.request] : -1;
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
                            on_reply((size_t)w.request, line, who(k));
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
                const int64_t id = ids[(size_t)w.request];
                if (!on_timeout || !on_timeout((size_t)w.request))
                    fail("%s: request id %lld: no reply within %s %g s%s; %s", who(k).c_str(), (long long)id, cfg_.timeout_flag.c_str(),
                         cfg_.timeout_s, cfg_.timeout_advice.c_str(), w.proc->stderr_tail().c_str());
                done++;
                w.proc->stop(0);
                workers_[k] = std::make_unique<Worker>(cfg_.cmd);  // its late reply must not answer another request
            }
        }
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
    WorkerPoolConfig cfg_;
    std::vector<std::unique_ptr<Worker>> workers_;

    static double seconds_since(std::chrono::steady_clock::time_point t) {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
    }

    std::string who(size_t k) const {
        return strfmt("%s %zu of %zu (pid %d, %s '%s')", cfg_.role.c_str(), k + 1, workers_.size(), workers_[k]->proc->pid(),
                      cfg_.cmd_flag.c_str(), cfg_.cmd.c_str());
    }

    [[noreturn]] void died(size_t k, int64_t id, const char* what) {
        Subprocess& p = *workers_[k]->proc;
        std::string ended = p.how_it_ended(1.0);
        fail("%s %s (it %s)%s; %s", who(k).c_str(), what, ended.c_str(),
             id >= 0 ? strfmt(" while holding request id %lld", (long long)id).c_str() : "", p.stderr_tail().c_str());
    }
};

}  // namespace fp8rl
