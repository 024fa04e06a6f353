// Tests of the user's scorer (--reward_cmd workers over JSON Lines, --reward_url in OpenRLHF's
// format) through the binary ($FP8RL_BIN): the awk reimplementation of the synthetic verifier
// (dev/rewards/exact_match.awk) scores the reference table as the Python verifier does and trains
// bit for bit as the built-in verifier, resumed or not; a scorer's own rewards and metrics are what
// --score and training report; every failure ends the run with one line, exit 1, within the
// timeout; an HTTP server (a small one in this file, on 127.0.0.1) gives the same run again.
// No Python: the scorers are sh and awk.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "rl/io/checkpoint.h"
#include "rl/io/json.h"
#include "rl/tasks/data.h"
#include "rl/tasks/reward.h"
#include "rl/tasks/score.h"
#include "test/harness.h"
#include "test/run_binary.h"
#include "test/temp_dir.h"
#include "test/training_run.h"

using namespace fp8rl;

namespace {

const char* kExactMatch = " --reward_cmd 'sh dev/rewards/exact_match.sh'";

// 1-character sort with one-token responses: about one response in ten is right from the start, so
// the rewards are not all zero.
std::string scorer_run(const std::string& out_dir, int steps) {
    return strfmt(" --init tiny --task sort --task_size 1 --max_new_tokens 1 --group_size 4 --batch_prompts 8 --minibatches 2"
                  " --lr 3e-3 --steps %d --eval_every 1 --eval_prompts 8 --eval_k 2 --seed 11 --threads 1 --out_dir %s",
                  steps, out_dir.c_str());
}

// log.jsonl without wall-clock metrics and without the external scorer's own (reward/*, val/reward/*).
std::vector<std::string> log_without_scorer(const std::string& dir) {
    std::vector<std::string> out;
    for (const Json& row : log_rows(dir)) {
        std::string kept;
        for (const auto& kv : row.fields) {
            const std::string& k = kv.first;
            // maj@n votes over the verifier's extracted answers, which an HTTP scorer's {"rewards": [...]} does not carry
            if (k.rfind("timing_s/", 0) == 0 || k.rfind("perf/", 0) == 0 || k.rfind("memory/", 0) == 0 || k.rfind("reward/", 0) == 0 ||
                k.rfind("val/reward/", 0) == 0 || k.find("/acc/maj@") != std::string::npos)
                continue;
            kept += k + "=" + (kv.second.is_null() ? std::string("null") : strfmt("%.17g", kv.second.number)) + " ";
        }
        out.push_back(kept);
    }
    return out;
}

// Two runs whose every step (but the scorer's own metrics) and final trainer state are equal bit for bit.
void check_runs_equal(const std::string& a, const std::string& b, size_t steps) {
    std::vector<std::string> x = log_without_scorer(a), y = log_without_scorer(b);
    CHECK_EQ(x.size(), steps);
    CHECK_EQ(y.size(), steps);
    for (size_t i = 0; i < std::min(x.size(), y.size()); i++) CHECK_MSG(x[i] == y[i], "step %zu:\n%s\n%s", i + 1, x[i].c_str(), y[i].c_str());
    TrainerState s = final_state(a), t = final_state(b);
    CHECK(s.master == t.master);
    CHECK(s.adam_m == t.adam_m && s.adam_v == t.adam_v);
}

double score_sum(const std::string& dir) {
    double sum = 0;
    for (const Json& row : log_rows(dir)) sum += row.find("critic/score/mean")->number;
    return sum;
}

}  // namespace

