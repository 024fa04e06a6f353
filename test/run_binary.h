// run_binary.h: running the binary under test ($FP8RL_BIN) from the tests that drive it as a user
// would, through the shell, keeping what it printed and how it exited.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "rl/common.h"

namespace harness {

// The binary under test: $FP8RL_BIN (make test-unit sets it), else the CPU build in the repo root.
inline std::string binary() {
    const char* b = getenv("FP8RL_BIN");
    return b && *b ? b : "./train_rl_cpu";
}

// The GPU binary in emulation: $FP8RL_EMU_BIN (make test-unit sets it), else the build in the repo root.
inline std::string emu_binary() {
    const char* b = getenv("FP8RL_EMU_BIN");
    return b && *b ? b : "./train_rl_emu";
}

struct RunResult {
    int status = -1;     // exit status; -1 when the command did not exit (killed by a signal)
    std::string output;  // stdout; stderr too where the command says 2>&1
};

// Runs a shell command line (pipes and redirections allowed) and waits for it.
inline RunResult run_command(const std::string& cmd) {
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) fp8rl::fail("cannot start a shell for: %s", cmd.c_str());
    RunResult r;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
    int status = pclose(p);
    r.status = status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return r;
}

// Runs one test of this very test binary in a child process, with `env` (VAR=value ...) set:
// tests that must watch a crash or an exit from outside. The child runs unsharded, since
// FP8RL_TEST_SHARD would pick among its one matching test and could pick none.
inline RunResult run_this_test(const std::string& env, const std::string& test) {
    return run_command("env -u FP8RL_TEST_SHARD " + env + " /proc/" + std::to_string(getpid()) + "/exe " + test + " 2>&1");
}

}  // namespace harness
