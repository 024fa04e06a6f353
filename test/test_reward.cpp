// Tests of the verifiers (rl/reward*.h) and the synthetic tasks (rl/tasks/tasks.h). The table of tricky
// and adversarial cases is labelled by dev/make_reward_fixtures.py with Python ports of verl's,
// lm-eval's and TinyZero's verifiers; the synthetic generators are checked by properties.
#include <set>

#include "rl/io/json.h"
#include "rl/tasks/reward.h"
#include "test/harness.h"
#include "test/run_binary.h"

using namespace fp8rl;

TEST(reward_table_matches_python_references) {
    std::string text = read_file("test/fixtures/reward/cases.jsonl");
    size_t line = 0, cases = 0;
    for (size_t i = 0; i < text.size();) {
        size_t nl = text.find('\n', i);
        std::string row = text.substr(i, nl - i);
        i = nl == std::string::npos ? text.size() : nl + 1;
        line++;
        if (row.empty()) continue;
        Json j = json_parse(row, strfmt("cases.jsonl:%zu", line));
        std::string task = j.find("task")->str, response = j.find("response")->str, answer = j.find("answer")->str;
        Verdict v = score_response(task, response, answer);
        const Json* extracted = j.find("extracted");
        CHECK_MSG(v.reward == j.find("reward")->number, "line %zu (%s) %s | %s: reward %g, python %g", line,
                  task.c_str(), response.c_str(), answer.c_str(), v.reward, j.find("reward")->number);
        CHECK_MSG(v.has_extracted == !extracted->is_null(), "line %zu (%s): extraction presence differs", line, task.c_str());
        if (v.has_extracted && extracted->is_string())
            CHECK_MSG(v.extracted == extracted->str, "line %zu (%s): extracted '%s', python '%s'", line, task.c_str(),
                      v.extracted.c_str(), extracted->str.c_str());
        cases++;
    }
    CHECK(cases >= 100);
}

TEST(reward_unknown_task_and_bad_countdown_answer) {
    CHECK_THROWS(score_response("chess", "e4", "e4"), "unknown task 'chess'");
    CHECK_THROWS(score_response("countdown", "<answer>1</answer>", "24"), "expected \"TARGET:N1,N2,...\"");
    CHECK_THROWS(score_response("countdown", "<answer>1</answer>", "24:1,,2"), "countdown answer");
    CHECK_THROWS(score_response("countdown", "<answer>1</answer>", "24:1,2,3,4,5,6,7"), "1 to 6 numbers");
    CHECK_THROWS(score_response("countdown", "<answer>1</answer>", "24:1234567"), "countdown answer");
}

TEST(reward_synthetic_generators_verify_their_own_answers) {
    for (const char* task : {"add", "reverse", "sort", "copy", "countdown"}) {
        std::set<std::string> prompts;
        for (uint64_t i = 0; i < 50; i++) {
            TaskExample ex = task_example(task, default_task_size(task), 7, i);
            TaskExample again = task_example(task, default_task_size(task), 7, i);
            CHECK(ex.prompt == again.prompt && ex.answer == again.answer);  // counter-based
            prompts.insert(ex.prompt);
            if (std::string(task) == "countdown") continue;  // the answer is the problem, not a response
            Verdict v = score_response(task, ex.answer, ex.answer);
            CHECK_MSG(v.correct && v.reward == 1.0, "%s: %s -> %s", task, ex.prompt.c_str(), ex.answer.c_str());
        }
        CHECK_MSG(prompts.size() >= 45, "%s: only %zu distinct prompts of 50", task, prompts.size());
        CHECK(task_example(task, default_task_size(task), 7, 0).prompt != task_example(task, default_task_size(task), 8, 0).prompt);
    }
}

// The answers of the generators recomputed independently from the prompt text.
TEST(reward_synthetic_answers_are_right) {
    for (uint64_t i = 0; i < 200; i++) {
        TaskExample a = task_example("add", 5, 3, i);
        long long x, y;
        CHECK(sscanf(a.prompt.c_str(), "%lld+%lld=", &x, &y) == 2);
        CHECK_EQ(a.answer.size(), (size_t)6);  // size + 1 digits, zero-padded
        CHECK_EQ(std::stoll(a.answer), x + y);
        TaskExample r = task_example("reverse", 6, 3, i);
        std::string s = r.prompt.substr(2, 6);
        CHECK_EQ(r.answer, std::string(s.rbegin(), s.rend()));
        TaskExample so = task_example("sort", 6, 3, i);
        CHECK(std::is_sorted(so.answer.begin(), so.answer.end()) && std::is_permutation(so.answer.begin(), so.answer.end(), so.prompt.begin() + 2));
        TaskExample c = task_example("countdown", 4, 3, i);
        CountdownProblem p = parse_countdown_answer(c.answer);
        CHECK(p.numbers.size() == 4 && p.target > 0 && p.target <= 1000);
        CHECK(c.prompt.find("equals " + std::to_string((long long)p.target) + ".") != std::string::npos);
    }
    CHECK_THROWS(task_example("add", 0, 1, 0), "size 0 out of range");
    CHECK_THROWS(task_example("gsm8k", 3, 1, 0), "has no generator");
}