// The awk verifier against the reference table of the Python verifier (dev/make_reward_fixtures.py):
// its rows of the synthetic tasks, through --score as training would send them.
TEST(reward_cmd_score_matches_the_reference_table) {
    harness::TempDir t;
    std::string rows;
    int n = 0;
    const std::string table = read_file("test/fixtures/reward/cases.jsonl");
    std::vector<Json> want;
    for (size_t pos = 0, nl; pos < table.size(); pos = nl + 1) {
        nl = table.find('\n', pos);
        const std::string line = table.substr(pos, nl - pos);
        Json row = json_parse(line, "cases.jsonl");
        if (!is_synthetic_task(row.find("task")->str) || row.find("task")->str == "countdown") continue;
        rows += line + "\n";
        want.push_back(row);
        n++;
    }
    CHECK(n >= 10);
    harness::write_text(t / "cases.jsonl", rows);
    harness::RunResult r = run_cmd(harness::binary() + " --score " + t / "cases.jsonl" + kExactMatch);
    CHECK_MSG(r.status == 0, "%s", r.output.c_str());
    size_t pos = 0;
    for (const Json& w : want) {
        size_t nl = r.output.find('\n', pos);
        if (nl == std::string::npos) {
            CHECK_MSG(false, "fewer output lines than %d: %s", n, r.output.c_str());
            return;
        }
        Json got = json_parse(r.output.substr(pos, nl - pos), "score output");
        pos = nl + 1;
        CHECK_EQ(got.find("reward")->number, w.find("reward")->number);
        CHECK_EQ(got.find("correct")->integer, (int64_t)(w.find("reward")->number > 0));
        CHECK_EQ(got.find("extracted")->str, w.find("extracted")->str);
    }
}

// A run scored by the awk verifier is the built-in run, bit for bit; so is one stopped after a step
// and resumed (the workers start afresh; a reply is a function of its request).
TEST(reward_cmd_run_equals_builtin_and_resumes_bit_exact) {
    std::string d = temp_dir("reward_cmd_equal");
    const int steps = harness::sanitized ? 2 : 3;
    harness::RunResult builtin = run_cmd(harness::binary() + scorer_run(d + "/builtin", steps));
    harness::RunResult first = run_cmd(harness::binary() + scorer_run(d + "/awk", 1) + kExactMatch);
    harness::RunResult second = run_cmd(harness::binary() + scorer_run(d + "/awk", steps) + kExactMatch + " --resume " + d + "/awk");
    CHECK_MSG(builtin.status == 0 && first.status == 0 && second.status == 0, "%s\n%s\n%s", builtin.output.c_str(), first.output.c_str(),
              second.output.c_str());
    if (builtin.status || first.status || second.status) return;
    CHECK_MSG(score_sum(d + "/builtin") > 0, "no response was rewarded: the comparison would not see the scorer");
    check_runs_equal(d + "/builtin", d + "/awk", (size_t)steps);
    for (const Json& row : log_rows(d + "/awk")) {
        CHECK(row.find("reward/latency_s") && row.find("reward/latency_s")->number >= 0);
        CHECK(row.find("reward/timeouts") && row.find("reward/timeouts")->number == 0);
    }
}

