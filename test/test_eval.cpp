// Tests of the held-out evaluation (rl/driver/eval.h): the unbiased pass@k against exact binomials,
// the majority vote's tie rule, and through the binary: the logged mean@n, pass@k and maj@n of several
// named sets equal what the --dump_eval generations give by an independent computation (exact integer
// binomials, a vote counted here), and --eval_only leaves every file of the run as it was.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>

#include "rl/driver/eval.h"
#include "rl/io/json.h"
#include "test/harness.h"
#include "test/run_binary.h"
#include "test/temp_dir.h"

using namespace fp8rl;

namespace {

// C(n, k) exactly, as an integer (n <= 60).
uint64_t binomial_exact(int n, int k) {
    if (k < 0 || k > n) return 0;
    uint64_t r = 1;
    for (int i = 1; i <= k; i++) r = r * (uint64_t)(n - k + i) / (uint64_t)i;  // exact at every step
    return r;
}

// pass@k of one prompt by the estimator's definition: 1 - C(n - c, k) / C(n, k).
double pass_at_k_exact(int n, int c, int k) { return 1.0 - (double)binomial_exact(n - c, k) / (double)binomial_exact(n, k); }

// The majority answer's correctness counted here: most votes, then the smallest first sample index.
bool majority_exact(const std::vector<std::pair<std::string, bool>>& samples) {  // (extracted or "\x01none", correct)
    std::map<std::string, std::pair<int, int>> tally;  // answer -> (votes, first index)
    for (int i = 0; i < (int)samples.size(); i++) {
        if (samples[(size_t)i].first == "\x01none") continue;
        auto it = tally.find(samples[(size_t)i].first);
        if (it == tally.end()) tally[samples[(size_t)i].first] = {1, i};
        else it->second.first++;
    }
    int best_votes = 0, best_first = -1;
    for (const auto& kv : tally)
        if (kv.second.first > best_votes || (kv.second.first == best_votes && kv.second.second < best_first))
            best_votes = kv.second.first, best_first = kv.second.second;
    return best_first >= 0 && samples[(size_t)best_first].second;
}

std::map<std::string, std::string> files_under(const std::string& dir) {
    std::map<std::string, std::string> out;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
        if (e.is_regular_file()) out[e.path().string()] = read_file(e.path().string());
    return out;
}

const std::string kEvalRun = " --init tiny --task add --task_size 1 --max_new_tokens 3 --group_size 4 --batch_prompts 8 --minibatches 2"
                             " --lr 3e-3 --eval_prompts 8 --seed 7 --out_dir ";

}  // namespace

TEST(eval_pass_at_k_is_the_unbiased_estimator) {
    size_t compared = 0;
    for (int n = 1; n <= 20; n++)
        for (int c = 0; c <= n; c++)
            for (int k : pass_ks(n)) {
                CHECK_MSG(std::fabs(pass_at_k(n, c, k) - pass_at_k_exact(n, c, k)) <= 1e-12, "n %d c %d k %d: %.17g vs %.17g", n, c,
                          k, pass_at_k(n, c, k), pass_at_k_exact(n, c, k));
                compared++;
            }
    CHECK(compared > 200);
    CHECK(pass_ks(8) == (std::vector<int>{1, 2, 4, 8}));
    CHECK(pass_ks(6) == (std::vector<int>{1, 2, 4, 6}));
    CHECK(pass_ks(1) == (std::vector<int>{1}));
}

TEST(eval_majority_vote_breaks_ties_by_first_answer) {
    auto v = [](const char* e, bool correct) {
        Verdict x;
        x.has_extracted = e != nullptr;
        x.extracted = e ? e : "";
        x.correct = correct;
        return x;
    };
    CHECK(majority_correct({v("1", false), v("2", true), v("2", true)}));         // 2 votes beat 1
    CHECK(!majority_correct({v("1", false), v("2", true), v("1", false), v("2", true)}));  // tie: "1" came first
    CHECK(majority_correct({v("2", true), v("1", false), v("1", false), v("2", true)}));   // tie: "2" came first
    CHECK(!majority_correct({v(nullptr, true), v(nullptr, true), v("3", false)}));  // no extraction, no vote
    CHECK(!majority_correct({v(nullptr, true)}));
}

