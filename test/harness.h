// harness.h: the in-repo test harness (no framework). A test is a function registered with
// TEST(name); checks record failures and keep going; SKIP(reason) marks a test skipped with a
// visible reason. The runner (test/run_tests.cpp) prints "N passed, N failed, N skipped".
#pragma once
#include <errno.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace harness {

struct TestCase {
    const char* name;
    const char* file;
    void (*fn)();
};

inline std::vector<TestCase>& registry() {
    static std::vector<TestCase> tests;
    return tests;
}

struct Registrar {
    Registrar(const char* name, const char* file, void (*fn)()) { registry().push_back({name, file, fn}); }
};

// What the whole binary needs, checked before any test runs: returns "" when it can run here, else
// why not (./test_gpu: a usable GPU; test/gpu/gpu_util.cuh sets it). Null: no precondition.
using Precondition = std::string (*)();
inline Precondition& precondition() {
    static Precondition p = nullptr;
    return p;
}

// State of the test that is running.
struct Current {
    int failures = 0;
    bool skipped = false;
    std::string skip_reason;
};
inline Current& current() {
    static Current c;
    return c;
}

struct SkipTest {};  // thrown by SKIP to leave the test body

inline void report_failure(const char* file, int line, const std::string& what) {
    current().failures++;
    if (current().failures <= 20) fprintf(stderr, "    FAIL %s:%d: %s\n", file, line, what.c_str());
    if (current().failures == 21) fprintf(stderr, "    (further failures of this test not shown)\n");
}

// Relative closeness: |a-b| <= rtol*max(|a|,|b|) + atol.
inline bool close(double a, double b, double rtol, double atol) {
    if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
    return std::fabs(a - b) <= rtol * std::fmax(std::fabs(a), std::fabs(b)) + atol;
}

// True when built with -DFP8RL_SANITIZE (the ASan/UBSan run): very long tests shrink their sweep
// (never skip it) so the sanitizer pass stays within CI's time.
#ifdef FP8RL_SANITIZE
constexpr bool sanitized = true;
#else
constexpr bool sanitized = false;
#endif

// The folder a test binary writes its scratch files under: build/test_tmp/BINARY (test_cpu,
// test_cpu_asan, ...), so the runs that make test starts side by side never share a file.
inline const std::string& scratch_dir() {
    static const std::string dir = [] {
        std::string d = std::string("build/test_tmp/") + program_invocation_short_name;
        std::filesystem::create_directories(d);
        return d;
    }();
    return dir;
}

// The tiny HF models of dev/make_model_fixtures.py.
inline const std::string model_fixtures = "test/fixtures/models/";

}  // namespace harness

#define HARNESS_CONCAT2(a, b) a##b
#define HARNESS_CONCAT(a, b) HARNESS_CONCAT2(a, b)

#define TEST(name)                                                                            \
    static void HARNESS_CONCAT(test_fn_, name)();                                             \
    static harness::Registrar HARNESS_CONCAT(test_reg_, name)(#name, __FILE__,                \
                                                              HARNESS_CONCAT(test_fn_, name)); \
    static void HARNESS_CONCAT(test_fn_, name)()

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) harness::report_failure(__FILE__, __LINE__, "CHECK(" #cond ")"); \
    } while (0)

// CHECK with a printf-style explanation shown on failure.
#define CHECK_MSG(cond, ...)                                                                               \
    do {                                                                                                   \
        if (!(cond)) harness::report_failure(__FILE__, __LINE__, std::string("CHECK(" #cond "): ") + fp8rl::strfmt(__VA_ARGS__)); \
    } while (0)

#define CHECK_EQ(a, b)                                                                                   \
    do {                                                                                                 \
        auto harness_a = (a);                                                                            \
        auto harness_b = (b);                                                                            \
        if (!(harness_a == harness_b))                                                                   \
            harness::report_failure(__FILE__, __LINE__, "CHECK_EQ(" #a ", " #b ")");                      \
    } while (0)

#define CHECK_NEAR(a, b, rtol, atol)                                                                      \
    do {                                                                                                  \
        double harness_a = (double)(a), harness_b = (double)(b);                                          \
        if (!harness::close(harness_a, harness_b, (rtol), (atol)))                                        \
            harness::report_failure(__FILE__, __LINE__,                                                   \
                                    fp8rl::strfmt("CHECK_NEAR(" #a ", " #b "): %.9g vs %.9g", harness_a, harness_b)); \
    } while (0)

// Expects `expr` to throw fp8rl::Error whose message contains `needle`.
#define CHECK_THROWS(expr, needle)                                                                          \
    do {                                                                                                    \
        bool harness_threw = false;                                                                         \
        try {                                                                                               \
            (void)(expr);                                                                                   \
        } catch (const fp8rl::Error& harness_e) {                                                           \
            harness_threw = true;                                                                           \
            if (std::string(harness_e.what()).find(needle) == std::string::npos)                            \
                harness::report_failure(__FILE__, __LINE__,                                                 \
                                        std::string("error message lacks \"") + (needle) + "\": " + harness_e.what()); \
        }                                                                                                   \
        if (!harness_threw) harness::report_failure(__FILE__, __LINE__, "expected an error from " #expr);   \
    } while (0)

#define SKIP(reason)                                     \
    do {                                                 \
        harness::current().skipped = true;               \
        harness::current().skip_reason = (reason);       \
        throw harness::SkipTest();                       \
    } while (0)
