// run_tests.cpp: runs every registered test, or those whose name contains one of the filters given
// as arguments (with FP8RL_TEST_SHARD=K/N, of those the Kth, the K+Nth, ...: make test runs a slow
// binary as N processes side by side), and prints the closing line "N passed, N failed, N skipped";
// exits 1 if any test failed, and 2 (one line, nothing run) when a filter matches no test, or when
// the binary's precondition fails (./test_gpu without a usable GPU: a skip is not a pass there).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "rl/common.h"
#include "test/harness.h"

int main(int argc, char** argv) {
    const std::vector<const char*> filters(argv + 1, argv + argc);
    auto matches = [&](const harness::TestCase& t) {
        if (filters.empty()) return true;
        for (const char* f : filters)
            if (strstr(t.name, f)) return true;
        return false;
    };
    int shard = 1, shards = 1;
    if (const char* s = getenv("FP8RL_TEST_SHARD")) {
        char end = 0;
        if (sscanf(s, "%d/%d%c", &shard, &shards, &end) != 2 || shards < 1 || shard < 1 || shard > shards) {
            fprintf(stderr, "%s: FP8RL_TEST_SHARD=%s is not K/N with 1 <= K <= N; unset it to run every test\n", argv[0], s);
            return 2;
        }
        printf("shard %d of %d: the matching tests number %d, %d, %d, ...\n", shard, shards, shard, shard + shards, shard + 2 * shards);
    }
    int matched_so_far = 0;
    auto selected = [&](const harness::TestCase& t) { return matches(t) && matched_so_far++ % shards == shard - 1; };
    for (const char* f : filters) {  // a stale filter must not pass for a check it never ran
        bool matched = false;
        for (const harness::TestCase& t : harness::registry()) matched = matched || strstr(t.name, f);
        if (!matched) {
            fprintf(stderr, "%s: no test name contains \"%s\"; list them with: grep -rho 'TEST([a-z0-9_]*' test/\n",
                    argv[0], f);
            return 2;
        }
    }
    if (harness::precondition()) {
        const std::string why_not = harness::precondition()();
        if (!why_not.empty()) {
            fprintf(stderr, "%s: cannot run here: %s\n", argv[0], why_not.c_str());
            return 2;
        }
    }
    int passed = 0, failed = 0, skipped = 0;
    for (const harness::TestCase& t : harness::registry()) {
        if (!selected(t)) continue;
        harness::current() = harness::Current();
        auto t0 = std::chrono::steady_clock::now();
        try {
            t.fn();
        } catch (const harness::SkipTest&) {
        } catch (const std::exception& e) {
            harness::report_failure(t.file, 0, std::string("unexpected exception: ") + e.what());
        }
        double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (harness::current().failures > 0) {
            failed++;
            printf("FAIL  %-48s (%s, %.2fs)\n", t.name, t.file, secs);
        } else if (harness::current().skipped) {
            skipped++;
            printf("SKIP  %-48s %s\n", t.name, harness::current().skip_reason.c_str());
        } else {
            passed++;
            printf("ok    %-48s %.2fs\n", t.name, secs);
        }
        fflush(stdout);
    }
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed > 0 ? 1 : 0;
}
