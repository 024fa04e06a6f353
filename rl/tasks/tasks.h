// tasks.h: built-in synthetic tasks for learning from scratch (no dataset needed): k-digit
// addition, string reversal, digit sorting, copying, and Countdown. Each has a generator of
// (prompt, answer) pairs and a verifier.
//
// Generation is counter-based: example `index` of a task under `seed` is a pure function of
// (task, size, seed, index), so ranks, resumed runs and eval sets need no generator state, and
// train and eval sets are disjoint by using different seeds.
//
// Prompts are short and plain so a character-level model can learn them:
//   add      "123+45="   -> "0168"       (two numbers of 1..size digits; the sum zero-padded to size+1)
//   reverse  "R:abcd="   -> "dcba"       (size lowercase letters)
//   sort     "S:3142="   -> "1234"       (size digits)
//   copy     "C:abcd="   -> "abcd"       (size lowercase letters)
//   countdown "Using the numbers [3, 5, 8, 1], ... equals 24 ..." -> "24:3,5,8,1" (size numbers)
// The synthetic verifiers reward an exact match of the response's first line (stripped), 1 or 0,
// as GRPO and DAPO reward outcomes. Sums have a fixed width so that every answer of a task has the
// same length: with natural widths a policy learning from scratch first learns the short answers
// (1-digit sums are 13x likelier to be hit at random than 2-digit ones), then ends every answer
// after one digit and stops exploring the long ones; on 1-digit addition it stalled at 53-64% (and
// with partial credit per character, tried first, at ~60%). See docs/results.md, "Learning from scratch".
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "rl/common.h"
#include "rl/tasks/reward_countdown.h"
#include "rl/tasks/reward_text.h"

namespace fp8rl {

struct TaskExample {
    std::string prompt;
    std::string answer;
};

// The synthetic tasks; `size` is digits (add), characters (reverse, sort, copy) or numbers (countdown).
inline bool is_synthetic_task(const std::string& task) {
    return task == "add" || task == "reverse" || task == "sort" || task == "copy" || task == "countdown";
}

inline int default_task_size(const std::string& task) {
    if (task == "add") return 3;
    if (task == "countdown") return 4;
    return 6;
}

// SplitMix64 finalizer: a well-mixed 64-bit value of (seed, index, draw).
inline uint64_t task_hash(uint64_t seed, uint64_t index, uint64_t draw) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull ^ (index + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull ^
                 (draw + 1) * 0x94D049BB133111EBull;
    for (int r = 0; r < 2; r++) {
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
    }
    return z;
}

// Uniform integer in [0, n) from one hash (multiply-high; bias below 2^-40 for the n used here).
inline uint64_t task_uniform(uint64_t seed, uint64_t index, uint64_t draw, uint64_t n) {
    return (uint64_t)(((unsigned __int128)task_hash(seed, index, draw) * n) >> 64);
}

inline std::string task_random_string(uint64_t seed, uint64_t index, int size, const char* alphabet, uint64_t k) {
    std::string s;
    for (int i = 0; i < size; i++) s += alphabet[task_uniform(seed, index, (uint64_t)i + 16, k)];
    return s;
}

// A Countdown problem with a reachable target: a random expression over a random order of the
// numbers, with + - * and exact /, kept when its value is a positive integer up to 1000.
inline TaskExample countdown_example(uint64_t seed, uint64_t index, int size) {
    for (uint64_t attempt = 0;; attempt++) {
        uint64_t base = 64 + attempt * 64;
        std::vector<int64_t> numbers;
        for (int i = 0; i < size; i++) numbers.push_back(1 + (int64_t)task_uniform(seed, index, base + i, 25));
        std::vector<int64_t> order = numbers;
        for (int i = size - 1; i > 0; i--) std::swap(order[i], order[task_uniform(seed, index, base + 16 + i, i + 1)]);
        Rational value{order[0], 1};
        bool ok = true;
        for (int i = 1; i < size && ok; i++) {
            static const char ops[] = "+-*/";
            char op = ops[task_uniform(seed, index, base + 32 + i, 4)];
            Rational next;
            ok = rational_combine(op, value, Rational{order[i], 1}, &next) && next.den == 1;
            value = next;
        }
        if (!ok || value.num <= 0 || value.num > 1000) continue;
        TaskExample ex;
        std::string list, answer = strfmt("%lld:", (long long)value.num);
        for (int i = 0; i < size; i++) {
            list += strfmt("%s%lld", i ? ", " : "", (long long)numbers[i]);
            answer += strfmt("%s%lld", i ? "," : "", (long long)numbers[i]);
        }
        ex.prompt = "Using the numbers [" + list + "], create an equation that equals " +
                    std::to_string((long long)value.num) +
                    ". Use + - * / and parentheses, each number exactly once. Show the equation in "
                    "<answer></answer> tags, for example <answer>(1 + 2) / 3</answer>.";
        ex.answer = answer;
        return ex;
    }
}

// Example `index` of a synthetic task; an unknown task or a size out of range is an Error.
inline TaskExample task_example(const std::string& task, int size, uint64_t seed, uint64_t index) {
    if (!is_synthetic_task(task)) fail("task '%s' has no generator; synthetic tasks: add, reverse, sort, copy, countdown", task.c_str());
    int max_size = task == "add" ? 18 : task == "countdown" ? (int)countdown_max_numbers : 64;
    if (size < 1 || size > max_size) fail("task %s: size %d out of range [1, %d]", task.c_str(), size, max_size);
    TaskExample ex;
    if (task == "add") {
        int64_t a_digits = 1 + (int64_t)task_uniform(seed, index, 0, size), b_digits = 1 + (int64_t)task_uniform(seed, index, 1, size);
        int64_t a = 0, b = 0;
        for (int i = 0; i < a_digits; i++) a = a * 10 + (int64_t)task_uniform(seed, index, 16 + i, 10);
        for (int i = 0; i < b_digits; i++) b = b * 10 + (int64_t)task_uniform(seed, index, 48 + i, 10);
        ex.prompt = strfmt("%lld+%lld=", (long long)a, (long long)b);
        ex.answer = strfmt("%0*lld", size + 1, (long long)(a + b));  // fixed width: see the top of the file
    } else if (task == "reverse" || task == "copy") {
        std::string s = task_random_string(seed, index, size, "abcdefghijklmnopqrstuvwxyz", 26);
        ex.prompt = (task == "reverse" ? "R:" : "C:") + s + "=";
        ex.answer = task == "reverse" ? std::string(s.rbegin(), s.rend()) : s;
    } else if (task == "sort") {
        std::string s = task_random_string(seed, index, size, "0123456789", 10);
        ex.prompt = "S:" + s + "=";
        std::sort(s.begin(), s.end());
        ex.answer = s;
    } else {
        ex = countdown_example(seed, index, size);
    }
    return ex;
}

// Verifier of add, reverse, sort and copy: exact match (see the top of the file).
inline Verdict synthetic_verdict(const std::string& response, const std::string& answer) {
    Verdict v;
    v.has_extracted = true;
    v.extracted = py_strip(response.substr(0, response.find('\n')));
    v.correct = v.extracted == answer;
    v.reward = v.correct ? 1.0 : 0.0;
    return v;
}

}  // namespace fp8rl
