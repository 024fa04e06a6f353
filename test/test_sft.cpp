// Tests of --mode sft and --mode cpt (rl/driver/lm_data.h, rl/driver/lm_trainer.h): loss masks against
// HF transformers' renderings of Qwen3, Qwen2.5 and Llama-3 conversations, the first train/loss in fp32
// against a float64 forward's masked token-mean NLL (fixtures of dev/make_sft_fixtures.py, rows no other
// test has seen), CPT windows, the WSD schedule, the GPU binary in emulation against the CPU binary,
// CPT -> SFT through a checkpoint, a fresh model with a HF tokenizer (--init with --tokenizer DIR), and bad
// input (one line, exit 1).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "rl/driver/lm_data.h"
#include "rl/objective/lr_schedule.h"
#include "test/harness.h"
#include "test/training_run.h"

using namespace fp8rl;

namespace {

const char* const kSftModel = "test/fixtures/models/qwen3_tiny";

std::vector<int64_t> sft_int_list(const Json& a) {
    std::vector<int64_t> out;
    for (const Json& x : a.items) out.push_back(x.integer);
    return out;
}

// The first row of a run's log that has `key`.
double sft_first(const std::string& dir, const std::string& key) {
    for (const Json& row : log_rows(dir))
        if (const Json* v = row.find(key)) return v->number;
    return NAN;
}

std::string sft_run(const std::string& flags, const std::string& out_dir) {
    return harness::binary() + " --model " + kSftModel + " --threads 2 --out_dir " + out_dir + " " + flags;
}

}  // namespace

// Each conversation's ids and mask equal HF's rendering with the mask of the tokens from after each
// assistant header through its end-of-turn token (test/fixtures/sft/masks_*.jsonl).
TEST(sft_masks_match_transformers) {
    const std::map<std::string, std::string> dirs = {{"qwen3", "test/fixtures/tokenizer/qwen3"},
                                                     {"qwen2.5", "test/fixtures/tokenizer/qwen2.5"},
                                                     {"llama3", "test/fixtures/tokenizer/llama3_style"},
                                                     {"qwen3_tiny", kSftModel}};
    for (const auto& d : dirs) {
        std::unique_ptr<Tokenizer> tok = Tokenizer::load(d.second);
        SftEncoder enc(*tok, d.second, 1, 0);
        int rows = 0, trained = 0;
        for_each_jsonl_row("test/fixtures/sft/masks_" + d.first + ".jsonl", [&](const Json& row, const std::string& where) {
            Json conv;
            conv.type = Json::Object;
            conv.fields.emplace_back("messages", *row.find("messages"));
            LmSequence s = enc.encode(conv, where);
            CHECK_MSG(std::vector<int64_t>(s.ids.begin(), s.ids.end()) == sft_int_list(*row.find("ids")), "%s: ids", where.c_str());
            CHECK_MSG(std::vector<int64_t>(s.loss.begin(), s.loss.end()) == sft_int_list(*row.find("mask")), "%s: mask", where.c_str());
            rows++;
            trained += (int)s.loss_tokens();
        });
        CHECK_MSG(rows == 9 && trained > 9 * 3, "%s: %d rows, %d trained tokens", d.first.c_str(), rows, trained);
    }
}

