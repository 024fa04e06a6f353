// reward_math.h: the MATH verifier (spec-rl.md §9.2) and the DAPO-Math verifier (§9.3).
//
// MATH ports verl's utils/reward_score/math_reward.py (Hendrycks' normalization from
// lm-evaluation-harness): the last \boxed{...} (brace-counted), strip_string on both sides,
// string equality; where a step of strip_string raises in Python (e.g. "\sqrt" at the end), the
// raw strings are compared, as verl does. fp8rl adds one rule (project choice): two answers that
// both read as exact numbers (integers, decimals, "1,000", \frac{a}{b}, with a leading '-') and
// have the same value are equal, so "18.0" = "18" and "0.25" = "\frac{1}{4}". Reward 1 or 0.
//
// DAPO ports verl's math_dapo.py: in the last 300 characters, the last `(?i)Answer\s*:\s*([^\n]+)`,
// normalize_final_answer on both sides, equality; with no "Answer:" line, the last \boxed{} of
// the last 100 characters, normalized. Reward +1 if correct, -1 otherwise.
#pragma once
#include <algorithm>
#include <string>
#include <vector>

#include "rl/tasks/reward_text.h"

namespace fp8rl {

// ---------------------------------------------------------------- MATH (Hendrycks / verl)

// A step of strip_string that raises in Python; is_equiv then compares the raw strings.
struct MathStripRaised {};

// Byte length of the code point at s[i] (Python indexes strings by code point).
inline size_t code_point_length(const std::string& s, size_t i) {
    size_t len;
    utf8_code_point_at(s, i, &len);
    return len;
}

inline size_t code_point_count(const std::string& s) {
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
}

inline std::vector<std::string> split_all(const std::string& s, const std::string& sep) {
    std::vector<std::string> parts;
    size_t i = 0;
    for (size_t j; (j = s.find(sep, i)) != std::string::npos; i = j + sep.size()) parts.push_back(s.substr(i, j - i));
    parts.push_back(s.substr(i));
    return parts;
}

// Brace-counted span from `idx` to the '}' that brings the count back to zero; npos if none.
inline size_t matching_brace_end(const std::string& s, size_t idx) {
    int open = 0;
    for (size_t i = idx; i < s.size(); i++) {
        if (s[i] == '{') open++;
        if (s[i] == '}' && --open == 0) return i;
    }
    return std::string::npos;
}

// verl math_reward.last_boxed_only_string followed by remove_boxed; false when Python returns
// None or remove_boxed's assertions fail (both give reward 0).
inline bool math_last_boxed_content(const std::string& s, std::string* content) {
    const std::string spaced = "\\boxed ";
    if (s.find(spaced) != std::string::npos) {
        std::string after = s.substr(s.rfind(spaced) + spaced.size());
        *content = after.substr(0, after.find('$'));
        return true;
    }
    size_t idx = s.rfind("\\boxed");
    if (idx == std::string::npos) idx = s.rfind("\\fbox");
    if (idx == std::string::npos) return false;
    size_t end = matching_brace_end(s, idx);
    if (end == std::string::npos) return false;
    std::string boxed = s.substr(idx, end + 1 - idx);
    if (!starts_with(boxed, 0, "\\boxed{")) return false;  // e.g. \fbox{...}: remove_boxed asserts
    *content = boxed.substr(7, boxed.size() - 8);
    return true;
}

inline std::string math_fix_sqrt(const std::string& s) {
    if (s.find("\\sqrt") == std::string::npos) return s;
    std::vector<std::string> parts = split_all(s, "\\sqrt");
    std::string out = parts[0];
    for (size_t k = 1; k < parts.size(); k++) {
        const std::string& p = parts[k];
        if (p.empty()) throw MathStripRaised();  // split[0] on an empty string
        if (p[0] != '{') {
            size_t n = code_point_length(p, 0);
            out += "\\sqrt{" + p.substr(0, n) + "}" + p.substr(n);
        } else {
            out += "\\sqrt" + p;
        }
    }
    return out;
}

inline std::string math_fix_fracs(const std::string& s) {
    std::vector<std::string> parts = split_all(s, "\\frac");
    std::string out = parts[0];
    for (size_t k = 1; k < parts.size(); k++) {
        const std::string& p = parts[k];
        out += "\\frac";
        if (p.empty()) throw MathStripRaised();  // substr[0] on an empty string
        if (p[0] == '{') {
            out += p;
            continue;
        }
        if (code_point_count(p) < 2) return s;
        size_t na = code_point_length(p, 0), nb = code_point_length(p, na);
        std::string a = p.substr(0, na), b = p.substr(na, nb), rest = p.substr(na + nb);
        out += b != "{" ? "{" + a + "}{" + b + "}" + rest : "{" + a + "}" + b + rest;
    }
    return out;
}

// Python's `"{}".format(int(x)) == x` for the digits we accept: -?(0|[1-9][0-9]*).
inline bool canonical_int(const std::string& x) {
    size_t i = !x.empty() && x[0] == '-' ? 1 : 0;
    if (i == x.size()) return false;
    if (x[i] == '0') return x.size() == i + 1 && i == 0;
    for (size_t k = i; k < x.size(); k++)
        if (x[k] < '0' || x[k] > '9') return false;
    return true;
}

inline std::string math_fix_a_slash_b(const std::string& s) {
    std::vector<std::string> parts = split_all(s, "/");
    if (parts.size() != 2 || !canonical_int(parts[0]) || !canonical_int(parts[1])) return s;
    return "\\frac{" + parts[0] + "}{" + parts[1] + "}";
}

// lm-eval's strip_string, step by step (spec-rl.md §9.2). Throws MathStripRaised where Python raises.
inline std::string math_strip_string(std::string s) {
    s = replace_all(s, "\n", "");
    s = replace_all(s, "\\!", "");
    s = replace_all(s, "\\\\", "\\");
    s = replace_all(replace_all(s, "tfrac", "frac"), "dfrac", "frac");
    s = replace_all(replace_all(s, "\\left", ""), "\\right", "");
    s = replace_all(replace_all(s, "^{\\circ}", ""), "^\\circ", "");
    s = replace_all(s, "\\$", "");
    if (s.find("\\text{ ") != std::string::npos) {  // units on the right
        std::vector<std::string> parts = split_all(s, "\\text{ ");
        if (parts.size() != 2) throw MathStripRaised();
        s = parts[0];
    }
    s = replace_all(replace_all(s, "\\\\%", ""), "\\%", "");
    s = replace_all(replace_all(s, " .", " 0."), "{.", "{0.");
    if (s.empty()) return s;
    if (s[0] == '.') s = "0" + s;
    std::vector<std::string> eq = split_all(s, "=");
    if (eq.size() == 2 && code_point_count(eq[0]) <= 2) s = eq[1];
    s = math_fix_sqrt(s);
    s = replace_all(s, " ", "");
    s = math_fix_fracs(s);
    if (s == "0.5") s = "\\frac{1}{2}";
    return math_fix_a_slash_b(s);
}

// An exact decimal: digits of |value| * 10^scale, and the sign.
struct ExactDecimal {
    bool negative = false;
    std::string digits;  // no leading zeros; "" is zero
    size_t scale = 0;
};

// Unsigned `[0-9]+(\.[0-9]+)?` or `[0-9]{1,3}(,[0-9]{3})+`.
inline bool parse_unsigned_decimal(const std::string& s, ExactDecimal* out) {
    auto all_digits = [](const std::string& t) {
        return !t.empty() && t.find_first_not_of("0123456789") == std::string::npos;
    };
    std::string digits;
    size_t scale = 0;
    if (s.find(',') != std::string::npos) {
        std::vector<std::string> groups = split_all(s, ",");
        for (size_t k = 0; k < groups.size(); k++) {
            if (!all_digits(groups[k]) || groups[k].size() > 3 || (k > 0 && groups[k].size() != 3)) return false;
            digits += groups[k];
        }
    } else {
        size_t dot = s.find('.');
        std::string whole = s.substr(0, dot), frac = dot == std::string::npos ? "" : s.substr(dot + 1);
        if (!all_digits(whole) || (dot != std::string::npos && !all_digits(frac))) return false;
        digits = whole + frac;
        scale = frac.size();
    }
    digits.erase(0, std::min(digits.find_first_not_of('0'), digits.size()));
    out->digits = digits;
    out->scale = scale;
    return true;
}

// Product of two digit strings (schoolbook; answers are short).
inline std::string multiply_digits(const std::string& a, const std::string& b) {
    if (a.empty() || b.empty()) return "";
    std::vector<int> acc(a.size() + b.size(), 0);
    for (size_t i = a.size(); i-- > 0;)
        for (size_t j = b.size(); j-- > 0;) {
            int v = acc[i + j + 1] + (a[i] - '0') * (b[j] - '0');
            acc[i + j + 1] = v % 10;
            acc[i + j] += v / 10;
        }
    std::string out;
    for (int d : acc)
        if (!out.empty() || d != 0) out += (char)('0' + d);
    return out;
}

// A number as an exact fraction p/q of decimals: `-?N` or `-?\frac{N}{N}` or `\frac{-N}{N}`.
struct ExactFraction {
    bool negative = false;
    ExactDecimal p, q;
};

inline bool parse_exact_number(const std::string& s, ExactFraction* out) {
    if (s.size() > 400) return false;  // keeps the schoolbook product cheap
    size_t i = !s.empty() && s[0] == '-' ? 1 : 0;
    out->negative = i == 1;
    out->q.digits = "1";
    if (!starts_with(s, i, "\\frac{")) return parse_unsigned_decimal(s.substr(i), &out->p);
    size_t mid = s.find("}{", i);
    if (mid == std::string::npos || s.back() != '}') return false;
    std::string num = s.substr(i + 6, mid - i - 6), den = s.substr(mid + 2, s.size() - mid - 3);
    if (i == 0 && !num.empty() && num[0] == '-') {
        out->negative = true;
        num = num.substr(1);
    }
    return parse_unsigned_decimal(num, &out->p) && parse_unsigned_decimal(den, &out->q) && !out->q.digits.empty();
}

// p1/q1 == p2/q2 exactly, by cross multiplication brought to a common power of ten.
inline bool exact_numbers_equal(const ExactFraction& x, const ExactFraction& y) {
    std::string l = multiply_digits(x.p.digits, y.q.digits), r = multiply_digits(y.p.digits, x.q.digits);
    size_t ls = x.p.scale + y.q.scale, rs = y.p.scale + x.q.scale;
    if (l.empty() || r.empty()) return l.empty() && r.empty();
    if (x.negative != y.negative) return false;
    if (ls < rs) l.append(rs - ls, '0');
    if (rs < ls) r.append(ls - rs, '0');
    return l == r;
}

// is_equiv of lm-eval plus fp8rl's exact numeric equality.
inline bool math_equivalent(const std::string& a, const std::string& b) {
    std::string sa, sb;
    try {
        sa = math_strip_string(a);
        sb = math_strip_string(b);
    } catch (const MathStripRaised&) {
        return a == b;
    }
    if (sa == sb) return true;
    ExactFraction x, y;
    return parse_exact_number(sa, &x) && parse_exact_number(sb, &y) && exact_numbers_equal(x, y);
}

inline Verdict math_verdict(const std::string& response, const std::string& answer) {
    Verdict v;
    v.has_extracted = math_last_boxed_content(response, &v.extracted);
    v.correct = v.has_extracted && math_equivalent(v.extracted, answer);
    v.reward = v.correct ? 1.0 : 0.0;
    return v;
}

// ---------------------------------------------------------------- DAPO (Minerva / verl math_dapo)

// `(?i)answer`: ASCII case folding plus U+017F (long s), which Python's re folds to 's'.
inline size_t dapo_answer_word_at(const std::string& s, size_t i) {
    size_t j = i;
    for (const char* w = "answer"; *w; w++) {
        char c = j < s.size() ? s[j] : '\0';
        if (((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) && (c | 0x20) == *w) {
            j++;
        } else if (*w == 's' && starts_with(s, j, "\xC5\xBF")) {
            j += 2;
        } else {
            return 0;
        }
    }
    return j - i;
}

inline size_t skip_py_space(const std::string& s, size_t i) {
    while (i < s.size()) {
        size_t len;
        if (!py_isspace(utf8_code_point_at(s, i, &len))) break;
        i += len;
    }
    return i;
}

// The match of `(?i)Answer\s*:\s*([^\n]+)` at s[i]: false if none; else the capture span
// [*cb, *ce). The greedy \s* after ':' may cross newlines. If it runs to the end of the text,
// Python backtracks code point by code point until [^\n] can match: the capture is then the last
// whitespace character of the run that is not a newline, alone.
inline bool dapo_answer_match_at(const std::string& s, size_t i, size_t* cb, size_t* ce) {
    size_t n = dapo_answer_word_at(s, i);
    if (n == 0) return false;
    size_t j = skip_py_space(s, i + n);
    if (j >= s.size() || s[j] != ':') return false;
    size_t start = j + 1, k = skip_py_space(s, start);
    if (k < s.size()) {
        *cb = k;
        *ce = std::min(s.find('\n', k), s.size());
        return true;
    }
    for (size_t q = s.size(); q > start;) {
        size_t end = q;
        q--;
        while (q > start && ((unsigned char)s[q] & 0xC0) == 0x80) q--;
        if (s[q] != '\n') {
            *cb = q;
            *ce = end;
            return true;
        }
    }
    return false;
}

// Python's re.findall of the Minerva pattern: the last capture, or "[INVALID]".
inline std::string dapo_extract_answer(const std::string& s) {
    std::string last = "[INVALID]";
    for (size_t i = 0; i < s.size();) {
        size_t cb, ce;
        if (!dapo_answer_match_at(s, i, &cb, &ce)) {
            i++;
            continue;
        }
        last = s.substr(cb, ce - cb);
        i = ce;
    }
    return last;
}

// re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", s): per line, a line holding two '$' becomes
// "$" + the text between its first two '$' + "$" ('.' does not cross newlines).
inline std::string dapo_keep_first_math(const std::string& s) {
    std::vector<std::string> lines = split_all(s, "\n");
    std::string out;
    for (size_t k = 0; k < lines.size(); k++) {
        const std::string& line = lines[k];
        size_t a = line.find('$'), b = a == std::string::npos ? a : line.find('$', a + 1);
        out += b == std::string::npos ? line : "$" + line.substr(a + 1, b - a - 1) + "$";
        if (k + 1 < lines.size()) out += "\n";
    }
    return out;
}

// re.sub(r"(PREFIX)(.*?)(\})", "\\2", s) (lazy: up to the first '}' on the same line), or with
// greedy = true re.sub(r"(PREFIX)(.*)(\})", ...) (up to the last '}' on the same line).
inline std::string dapo_unwrap(const std::string& s, const std::string& prefix, bool greedy) {
    std::string out;
    size_t i = 0;
    while (i < s.size()) {
        size_t at = s.find(prefix, i);
        if (at == std::string::npos) break;
        size_t body = at + prefix.size();
        size_t eol = std::min(s.find('\n', body), s.size());
        size_t close = greedy ? s.rfind('}', eol == 0 ? 0 : eol - 1) : s.find('}', body);
        if (close == std::string::npos || close < body || close >= eol) {
            out += s.substr(i, at + 1 - i);
            i = at + 1;
            continue;
        }
        out += s.substr(i, at - i) + s.substr(body, close - body);
        i = close + 1;
    }
    return out + s.substr(std::min(i, s.size()));
}

// re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", s) and re.sub(r"(sqrt)([^{])", "sqrt{\\2}", s).
inline std::string dapo_brace_shorthand(const std::string& s, const char* word, int args) {
    std::string out;
    size_t w = std::char_traits<char>::length(word), i = 0;
    while (i < s.size()) {
        size_t at = s.find(word, i);
        if (at == std::string::npos) break;
        size_t a = at + w;
        bool ok = a < s.size() && s[a] != '{';
        size_t na = ok ? code_point_length(s, a) : 0, b = a + na;
        if (ok && args == 2) ok = b < s.size() && s[b] != '\n';
        if (!ok) {
            out += s.substr(i, at + 1 - i);
            i = at + 1;
            continue;
        }
        out += s.substr(i, at - i) + word + "{" + s.substr(a, na) + "}";
        i = b;
        if (args == 2) {
            size_t nb = code_point_length(s, b);
            out += "{" + s.substr(b, nb) + "}";
            i = b + nb;
        }
    }
    return out + s.substr(std::min(i, s.size()));
}

// verl math_dapo.normalize_final_answer.
inline std::string dapo_normalize(const std::string& answer) {
    static const char* const substitutions[][2] = {
        {"an ", ""}, {"a ", ""}, {".$", "$"}, {"\\$", ""}, {"\\ ", ""}, {" ", ""}, {"mbox", "text"},
        {",\\text{and}", ","}, {"\\text{and}", ","}, {"\\text{m}", "\\text{}"},
    };
    static const char* const removed[] = {
        "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
        "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
        "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
        "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;",
        ",\\!", "{,}", "\"", "\\dots",
    };
    std::string s = split_all(answer, "=").back();
    for (const auto& sub : substitutions) s = replace_all(s, sub[0], sub[1]);
    for (const char* r : removed) s = replace_all(s, r, "");
    s = dapo_keep_first_math(s);
    s = dapo_unwrap(s, "\\text{", false);
    s = dapo_unwrap(s, "\\textbf{", false);
    s = dapo_unwrap(s, "\\overline{", false);
    s = dapo_unwrap(s, "\\boxed{", true);
    s = dapo_brace_shorthand(s, "frac", 2);
    s = dapo_brace_shorthand(s, "sqrt", 1);
    s = replace_all(s, "$", "");
    if (py_isdigit(replace_all(s, ",", ""))) s = replace_all(s, ",", "");
    return py_strip(s);
}

// math_dapo's last_boxed_only_string + remove_boxed (searches "\boxed{" only).
inline bool dapo_last_boxed_content(const std::string& s, std::string* content) {
    size_t idx = s.rfind("\\boxed{");
    if (idx == std::string::npos) return false;
    size_t end = matching_brace_end(s, idx);
    if (end == std::string::npos) return false;
    *content = s.substr(idx + 7, end - idx - 7);
    return true;
}

inline Verdict dapo_verdict(const std::string& response, const std::string& answer) {
    std::string tail = last_code_points(response, 300);
    Verdict v;
    v.extracted = dapo_normalize(dapo_extract_answer(tail));
    v.correct = v.extracted == dapo_normalize(answer);
    std::string boxed;
    if (v.extracted == "[INVALID]" && dapo_last_boxed_content(last_code_points(tail, 100), &boxed)) {
        v.extracted = dapo_normalize(boxed);
        v.correct = v.extracted == dapo_normalize(answer);
    }
    v.has_extracted = v.extracted != "[INVALID]";
    v.reward = v.correct ? 1.0 : -1.0;
    return v;
}

}  // namespace fp8rl