// Two named sets (one scored by another task's verifier), sampled hot at a one-token budget so some
// samples are right: every logged score equals the dump's, computed independently here.
TEST(eval_scores_equal_the_dumped_generations) {
    harness::TempDir tmp;
    std::string a, b;
    for (int i = 0; i < 12; i++) {  // answers a tiny random model sometimes says in one token
        a += strfmt("{\"prompt\": \"%d+%d=\", \"answer\": \"%s\"}\n", i % 10, (i * 7) % 10, i % 3 == 0 ? "=" : i % 3 == 1 ? "+" : "1");
        b += strfmt("{\"prompt\": \"%d+%d=\", \"answer\": \"%d\"}\n", (i * 3) % 10, i % 10, i % 4);
    }
    harness::write_text(tmp / "a.jsonl", a);
    harness::write_text(tmp / "b.jsonl", b);
    const int n = 6;
    harness::RunResult r = harness::run_command(
        harness::binary() + kEvalRun + tmp / "run" + strfmt(" --eval_only 1 --dump_eval 1 --eval_k %d --eval_temperature 3", n) +
        " --eval_max_new_tokens 1 --eval_data setA=" + tmp / "a.jsonl" + " --eval_data setB=" + tmp / "b.jsonl:copy 2>&1");
    CHECK_MSG(r.status == 0, "%s", r.output.c_str());
    if (r.status) return;
    for (const char* s : {"  eval setA: greedy accuracy", "  eval setB: greedy accuracy"})
        CHECK_MSG(r.output.find(s) != std::string::npos, "no \"%s\" in: %s", s, r.output.c_str());
    const std::string text = read_file(tmp / "run/eval.jsonl");
    CHECK_EQ(std::count(text.begin(), text.end(), '\n'), 1);
    const Json logged = json_parse(text.substr(0, text.find('\n')), "eval.jsonl");
    struct Prompt {
        std::vector<std::pair<std::string, bool>> samples;
        bool greedy = false;
        double tokens = 0;
    };
    std::map<std::string, std::map<std::string, Prompt>> sets;  // set -> prompt -> what was generated
    const std::string dump = read_file(tmp / "run/eval_generations.jsonl");
    for (size_t pos = 0, nl; pos < dump.size(); pos = nl + 1) {
        nl = dump.find('\n', pos);
        const Json g = json_parse(dump.substr(pos, nl - pos), "eval_generations.jsonl");
        Prompt& p = sets[g.find("set")->str][g.find("prompt")->str];
        if (g.find("sample")->integer < 0) {
            p.greedy = g.find("correct")->boolean;
            continue;
        }
        CHECK_EQ(g.find("sample")->integer, (int64_t)p.samples.size());
        const Json* e = g.find("extracted");
        p.samples.push_back({e->is_null() ? "\x01none" : e->str, g.find("correct")->boolean});
        CHECK_EQ(g.find("reward")->number, g.find("correct")->boolean ? 1.0 : 0.0);
    }
    CHECK_EQ(sets.size(), (size_t)2);
    double all_correct = 0, all_samples = 0;
    for (const auto& set : sets) {
        const std::string p = "val-core/" + set.first + "/acc/";
        double greedy = 0, mean = 0, maj = 0;
        std::map<int, double> pass;
        for (const auto& kv : set.second) {
            const std::vector<std::pair<std::string, bool>>& s = kv.second.samples;
            CHECK_EQ(s.size(), (size_t)n);
            int c = 0;
            for (const auto& x : s) c += x.second;
            all_correct += c, all_samples += n;
            greedy += kv.second.greedy;
            mean += (double)c / n;
            maj += majority_exact(s);
            for (int k : {1, 2, 4, 6}) pass[k] += pass_at_k_exact(n, c, k);
        }
        const double P = (double)set.second.size();
        CHECK_EQ(P, 8.0);  // --eval_prompts 8 of each file's 12
        auto logged_value = [&](const std::string& key) {
            const Json* v = logged.find(key);
            CHECK_MSG(v != nullptr, "eval.jsonl has no %s", key.c_str());
            return v ? v->number : NAN;
        };
        auto close = [](double x, double y) { return std::fabs(x - y) <= 1e-8; };
        CHECK_MSG(close(logged_value(p + "greedy"), greedy / P), "%s greedy", set.first.c_str());
        CHECK_MSG(close(logged_value(p + strfmt("mean@%d", n)), mean / P), "%s mean@%d", set.first.c_str(), n);
        CHECK_MSG(close(logged_value(p + strfmt("maj@%d", n)), maj / P), "%s maj@%d: logged %.9g, dump %.9g", set.first.c_str(), n,
                  logged_value(p + strfmt("maj@%d", n)), maj / P);
        for (const auto& kv : pass)
            CHECK_MSG(close(logged_value(p + strfmt("pass@%d", kv.first)), kv.second / P), "%s pass@%d: logged %.9g, dump %.9g",
                      set.first.c_str(), kv.first, logged_value(p + strfmt("pass@%d", kv.first)), kv.second / P);
        CHECK_EQ(logged_value("val-core/" + set.first + "/response_length/mean"), 1.0);  // one-token budget
        CHECK_EQ(logged_value("val-core/" + set.first + "/num_prompts"), P);
    }
    CHECK_MSG(all_correct > 0 && all_correct < all_samples, "%g of %g samples correct: the comparison is vacuous", all_correct, all_samples);
}

