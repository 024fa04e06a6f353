// Tests of --plan_ranks N (rl/driver/cli.h's run_plan_mode): the GPU binary prints the memory plan of
// one rank of an N-rank run from a config.json alone (Qwen3-1.7B's, 8B's and 32B's, test/fixtures/configs:
// no weights, no tokenizer, no data) and exits 0 when it fits the device (an H200 in emulation, or
// --plan_device), else 1 with one line naming what would fit. The expected figures come from the config's fields, counted here, and from issue 31's
// formula for the persistent state, not from cuda/engine/memory_plan.h; train_rl_cpu refuses the flag.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "rl/io/json.h"
#include "test/harness.h"
#include "test/training_run.h"

using namespace fp8rl;

namespace {

// A Qwen3 config's sizes as config.json states them, and what follows from them by counting.
struct Qwen3Shape {
    double V, C, I, L, H, KV, D;
    bool tied;
    explicit Qwen3Shape(const std::string& dir) {
        const Json j = json_parse_file(dir + "/config.json");
        auto field = [&](const char* name) { return (double)j.find(name)->integer; };
        V = field("vocab_size"), C = field("hidden_size"), I = field("intermediate_size"), L = field("num_hidden_layers");
        H = field("num_attention_heads"), KV = field("num_key_value_heads"), D = field("head_dim");
        tied = j.find("tie_word_embeddings")->boolean;  // Qwen3-1.7B's: one embedding serves as the lm_head
    }
    // q, k, v, o and the SwiGLU's gate, up, down of one layer as [out][in]
    std::vector<std::pair<double, double>> projections() const {
        return {{H * D, C}, {KV * D, C}, {KV * D, C}, {C, H * D}, {I, C}, {I, C}, {C, I}};
    }
    double projection_params() const {
        double n = 0;
        for (const auto& [out, in] : projections()) n += out * in;
        return L * n;
    }
    // + the embedding and the head, the layers' two RMSNorms and q/k norms, the final norm
    double params() const { return (tied ? 1 : 2) * V * C + projection_params() + L * (2 * C + 2 * D) + C; }
    // the FP8 codes of every projection and of its transpose, with both grids of FP32 128x128-block scales
    double fp8_bytes() const {
        double blocks = 0;
        for (const auto& [out, in] : projections()) blocks += std::ceil(out / 128) * std::ceil(in / 128);
        return 2 * projection_params() + L * 2 * 4 * blocks;
    }
    // One FP8 weight copy (fp8 rollout and training, block scaling): half of the above (no stored
    // transposes), and the transpose of the largest projection, [gate|up] (2I x C), made before each dgrad
    double one_fp8_copy_bytes() const { return fp8_bytes() / 2 + 2 * I * C + 4 * std::ceil(2 * I / 128) * std::ceil(C / 128); }
    // ... and BF16 for what is not a projection, and one layer's weights (a BF16 pass casts them there)
    double one_copy_bf16_bytes() const { return 2 * (params() - projection_params()) + 2 * (projection_params() / L + 2 * C + 2 * D); }
    // issue 31: FP32 gradients whole on every rank (4 B/param), master weights and both AdamW moments
    // split over the ranks (12/N), a BF16 copy of every weight, the FP8 copies
    double persistent_bytes(int ranks) const { return (4 + 12.0 / ranks) * params() + 2 * params() + fp8_bytes(); }
    // ZeRO-2's bucket: the most parameters the backward finishes at once, the embedding's (or the
    // lm_head's, as large) or one layer's (its projections, two RMSNorms and the q/k norms)
    double bucket_params() const { return std::max(V * C, projection_params() / L + 2 * C + 2 * D); }
};

constexpr double kH200 = 143771.0 * 1048576;  // bytes, as nvidia-smi reports an H200 (the emulation's device)

// The MiB the plan prints on the line starting with `label`; NAN when there is none.
double plan_mib(const std::string& out, const std::string& label) {
    const size_t at = out.find("\n  " + label);
    if (at == std::string::npos) return NAN;
    const size_t end = out.find(" MiB", at);
    const size_t start = out.rfind(' ', end - 1);
    return atof(out.substr(start, end - start).c_str());
}

harness::RunResult plan(const std::string& binary, const std::string& model, int ranks, const std::string& flags) {
    return run_cmd(binary + strfmt(" --plan_ranks %d --model ", ranks) + model + " " + flags);
}

std::string error_line(const std::string& out) {
    const size_t at = out.find("error: ");
    return at == std::string::npos ? std::string() : out.substr(at, out.find('\n', at) - at);
}

const char* const kQwen3_8B = "test/fixtures/configs/qwen3_8b";
const char* const kQwen3_32B = "test/fixtures/configs/qwen3_32b";
// A modest run: 8 prompts x 8 samples, 512 + 1024 tokens, 16 rollout slots, 4k-token micro-batches,
// training in fp8 (rollout in bf16: a BF16 copy and two FP8 copies, issue 31's persistent state).
const char* const kModestRun = "--max_prompt_tokens 512 --max_new_tokens 1024 --rollout_slots 16 --micro_batch_tokens 4096 "
                               "--recompute layer --batch_prompts 8 --group_size 8 --train_precision fp8";

}  // namespace