// A scorer the tests have not seen elsewhere: its reward depends on the response's length, the data
// row's "w" and the sample; it reports a metric. It also copies each request to a file, so that
// the test can run it again by itself on those requests: the training's critic/score and
// reward/chars are the means of what it computes alone, and --score gives its rewards line by line.
TEST(reward_cmd_rewards_and_metrics_are_the_scorers_own) {
    harness::TempDir t;
    std::string d = temp_dir("reward_cmd_own");
    const std::string scorer =
        "match($0, /\"id\":-?[0-9]+/) { id = substr($0, RSTART + 5, RLENGTH - 5) }\n"
        "match($0, /\"response\":\"[^\"]*\"/) { chars = RLENGTH - 13 }\n"
        "match($0, /\"w\":[0-9]+/) { w = substr($0, RSTART + 4, RLENGTH - 4) }\n"
        "match($0, /\"sample\":[0-9]+/) { s = substr($0, RSTART + 9, RLENGTH - 9) }\n"
        "{ printf \"{\\\"id\\\":%s,\\\"reward\\\":%g,\\\"metrics\\\":{\\\"chars\\\":%d,\\\"w\\\":%s}}\\n\", id, w * chars / 4 + s / 8, chars, w; fflush() }\n";
    harness::write_text(t / "score.awk", scorer);
    std::string data;
    for (int i = 0; i < 8; i++) data += strfmt("{\"prompt\":\"S:%d=\",\"answer\":\"%d\",\"w\":%d}\n", i, i, i % 3);
    harness::write_text(t / "train.jsonl", data);
    harness::write_text(t / "score.sh", "awk -W version 2>/dev/null | grep -q mawk && i='-W interactive'\nLC_ALL=C exec awk $i -f " +
                                            t / "score.awk" + "\n");
    const std::string awk = "sh " + t / "score.sh";
    const std::string cmd = "tee -a " + t / "requests.jsonl" + " | " + awk;
    harness::RunResult r = run_cmd(harness::binary() + " --init tiny --task sort --data " + t / "train.jsonl" +
                                   " --max_new_tokens 3 --group_size 4 --batch_prompts 4 --steps 2 --eval_every 0 --seed 5 --threads 1"
                                   " --reward_workers 1 --out_dir " + d + " --reward_cmd \"" + cmd + "\"");
    CHECK_MSG(r.status == 0, "%s", r.output.c_str());
    if (r.status) return;
    // the scorer alone on the requests it was sent
    harness::RunResult alone = run_cmd(awk + " < " + t / "requests.jsonl");
    CHECK_EQ(alone.status, 0);
    const std::string sent = read_file(t / "requests.jsonl");
    std::map<int64_t, std::vector<double>> rewards, chars;  // by step
    for (size_t a = 0, b = 0, na, nb; a < sent.size() && b < alone.output.size(); a = na + 1, b = nb + 1) {
        na = sent.find('\n', a);
        nb = alone.output.find('\n', b);
        Json req = json_parse(sent.substr(a, na - a), "request"), rep = json_parse(alone.output.substr(b, nb - b), "reply");
        CHECK_EQ(req.find("task")->str, std::string("sort"));
        CHECK(req.find("prompt")->str.rfind("S:", 0) == 0);
        CHECK_EQ(req.find("data")->find("w")->integer, (int64_t)(std::stoi(req.find("answer")->str) % 3));
        rewards[req.find("step")->integer].push_back(rep.find("reward")->number);
        chars[req.find("step")->integer].push_back(rep.find("metrics")->find("chars")->number);
    }
    std::vector<Json> rows = log_rows(d);
    CHECK_EQ(rows.size(), (size_t)2);
    CHECK_EQ(rewards.size(), (size_t)2);
    for (size_t s = 0; s < rows.size() && s < rewards.size(); s++) {
        double mean = 0, mean_chars = 0;
        for (double x : rewards[(int64_t)s]) mean += x / (double)rewards[(int64_t)s].size();
        for (double x : chars[(int64_t)s]) mean_chars += x / (double)chars[(int64_t)s].size();
        CHECK_EQ(rewards[(int64_t)s].size(), (size_t)16);
        CHECK_NEAR(rows[s].find("critic/score/mean")->number, mean, 1e-12, 0);
        CHECK_NEAR(rows[s].find("reward/chars")->number, mean_chars, 1e-12, 0);
        CHECK(rows[s].find("reward/w") != nullptr);
    }
    // --score: the same requests (as lines) give the scorer's replies, in order
    harness::RunResult scored = run_cmd(harness::binary() + " --score " + t / "requests.jsonl" + " --reward_cmd \"" + awk + "\"");
    CHECK_MSG(scored.status == 0, "%s", scored.output.c_str());
    for (size_t a = 0, b = 0, na, nb; a < scored.output.size() && b < alone.output.size(); a = na + 1, b = nb + 1) {
        na = scored.output.find('\n', a);
        nb = alone.output.find('\n', b);
        Json got = json_parse(scored.output.substr(a, na - a), "score"), want = json_parse(alone.output.substr(b, nb - b), "reply");
        CHECK_EQ(got.find("reward")->number, want.find("reward")->number);
        CHECK_EQ(got.find("metrics")->find("chars")->number, want.find("metrics")->find("chars")->number);
    }
}

