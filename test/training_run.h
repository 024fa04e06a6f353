// training_run.h: what the tests that run whole trainings through a binary share: running a command
// with its output kept, a fresh directory per test, the log without wall-clock metrics, the final
// trainer state, the comparison of two runs (and of their FP8 KV scales), and the learning test.
#pragma once
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "rl/io/checkpoint.h"
#include "rl/io/json.h"
#include "test/harness.h"
#include "test/run_binary.h"

namespace fp8rl {

// Runs a command line, capturing stdout and stderr together. Under the sanitizer run, leaks inside
// Open MPI's libraries are not ours (test/lsan_mpi.supp).
inline harness::RunResult run_cmd(const std::string& cmd) {
    return harness::run_command("LSAN_OPTIONS=suppressions=test/lsan_mpi.supp:print_suppressions=0 " + cmd + " 2>&1");
}

inline std::string temp_dir(const std::string& name) {
    std::string d = harness::scratch_dir() + "/" + name;
    std::filesystem::remove_all(d);
    std::filesystem::create_directories(d);
    return d;
}

// Metrics that measure wall-clock time or memory, not the computation: two runs of the same
// training never compare them (the scorer's latency included).
inline bool wall_clock_metric(const std::string& name) {
    return name.rfind("timing_s/", 0) == 0 || name.rfind("perf/", 0) == 0 || name.rfind("memory/", 0) == 0 ||
           name.find("latency_s") != std::string::npos;
}

// log.jsonl without the wall-clock metrics (timing_s/*, perf/*) and the device memory (memory/*), which differ between runs.
inline std::vector<std::string> log_without_timing(const std::string& dir) {
    std::vector<std::string> lines;
    std::string text = read_file(dir + "/log.jsonl");
    size_t pos = 0;
    while (pos < text.size()) {
        size_t nl = text.find('\n', pos);
        Json row = json_parse(text.substr(pos, nl - pos), dir + "/log.jsonl");
        pos = nl + 1;
        std::string kept;
        for (const auto& kv : row.fields) {
            if (wall_clock_metric(kv.first)) continue;
            kept += kv.first + "=" + (kv.second.is_null() ? std::string("null") : strfmt("%.9g", kv.second.number)) + " ";
        }
        lines.push_back(kept);
    }
    return lines;
}

// A run that a worker's failure ended (--reward_cmd, --env_cmd): exit 1 within the timeout + 10 s
// (`seconds` it took), one error line holding each of `needles`, the tail of the worker's stderr where
// `cmd` wrote to it, and request id 0 where the worker did not exit.
inline void check_worker_failure(const harness::RunResult& r, double seconds, const std::string& cmd,
                                 const std::vector<std::string>& needles) {
    CHECK_MSG(r.status == 1, "%s: exit %d: %s", cmd.c_str(), r.status, r.output.c_str());
    size_t at = r.output.find("error: ");
    CHECK_MSG(at != std::string::npos && r.output.find("error: ", at + 1) == std::string::npos, "%s: %s", cmd.c_str(), r.output.c_str());
    for (const std::string& needle : needles)
        CHECK_MSG(r.output.find(needle) != std::string::npos, "%s: no \"%s\" in: %s", cmd.c_str(), needle.c_str(), r.output.c_str());
    if (cmd.find(">&2") != std::string::npos)
        CHECK_MSG(r.output.find("its stderr ends: ") != std::string::npos, "%s: %s", cmd.c_str(), r.output.c_str());
    if (cmd.find("exit") == std::string::npos)
        CHECK_MSG(r.output.find("request id 0") != std::string::npos, "%s: %s", cmd.c_str(), r.output.c_str());
    CHECK_MSG(seconds < 11, "%s: %.1f s", cmd.c_str(), seconds);
}

inline TrainerState final_state(const std::string& dir) { return load_trainer_state(resolve_checkpoint(dir)); }

// The rows of a run's log.jsonl.
inline std::vector<Json> log_rows(const std::string& dir) {
    std::vector<Json> out;
    std::string text = read_file(dir + "/log.jsonl");
    for (size_t pos = 0, nl; pos < text.size(); pos = nl + 1) {
        nl = text.find('\n', pos);
        out.push_back(json_parse(text.substr(pos, nl - pos), dir + "/log.jsonl"));
    }
    return out;
}

// Two runs of the same training whose sums are grouped differently (ranks, micro-batches) agree
// to rounding: every metric of every step (but wall-clock ones) within rtol (+ atol); the final step,
// data cursor, master weights and AdamW moments (m, and sqrt(v): v is a squared gradient) within
// weight_atol. Returns the largest weight or moment difference.
// min_per_row: the metrics each log row must share (an RL row has 20+, an SFT/CPT row ~10).
inline double check_runs_agree(const std::string& a, const std::string& b, double rtol, double atol, double weight_atol,
                               int min_per_row = 20) {
    std::vector<Json> x = log_rows(a), y = log_rows(b);
    CHECK_EQ(x.size(), y.size());
    int compared = 0;
    for (size_t i = 0; i < std::min(x.size(), y.size()); i++)
        for (const auto& kv : x[i].fields) {
            if (wall_clock_metric(kv.first) || kv.second.is_null()) continue;
            const Json* other = y[i].find(kv.first);
            CHECK_MSG(other && other->is_number(), "step %zu: %s missing in %s", i + 1, kv.first.c_str(), b.c_str());
            if (!other || !other->is_number()) continue;
            CHECK_MSG(harness::close(kv.second.number, other->number, rtol, atol), "step %zu %s: %.9g (%s) vs %.9g (%s)", i + 1,
                      kv.first.c_str(), kv.second.number, a.c_str(), other->number, b.c_str());
            compared++;
        }
    CHECK(compared >= min_per_row * (int)x.size());
    TrainerState s = final_state(a), t = final_state(b);
    CHECK_EQ(s.step, t.step);
    CHECK_EQ(s.data_cursor, t.data_cursor);
    CHECK_EQ(s.master.size(), t.master.size());
    double worst = 0, moved = 0;
    for (size_t i = 0; i < std::min(s.master.size(), t.master.size()); i++) {
        worst = std::max(worst, (double)std::fabs(s.master[i] - t.master[i]));
        worst = std::max(worst, (double)std::fabs(s.adam_m[i] - t.adam_m[i]));
        worst = std::max(worst, (double)std::sqrt(std::fabs(s.adam_v[i] - t.adam_v[i])));
        moved = std::max(moved, (double)std::fabs(s.adam_m[i]));
    }
    CHECK_MSG(moved > 0, "%s: the AdamW moments are zero: the run never updated", a.c_str());
    CHECK_MSG(worst <= weight_atol, "%s vs %s: max |difference| of master, m, sqrt(v) = %g", a.c_str(), b.c_str(), worst);
    printf("    %s vs %s: %d metrics within rtol %g; weights and moments differ by at most %g\n", a.c_str(), b.c_str(),
           compared, rtol, worst);
    return worst;
}

// Two runs with an FP8 KV cache that must calibrate it alike (rank counts, from the same weights):
// every step logs the four fp8/kv_scale_* metrics in both, bit for bit equal.
inline void check_kv_scales_equal(const std::string& a, const std::string& b) {
    std::vector<Json> x = log_rows(a), y = log_rows(b);
    CHECK_EQ(x.size(), y.size());
    for (size_t i = 0; i < std::min(x.size(), y.size()); i++)
        for (const char* k : {"fp8/kv_scale_k_min", "fp8/kv_scale_k_max", "fp8/kv_scale_v_min", "fp8/kv_scale_v_max"}) {
            const Json *p = x[i].find(k), *q = y[i].find(k);
            CHECK_MSG(p && q && p->is_number() && q->is_number(), "step %zu: %s missing in %s or %s", i + 1, k, a.c_str(), b.c_str());
            if (p && q && p->is_number() && q->is_number())
                CHECK_MSG(p->number == q->number, "step %zu %s: %.9g (%s) vs %.9g (%s)", i + 1, k, p->number, a.c_str(), q->number,
                          b.c_str());
        }
}

// Learning from scratch: a fresh tiny model on 1-character sort (copy the digit), the quickest of
// the synthetic tasks to learn, trained `steps` steps by `binary` (train_rl_cpu or train_rl_emu)
// with `flags` (budget, batch, learning rate, precision): the mean reward (exact match) of the last
// 5 steps must be at least min_last and at least min_ratio times that of the first 5.
inline void check_learns_from_scratch(const std::string& binary, const std::string& dir, const std::string& flags, int steps,
                                      double min_last, double min_ratio) {
    harness::RunResult r = run_cmd(binary + strfmt(" --init tiny --task sort --task_size 1 --group_size 8 --steps %d"
                                                   " --eval_every 0 --seed 11 --out_dir %s/run",
                                                   steps, dir.c_str()) + flags);
    CHECK_MSG(r.status == 0, "%s", r.output.c_str());
    if (r.status) return;
    std::vector<double> reward;
    for (const Json& row : log_rows(dir + "/run")) reward.push_back(row.find("critic/rewards/mean")->number);
    CHECK_EQ(reward.size(), (size_t)steps);
    if (reward.size() != (size_t)steps) return;
    double first = 0, last = 0;
    for (int i = 0; i < 5; i++) {
        first += reward[(size_t)i] / 5;
        last += reward[(size_t)steps - 1 - (size_t)i] / 5;
    }
    printf("    %s%s: mean reward of the first 5 steps %.3f, of the last 5 %.3f\n", binary.c_str(), flags.c_str(), first, last);
    CHECK_MSG(last >= min_last && last >= min_ratio * first, "%s%s: mean reward of the first 5 steps %.3f, of the last 5 %.3f",
              binary.c_str(), flags.c_str(), first, last);
}

}  // namespace fp8rl