// Issue 31's own figures first (Qwen3-8B: 161 GB of persistent state on one GPU, 75 GB per GPU at 8
// ranks), which the formula here reproduces; then the plan's persistent lines at 8 ranks against the
// formula's terms, each to the printed 0.1 MiB (the gradients carry the norm's few partial sums more).
TEST(plan_ranks_persistent_state_is_the_issue_formula) {
    if (std::system(("test -x " + harness::emu_binary()).c_str()) != 0) SKIP("./train_rl_emu not built (make train_rl_emu)");
    const Qwen3Shape q(kQwen3_8B);
    CHECK(!q.tied);
    CHECK_EQ(q.params(), 8190735360.0);  // Qwen3-8B's "8.2B" (6.95B outside the embedding and head)
    CHECK_MSG(std::fabs(q.persistent_bytes(1) / 1e9 - 161) < 0.5 && std::fabs(q.persistent_bytes(8) / 1e9 - 75) < 0.5,
              "persistent %.1f GB (1 rank), %.1f GB (8 ranks)", q.persistent_bytes(1) / 1e9, q.persistent_bytes(8) / 1e9);
    const harness::RunResult r = plan(harness::emu_binary(), kQwen3_8B, 8, kModestRun);
    CHECK_MSG(r.status == 0, "exit %d: %s", r.status, r.output.c_str());
    CHECK_MSG(r.output.find(strfmt("for %.0f parameters", q.params())) != std::string::npos, "%s", r.output.c_str());
    const double MiB = 1048576, P = q.params(), shard = std::ceil(P / 8);
    const struct {
        const char* label;
        double expected, tolerance;
    } lines[] = {{"FP32 master weights (1/8", 4 * shard / MiB, 0.05},  {"FP32 gradients", 4 * P / MiB, 0.1},
                 {"AdamW m (1/8", 4 * shard / MiB, 0.05},              {"AdamW v (1/8", 4 * shard / MiB, 0.05},
                 {"BF16 weight copy", 2 * P / MiB, 0.05},               {"FP8 weight copies", q.fp8_bytes() / MiB, 0.05}};
    double persistent = 0;
    for (const auto& l : lines) {
        const double got = plan_mib(r.output, l.label);
        CHECK_MSG(std::fabs(got - l.expected) <= l.tolerance, "%s: %.1f MiB printed, %.1f MiB expected", l.label, got, l.expected);
        persistent += got;
    }
    CHECK_MSG(std::fabs(persistent - q.persistent_bytes(8) / MiB) < 0.5, "persistent %.1f MiB printed, %.1f MiB by the formula",
              persistent, q.persistent_bytes(8) / MiB);
}

