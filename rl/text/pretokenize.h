// pretokenize.h: the Split regexes of byte-level BPE tokenizers, implemented natively (no regex
// library) as hand-written matchers over the character classes of rl/text/unicode.h.
//
// The three patterns fp8rl knows (exact strings from tokenizer.json, after JSON unescaping):
//   Qwen2/2.5/3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   Llama-3:     the same with \p{N}{1,3} in place of \p{N}
//   GPT-2 (ByteLevel use_regex): 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// Semantics are Oniguruma's (what HF tokenizers runs): leftmost-first alternation with
// backtracking, matches found left to right; each match is one pre-token ("Isolated"), and text
// between matches (none, for these patterns) would be a pre-token too.
#pragma once
#include <string>
#include <vector>

#include "rl/common.h"
#include "rl/text/unicode.h"

namespace fp8rl {

enum class SplitPattern { Qwen, Llama3, Gpt2 };

inline const char* split_pattern_qwen() {
    return "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
}
inline const char* split_pattern_llama3() {
    return "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
}
inline const char* split_pattern_gpt2() {
    return "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
}

// Which native matcher implements a regex from tokenizer.json; an unknown one is an error.
inline SplitPattern split_pattern_from_regex(const std::string& regex, const std::string& where) {
    if (regex == split_pattern_qwen()) return SplitPattern::Qwen;
    if (regex == split_pattern_llama3()) return SplitPattern::Llama3;
    if (regex == split_pattern_gpt2()) return SplitPattern::Gpt2;
    fail("%s: Split regex \"%s\" is not one fp8rl implements (it knows the Qwen2/Qwen3, Llama-3 and GPT-2 "
         "patterns); use a tokenizer.json with one of those",
         where.c_str(), regex.c_str());
}

// Text decoded once into code points with their classes and byte offsets.
struct CodePoints {
    std::vector<uint32_t> cp;      // [n]
    std::vector<uint8_t> cls;      // [n] UnicodeClass
    std::vector<uint32_t> offset;  // [n + 1] byte offset of each code point in the UTF-8 text

    explicit CodePoints(const std::string& text) {
        cp.reserve(text.size());
        cls.reserve(text.size());
        offset.reserve(text.size() + 1);
        for (size_t i = 0; i < text.size();) {
            offset.push_back((uint32_t)i);
            uint32_t c = utf8_next(text, i);
            cp.push_back(c);
            cls.push_back(unicode_class(c));
        }
        offset.push_back((uint32_t)text.size());
    }
    size_t size() const { return cp.size(); }
};

class SplitMatcher {
public:
    SplitMatcher(const CodePoints& t, SplitPattern p) : t_(t), p_(p), n_(t.size()) {}

    // Length in code points of the match starting at i (> 0 for these patterns at any i < n).
    size_t match(size_t i) const {
        if (size_t m = contraction(i)) return m;
        if (size_t m = letters(i)) return m;
        if (size_t m = numbers(i)) return m;
        if (size_t m = others(i)) return m;
        if (p_ != SplitPattern::Gpt2)
            if (size_t m = space_then_newlines(i)) return m;
        return spaces(i);
    }

private:
    const CodePoints& t_;
    SplitPattern p_;
    size_t n_;

    bool is(size_t i, UnicodeClass c) const { return i < n_ && t_.cls[i] == c; }
    bool is_newline(size_t i) const { return i < n_ && (t_.cp[i] == '\r' || t_.cp[i] == '\n'); }
    size_t run(size_t i, UnicodeClass c) const {
        size_t j = i;
        while (is(j, c)) j++;
        return j - i;
    }

    // Letter of a contraction suffix: ASCII case-insensitively for Qwen/Llama-3's (?i:...), exactly
    // for GPT-2. (HF's Oniguruma does not fold U+017F LONG S to 's' here; the fixtures check it.)
    bool letter_is(size_t i, char lower) const {
        if (i >= n_) return false;
        uint32_t c = t_.cp[i];
        return c == (uint32_t)lower || (p_ != SplitPattern::Gpt2 && c == (uint32_t)(lower - 'a' + 'A'));
    }

    // '(s|t|re|ve|m|ll|d)
    size_t contraction(size_t i) const {
        if (i >= n_ || t_.cp[i] != '\'') return 0;
        if (letter_is(i + 1, 's') || letter_is(i + 1, 't') || letter_is(i + 1, 'm') || letter_is(i + 1, 'd')) return 2;
        if ((letter_is(i + 1, 'r') || letter_is(i + 1, 'v')) && letter_is(i + 2, 'e')) return 3;
        if (letter_is(i + 1, 'l') && letter_is(i + 2, 'l')) return 3;
        return 0;
    }

    // Qwen/Llama-3: [^\r\n\p{L}\p{N}]?\p{L}+    GPT-2: ' '?\p{L}+
    size_t letters(size_t i) const {
        if (is(i, UC_LETTER)) return run(i, UC_LETTER);
        bool prefix = p_ == SplitPattern::Gpt2 ? (i < n_ && t_.cp[i] == ' ')
                                               : (i < n_ && !is_newline(i) && !is(i, UC_NUMBER));
        if (prefix && is(i + 1, UC_LETTER)) return 1 + run(i + 1, UC_LETTER);
        return 0;
    }

    // Qwen: \p{N}   Llama-3: \p{N}{1,3}   GPT-2: ' '?\p{N}+
    size_t numbers(size_t i) const {
        size_t digits = run(i, UC_NUMBER);
        if (p_ == SplitPattern::Qwen) return digits ? 1 : 0;
        if (p_ == SplitPattern::Llama3) return digits < 3 ? digits : 3;
        if (digits) return digits;
        if (i < n_ && t_.cp[i] == ' ' && is(i + 1, UC_NUMBER)) return 1 + run(i + 1, UC_NUMBER);
        return 0;
    }

    // ' '?[^\s\p{L}\p{N}]+ followed, for Qwen/Llama-3, by [\r\n]*
    size_t others(size_t i) const {
        size_t j = i;
        if (j < n_ && t_.cp[j] == ' ' && is(j + 1, UC_OTHER)) j++;
        size_t k = j + run(j, UC_OTHER);
        if (k == j) return 0;
        if (p_ != SplitPattern::Gpt2)
            while (is_newline(k)) k++;
        return k - i;
    }

    // \s*[\r\n]+ : the whitespace run up to and including its last CR or LF
    size_t space_then_newlines(size_t i) const {
        size_t end = i + run(i, UC_SPACE);
        for (size_t k = end; k > i; k--)
            if (is_newline(k - 1)) return k - i;
        return 0;
    }

    // \s+(?!\S) then \s+ : a whitespace run leaves its last character to the next non-space
    size_t spaces(size_t i) const {
        size_t len = run(i, UC_SPACE);
        if (len >= 2 && i + len < n_) return len - 1;
        return len;
    }
};

// Splits text into pre-tokens (byte ranges of text). Every byte ends up in exactly one piece.
inline void split_pretokens(const std::string& text, SplitPattern p, std::vector<std::string>& out) {
    CodePoints t(text);
    SplitMatcher m(t, p);
    for (size_t i = 0; i < t.size();) {
        size_t len = m.match(i);
        if (len == 0) len = 1;  // cannot happen with these patterns; never loop forever
        out.push_back(text.substr(t.offset[i], t.offset[i + len] - t.offset[i]));
        i += len;
    }
}

}  // namespace fp8rl