// Each failure of a worker: exit 1 with one error line naming the worker, the request id and the
// tail of its stderr, within the timeout + 10 s; the checkpoint written before it stays loadable.
TEST(reward_cmd_failures_end_the_run_with_one_line) {
    std::string d = temp_dir("reward_cmd_fail");
    struct Case {
        std::string cmd, flags, message;
    } cases[] = {
        {"echo scorer gave up >&2; exit 3", "", "exited with status 3"},
        {"while read l; do echo not json; done", "", "the reply is not JSON"},
        {"while read l; do echo '{\\\"id\\\": 0}'; done", "", "no numeric \"reward\""},
        {"while read l; do echo '{\\\"id\\\": 999, \\\"reward\\\": 1}'; done", "", "a reply for unknown id 999"},
        {"echo waiting >&2; sleep 100", " --reward_timeout 1", "no reply within --reward_timeout 1 s"},
    };
    for (const Case& c : cases) {
        const auto t0 = std::chrono::steady_clock::now();
        harness::RunResult r = run_cmd(harness::binary() + scorer_run(d + "/run", 1) + " --reward_workers 1 --reward_cmd \"" + c.cmd + "\"" + c.flags);
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        check_worker_failure(r, seconds, c.cmd, {c.message, "reward worker 1 of 1", "last checkpoint"});
    }
    // A worker that never answers the last responses of each group at the second step (the eval after
    // the first, of 2 samples, gets its replies): the first step's checkpoint is the latest and loads.
    const std::string at_step_1 = "grep --line-buffered -v '\\\"step\\\":1,\\\"sample\\\":3' | sh dev/rewards/exact_match.sh";
    harness::RunResult r = run_cmd(harness::binary() + scorer_run(d + "/ckpt", 2) + " --save_every 1 --reward_timeout 2 --reward_cmd \"" + at_step_1 + "\"");
    CHECK_MSG(r.status == 1 && r.output.find("step 2: ") != std::string::npos, "exit %d: %s", r.status, r.output.c_str());
    TrainerState s = final_state(d + "/ckpt");
    CHECK_EQ(s.step, (int64_t)1);
}

// A scorer's flags without the scorer are refused, as are both scorers at once.
TEST(reward_flags_without_their_scorer_are_refused) {
    struct Case {
        std::string flags, message;
    } cases[] = {
        {"--reward_workers 4", "--reward_workers applies to --reward_cmd"},
        {"--reward_batch 8", "--reward_batch applies to --reward_url"},
        {"--reward_timeout 5", "--reward_timeout applies to --reward_cmd and --reward_url"},
        {"--reward_cmd cat --reward_url http://127.0.0.1:1/", "give at most one of --reward_cmd and --reward_url"},
        {"--reward_url https://127.0.0.1/r", "https is not supported"},
    };
    for (const Case& c : cases) {
        harness::RunResult r = run_cmd(harness::binary() + " --score - " + c.flags + " < /dev/null");
        CHECK_MSG(r.status == 1 && r.output.find("error: ") == 0 && r.output.find(c.message) != std::string::npos, "%s: exit %d: %s",
                  c.flags.c_str(), r.status, r.output.c_str());
    }
}

// --reward_on_timeout: the responses of a scorer that never answers get that reward, counted.
TEST(reward_cmd_timeout_reward_is_counted) {
    std::string d = temp_dir("reward_cmd_timeout");
    harness::RunResult r = run_cmd(harness::binary() + " --init tiny --task sort --task_size 1 --max_new_tokens 1 --group_size 2"
                                   " --batch_prompts 2 --steps 1 --eval_every 0 --seed 3 --threads 1 --out_dir " + d +
                                   " --reward_cmd 'sleep 100' --reward_timeout 0.2 --reward_on_timeout 0.5");
    CHECK_MSG(r.status == 0, "%s", r.output.c_str());
    if (r.status) return;
    std::vector<Json> rows = log_rows(d);
    CHECK_EQ(rows.size(), (size_t)1);
    if (rows.empty()) return;
    CHECK_EQ(rows[0].find("reward/timeouts")->number, 4.0);
    CHECK_EQ(rows[0].find("critic/score/mean")->number, 0.5);
}