// Fits or not, by the persistent state alone: on 1 rank Qwen3-8B's (161 GB) exceeds an H200 (150.8 GB),
// so the modest run is refused, naming 2 ranks; on 2 ranks (112 GB, + a 3.7 GB BF16 KV pool for 16
// slots of 1,536 tokens at 144 KiB a token) it fits with room for 4k-token micro-batches. --zero 0 on
// 2 ranks keeps 161 GB again: refused, naming --zero 1. Qwen3-32B on 8 ranks with --zero 1 keeps
// 308 GB of persistent state on every rank: refused, no rank count fits (--zero 2: the next test).
TEST(plan_ranks_exit_code_and_the_line_naming_what_fits) {
    if (std::system(("test -x " + harness::emu_binary()).c_str()) != 0) SKIP("./train_rl_emu not built (make train_rl_emu)");
    const Qwen3Shape q8(kQwen3_8B), q32(kQwen3_32B);
    CHECK(q8.persistent_bytes(1) > kH200 && q8.persistent_bytes(2) + 16 * 1552 * 147456.0 < kH200 - 30e9);
    CHECK(q32.persistent_bytes(8) > kH200);
    const harness::RunResult one = plan(harness::emu_binary(), kQwen3_8B, 1, kModestRun);
    CHECK_MSG(one.status == 1, "exit %d: %s", one.status, one.output.c_str());
    const std::string line = error_line(one.output);
    CHECK_MSG(line.find("error: the memory plan needs ") == 0 && line.find(" 2 ranks") != std::string::npos, "%s",
              one.output.c_str());
    CHECK(one.output.find("memory plan (one GPU)") != std::string::npos);  // the plan is printed before the refusal
    const harness::RunResult two = plan(harness::emu_binary(), kQwen3_8B, 2, kModestRun);
    CHECK_MSG(two.status == 0 && two.output.find("\nfits: ") != std::string::npos, "exit %d: %s", two.status, two.output.c_str());
    const harness::RunResult zero0 = plan(harness::emu_binary(), kQwen3_8B, 2, std::string(kModestRun) + " --zero 0");
    CHECK_MSG(zero0.status == 1 && error_line(zero0.output).find("--zero 1 (") != std::string::npos, "%s", zero0.output.c_str());
    const harness::RunResult big = plan(harness::emu_binary(), kQwen3_32B, 8, kModestRun);
    CHECK_MSG(big.status == 1 && error_line(big.output).find("no rank count up to 8 ") != std::string::npos, "%s",
              big.output.c_str());
    // the built-in tiny model (--init tiny, ~0.1M parameters: its config with the task's vocabulary) fits
    const harness::RunResult tiny = run_cmd(harness::emu_binary() + " --plan_ranks 1 --init tiny --max_prompt_tokens 16");
    CHECK_MSG(tiny.status == 0 && tiny.output.find(" parameters, ") != std::string::npos &&
                  tiny.output.find("\nfits: ") != std::string::npos,
              "exit %d: %s", tiny.status, tiny.output.c_str());
}

// Issue 49's run: Qwen3-1.7B (tied), fp8 with an FP8 KV cache, 64 prompts x 8 of up to 256 + 1,024
// tokens, 16k-token micro-batches, no recompute.
const char* const kQwen3_1_7B = "test/fixtures/configs/qwen3_1_7b";
std::string issue49_run(int batch_prompts = 64, int group_size = 8, int max_new_tokens = 1024, int micro_batch_tokens = 16384) {
    return strfmt("--rollout_precision fp8 --train_precision fp8 --kv_cache fp8 --batch_prompts %d --group_size %d "
                  "--max_prompt_tokens 256 --max_new_tokens %d --micro_batch_tokens %d --plan_device h100",
                  batch_prompts, group_size, max_new_tokens, micro_batch_tokens);
}