// --eval_only on a run's directory: every file there, the checkpoint's and trainer state's
// included, is byte for byte what it was; only eval.jsonl is added.
TEST(eval_only_leaves_the_run_untouched) {
    harness::TempDir tmp;
    const std::string run = tmp / "run";
    harness::RunResult r = harness::run_command(harness::binary() + kEvalRun + run + " --steps 1 --eval_every 1 --eval_k 2 2>&1");
    CHECK_MSG(r.status == 0, "%s", r.output.c_str());
    if (r.status) return;
    const std::map<std::string, std::string> before = files_under(run);
    r = harness::run_command(harness::binary() + kEvalRun + run + " --steps 1 --eval_k 2 --eval_only 1 --resume " + run + " 2>&1");
    CHECK_MSG(r.status == 0 && r.output.find("eval of " + run + "/checkpoints/step_000001 at step 1:") != std::string::npos, "%s",
              r.output.c_str());
    std::map<std::string, std::string> after = files_under(run);
    CHECK(after.count(run + "/eval.jsonl") == 1);
    after.erase(run + "/eval.jsonl");
    CHECK_EQ(after.size(), before.size());
    for (const auto& kv : before) {
        auto it = after.find(kv.first);
        CHECK_MSG(it != after.end() && it->second == kv.second, "%s changed", kv.first.c_str());
    }
    // the eval of --eval_only is the one the run logged at its last step (same weights, same draws)
    const Json logged = json_parse(read_file(run + "/eval.jsonl"), "eval.jsonl");
    const std::string log = before.at(run + "/log.jsonl");
    const Json last = json_parse(log.substr(0, log.find('\n')), "log.jsonl");
    for (const char* key : {"val-core/add/acc/greedy", "val-core/add/acc/mean@2", "val-core/add/acc/pass@2"})
        CHECK_MSG(last.find(key) && logged.find(key) && last.find(key)->number == logged.find(key)->number, "%s", key);
    // flags that cannot work together, one line each
    for (const char* bad : {" --dump_eval 1", " --eval_only 1 --eval_greedy 0 --eval_k 0", " --eval_only 1 --eval_data x=a.jsonl --eval_data x=b.jsonl"}) {
        r = harness::run_command(harness::binary() + kEvalRun + tmp / "bad" + bad + " 2>&1");
        CHECK_MSG(r.status == 1 && std::count(r.output.begin(), r.output.end(), '\n') == 1, "%s: %s", bad, r.output.c_str());
    }
}

// --mode sft with --eval_task_data: the task eval of the RL runs (greedy, mean@n, pass@k, maj@n) at
// step 0 and at each eval, logged under the set's name beside val/loss.
TEST(eval_task_data_scores_an_sft_run) {
    harness::TempDir tmp;
    harness::write_text(tmp / "sft.jsonl", "{\"prompt\": \"3+4=\", \"completion\": \"7\"}\n{\"prompt\": \"2+2=\", \"completion\": \"4\"}\n");
    harness::write_text(tmp / "task.jsonl", "{\"prompt\": \"3+4=\", \"answer\": \"7\"}\n{\"prompt\": \"2+2=\", \"answer\": \"4\"}\n");
    harness::RunResult r = harness::run_command(
        harness::binary() + " --mode sft --init tiny --tokenizer bytes --data " + tmp / "sft.jsonl" + " --eval_data " + tmp / "sft.jsonl" +
        " --eval_task_data sums=" + tmp / "task.jsonl:add --eval_k 2 --max_new_tokens 2 --batch_seqs 2 --steps 1 --lr 1e-3 --eval_every 1"
        " --out_dir " + tmp / "run 2>&1");
    CHECK_MSG(r.status == 0 && r.output.find("  eval sums: greedy accuracy") != std::string::npos, "%s", r.output.c_str());
    if (r.status) return;
    const std::string log = read_file(tmp / "run/log.jsonl");
    int rows = 0;
    for (size_t pos = 0, nl; pos < log.size(); pos = nl + 1, rows++) {
        nl = log.find('\n', pos);
        const Json row = json_parse(log.substr(pos, nl - pos), "log.jsonl");
        for (const char* key : {"val/loss", "val-core/sums/acc/greedy", "val-core/sums/acc/mean@2", "val-core/sums/acc/pass@2",
                                "val-core/sums/acc/maj@2", "val-core/sums/num_prompts"})
            CHECK_MSG(row.find(key) != nullptr, "log row %d has no %s", rows, key);
    }
    CHECK_EQ(rows, 2);  // step 0 and step 1
    r = harness::run_command(harness::binary() + kEvalRun + tmp / "bad --eval_task_data x=" + tmp / "task.jsonl 2>&1");
    CHECK_MSG(r.status == 1 && r.output.find("--eval_task_data is the task eval of --mode sft|cpt") != std::string::npos, "%s",
              r.output.c_str());
}