// SFT's first train/loss in fp32 (the loss before the update) equals the float64 forward's masked
// token-mean NLL over the same rows, for conversations and for prompt/completion rows, and its
// train/mean_token_accuracy counts the float64 forward's hits (targets whose logit is the largest,
// every one at least 0.067 from the best other: fp32 cannot flip one).
TEST(sft_first_loss_matches_fp64) {
    const Json expected = json_parse_file("test/fixtures/sft/expected_loss.json");
    const Json accuracy = json_parse_file("test/fixtures/sft/expected_accuracy.json");
    for (const char* file : {"messages.jsonl", "prompt.jsonl"}) {
        const std::string d = temp_dir(std::string("sft_fp64_") + file);
        harness::RunResult r = run_cmd(sft_run(std::string("--mode sft --data test/fixtures/sft/") + file +
                                                   " --batch_seqs 6 --steps 1 --lr 1e-3 --train_precision fp32",
                                               d));
        CHECK_MSG(r.status == 0, "%s", r.output.c_str());
        if (r.status) continue;
        const double want = expected.find(file)->number, got = sft_first(d, "train/loss");
        CHECK_MSG(std::fabs(got - want) <= 1e-4 * want, "%s: train/loss %.9g, float64 %.9g", file, got, want);
        const Json* a = accuracy.find(file);
        const double tokens = sft_first(d, "train/tokens"), hits = sft_first(d, "train/mean_token_accuracy") * tokens;
        CHECK_MSG(tokens == (double)a->find("tokens")->integer && std::fabs(hits - (double)a->find("hits")->integer) < 1e-3,
                  "%s: %.6g hits of %.0f tokens, float64 %lld of %lld", file, hits, tokens, (long long)a->find("hits")->integer,
                  (long long)a->find("tokens")->integer);
    }
}

// CPT windows: N + 1 tokens, the last shared with the next window; every document ends with the
// end-of-text id; --doc_mask 1 cuts a window after each end-of-text, leaving out one-token pieces.
TEST(cpt_windows_overlap_and_doc_mask) {
    const std::string d = temp_dir("cpt_windows");
    write_file_atomic(d + "/docs.jsonl", "{\"ids\": [1, 2, 3]}\n{\"ids\": [4, 5]}\n{\"ids\": [6, 7, 8, 9]}\n");
    // stream: 1 2 3 E 4 5 E 6 7 8 9 E (E = 0), 12 tokens: windows of 4 + 1 at 0, 4 (the tail from 8 is short)
    std::vector<LmRow> w = load_cpt_windows(d + "/docs.jsonl", nullptr, 10, 0, 4, false);
    CHECK_EQ(w.size(), (size_t)2);
    CHECK(w[0].size() == 1 && w[0][0].ids == std::vector<int32_t>({1, 2, 3, 0, 4}));
    CHECK(w[1].size() == 1 && w[1][0].ids == std::vector<int32_t>({4, 5, 0, 6, 7}));
    CHECK(w[1][0].loss == std::vector<uint8_t>({0, 1, 1, 1, 1}));
    std::vector<LmRow> m = load_cpt_windows(d + "/docs.jsonl", nullptr, 10, 0, 4, true);
    CHECK(m[0].size() == 1 && m[0][0].ids == std::vector<int32_t>({1, 2, 3, 0}));  // {4} alone predicts nothing
    CHECK(m[1].size() == 2 && m[1][0].ids == std::vector<int32_t>({4, 5, 0}) && m[1][1].ids == std::vector<int32_t>({6, 7}));
}

// WSD: warm-up, constant, then linear to min_ratio * lr at the last update.
TEST(lr_schedule_wsd) {
    LrSchedule s;
    s.lr = 1.0;
    s.warmup = 2;
    s.total = 10;
    s.wsd = true;
    s.decay = 3;
    s.min_ratio = 0.1;
    const double want[10] = {0.5, 1, 1, 1, 1, 1, 1, 1, 0.55, 0.1};
    for (int i = 0; i < 10; i++) CHECK_NEAR(s.at(i), want[i], 1e-12, 1e-12);
}