// The phases share the device: issue 49's run fits an H100 (81,559 MiB) without --recompute, where
// the rollout's KV pool added to the update's activations planned 97.19 GiB. --rollout_slots 0 plans
// every one of the 512 requests, and the KV pool gets what the rollout phase leaves, up to every
// slot at full length: 512 x 81 pages (1,280 tokens in pages of 16, and a prompt's partial page) of
// 2 x 28 layers x 16 tokens x 8 KV heads x 128 dims x 1 byte. With 4,096 new tokens the pool asked for
// (512 x 273 pages, 122 GiB) does not fit: the pool is what is left, whole pages, at least one
// sequence's, and the phase's peak stays within the device less the pool's 1 GiB of headroom.
TEST(plan_ranks_phases_share_the_device) {
    if (std::system(("test -x " + harness::emu_binary()).c_str()) != 0) SKIP("./train_rl_emu not built (make train_rl_emu)");
    const double MiB = 1048576, h100 = 81559 * MiB, page = 2.0 * 28 * 16 * 8 * 128;
    const Qwen3Shape q(kQwen3_1_7B);
    CHECK(q.tied);
    CHECK_EQ(q.params(), 1720574976.0);
    const harness::RunResult r = plan(harness::emu_binary(), kQwen3_1_7B, 1, issue49_run());
    CHECK_MSG(r.status == 0 && r.output.find("on an H100 (79.65 GiB)") != std::string::npos &&
                  r.output.find("--recompute none") != std::string::npos && r.output.find("\nfits: ") != std::string::npos,
              "exit %d: %s", r.status, r.output.c_str());
    CHECK_MSG(r.output.find("  rollout slots: 512 of the 512 requests") != std::string::npos, "%s", r.output.c_str());
    CHECK_EQ(page, 896.0 * 1024);
    CHECK_MSG(plan_mib(r.output, "KV page pool: 41472 pages of 896 KiB") == 512 * 81 * page / MiB, "%s", r.output.c_str());
    CHECK_MSG(plan_mib(r.output, "rollout phase peak") <= h100 / MiB && plan_mib(r.output, "update phase peak") <= h100 / MiB, "%s",
              r.output.c_str());
    const harness::RunResult longer = plan(harness::emu_binary(), kQwen3_1_7B, 1, issue49_run(64, 8, 4096));
    CHECK_MSG(longer.status == 0, "exit %d: %s", longer.status, longer.output.c_str());
    const size_t at = longer.output.find("KV page pool: ");
    CHECK(at != std::string::npos);
    if (at == std::string::npos) return;
    const long pages = atol(longer.output.c_str() + at + strlen("KV page pool: "));
    const double peak = plan_mib(longer.output, "rollout phase peak") * MiB, headroom = 1024 * MiB;
    CHECK_MSG(pages >= (256 + 4096 - 1 + 15) / 16 + 1 && pages < 512 * 273, "%ld pages", pages);
    CHECK_MSG(peak <= h100 - headroom && peak + page > h100 - headroom - 0.1 * MiB, "peak %.1f MiB, %ld pages", peak / MiB, pages);
}

