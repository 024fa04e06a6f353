// training_run.h: what the tests that run whole trainings through a binary share: running a command
// with its output kept, a fresh directory per test, the log without wall-clock metrics, the final
// trainer state.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include "rl/checkpoint.h"
#include "rl/json.h"
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

}  // namespace fp8rl
