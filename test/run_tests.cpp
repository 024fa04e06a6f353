// run_tests.cpp: runs every registered test (or those whose name contains argv[1]) and prints
// the closing line "N passed, N failed, N skipped"; exits 1 if any test failed.
#include <chrono>
#include <cstring>
#include <exception>

#include "rl/common.h"
#include "test/harness.h"

int main(int argc, char** argv) {
    const char* filter = argc > 1 ? argv[1] : nullptr;
    int passed = 0, failed = 0, skipped = 0;
    for (const harness::TestCase& t : harness::registry()) {
        if (filter && !strstr(t.name, filter)) continue;
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