// --offload_train_state 1: the rollout phase holds no FP32 master weights, moments or gradients. A
// rollout that does not fit beside them (800 prompts of 256 tokens prefilled at once) is refused
// naming the offload, with which it fits; the plan prices it at 2 x 12 bytes per parameter over
// PCIe. A refusal of the update phase names --recompute layer (32k-token micro-batches without it) and,
// with it, the most tokens per micro-batch that fit (256k asked): with them it fits, with one more not.
TEST(plan_ranks_offload_and_what_fits) {
    if (std::system(("test -x " + harness::emu_binary()).c_str()) != 0) SKIP("./train_rl_emu not built (make train_rl_emu)");
    const Qwen3Shape q(kQwen3_1_7B);
    const std::string wide = issue49_run(800, 2);
    const harness::RunResult kept = plan(harness::emu_binary(), kQwen3_1_7B, 1, wide);
    CHECK_MSG(kept.status == 1 && error_line(kept.output).find("--offload_train_state 1 (") != std::string::npos &&
                  error_line(kept.output).find(", fits)") != std::string::npos,
              "exit %d: %s", kept.status, kept.output.c_str());
    const harness::RunResult off = plan(harness::emu_binary(), kQwen3_1_7B, 1, wide + " --offload_train_state 1");
    const double pcie = 2 * 12 * q.params() / 1073741824.0;
    CHECK_MSG(off.status == 0 && off.output.find(strfmt("--offload_train_state 1: %.2f GiB over PCIe per step", pcie)) != std::string::npos,
              "exit %d, expected %.2f GiB: %s", off.status, pcie, off.output.c_str());
    const std::string line = error_line(plan(harness::emu_binary(), kQwen3_1_7B, 1, issue49_run(64, 8, 1024, 32768)).output);
    CHECK_MSG(line.find("--recompute layer (") != std::string::npos, "%s", line.c_str());
    const std::string refusal =
        error_line(plan(harness::emu_binary(), kQwen3_1_7B, 1, issue49_run(64, 8, 1024, 262144) + " --recompute layer").output);
    const size_t at = refusal.find("--micro_batch_tokens ");
    CHECK_MSG(at != std::string::npos, "%s", refusal.c_str());
    if (at == std::string::npos) return;
    const long n = atol(refusal.c_str() + at + strlen("--micro_batch_tokens "));
    for (long t : {n, n + 1})
        CHECK_MSG(plan(harness::emu_binary(), kQwen3_1_7B, 1, issue49_run(64, 8, 1024, (int)t) + " --recompute layer").status == (t > n),
                  "--micro_batch_tokens %ld", t);
}

// --zero 2 (ZeRO-2) splits the FP32 gradients over the ranks as --zero 1 splits the master weights
// and moments: Qwen3-8B on 8 ranks keeps 4/8 bytes per parameter of gradients instead of 4, plus two
// buckets of the most parameters the backward finishes at once (the embedding here, V x C floats);
// the other lines stay. Qwen3-32B on 8 ranks with --zero 1 is refused naming --zero 2 (with its
// total); with --zero 2 it is still refused in bf16 (the BF16 and FP8 copies stay whole), and the
// line says what ZeRO-2 splits.
TEST(plan_ranks_zero2_shards_the_gradients) {
    if (std::system(("test -x " + harness::emu_binary()).c_str()) != 0) SKIP("./train_rl_emu not built (make train_rl_emu)");
    const Qwen3Shape q(kQwen3_8B);
    const harness::RunResult z1 = plan(harness::emu_binary(), kQwen3_8B, 8, kModestRun);
    const harness::RunResult z2 = plan(harness::emu_binary(), kQwen3_8B, 8, std::string(kModestRun) + " --zero 2");
    CHECK_MSG(z1.status == 0 && z2.status == 0, "exit %d, %d: %s\n%s", z1.status, z2.status, z1.output.c_str(), z2.output.c_str());
    const double MiB = 1048576, P = q.params();
    const double whole = plan_mib(z1.output, "FP32 gradients"), split = plan_mib(z2.output, "FP32 gradients (1/8: gradient shards)");
    CHECK_MSG(std::fabs(whole - 4 * P / MiB) <= 0.1, "--zero 1: gradients %.1f MiB, expected %.1f", whole, 4 * P / MiB);
    CHECK_MSG(std::fabs(split - 4 * std::ceil(P / 8) / MiB) <= 0.1, "--zero 2: gradients %.1f MiB, expected %.1f", split,
              4 * std::ceil(P / 8) / MiB);
    const double buckets = plan_mib(z2.output, "ZeRO-2 gradient buckets");
    CHECK_MSG(std::fabs(buckets - 2 * 4 * q.bucket_params() / MiB) <= 0.05, "buckets %.1f MiB, expected %.1f", buckets,
              2 * 4 * q.bucket_params() / MiB);
    CHECK(std::isnan(plan_mib(z1.output, "ZeRO-2 gradient buckets")));
    for (const char* label : {"FP32 master weights (1/8", "AdamW m (1/8", "AdamW v (1/8", "BF16 weight copy", "FP8 weight copies"})
        CHECK_MSG(plan_mib(z1.output, label) == plan_mib(z2.output, label), "%s: %.1f MiB with --zero 1, %.1f with --zero 2", label,
                  plan_mib(z1.output, label), plan_mib(z2.output, label));
    const harness::RunResult big1 = plan(harness::emu_binary(), kQwen3_32B, 8, kModestRun);
    const harness::RunResult big2 = plan(harness::emu_binary(), kQwen3_32B, 8, std::string(kModestRun) + " --zero 2");
    CHECK_MSG(big1.status == 1 && error_line(big1.output).find("--zero 2 (") != std::string::npos, "%s", big1.output.c_str());
    CHECK_MSG(big2.status == 1 && error_line(big2.output).find("ZeRO-2 splits only the master weights, AdamW moments and gradients") !=
                                      std::string::npos,
              "%s", big2.output.c_str());
}