// 2 ranks with a scorer give the 1-rank run (as trainer_mpi_two_ranks_match_one without one).
TEST(reward_cmd_mpi_two_ranks_match_one) {
    if (std::system("command -v mpirun > /dev/null 2>&1") != 0) SKIP("mpirun not found (install openmpi-bin)");
    std::string d = temp_dir("reward_cmd_mpi");
    std::string mpirun = "ASAN_OPTIONS=detect_leaks=0 OMPI_MCA_btl=self,vader mpirun --allow-run-as-root --oversubscribe -np ";
    harness::RunResult one = run_cmd(mpirun + "1 " + harness::binary() + scorer_run(d + "/r1", 2) + kExactMatch + " --entropy_coef 0.01");
    harness::RunResult two = run_cmd(mpirun + "2 " + harness::binary() + scorer_run(d + "/r2", 2) + kExactMatch + " --entropy_coef 0.01");
    CHECK_MSG(one.status == 0 && two.status == 0, "%s\n%s", one.output.c_str(), two.output.c_str());
    if (one.status || two.status) return;
    if (two.output.find("2 rank(s)") == std::string::npos) SKIP("train_rl_cpu was built without MPI (no mpicxx: install libopenmpi-dev, then rebuild)");
    check_runs_agree(d + "/r1", d + "/r2", 1e-3, 1e-6, 1e-4);
}

namespace {

// A reward server in OpenRLHF's format on 127.0.0.1 (an ephemeral port), on a thread of the test,
// for the tests of --reward_url. Paths: /exact scores each response (the query less its prompt) with
// the synthetic tasks' verifier against its label and answers with Content-Length; /chunked does the
// same in chunks; /fail500 answers 500; /silent reads the request and never answers. Every wait is a
// poll of 100 ms that checks for the end of the test, so the server never outlives it.
class RewardServer {
public:
    RewardServer() {
        listen_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = 0;
        socklen_t len = sizeof a;
        if (listen_ < 0 || bind(listen_, (sockaddr*)&a, sizeof a) != 0 || listen(listen_, 16) != 0 ||
            getsockname(listen_, (sockaddr*)&a, &len) != 0)
            fail("test reward server: cannot listen on 127.0.0.1: %s", strerror(errno));
        port_ = ntohs(a.sin_port);
        thread_ = std::thread([this] { serve(); });
    }
    ~RewardServer() {
        stop_ = true;
        thread_.join();
        close(listen_);
    }
    std::string url(const std::string& path) const { return strfmt("http://127.0.0.1:%d%s", port_, path.c_str()); }
    int posts() const { return posts_; }

private:
    int listen_ = -1, port_ = 0;
    std::atomic<bool> stop_{false};
    std::atomic<int> posts_{0};
    std::thread thread_;

    bool readable(int fd) {
        pollfd p{fd, POLLIN, 0};
        return poll(&p, 1, 100) > 0;
    }

    void serve() {
        while (!stop_) {
            if (!readable(listen_)) continue;
            int c = accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
            if (c < 0) continue;
            handle(c);
            close(c);
        }
    }

    void handle(int c) {
        std::string raw;
        size_t body_at = std::string::npos, length = 0;
        while (!stop_ && (body_at == std::string::npos || raw.size() < body_at + length)) {
            if (!readable(c)) continue;
            char buf[65536];
            ssize_t n = recv(c, buf, sizeof buf, 0);
            if (n <= 0) return;
            raw.append(buf, (size_t)n);
            if (body_at == std::string::npos && raw.find("\r\n\r\n") != std::string::npos) {
                body_at = raw.find("\r\n\r\n") + 4;
                size_t cl = raw.find("Content-Length: ");
                length = cl < body_at ? (size_t)atoll(raw.c_str() + cl + 16) : 0;
            }
        }
        if (stop_) return;
        posts_++;
        const std::string path = raw.substr(5, raw.find(' ', 5) - 5);
        if (path == "/silent") {
            char byte;
            while (!stop_)  // until the client gives up and closes
                if (readable(c) && recv(c, &byte, 1, 0) <= 0) return;
            return;
        }
        if (path == "/fail500") return reply(c, "500 Internal Server Error", "boom", false);
        Json q = json_parse(raw.substr(body_at, length), "request body");
        std::string rewards = "[";
        const Json &query = *q.find("query"), &prompts = *q.find("prompts"), &labels = *q.find("labels");
        for (size_t i = 0; i < query.items.size(); i++) {
            const std::string response = query.items[i].str.substr(prompts.items[i].str.size());
            rewards += (i ? "," : "") + format_double(synthetic_verdict(response, labels.items[i].str).reward);
        }
        reply(c, "200 OK", "{\"rewards\":" + rewards + "],\"extra_logs\":{}}", path == "/chunked");
    }