// Countdown problems are solvable: a brute-force search over expressions finds the target.
static bool reachable(std::vector<Rational> v, const Rational& target) {
    if (v.size() == 1) return v[0].num == target.num && v[0].den == target.den;
    for (size_t i = 0; i < v.size(); i++)
        for (size_t j = 0; j < v.size(); j++) {
            if (i == j) continue;
            for (char op : std::string("+-*/")) {
                Rational r;
                if (!rational_combine(op, v[i], v[j], &r)) continue;
                std::vector<Rational> rest = {r};
                for (size_t k = 0; k < v.size(); k++)
                    if (k != i && k != j) rest.push_back(v[k]);
                if (reachable(rest, target)) return true;
            }
        }
    return false;
}

TEST(reward_countdown_problems_are_solvable) {
    for (uint64_t i = 0; i < (harness::sanitized ? 10 : 40); i++) {
        CountdownProblem p = parse_countdown_answer(task_example("countdown", 4, 11, i).answer);
        std::vector<Rational> v;
        for (int64_t x : p.numbers) v.push_back(Rational{x, 1});
        CHECK_MSG(reachable(v, Rational{p.target, 1}), "problem %llu: target %lld", (unsigned long long)i, (long long)p.target);
    }
}

TEST(reward_score_cli_matches_table) {
    harness::RunResult r = harness::run_command(harness::binary() + " --score test/fixtures/reward/cases.jsonl");
    CHECK_EQ(r.status, 0);
    std::string expected_text = read_file("test/fixtures/reward/cases.jsonl");
    size_t i = 0, j = 0, rows = 0;
    while (i < r.output.size() && j < expected_text.size()) {
        size_t a = r.output.find('\n', i), b = expected_text.find('\n', j);
        Json got = json_parse(r.output.substr(i, a - i), "score output");
        Json want = json_parse(expected_text.substr(j, b - j), "cases.jsonl");
        CHECK_EQ(got.find("reward")->number, want.find("reward")->number);
        CHECK_EQ(got.find("extracted")->is_null(), want.find("extracted")->is_null());
        if (want.find("extracted")->is_string()) CHECK_EQ(got.find("extracted")->str, want.find("extracted")->str);
        i = a + 1;
        j = b + 1;
        rows++;
    }
    CHECK(rows >= 100);
}

TEST(reward_score_cli_rejects_bad_lines) {
    const std::string file = harness::scratch_dir() + "/reward_bad_score.jsonl";
    const char* path = file.c_str();
    FILE* f = fopen(path, "w");
    fputs("{\"task\":\"gsm8k\",\"response\":\"#### 5\",\"answer\":\"5\"}\n\n{\"task\":\"gsm8k\",\"response\":5,\"answer\":\"5\"}\n", f);
    fclose(f);
    harness::RunResult r = harness::run_command(harness::binary() + " --score " + path + " 2>&1");
    CHECK_EQ(r.status, 1);
    CHECK_MSG(r.output.find("error: " + file + ":3: \"response\" must be a string") == 0, "got: %s", r.output.c_str());
    f = fopen(path, "w");
    fputs("{\"task\":\"sudoku\",\"response\":\"\",\"answer\":\"\"}\n", f);
    fclose(f);
    r = harness::run_command(harness::binary() + " --score " + path + " 2>&1");
    CHECK_EQ(r.status, 1);
    CHECK_MSG(r.output.find("error: " + file + ":1: unknown task 'sudoku'") == 0, "got: %s", r.output.c_str());
    f = fopen(path, "w");
    fputs("[1,2]\n", f);
    fclose(f);
    r = harness::run_command(harness::binary() + " --score " + path + " 2>&1");
    CHECK_EQ(r.status, 1);
    CHECK_MSG(r.output.find(file + ":1: expected a JSON object") != std::string::npos, "got: %s", r.output.c_str());
    remove(path);
}