// Issue 31's scale targets fit, by the plan: fp8 with an FP8 KV cache, --zero 2, --recompute layer,
// 16k-token micro-batches, Calibrated Clipping, 64 prompts x 8 samples of prompts up to 512 tokens;
// Qwen3-8B on 2 H200s with 8,192 new tokens and 64 slots, Qwen3-32B on 8 with 4,096 and 16. Each keeps
// one FP8 weight copy, whose lines are the counts above; the FP32 state is 16/N bytes per parameter.
// With two copies (--fp8_scaling row: a 1x128 copy does not transpose) Qwen3-32B does not fit.
TEST(plan_ranks_issue_targets_fit_with_one_fp8_copy) {
    if (std::system(("test -x " + harness::emu_binary()).c_str()) != 0) SKIP("./train_rl_emu not built (make train_rl_emu)");
    const std::string target = "--rollout_precision fp8 --train_precision fp8 --kv_cache fp8 --calibrated_clip 1 --recompute layer "
                               "--micro_batch_tokens 16384 --batch_prompts 64 --group_size 8 --max_prompt_tokens 512 --zero 2";
    const struct {
        const char* model;
        int ranks;
        const char* flags;
    } runs[] = {{kQwen3_8B, 2, " --max_new_tokens 8192 --rollout_slots 64"}, {kQwen3_32B, 8, " --max_new_tokens 4096 --rollout_slots 16"}};
    const double MiB = 1048576;
    for (const auto& run : runs) {
        const Qwen3Shape q(run.model);
        const harness::RunResult r = plan(harness::emu_binary(), run.model, run.ranks, target + run.flags);
        CHECK_MSG(r.status == 0 && r.output.find("\nfits: ") != std::string::npos, "%s: exit %d: %s", run.model, r.status,
                  r.output.c_str());
        const double shard = 4 * std::ceil(q.params() / run.ranks) / MiB;
        const struct {
            const char* label;
            double expected;
        } lines[] = {{"FP32 master weights (1/", shard},
                     {"FP32 gradients (1/", shard},
                     {"AdamW m (1/", shard},
                     {"AdamW v (1/", shard},
                     {"BF16 copy: embeddings, norms, head; one layer", q.one_copy_bf16_bytes() / MiB},
                     {"FP8 weight copy + scale grids; one transpose", q.one_fp8_copy_bytes() / MiB}};
        for (const auto& l : lines) {
            const double got = plan_mib(r.output, l.label);
            CHECK_MSG(std::fabs(got - l.expected) <= 0.1, "%s: %s %.1f MiB printed, %.1f MiB expected", run.model, l.label, got,
                      l.expected);
        }
    }
    // on 8 H100s (issue 49): the rollout takes all 64 of a rank's requests (--rollout_slots 0), each at full length
    const harness::RunResult h100 = plan(harness::emu_binary(), kQwen3_8B, 8, target + " --max_new_tokens 8192 --plan_device h100");
    CHECK_MSG(h100.status == 0 && h100.output.find("  rollout slots: 64 of the 64 requests") != std::string::npos &&
                  h100.output.find("  KV pool: 64 sequences at full length") != std::string::npos,
              "exit %d: %s", h100.status, h100.output.c_str());
    const harness::RunResult two_copies = plan(harness::emu_binary(), kQwen3_32B, 8, target + runs[1].flags + " --fp8_scaling row");
    CHECK_MSG(two_copies.status == 1 && two_copies.output.find("FP8 weight copies + scale grids") != std::string::npos, "exit %d: %s",
              two_copies.status, two_copies.output.c_str());
}

