// reward_countdown.h: the Countdown verifier. The task: combine the given numbers with + - * /
// and parentheses, each number exactly once, to reach the target. No framework ships this reward
// (spec-rl.md §9.4); fp8rl follows TinyZero's countdown.py where it is safe and defines the rest:
//   * extraction: the last `<answer>(.*?)</answer>` of the response (no newline inside), stripped;
//   * the expression is parsed, never eval'ed: integers without leading zeros, binary + - * /,
//     parentheses, spaces; no unary minus, no "**" or "//";
//   * the multiset of numbers in it must equal the given one, and its exact rational value
//     (division by zero is invalid) must equal the target;
//   * reward 1 when correct, 0.1 when an answer was extracted but is wrong (TinyZero's format
//     score), 0 when there is none.
// The ground-truth string is "TARGET:N1,N2,..." (e.g. "24:3,5,8,1").
#pragma once
#include <algorithm>
#include <string>
#include <vector>

#include "rl/common.h"
#include "rl/tasks/reward_text.h"

namespace fp8rl {

struct CountdownProblem {
    int64_t target = 0;
    std::vector<int64_t> numbers;
};

// Numbers up to 10^6 and at most 6 of them keep every intermediate value of any expression
// within the 128-bit rationals the evaluator uses.
constexpr int64_t countdown_max_number = 1000000;
constexpr size_t countdown_max_numbers = 6;

// Parses "TARGET:N1,N2,..."; throws an Error saying what the answer should look like.
inline CountdownProblem parse_countdown_answer(const std::string& answer) {
    auto bad = [&]() {
        fail("countdown answer '%s': expected \"TARGET:N1,N2,...\" with 1 to %zu numbers in 0..%lld and an "
             "integer target, e.g. \"24:3,5,8,1\"",
             answer.c_str(), countdown_max_numbers, (long long)countdown_max_number);
    };
    auto parse_int = [&](const std::string& t, bool allow_sign) {
        size_t i = allow_sign && !t.empty() && t[0] == '-' ? 1 : 0;
        if (i == t.size() || t.size() - i > 10 || t.find_first_not_of("0123456789", i) != std::string::npos) bad();
        int64_t v = std::stoll(t.substr(i));
        return i ? -v : v;
    };
    size_t colon = answer.find(':');
    if (colon == std::string::npos) bad();
    CountdownProblem p;
    p.target = parse_int(answer.substr(0, colon), true);
    std::string rest = answer.substr(colon + 1);
    for (size_t i = 0;;) {
        size_t comma = rest.find(',', i);
        int64_t v = parse_int(rest.substr(i, comma == std::string::npos ? std::string::npos : comma - i), false);
        if (v > countdown_max_number) bad();
        p.numbers.push_back(v);
        if (comma == std::string::npos) break;
        i = comma + 1;
    }
    if (p.numbers.size() > countdown_max_numbers) bad();
    return p;
}

// An exact rational num/den (den > 0, reduced).
struct Rational {
    __int128 num = 0, den = 1;
};

inline __int128 gcd128(__int128 a, __int128 b) {
    if (a < 0) a = -a;
    while (b != 0) {
        __int128 t = a % b;
        a = b;
        b = t < 0 ? -t : t;
    }
    return a;
}

// a op b for op in "+-*/"; false on division by zero or 128-bit overflow.
inline bool rational_combine(char op, const Rational& a, const Rational& b, Rational* out) {
    __int128 n, d, t1, t2;
    switch (op) {
        case '+':
        case '-':
            if (__builtin_mul_overflow(a.num, b.den, &t1) || __builtin_mul_overflow(b.num, a.den, &t2) ||
                __builtin_mul_overflow(a.den, b.den, &d))
                return false;
            if (op == '+' ? __builtin_add_overflow(t1, t2, &n) : __builtin_sub_overflow(t1, t2, &n)) return false;
            break;
        case '*':
            if (__builtin_mul_overflow(a.num, b.num, &n) || __builtin_mul_overflow(a.den, b.den, &d)) return false;
            break;
        default:  // '/'
            if (b.num == 0) return false;
            if (__builtin_mul_overflow(a.num, b.den, &n) || __builtin_mul_overflow(a.den, b.num, &d)) return false;
            if (d < 0) n = -n, d = -d;
    }
    __int128 g = gcd128(n, d);
    out->num = n / g;
    out->den = d / g;
    return true;
}
// Recursive-descent parser and evaluator of the expression grammar above. Any syntax error,
// division by zero or overflow makes the expression invalid.
class CountdownExpression {
public:
    explicit CountdownExpression(const std::string& text) : s_(text) {}

    // False when the text is not a valid expression; else its value and the numbers it uses.
    bool evaluate(Rational* value, std::vector<int64_t>* numbers) {
        if (!expr(value) || (skip(), i_ != s_.size())) return false;
        *numbers = numbers_;
        return true;
    }

private:
    const std::string& s_;
    size_t i_ = 0;
    int depth_ = 0;
    std::vector<int64_t> numbers_;

    void skip() {
        while (i_ < s_.size() && s_[i_] == ' ') i_++;
    }
    bool peek(char c) {
        skip();
        return i_ < s_.size() && s_[i_] == c;
    }
    bool expr(Rational* v) {
        if (!term(v)) return false;
        while (peek('+') || peek('-')) {
            char op = s_[i_++];
            Rational r;
            if (!term(&r) || !rational_combine(op, *v, r, v)) return false;
        }
        return true;
    }
    bool term(Rational* v) {
        if (!factor(v)) return false;
        while (peek('*') || peek('/')) {
            char op = s_[i_++];
            if (peek('*') || peek('/')) return false;  // "**" and "//"
            Rational r;
            if (!factor(&r) || !rational_combine(op, *v, r, v)) return false;
        }
        return true;
    }
    bool factor(Rational* v) {
        if (peek('(')) {
            if (++depth_ > 64) return false;
            i_++;
            if (!expr(v) || !peek(')')) return false;
            i_++;
            depth_--;
            return true;
        }
        size_t b = i_;
        while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') i_++;
        size_t n = i_ - b;
        if (n == 0 || n > 18 || (n > 1 && s_[b] == '0')) return false;
        int64_t x = std::stoll(s_.substr(b, n));
        numbers_.push_back(x);
        v->num = x;
        v->den = 1;
        return true;
    }
};

// The last `<answer>(.*?)</answer>` with no newline inside (Python's '.'), stripped.
inline bool countdown_extract(const std::string& response, std::string* out) {
    bool found = false;
    for (size_t i = 0; (i = response.find("<answer>", i)) != std::string::npos;) {
        size_t body = i + 8, close = response.find("</answer>", body);
        if (close == std::string::npos) break;
        if (response.find('\n', body) < close) {
            i++;
            continue;
        }
        *out = py_strip(response.substr(body, close - body));
        found = true;
        i = close + 9;
    }
    return found;
}

inline Verdict countdown_verdict(const std::string& response, const std::string& answer) {
    CountdownProblem problem = parse_countdown_answer(answer);
    Verdict v;
    v.has_extracted = countdown_extract(response, &v.extracted);
    if (!v.has_extracted) return v;
    Rational value;
    std::vector<int64_t> used;
    std::vector<int64_t> given = problem.numbers;
    bool valid = CountdownExpression(v.extracted).evaluate(&value, &used);
    std::sort(used.begin(), used.end());
    std::sort(given.begin(), given.end());
    v.correct = valid && used == given && value.den == 1 && value.num == problem.target;
    v.reward = v.correct ? 1.0 : 0.1;
    return v;
}

}  // namespace fp8rl
