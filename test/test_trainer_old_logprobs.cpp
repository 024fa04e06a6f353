// test_trainer_old_logprobs.cpp: the old policy's log-probs (rl/driver/driver.h,
// Trainer::old_lp_from_training), in process, on the CPU engine behind an engine that records every
// call (test/old_logprobs_run.h). With one minibatch and one epoch the driver runs no pass
// recomputing them and uses the training forward's instead: those are the pass's bits (every value,
// memcmp), and the run's metrics, losses and weights are those of the same run made with the pass
// (the test-only TrainConfig::always_old_logprob_pass). With two minibatches or two epochs the pass
// still runs.
#include "cpu/engine_cpu.h"
#include "test/old_logprobs_run.h"

using namespace fp8rl;
using namespace fp8rl::old_lp_test;

// With --minibatches 1 --epochs 1: no old-log-prob pass (logprobs() is asked only for Calibrated
// Clipping's fp32 shadow pass on its calibration steps), and everything equals the run with the pass.
TEST(trainer_one_minibatch_one_epoch_reuses_the_training_forward) {
    const int steps = harness::sanitized ? 2 : 3;  // 20 s under the sanitizer with 3 steps and both precisions
    for (const char* precision : {"fp8", "bf16"}) {
        if (harness::sanitized && std::string(precision) == "bf16") continue;
        const std::string flags = std::string("--train_precision ") + precision;
        Run skip = train<CpuEngine>(flags, false, steps), pass = train<CpuEngine>(flags, true, steps);
        check_no_pass_equals_pass(skip, pass, precision);
    }
}

// Two minibatches, or two epochs: the old policy is not the one every update's forward sees, so
// the pass runs, once per step over every micro-batch.
TEST(trainer_more_minibatches_or_epochs_run_the_old_logprob_pass) {
    for (const char* flags : {"--minibatches 2", "--epochs 2"}) {
        Run r = train<CpuEngine>(std::string("--train_precision fp8 ") + flags, false, harness::sanitized ? 1 : 3);
        check_pass_runs(r, flags);
    }
}