// The GPU binary in emulation trains what the CPU binary trains: SFT's step-1 loss (the forward before
// the update), its token accuracy (the same hits), its gradient norm and the held-out losses before
// and after the update, in bf16 and fp8 (with fp32 and with power-of-two scales).
// The engines differ by BF16 summation order (~1e-3 per token log-prob, test/gpu/test_engine.cu): a
// mean over ~100 tokens agrees within 2e-3 relative, the gradient norm within 2e-2. Skipped under the
// sanitizer: its GPU half is the plain ./train_rl_emu, the same runs as the plain build's (13 s of CI
// there), and the sanitizer sees train_rl_cpu's SFT in the other SFT tests (bf16, fp8 with pow2 scales).
TEST(sft_train_rl_emu_matches_train_rl_cpu) {
    if (harness::sanitized) SKIP("the plain build compares the engines; the sanitizer build runs train_rl_cpu's SFT in the other SFT tests");
    if (std::system(("test -x " + harness::emu_binary()).c_str()) != 0) SKIP("./train_rl_emu not built (make train_rl_emu)");
    std::map<std::string, double> fp8_val;  // val/loss before the update, by --fp8_scales
    for (const std::string p : {"bf16", "fp8 --fp8_scales fp32", "fp8 --fp8_scales pow2"}) {
        const std::string d = temp_dir("sft_emu_" + p.substr(0, 3) + "_" + p.substr(p.size() - 4));
        const std::string flags = std::string(" --mode sft --model ") + kSftModel +
                                  " --data test/fixtures/sft/messages.jsonl --eval_data test/fixtures/sft/prompt.jsonl"
                                  " --batch_seqs 2 --steps 1 --lr 1e-3 --threads 2 --train_precision " + p;
        harness::RunResult cpu = run_cmd(harness::binary() + flags + " --out_dir " + d + "/cpu");
        harness::RunResult gpu = run_cmd(harness::emu_binary() + flags + " --out_dir " + d + "/gpu");
        CHECK_MSG(cpu.status == 0 && gpu.status == 0, "%s\n%s", cpu.output.c_str(), gpu.output.c_str());
        if (cpu.status || gpu.status) continue;
        const std::vector<Json> c = log_rows(d + "/cpu"), g = log_rows(d + "/gpu");
        CHECK(c.size() == 2 && g.size() == 2);  // the step-0 eval, then step 1 with its eval
        if (!c.empty() && c[0].find("val/loss")) fp8_val[p] = c[0].find("val/loss")->number;
        for (size_t i = 0; i < std::min(c.size(), g.size()); i++)
            for (const char* k : {"train/loss", "train/tokens", "val/loss", "val/loss_bf16", "actor/grad_norm"}) {
                const Json *a = c[i].find(k), *b = g[i].find(k);
                CHECK_MSG((a == nullptr) == (b == nullptr), "%s row %zu: %s", p.c_str(), i, k);
                if (a && b)
                    CHECK_MSG(std::fabs(a->number - b->number) <= (std::string(k) == "actor/grad_norm" ? 2e-2 : 2e-3) * std::fabs(a->number),
                              "%s row %zu %s: cpu %.6g emu %.6g", p.c_str(), i, k, a->number, b->number);
            }
        const Json *ca = c.size() == 2 ? c[1].find("train/mean_token_accuracy") : nullptr,
                   *ga = g.size() == 2 ? g[1].find("train/mean_token_accuracy") : nullptr;
        CHECK_MSG(ca && ga && ca->number == ga->number && ca->number > 0, "%s: train/mean_token_accuracy cpu %.9g emu %.9g",
                  p.c_str(), ca ? ca->number : NAN, ga ? ga->number : NAN);
    }
    // power-of-two scales quantize differently (a coarser scale: fewer mantissa bits used)
    CHECK_MSG(fp8_val["fp8 --fp8_scales fp32"] != fp8_val["fp8 --fp8_scales pow2"], "pow2 val/loss %.9g equals fp32's",
              fp8_val["fp8 --fp8_scales pow2"]);
}

