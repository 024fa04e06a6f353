// train_rl_cpu.cpp: main() of the CPU reference binary. It reads the flag table (rl/args.h),
// runs the one mode asked for, and turns every fp8rl::Error into one line on stderr and exit 1.
#include <cstdio>
#include <exception>

#include "rl/args.h"
#include "rl/common.h"
#include "rl/model_info.h"
#include "rl/weights.h"

using namespace fp8rl;

static int run(const Args& args) {
    if (args.flag("help")) {
        fputs("usage: train_rl_cpu [--flag value ...]\n\n", stdout);
        fputs(help_text().c_str(), stdout);
        return 0;
    }
    if (args.flag("info")) {
        if (!args.given("model")) fail("--info needs --model DIR");
        ModelWeights w = ModelWeights::load(args.str("model"));
        fputs(model_info(w, args.str("model")).c_str(), stdout);
        return 0;
    }
    fail("no mode selected and training is not built yet; see --help");
}

int main(int argc, char** argv) {
    try {
        return run(Args::parse(argc, argv));
    } catch (const Error& e) {
        fprintf(stderr, "error: %s\n", e.what());
        return 1;
    } catch (const std::bad_alloc&) {
        fprintf(stderr, "error: out of memory; use a smaller model or batch\n");
        return 1;
    }
}