// Bad uses get one error line and exit 1: the CPU binary has no device plan; without
// --max_prompt_tokens there is no prompt length to plan for (no data is read); a rank count that
// does not split the batch; a --zero beyond 2 is refused, not planned.
TEST(plan_ranks_refusals) {
    const std::string flags = std::string(" --plan_ranks 2 --model ") + kQwen3_8B;
    const harness::RunResult cpu = run_cmd(harness::binary() + flags + " --max_prompt_tokens 512");
    CHECK_MSG(cpu.status == 1 && cpu.output.find("error: --plan_ranks plans the GPU engine's device memory: run it with train_rl") !=
                                     std::string::npos,
              "exit %d: %s", cpu.status, cpu.output.c_str());
    if (std::system(("test -x " + harness::emu_binary()).c_str()) != 0) SKIP("./train_rl_emu not built (make train_rl_emu)");
    const struct {
        std::string args, message;
    } cases[] = {
        {flags, "error: --plan_ranks reads no data: give --max_prompt_tokens N"},
        {flags + " --max_prompt_tokens 512 --batch_prompts 3", "--batch_prompts 3 is not a multiple of --minibatches 1 x 2 MPI ranks"},
        {flags + " --max_prompt_tokens 512 --zero 3", "error: --zero 3: out of range [0, 2]"},
    };
    for (const auto& c : cases) {
        const harness::RunResult r = run_cmd(harness::emu_binary() + c.args);
        CHECK_MSG(r.status == 1 && r.output.find(c.message) != std::string::npos, "%s: exit %d, expected \"%s\" in: %s",
                  c.args.c_str(), r.status, c.message.c_str(), r.output.c_str());
    }
}

