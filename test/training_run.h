// training_run.h: what the tests that run whole trainings through a binary share: running a command
// with its output kept, a fresh directory per test, the log without wall-clock metrics, the final
// trainer state.
#pragma once
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "rl/checkpoint.h"
#include "rl/json.h"
#include "test/harness.h"
#include "test/run_binary.h"

namespace fp8rl {

// Runs a command line, capturing stdout and stderr together. Under the sanitizer run, leaks inside
// Open MPI's libraries are not ours (test/lsan_mpi.supp).
inline harness::RunResult run_cmd(const std::string& cmd) {
    return harness::run_command("LSAN_OPTIONS=suppressions=test/lsan_mpi.supp:print_suppressions=0 " + cmd + " 2>&1");
}

inline std::string temp_dir(const std::string& name) {
    std::string d = "build/test_tmp/" + name;
    std::filesystem::remove_all(d);
    std::filesystem::create_directories(d);
    return d;
}

// log.jsonl without the wall-clock metrics (timing_s/*, perf/*), which differ between runs.
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
            if (kv.first.rfind("timing_s/", 0) == 0 || kv.first.rfind("perf/", 0) == 0) continue;
            kept += kv.first + "=" + (kv.second.is_null() ? std::string("null") : strfmt("%.9g", kv.second.number)) + " ";
        }
        lines.push_back(kept);
    }
    return lines;
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
// to rounding: every metric of every step within rtol (+ atol), the final weights within weight_atol.
inline void check_runs_agree(const std::string& a_dir, const std::string& b_dir, double rtol, double atol, double weight_atol) {
    std::vector<Json> a = log_rows(a_dir), b = log_rows(b_dir);
    CHECK_EQ(a.size(), b.size());
    for (size_t i = 0; i < std::min(a.size(), b.size()); i++)
        for (const auto& kv : a[i].fields) {
            if (kv.first.rfind("timing_s/", 0) == 0 || kv.first.rfind("perf/", 0) == 0 || kv.second.is_null()) continue;
            const Json* other = b[i].find(kv.first);
            CHECK_MSG(other && other->is_number(), "step %zu: %s missing in %s", i, kv.first.c_str(), b_dir.c_str());
            if (other && other->is_number())
                CHECK_MSG(harness::close(kv.second.number, other->number, rtol, atol), "step %zu: %s %.9g vs %.9g", i,
                          kv.first.c_str(), kv.second.number, other->number);
        }
    TrainerState x = final_state(a_dir), y = final_state(b_dir);
    CHECK_EQ(x.master.size(), y.master.size());
    double worst = 0;
    for (size_t i = 0; i < std::min(x.master.size(), y.master.size()); i++)
        worst = std::max(worst, (double)std::fabs(x.master[i] - y.master[i]));
    CHECK_MSG(worst <= weight_atol, "max |w(%s) - w(%s)| = %g", a_dir.c_str(), b_dir.c_str(), worst);
}

}  // namespace fp8rl