// recipe.json (beside log.jsonl and in each checkpoint) records an SFT run's mode and numerics, FP8
// scale kind included, in both binaries; a run resumed with other scales says so in one line. The run
// also draws its dashboard (the SFT/CPT panels) and names it on its last line.
TEST(sft_records_its_recipe_and_dashboard) {
    const std::string d = temp_dir("sft_recipe");
    const std::string flags = std::string(" --mode sft --model ") + kSftModel +
                              " --data test/fixtures/sft/prompt.jsonl --batch_seqs 2 --lr 1e-3 --threads 2"
                              " --train_precision fp8 --fp8_scaling row";
    const bool emu = std::system(("test -x " + harness::emu_binary()).c_str()) == 0;
    for (const std::string& bin : emu ? std::vector<std::string>{harness::binary(), harness::emu_binary()}
                                      : std::vector<std::string>{harness::binary()}) {
        const std::string run = d + "/" + std::filesystem::path(bin).filename().string();
        harness::RunResult r = run_cmd(bin + flags + " --steps 1 --fp8_scales pow2 --out_dir " + run);
        CHECK_MSG(r.status == 0, "%s", r.output.c_str());
        if (r.status) continue;
        CHECK_MSG(r.output.find("files: " + run + "/log.jsonl " + run + "/dashboard.html") != std::string::npos, "%s", r.output.c_str());
        CHECK_MSG(read_file(run + "/dashboard.html").find("loss (nats/token)") != std::string::npos, "%s/dashboard.html", run.c_str());
        for (const std::string& dir : {run, resolve_checkpoint(run)}) {
            const Json recipe = json_parse_file(dir + "/recipe.json");
            for (const auto& [key, want] : std::vector<std::pair<std::string, std::string>>{
                     {"mode", "sft"}, {"train_precision", "fp8"}, {"fp8_scaling", "row"}, {"fp8_scales", "pow2"}}) {
                const Json* v = recipe.find(key);
                CHECK_MSG(v && v->str == want, "%s/recipe.json %s: %s", dir.c_str(), key.c_str(), json_dump(recipe).c_str());
            }
        }
        harness::RunResult resumed = run_cmd(bin + flags + " --steps 2 --fp8_scales fp32 --resume " + run + " --out_dir " + run);
        CHECK_MSG(resumed.status == 0, "%s", resumed.output.c_str());
        CHECK_MSG(resumed.output.find("resume: the checkpoint was trained with other numerics: fp8_scales \"pow2\" -> \"fp32\"") !=
                      std::string::npos, "%s", resumed.output.c_str());
        const Json after = json_parse_file(run + "/recipe.json");
        const Json* now = after.find("fp8_scales");
        CHECK_MSG(now && now->str == "fp32", "%s/recipe.json after the resume", run.c_str());
    }
    if (!emu) SKIP("./train_rl_emu not built (make train_rl_emu): checked train_rl_cpu only");
}

// CPT of a fresh byte-level model, then SFT from its run directory (which loads its latest checkpoint):
// CPT's held-out loss falls well below its start.
TEST(cpt_then_sft_from_checkpoint) {
    const std::string d = temp_dir("cpt_sft");
    std::string text;
    for (int i = 0; i < 60; i++) text += strfmt("{\"text\": \"%d+%d=%d\"}\n", i % 7, i % 5, i % 7 + i % 5);
    write_file_atomic(d + "/text.jsonl", text);
    write_file_atomic(d + "/sft.jsonl", "{\"prompt\": \"3+4=\", \"completion\": \"7\"}\n{\"prompt\": \"2+2=\", \"completion\": \"4\"}\n");
    harness::RunResult cpt = run_cmd(harness::binary() + " --mode cpt --init tiny --tokenizer bytes --data " + d +
                                     "/text.jsonl --eval_data " + d + "/text.jsonl --seq_len 32 --batch_seqs 4 --steps 12 --lr 3e-3"
                                     " --lr_schedule wsd --warmup_steps 2 --decay_steps 3 --threads 2 --out_dir " + d + "/cpt");
    CHECK_MSG(cpt.status == 0, "%s", cpt.output.c_str());
    if (cpt.status) return;
    const std::vector<Json> rows = log_rows(d + "/cpt");
    const double start = rows.front().find("val/loss")->number, end = rows.back().find("val/loss")->number;
    CHECK_MSG(end < 0.8 * start, "CPT val/loss %.4f -> %.4f", start, end);
    harness::RunResult sft = run_cmd(harness::binary() + " --mode sft --model " + d + "/cpt --data " + d + "/sft.jsonl --eval_data " +
                                     d + "/sft.jsonl --batch_seqs 2 --steps 1 --lr 1e-3 --threads 2 --out_dir " + d + "/sft");
    CHECK_MSG(sft.status == 0, "%s", sft.output.c_str());
    CHECK_MSG(sft.output.find("checkpoints/step_000012") != std::string::npos, "%s", sft.output.c_str());
}

