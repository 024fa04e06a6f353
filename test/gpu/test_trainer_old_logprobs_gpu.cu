// test_trainer_old_logprobs_gpu.cu: the old policy's log-probs on the GPU engine (in emulation in
// make test), in process as test/test_trainer_old_logprobs.cpp checks them on the CPU engine (the
// shared run and checks: test/old_logprobs_run.h). With one minibatch and one epoch the driver runs
// no pass and takes the training forward's log-probs, which are the pass's bits (GpuEngine's
// logprobs() and forward_train() run one forward), with the metrics and weights of a run that makes
// the pass; with two minibatches the pass runs.
#include "cuda/engine/engine_gpu.cuh"
#include "test/gpu/gpu_util.cuh"
#include "test/old_logprobs_run.h"

using namespace fp8rl;
using namespace fp8rl::old_lp_test;

TEST(gpu_trainer_one_minibatch_one_epoch_reuses_the_training_forward) {
    REQUIRE_GPU();
    if (harness::sanitized)  // 50 s there; the driver's code runs under the sanitizer in test_cpu_asan's twin
        SKIP("checked by the plain build; the sanitizer build runs the CPU engine's twin (test_trainer_old_logprobs.cpp)");
    const int steps = emulated ? 2 : 3, budget = 100;  // several micro-batches a step
    Run skip = train<GpuEngine>("--train_precision fp8", false, steps, budget);
    Run pass = train<GpuEngine>("--train_precision fp8", true, steps, budget);
    check_no_pass_equals_pass(skip, pass, "fp8 (GPU engine)");
    check_pass_runs(train<GpuEngine>("--train_precision fp8 --minibatches 2", false, 1, budget), "--minibatches 2");
}
