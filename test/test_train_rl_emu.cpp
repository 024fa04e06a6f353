// Tests of the GPU binary's whole pipeline in emulation (./train_rl_emu: train_rl.cu on the emulated
// GPU engine) against the CPU binary: one RL step in bf16 and in fp8 gives the CPU's metrics, and
// resuming equals not stopping, bit for bit. Not in the sanitizer build (the GPU engine's kernels
// run under ASan in build/test_gpu_emu_asan); make test-unit sets FP8RL_EMU_BIN.
#ifndef FP8RL_SANITIZE
#include <cmath>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "test/harness.h"
#include "test/training_run.h"

using namespace fp8rl;

namespace {

std::string emu_binary() {
    const char* b = getenv("FP8RL_EMU_BIN");
    return b && *b ? b : "./train_rl_emu";
}

// The demo task at a size emulation runs in seconds.
std::string tiny_run(const std::string& out_dir, int steps, const char* precision, const char* kv_cache = "bf16") {
    return strfmt(" --init tiny --task add --task_size 1 --max_new_tokens 3 --group_size 4 --batch_prompts 4 --lr 3e-3"
                  " --steps %d --eval_every 0 --seed 7 --threads 2 --rollout_precision %s --train_precision %s"
                  " --kv_cache %s --out_dir %s",
                  steps, precision, precision, kv_cache, out_dir.c_str());
}

std::map<std::string, double> first_row(const std::string& dir) {
    std::string text = read_file(dir + "/log.jsonl");
    Json row = json_parse(text.substr(0, text.find('\n')), dir + "/log.jsonl");
    std::map<std::string, double> m;
    for (const auto& kv : row.fields)
        if (kv.second.is_number()) m[kv.first] = kv.second.number;
    return m;
}

}  // namespace

// Step 1 of the same run on both engines, in bf16, fp8, and fp8 with an FP8 KV cache. Generation
// runs on each engine's own model (rollout.cu on the GPU), whose logits differ from the CPU's by
// BF16 summation order (~1e-3); a sampled token changes only where its uniform falls within that of
// a CDF boundary, which this run's 48 tokens do not, so rewards, lengths and advantages agree
// exactly (a different seed may flip a token: then these metrics differ and the test says which).
// The FP8 KV scales (amax of K and V over a forward of the prompts) agree within 1e-2.
// What the trainer computes on the GPU engine agrees within its BF16 noise: the engine test
// (test/gpu/test_engine.cu) bounds per-token log-probs at about 1e-3 RMS, so the step's averages
// (ratios, losses, entropies) agree to 1e-2 relative (+1e-3 absolute) and the gradient norm, a sum
// over all tokens and weights, to 5e-2 relative. The rollout/train mismatch metrics measure that
// noise itself (the CPU rollout's log-probs against each engine's; on the CPU engine they are 0):
// their means stay within 1e-2 and their maxima over a step's tokens (up to ~10x the fp8 RMS of
// 5e-3) within 5e-2, absolute.
TEST(train_rl_emu_step_matches_train_rl_cpu) {
    if (std::system(("test -x " + emu_binary()).c_str()) != 0) SKIP("./train_rl_emu not built (make train_rl_emu)");
    const char* const runs[][2] = {{"bf16", "bf16"}, {"fp8", "bf16"}, {"fp8", "fp8"}};
    for (const auto& run : runs) {
        const char *precision = run[0], *kv_cache = run[1];
        std::string d = temp_dir(std::string("emu_step_") + precision + "_kv_" + kv_cache);
        harness::RunResult cpu = run_cmd(harness::binary() + tiny_run(d + "/cpu", 1, precision, kv_cache));
        harness::RunResult gpu = run_cmd(emu_binary() + tiny_run(d + "/gpu", 1, precision, kv_cache));
        CHECK_MSG(cpu.status == 0 && gpu.status == 0, "%s\n%s", cpu.output.c_str(), gpu.output.c_str());
        if (cpu.status || gpu.status) continue;
        std::map<std::string, double> c = first_row(d + "/cpu"), g = first_row(d + "/gpu");
        int compared = 0;
        for (const auto& kv : c) {
            const std::string& k = kv.first;
            if (k.rfind("timing_s/", 0) == 0 || k.rfind("perf/", 0) == 0 || !g.count(k)) continue;
            auto starts = [&](const char* p) { return k.rfind(p, 0) == 0; };
            const bool rollout = starts("critic/") || starts("response_length/") || starts("prompt_length/");
            const bool mismatch = starts("rollout_corr/") || starts("training/rollout_probs");
            const double rtol = rollout || mismatch ? 0 : k == "actor/grad_norm" ? 5e-2 : 1e-2;  // fp8/kv_scale_*: 1e-2
            const bool extreme = k.find("max") != std::string::npos || k.find("min") != std::string::npos;
            const double atol = rollout ? 0 : mismatch ? (extreme ? 5e-2 : 1e-2) : 1e-3;
            CHECK_MSG(harness::close(g[k], kv.second, rtol, atol), "%s %s: train_rl_emu %.9g, train_rl_cpu %.9g", precision,
                      k.c_str(), g[k], kv.second);
            compared++;
        }
        printf("    %s, KV cache %s: %d metrics compared\n", precision, kv_cache, compared);
        CHECK(compared > 20);
        const bool fp8_kv = std::string(kv_cache) == "fp8";
        CHECK_MSG(g.count("fp8/kv_scale_k_max") == (size_t)fp8_kv && c.count("fp8/kv_scale_k_max") == (size_t)fp8_kv,
                  "KV cache %s: fp8/kv_scale_k_max logged by train_rl_emu %zu, train_rl_cpu %zu", kv_cache,
                  g.count("fp8/kv_scale_k_max"), c.count("fp8/kv_scale_k_max"));
    }
}

// Resume on the emulated GPU engine: 2 steps == 1 + resume + 1, every metric and the final state
// bit for bit (the engine's kernels reduce in a fixed order, and the checkpoint holds the FP32
// master weights and AdamW moments).
TEST(train_rl_emu_resume_is_bit_exact) {
    if (std::system(("test -x " + emu_binary()).c_str()) != 0) SKIP("./train_rl_emu not built (make train_rl_emu)");
    std::string d = temp_dir("emu_resume");
    harness::RunResult full = run_cmd(emu_binary() + tiny_run(d + "/full", 2, "fp8"));
    harness::RunResult first = run_cmd(emu_binary() + tiny_run(d + "/split", 1, "fp8"));
    harness::RunResult second = run_cmd(emu_binary() + tiny_run(d + "/split", 2, "fp8") + " --resume " + d + "/split");
    CHECK_MSG(full.status == 0 && first.status == 0 && second.status == 0, "%s\n%s\n%s", full.output.c_str(),
              first.output.c_str(), second.output.c_str());
    if (full.status || first.status || second.status) return;
    std::vector<std::string> a = log_without_timing(d + "/full"), b = log_without_timing(d + "/split");
    CHECK_EQ(a.size(), (size_t)2);
    CHECK(a == b);
    TrainerState x = final_state(d + "/full"), y = final_state(d + "/split");
    CHECK(x.master == y.master);
    CHECK(x.adam_m == y.adam_m && x.adam_v == y.adam_v);
}
#endif  // FP8RL_SANITIZE