    void reply(int c, const std::string& status, const std::string& body, bool chunked) {
        std::string r = "HTTP/1.1 " + status + "\r\nContent-Type: application/json\r\n";
        if (chunked) {
            r += "Transfer-Encoding: chunked\r\n\r\n";
            for (size_t i = 0; i < body.size(); i += 7) r += strfmt("%zx\r\n", std::min<size_t>(7, body.size() - i)) + body.substr(i, 7) + "\r\n";
            r += "0\r\n\r\n";
        } else {
            r += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
        }
        for (size_t sent = 0; sent < r.size();) {
            ssize_t n = send(c, r.data() + sent, r.size() - sent, MSG_NOSIGNAL);
            if (n <= 0) return;
            sent += (size_t)n;
        }
    }
};

}  // namespace

// The server's rewards, in training and by --score: a run scored over HTTP (in batches of 5, the last
// one short) is the built-in run, bit for bit, with DAPO's dynamic sampling (which regenerates the
// batch when too few groups have unequal rewards); --score reads chunked replies too.
TEST(reward_url_run_equals_builtin) {
    RewardServer server;
    std::string d = temp_dir("reward_url_equal");
    const int steps = harness::sanitized ? 2 : 3;
    const std::string dynamic = " --dynamic_sampling 1 --max_gen_batches 3";
    harness::RunResult builtin = run_cmd(harness::binary() + scorer_run(d + "/builtin", steps) + dynamic);
    harness::RunResult http =
        run_cmd(harness::binary() + scorer_run(d + "/http", steps) + dynamic + " --reward_batch 5 --reward_url " + server.url("/exact"));
    CHECK_MSG(builtin.status == 0 && http.status == 0, "%s\n%s", builtin.output.c_str(), http.output.c_str());
    if (builtin.status || http.status) return;
    CHECK_MSG(score_sum(d + "/builtin") > 0, "no response was rewarded: the comparison would not see the scorer");
    check_runs_equal(d + "/builtin", d + "/http", (size_t)steps);
    // each step: generations of 32 responses (7 POSTs each) and an eval of 8 greedy (2) and 16 sampled (4)
    int generations = 0;
    for (const Json& row : log_rows(d + "/builtin")) generations += (int)row.find("dynamic_sampling/num_gen_batches")->number;
    CHECK(generations > steps);
    CHECK_EQ(server.posts(), generations * 7 + steps * (2 + 4));
    harness::TempDir t;
    harness::write_text(t / "rows.jsonl", "{\"prompt\":\"S:3=\",\"response\":\" 3 \\nx\",\"answer\":\"3\"}\n"
                                          "{\"prompt\":\"S:4=\",\"response\":\"43\",\"answer\":\"4\"}\n");
    for (const char* path : {"/exact", "/chunked"}) {
        harness::RunResult r = run_cmd(harness::binary() + " --score " + t / "rows.jsonl" + " --reward_url " + server.url(path));
        CHECK_MSG(r.status == 0 && r.output == "{\"reward\":1,\"extracted\":null,\"correct\":1}\n{\"reward\":0,\"extracted\":null,\"correct\":0}\n",
                  "%s: %s", path, r.output.c_str());
    }
}