// --init with --tokenizer DIR: a fresh model with that tokenizer's ids, end of text and chat template
// (the tiny Qwen3's, whose config.json transformers wrote: vocab 320, eos 317 = <|im_end|>), so SFT
// trains on the tokens HF's masks mark (expected_accuracy.json's count); a tokenizer whose eos_token
// is not in its vocabulary is refused in one line.
TEST(init_with_tokenizer_dir) {
    const std::string d = temp_dir("init_tokenizer");
    harness::RunResult r = run_cmd(harness::binary() + " --mode sft --init tiny --tokenizer " + kSftModel +
                                   " --data test/fixtures/sft/messages.jsonl --batch_seqs 6 --steps 1 --lr 1e-3 --threads 2"
                                   " --out_dir " + d + "/sft");
    CHECK_MSG(r.status == 0, "%s", r.output.c_str());
    if (r.status) return;
    const Json hf = json_parse_file(std::string(kSftModel) + "/config.json"), fresh = json_parse_file(d + "/sft/init_model/config.json");
    for (const char* k : {"vocab_size", "eos_token_id"})
        CHECK_MSG(fresh.find(k)->integer == hf.find(k)->integer, "%s: fresh %lld, HF %lld", k, (long long)fresh.find(k)->integer,
                  (long long)hf.find(k)->integer);
    const double tokens = sft_first(d + "/sft", "train/tokens");
    const int64_t want = json_parse_file("test/fixtures/sft/expected_accuracy.json").find("messages.jsonl")->find("tokens")->integer;
    CHECK_MSG(tokens == (double)want, "train/tokens %.0f, HF's masks %lld", tokens, (long long)want);
    CHECK(read_file(d + "/sft/init_model/chat_template.jinja") == read_file(std::string(kSftModel) + "/chat_template.jinja"));
    std::filesystem::create_directories(d + "/bad");
    write_file_atomic(d + "/bad/tokenizer.json", read_file(std::string(kSftModel) + "/tokenizer.json"));
    write_file_atomic(d + "/bad/tokenizer_config.json", "{\"eos_token\": \"<|missing|>\"}\n");
    harness::RunResult bad = harness::run_command(harness::binary() + " --mode sft --init tiny --tokenizer " + d +
                                                  "/bad --data test/fixtures/sft/messages.jsonl --out_dir " + d + "/out 2>&1 >/dev/null");
    CHECK_MSG(bad.status == 1 && bad.output.find("eos_token <|missing|> is not in the vocabulary") != std::string::npos &&
                  std::count(bad.output.begin(), bad.output.end(), '\n') == 1,
              "%d: %s", bad.status, bad.output.c_str());
}

// Bad input: one line naming the problem, exit 1.
TEST(sft_cpt_bad_input_one_line) {
    const std::string d = temp_dir("sft_bad");
    write_file_atomic(d + "/no_loss.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n");
    write_file_atomic(d + "/role.jsonl", "{\"messages\": [{\"role\": \"robot\", \"content\": \"hi\"}]}\n");
    write_file_atomic(d + "/text.jsonl", "{\"text\": \"hello world\"}\n");
    const std::pair<std::string, const char*> cases[] = {
        {"--mode sft --data " + d + "/no_loss.jsonl", "no tokens to train on"},
        {"--mode sft --data " + d + "/role.jsonl", "role \"robot\""},
        {"--mode cpt --data " + d + "/text.jsonl --seq_len 512", "more than the model's 512 positions"},
        {"--mode sft", "--mode sft trains on --data"},
    };
    for (const auto& c : cases) {
        harness::RunResult r = harness::run_command(sft_run(c.first, d + "/out") + " 2>&1 >/dev/null");
        CHECK_MSG(r.status == 1 && r.output.find(c.second) != std::string::npos &&
                      std::count(r.output.begin(), r.output.end(), '\n') == 1,
                  "%s -> %d: %s", c.first.c_str(), r.status, r.output.c_str());
    }
}