// --plan_ranks with --mode sft reads no data: Qwen2.5-7B's and -1.5B's SFT at 8k tokens on 8 ranks (InfiR2's
// comparison, docs/results.md). Their parameter counts from their config.json's fields (Qwen2: biases on
// q, k and v) are the model cards' 7.61B and 1.54B; the persistent lines are issue 31's formula's terms;
// a micro-batch is one 8,192-token row; 4k-token micro-batches need fewer activation bytes; bf16 holds a BF16
// copy and no FP8 weights, fp8 one FP8 copy (counted here from the shapes); without --max_seq_len, one line.
TEST(plan_ranks_sft_at_8k_tokens) {
    if (std::system(("test -x " + harness::emu_binary()).c_str()) != 0) SKIP("./train_rl_emu not built (make train_rl_emu)");
    const double MiB = 1048576;
    for (const char* dir : {"test/fixtures/configs/qwen2_5_7b", "test/fixtures/configs/qwen2_5_1_5b"}) {
        const Json j = json_parse_file(std::string(dir) + "/config.json");
        auto field = [&](const char* name) { return (double)j.find(name)->integer; };
        const double V = field("vocab_size"), C = field("hidden_size"), I = field("intermediate_size"), L = field("num_hidden_layers");
        const double H = field("num_attention_heads"), KV = field("num_key_value_heads"), D = C / H;
        const double layer = C * H * D + H * D + 2 * (C * KV * D + KV * D) + H * D * C + 3 * C * I + 2 * C;
        const double P = (j.find("tie_word_embeddings")->boolean ? 1 : 2) * V * C + L * layer + C;
        CHECK_EQ(P, std::string(dir).find("7b") != std::string::npos ? 7615616512.0 : 1543714304.0);
        std::string outputs[2];
        for (int fp8 = 0; fp8 < 2; fp8++) {
            const std::string flags = std::string("--mode sft --batch_seqs 8 --train_precision ") + (fp8 ? "fp8" : "bf16");
            const harness::RunResult r = plan(harness::emu_binary(), dir, 8, flags + " --max_seq_len 8192 --micro_batch_tokens 8192");
            CHECK_MSG(r.status == 0, "exit %d: %s", r.status, r.output.c_str());
            CHECK_MSG(r.output.find(strfmt("for %.0f parameters, 8192 tokens per micro-batch", P)) != std::string::npos, "%s", r.output.c_str());
            const double shard = std::ceil(P / 8);
            CHECK_NEAR(plan_mib(r.output, "FP32 master weights (1/8"), 4 * shard / MiB, 0, 0.05);
            CHECK_NEAR(plan_mib(r.output, "AdamW v (1/8"), 4 * shard / MiB, 0, 0.05);
            CHECK_NEAR(plan_mib(r.output, "FP32 gradients"), 4 * P / MiB, 0, 0.1);
            // bf16 holds no FP8 weights; fp8 (SFT generates nothing) one FP8 copy without --rollout_precision fp8:
            // every projection's codes and 128x128-block scales, the transpose of the largest ([gate|up]) before
            // its dgrad, and BF16 only for what is not a projection and one layer (a BF16 pass casts it there)
            const double Q = H * D, Kd = KV * D, proj = 2 * Q * C + 2 * Kd * C + 3 * I * C;
            auto blocks = [](double n, double k) { return std::ceil(n / 128) * std::ceil(k / 128); };
            const double scales = 2 * blocks(Q, C) + 2 * blocks(Kd, C) + 3 * blocks(I, C);
            if (fp8) {
                CHECK_NEAR(plan_mib(r.output, "FP8 weight copy + scale grids; one transpose"),
                           (L * (proj + 4 * scales) + 2 * I * C + 4 * blocks(2 * I, C)) / MiB, 0, 0.05);
                CHECK_NEAR(plan_mib(r.output, "BF16 copy: embeddings, norms, head; one layer"), 2 * (P - L * proj + layer) / MiB, 0, 0.05);
            } else {
                CHECK_NEAR(plan_mib(r.output, "BF16 weight copy"), 2 * P / MiB, 0, 0.05);
                CHECK_NEAR(plan_mib(r.output, "FP8 weight copies: none"), 0, 0, 0.05);
            }
            outputs[fp8] = r.output;
            const harness::RunResult half = plan(harness::emu_binary(), dir, 8, flags + " --max_seq_len 4096 --micro_batch_tokens 4096");
            CHECK_MSG(half.status == 0 && plan_mib(half.output, "activations per micro-batch") < plan_mib(r.output, "activations per micro-batch"),
                      "%s", half.output.c_str());
        }
        printf("    %s --mode sft at 8 ranks: update phase peak %.0f MiB in bf16 (no FP8 weights), %.0f MiB in fp8 (one FP8 copy)\n",
               dir, plan_mib(outputs[0], "update phase peak"), plan_mib(outputs[1], "update phase peak"));
    }
    const harness::RunResult bare = plan(harness::emu_binary(), "test/fixtures/configs/qwen2_5_7b", 8, "--mode sft --batch_seqs 8");
    CHECK_MSG(bare.status == 1 && error_line(bare.output).find("--max_seq_len N") != std::string::npos, "%s", bare.output.c_str());
}