// An HTTP error, a server that never answers (within --reward_timeout + 10 s) and no server at all:
// exit 1 with one line naming the URL and the request ids; --reward_on_timeout instead gives its reward.
TEST(reward_url_failures_end_the_run_with_one_line) {
    RewardServer server;
    std::string d = temp_dir("reward_url_fail");
    struct Case {
        std::string url, flags, message;
    } cases[] = {
        {server.url("/fail500"), "", "HTTP status 500: 'boom'"},
        {server.url("/silent"), " --reward_timeout 1", "no complete response within 1 s"},
        {"http://127.0.0.1:1/none", "", "cannot connect"},
    };
    for (const Case& c : cases) {
        const auto t0 = std::chrono::steady_clock::now();
        harness::RunResult r = run_cmd(harness::binary() + scorer_run(d + "/run", 1) + " --reward_url " + c.url + c.flags);
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        CHECK_MSG(r.status == 1, "%s: exit %d: %s", c.url.c_str(), r.status, r.output.c_str());
        size_t at = r.output.find("error: ");
        CHECK_MSG(at != std::string::npos && r.output.find("error: ", at + 1) == std::string::npos, "%s: %s", c.url.c_str(), r.output.c_str());
        for (const std::string& needle : {c.message, "--reward_url " + c.url + ": request ids 0..", std::string("last checkpoint")})
            CHECK_MSG(r.output.find(needle) != std::string::npos, "no \"%s\" in: %s", needle.c_str(), r.output.c_str());
        CHECK_MSG(seconds < 11, "%s: %.1f s", c.url.c_str(), seconds);
    }
    harness::RunResult r = run_cmd(harness::binary() + scorer_run(d + "/timeout", 1) + " --reward_url " + server.url("/silent") +
                                   " --reward_timeout 0.3 --reward_on_timeout -1");
    CHECK_MSG(r.status == 0, "%s", r.output.c_str());
    if (r.status) return;
    std::vector<Json> rows = log_rows(d + "/timeout");
    CHECK_EQ(rows[0].find("reward/timeouts")->number, 32.0);
    CHECK_EQ(rows[0].find("critic/score/mean")->number, -1.0);
    CHECK_EQ(rows[0].find("val/reward/timeouts")->number, 8.0 + 16.0);
}

// --reward_url's URLs: http only, names, IPv4 and [IPv6] hosts, the default port and path.
TEST(reward_url_parsing) {
    HttpUrl u = parse_http_url("http://[::1]:8080/get_reward");
    CHECK_EQ(u.host, std::string("::1"));
    CHECK_EQ(u.port, std::string("8080"));
    CHECK_EQ(u.path, std::string("/get_reward"));
    u = parse_http_url("http://scorer.local");
    CHECK_EQ(u.host, std::string("scorer.local"));
    CHECK_EQ(u.port, std::string("80"));
    CHECK_EQ(u.path, std::string("/"));
    CHECK_THROWS(parse_http_url("https://127.0.0.1/r"), "https is not supported");
    CHECK_THROWS(parse_http_url("127.0.0.1:5000"), "expected a URL like http://");
    CHECK_THROWS(parse_http_url("http://127.0.0.1:50a0/"), "the port must be a number");
    CHECK_THROWS(parse_http_url("http://:5000/"), "no host");
}

// A data row's fields other than prompt, messages and answer reach the scorer as "data", in their
// order and values; a generated prompt's data is {}.
TEST(reward_request_carries_the_rows_other_fields) {
    harness::TempDir t;
    harness::write_text(t / "rows.jsonl", "{\"id\": \"q7\", \"prompt\": \"S:3=\", \"answer\": \"3\", \"meta\": {\"tests\": [1, 2.5, null]}, \"w\": -2}\n"
                                          "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"answer\": 1}\n");
    std::vector<Example> ex = load_jsonl_dataset(t / "rows.jsonl");
    CHECK_EQ(ex[0].data, std::string("{\"id\":\"q7\",\"meta\":{\"tests\":[1,2.5,null]},\"w\":-2}"));
    CHECK_EQ(ex[1].data, std::string("{}"));
    ScoreRequest r;
    r.id = 12;
    r.task = "sort";
    r.prompt = "S:3=";
    r.response = "3\n\"x\"";
    r.answer = ex[0].answer;
    r.data = ex[0].data;
    r.step = 4;
    r.sample = 1;
    CHECK_EQ(score_request_json(r), std::string("{\"id\":12,\"task\":\"sort\",\"prompt\":\"S:3=\",\"response\":\"3\\n\\\"x\\\"\",\"answer\":\"3\","
                                                "\"data\":{\"id\":\"q7\",\"meta\":{\"tests\":[1,2.5,null]},\"w\":-2},\"step\":4,\"sample\":1}"));
    r.has_answer = false;
    CHECK(score_request_json(r).find("\"answer\":null,") != std::string::npos);
}
