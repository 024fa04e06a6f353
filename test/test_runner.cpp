// The test runner itself (test/run_tests.cpp): make test splits the slow binaries into shards
// (FP8RL_TEST_SHARD=K/N), so the shards must run every matching test exactly once between them.
#include <unistd.h>

#include <set>
#include <sstream>

#include "test/harness.h"
#include "test/run_binary.h"

namespace {

// The names this binary's runner reports as passed for the filter "advantage_", under an environment.
std::multiset<std::string> passed_tests(const std::string& env, int* status) {
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    CHECK(n > 0);
    self[n > 0 ? n : 0] = 0;
    const harness::RunResult r = harness::run_command(env + " '" + self + "' advantage_ 2>&1");
    *status = r.status;
    std::multiset<std::string> names;
    std::istringstream lines(r.output);
    for (std::string line; std::getline(lines, line);)
        if (line.rfind("ok    ", 0) == 0) names.insert(line.substr(6, line.find(' ', 6) - 6));
    return names;
}

}  // namespace

TEST(runner_shards_run_each_matching_test_once) {
    int status = 0;
    const std::multiset<std::string> all = passed_tests("FP8RL_TEST_SHARD=", &status);
    CHECK_EQ(status, 2);  // an empty shard is bad input, not "run everything"
    const std::multiset<std::string> whole = passed_tests("env -u FP8RL_TEST_SHARD", &status);
    CHECK_EQ(status, 0);
    CHECK(whole.size() >= 3 && all.empty());
    std::multiset<std::string> joined;
    for (int k = 1; k <= 3; k++) {
        const std::multiset<std::string> part = passed_tests("FP8RL_TEST_SHARD=" + std::to_string(k) + "/3", &status);
        CHECK_EQ(status, 0);
        CHECK(!part.empty());
        joined.insert(part.begin(), part.end());
    }
    CHECK(joined == whole);
    for (const char* bad : {"0/2", "3/2", "1/0", "1/2x", "two"}) {
        passed_tests(std::string("FP8RL_TEST_SHARD=") + bad, &status);
        CHECK_MSG(status == 2, "FP8RL_TEST_SHARD=%s exited %d, not 2", bad, status);
    }
}
