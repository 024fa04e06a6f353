// reward_text.h: the few Python string semantics the reward verifiers depend on, on UTF-8 text.
// The public verifiers (verl, lm-eval) are Python: they slice by code points ("the last 300
// characters"), strip Unicode whitespace and call str.isdigit(), which accepts non-ASCII digits.
// Matching them on adversarial text needs these exactly; everything else in the verifiers is
// byte-level and works on UTF-8 unchanged because every pattern they search for is ASCII.
#pragma once
#include <cstdint>
#include <string>

#include "rl/tasks/reward_digits.h"

namespace fp8rl {

// What a verifier says about one response: the reward, whether the answer counts as correct
// (reward can be partial or shaped), and the extracted answer (absent = nothing to extract).
struct Verdict {
    double reward = 0.0;
    bool correct = false;
    bool has_extracted = false;
    std::string extracted;
};

// Length in bytes of the UTF-8 sequence whose lead byte is c (1 for continuation/invalid bytes,
// which the JSON parser never lets through anyway).
inline size_t utf8_lead_length(unsigned char c) {
    if (c >= 0xF0 && c <= 0xF4) return 4;
    if (c >= 0xE0) return c <= 0xEF ? 3 : 1;
    if (c >= 0xC2) return 2;
    return 1;
}

// Code point starting at s[i] (s is valid UTF-8); *len gets its byte length.
inline uint32_t utf8_code_point_at(const std::string& s, size_t i, size_t* len) {
    size_t n = utf8_lead_length((unsigned char)s[i]);
    if (i + n > s.size()) n = 1;
    *len = n;
    uint32_t c = (unsigned char)s[i];
    if (n == 1) return c;
    c &= 0xFFu >> (n + 1);
    for (size_t k = 1; k < n; k++) c = (c << 6) | ((unsigned char)s[i + k] & 0x3F);
    return c;
}

// Python's s[-n:]: the last n code points.
inline std::string last_code_points(const std::string& s, size_t n) {
    size_t i = s.size();
    while (i > 0 && n > 0) {
        i--;
        if (((unsigned char)s[i] & 0xC0) != 0x80) n--;
    }
    return s.substr(i);
}

// Python's str.isspace() for one code point (also what `\s` matches in a str regex).
inline bool py_isspace(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

// Python's str.isdigit(): non-empty and every code point a Unicode digit (table: reward_digits.h).
inline bool py_isdigit(const std::string& s) {
    if (s.empty()) return false;
    for (size_t i = 0; i < s.size();) {
        size_t len;
        if (!unicode_is_digit(utf8_code_point_at(s, i, &len))) return false;
        i += len;
    }
    return true;
}

// Python's str.strip(): removes leading and trailing Unicode whitespace.
inline std::string py_strip(const std::string& s) {
    size_t b = 0, e = s.size();
    while (b < e) {
        size_t len;
        if (!py_isspace(utf8_code_point_at(s, b, &len))) break;
        b += len;
    }
    while (e > b) {
        size_t k = e - 1;
        while (k > b && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
        size_t len;
        if (!py_isspace(utf8_code_point_at(s, k, &len))) break;
        e = k;
    }
    return s.substr(b, e - b);
}

// Python's s.replace(from, to) (all non-overlapping occurrences, left to right).
inline std::string replace_all(const std::string& s, const std::string& from, const std::string& to) {
    std::string out;
    size_t i = 0;
    for (size_t j; (j = s.find(from, i)) != std::string::npos; i = j + from.size()) out += s.substr(i, j - i) + to;
    return out + s.substr(i);
}

inline bool starts_with(const std::string& s, size_t at, const char* prefix) {
    return s.compare(at, std::char_traits<char>::length(prefix), prefix) == 0;
}

}  // namespace fp8rl
