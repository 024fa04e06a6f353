// reward_gsm8k.h: the GSM8K verifier, a port of verl's utils/reward_score/gsm8k.py (spec-rl.md
// §9.1). Only the last 300 characters are searched. strict: the last match of
// `#### (\-?[0-9\.\,]+)` with ',' and '$' removed; flexible: the last match of `(\-?[0-9\.\,]+)`
// that is not "" or "." (as verl, if every match is invalid the first one is kept). The
// extracted string must equal the ground truth exactly: reward 1, otherwise 0.
#pragma once
#include <string>
#include <vector>

#include "rl/tasks/reward_text.h"

namespace fp8rl {

inline bool gsm8k_number_char(char c) { return (c >= '0' && c <= '9') || c == '.' || c == ','; }

// Length of the match of `\-?[0-9\.\,]+` at s[i], 0 when there is none.
inline size_t gsm8k_number_at(const std::string& s, size_t i) {
    size_t j = i;
    if (j < s.size() && s[j] == '-' && j + 1 < s.size() && gsm8k_number_char(s[j + 1])) j++;
    size_t k = j;
    while (k < s.size() && gsm8k_number_char(s[k])) k++;
    return k > j ? k - i : 0;
}

// All non-overlapping matches, left to right, as Python's re.findall; with `marker`, a match is
// the marker followed by a number and the number is what is returned.
inline std::vector<std::string> gsm8k_find_numbers(const std::string& s, const char* marker) {
    std::vector<std::string> found;
    size_t m = std::char_traits<char>::length(marker);
    for (size_t i = 0; i < s.size();) {
        size_t n = starts_with(s, i, marker) ? gsm8k_number_at(s, i + m) : 0;
        if (n == 0) {
            i++;
            continue;
        }
        found.push_back(s.substr(i + m, n));
        i += m + n;
    }
    return found;
}

inline Verdict gsm8k_verdict(const std::string& response, const std::string& answer, bool flexible) {
    std::string tail = last_code_points(response, 300);
    Verdict v;
    std::vector<std::string> found = gsm8k_find_numbers(tail, flexible ? "" : "#### ");
    if (found.empty()) return v;
    v.has_extracted = true;
    if (flexible) {
        v.extracted = found.front();
        for (size_t i = found.size(); i-- > 0;)
            if (found[i] != "" && found[i] != ".") {
                v.extracted = found[i];
                break;
            }
    } else {
        v.extracted = replace_all(replace_all(found.back(), ",", ""), "$", "");
    }
    v.correct = v.extracted == answer;
    v.reward = v.correct ? 1.0 : 0.0;
    return v;
}

}  // namespace fp8rl
