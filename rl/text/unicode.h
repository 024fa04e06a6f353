// unicode.h: UTF-8 decoding and encoding, the character classes the pre-tokenizer regexes use
// (\p{L}, \p{N}, \s) and NFC normalization, all from the generated tables in unicode_tables.h.
//
// Invalid UTF-8 policy (the same everywhere in fp8rl): every maximal ill-formed subsequence is
// replaced by one U+FFFD, exactly as Python's bytes.decode("utf-8", "replace") and Rust's
// String::from_utf8_lossy do (Unicode "substitution of maximal subparts"). So encoding invalid
// bytes gives the ids HF tokenizers gives for their Python "replace" decoding, and decoding ids
// whose bytes are not valid UTF-8 gives HF's decode output.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "rl/text/unicode_tables.h"

namespace fp8rl {

constexpr uint32_t unicode_replacement = 0xFFFD;

// Length of the well-formed UTF-8 sequence at s[0..n), or 0 if it is not one. When it is not,
// *subpart gets the length of the maximal subpart (>= 1) that one U+FFFD replaces.
inline size_t utf8_sequence_length(const unsigned char* s, size_t n, size_t* subpart) {
    unsigned c = s[0];
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Unicode Table 3-7)
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
    else { *subpart = 1; return 0; }
    for (size_t k = 1; k < len; k++) {
        unsigned b = k < n ? s[k] : 0;
        bool ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
        if (k >= n || !ok) { *subpart = k; return 0; }
    }
    return len;
}

// Decodes the code point at s[i..n) and advances i; ill-formed input yields U+FFFD (see above).
inline uint32_t utf8_next(const std::string& s, size_t& i) {
    const unsigned char* p = (const unsigned char*)s.data() + i;
    size_t subpart = 0, len = utf8_sequence_length(p, s.size() - i, &subpart);
    if (len == 0) { i += subpart; return unicode_replacement; }
    i += len;
    if (len == 1) return p[0];
    if (len == 2) return ((p[0] & 0x1Fu) << 6) | (p[1] & 0x3Fu);
    if (len == 3) return ((p[0] & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
    return ((p[0] & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu);
}

inline void utf8_append(std::string& out, uint32_t cp) {
    if (cp < 0x80) out += (char)cp;
    else if (cp < 0x800) { out += (char)(0xC0 | (cp >> 6)); out += (char)(0x80 | (cp & 0x3F)); }
    else if (cp < 0x10000) {
        out += (char)(0xE0 | (cp >> 12)); out += (char)(0x80 | ((cp >> 6) & 0x3F)); out += (char)(0x80 | (cp & 0x3F));
    } else {
        out += (char)(0xF0 | (cp >> 18)); out += (char)(0x80 | ((cp >> 12) & 0x3F));
        out += (char)(0x80 | ((cp >> 6) & 0x3F)); out += (char)(0x80 | (cp & 0x3F));
    }
}

inline std::vector<uint32_t> utf8_decode(const std::string& s) {
    std::vector<uint32_t> cps;
    cps.reserve(s.size());
    for (size_t i = 0; i < s.size();) cps.push_back(utf8_next(s, i));
    return cps;
}

inline std::string utf8_encode(const std::vector<uint32_t>& cps) {
    std::string out;
    out.reserve(cps.size());
    for (uint32_t cp : cps) utf8_append(out, cp);
    return out;
}

// Lossy conversion of bytes to valid UTF-8 (the replacement policy above).
inline std::string utf8_sanitize(const std::string& s) {
    const unsigned char* p = (const unsigned char*)s.data();
    size_t i = 0, subpart = 0;
    while (i < s.size()) {  // fast path: most text is valid
        size_t len = utf8_sequence_length(p + i, s.size() - i, &subpart);
        if (len == 0) break;
        i += len;
    }
    if (i == s.size()) return s;
    return utf8_encode(utf8_decode(s));
}

// Number of bytes at the end of s that start a well-formed sequence not yet complete (0..3): a
// streaming decoder holds them back until the next bytes arrive.
inline size_t utf8_incomplete_tail(const std::string& s) {
    size_t n = s.size();
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        const unsigned char* p = (const unsigned char*)s.data() + n - back;
        if ((*p & 0xC0) == 0x80) continue;  // continuation byte: look further back
        size_t subpart = 0;
        bool lead = *p >= 0xC2 && *p <= 0xF4;  // starts a multi-byte sequence
        if (lead && utf8_sequence_length(p, back, &subpart) == 0 && subpart == back) return back;
        return 0;
    }
    return 0;
}

// ---- binary search over the generated range tables ----

template <size_t N>
inline uint8_t unicode_range_lookup(const UnicodeRange (&table)[N], uint32_t cp) {
    size_t lo = 0, hi = N;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (table[mid].hi < cp) lo = mid + 1;
        else hi = mid;
    }
    return lo < N && table[lo].lo <= cp ? table[lo].value : 0;
}

// A table for the Basic Multilingual Plane built once from a range table, so that the hot loop
// (classes and NFC checks of every character) is one load for all but supplementary characters.
template <size_t N>
inline std::vector<uint8_t> unicode_bmp_table(const UnicodeRange (&table)[N]) {
    std::vector<uint8_t> bmp(0x10000, 0);
    for (const UnicodeRange& r : table)
        for (uint32_t cp = r.lo; cp <= r.hi && cp < 0x10000; cp++) bmp[cp] = r.value;
    return bmp;
}

enum UnicodeClass : uint8_t { UC_OTHER = 0, UC_LETTER = 1, UC_NUMBER = 2, UC_SPACE = 3 };

// \p{L}, \p{N}, \s (White_Space) or none of them.
inline UnicodeClass unicode_class(uint32_t cp) {
    static const std::vector<uint8_t> bmp = unicode_bmp_table(unicode_class_ranges);
    return (UnicodeClass)(cp < 0x10000 ? bmp[cp] : unicode_range_lookup(unicode_class_ranges, cp));
}

inline uint8_t unicode_ccc(uint32_t cp) {
    static const std::vector<uint8_t> bmp = unicode_bmp_table(unicode_ccc_ranges);
    return cp < 0x10000 ? bmp[cp] : unicode_range_lookup(unicode_ccc_ranges, cp);
}

// 0 = Yes, 1 = No, 2 = Maybe.
inline uint8_t unicode_nfc_qc(uint32_t cp) {
    static const std::vector<uint8_t> bmp = unicode_bmp_table(unicode_nfc_qc_ranges);
    return cp < 0x10000 ? bmp[cp] : unicode_range_lookup(unicode_nfc_qc_ranges, cp);
}

// ---- NFC (Unicode Standard Annex #15) ----

namespace hangul {
constexpr uint32_t SBase = 0xAC00, LBase = 0x1100, VBase = 0x1161, TBase = 0x11A7;
constexpr uint32_t LCount = 19, VCount = 21, TCount = 28, NCount = VCount * TCount, SCount = LCount * NCount;
}  // namespace hangul

// NFC boundary: a character that never composes with or reorders across what precedes it, so
// NFC of a text is the concatenation of NFC of the pieces between boundaries.
inline bool nfc_boundary(uint32_t cp) { return cp < 0x300 || (unicode_ccc(cp) == 0 && unicode_nfc_qc(cp) == 0); }

// Index of the first character at or after `from` where the quick check does not answer Yes
// (NFC_QC No or Maybe, or combining marks out of canonical order), or cps.size().
inline size_t nfc_first_unstable(const std::vector<uint32_t>& cps, size_t from) {
    uint8_t last_ccc = 0;
    for (size_t i = from; i < cps.size(); i++) {
        uint32_t cp = cps[i];
        if (cp < 0x300) { last_ccc = 0; continue; }  // nothing below U+0300 combines or decomposes
        uint8_t ccc = unicode_ccc(cp);
        if ((ccc != 0 && last_ccc > ccc) || unicode_nfc_qc(cp) != 0) return i;
        last_ccc = ccc;
    }
    return cps.size();
}

inline void nfd_append(uint32_t cp, std::vector<uint32_t>& out) {
    using namespace hangul;
    if (cp >= SBase && cp < SBase + SCount) {
        uint32_t s = cp - SBase;
        out.push_back(LBase + s / NCount);
        out.push_back(VBase + (s % NCount) / TCount);
        if (s % TCount) out.push_back(TBase + s % TCount);
        return;
    }
    const UnicodeDecomposition* end = unicode_decompositions + sizeof unicode_decompositions / sizeof *unicode_decompositions;
    const UnicodeDecomposition* d = std::lower_bound(unicode_decompositions, end, cp,
                                                     [](const UnicodeDecomposition& e, uint32_t c) { return e.cp < c; });
    if (d == end || d->cp != cp) { out.push_back(cp); return; }
    nfd_append(d->first, out);
    if (d->second) nfd_append(d->second, out);
}

// Composite of the pair, or 0 when the pair does not compose.
inline uint32_t nfc_compose_pair(uint32_t a, uint32_t b) {
    using namespace hangul;
    if (a >= LBase && a < LBase + LCount && b >= VBase && b < VBase + VCount)
        return SBase + ((a - LBase) * VCount + (b - VBase)) * TCount;
    if (a >= SBase && a < SBase + SCount && (a - SBase) % TCount == 0 && b > TBase && b < TBase + TCount)
        return a + (b - TBase);
    const UnicodeComposition* end = unicode_compositions + sizeof unicode_compositions / sizeof *unicode_compositions;
    const UnicodeComposition* c = std::lower_bound(unicode_compositions, end, std::make_pair(a, b),
                                                   [](const UnicodeComposition& e, std::pair<uint32_t, uint32_t> k) {
                                                       return e.first != k.first ? e.first < k.first : e.second < k.second;
                                                   });
    return c != end && c->first == a && c->second == b ? c->composite : 0;
}

// Canonical decomposition followed by the canonical ordering of combining marks.
inline std::vector<uint32_t> nfd(const std::vector<uint32_t>& cps) {
    std::vector<uint32_t> d;
    d.reserve(cps.size() + 8);
    for (uint32_t cp : cps) nfd_append(cp, d);
    for (size_t i = 0; i < d.size();) {  // stable sort of each run of non-starters by ccc
        if (unicode_ccc(d[i]) == 0) { i++; continue; }
        size_t j = i;
        while (j < d.size() && unicode_ccc(d[j]) != 0) j++;
        std::stable_sort(d.begin() + (long)i, d.begin() + (long)j,
                         [](uint32_t a, uint32_t b) { return unicode_ccc(a) < unicode_ccc(b); });
        i = j;
    }
    return d;
}

// Canonical composition of a decomposed, reordered sequence.
inline std::vector<uint32_t> nfc_compose(const std::vector<uint32_t>& d) {
    std::vector<uint32_t> out;
    out.reserve(d.size());
    long starter = -1;  // index in out of the last starter that may still compose
    uint8_t last_ccc = 0;
    for (uint32_t cp : d) {
        uint8_t ccc = unicode_ccc(cp);
        bool blocked = !out.empty() && (long)out.size() - 1 != starter && (last_ccc == 0 || last_ccc >= ccc);
        if (starter >= 0 && !blocked) {
            uint32_t composite = nfc_compose_pair(out[(size_t)starter], cp);
            if (composite) { out[(size_t)starter] = composite; continue; }
        }
        if (ccc == 0) starter = (long)out.size();
        last_ccc = ccc;
        out.push_back(cp);
    }
    return out;
}

// NFC, normalizing only the pieces around characters that fail the quick check.
inline std::vector<uint32_t> nfc(const std::vector<uint32_t>& cps) {
    size_t n = cps.size(), i = 0, bad = nfc_first_unstable(cps, 0);
    if (bad == n) return cps;
    std::vector<uint32_t> out;
    out.reserve(n);
    while (bad < n) {
        size_t s = bad, e = bad + 1;
        while (s > i && !nfc_boundary(cps[s])) s--;
        while (e < n && !nfc_boundary(cps[e])) e++;
        out.insert(out.end(), cps.begin() + (long)i, cps.begin() + (long)s);
        std::vector<uint32_t> piece = nfc_compose(nfd(std::vector<uint32_t>(cps.begin() + (long)s, cps.begin() + (long)e)));
        out.insert(out.end(), piece.begin(), piece.end());
        i = e;
        bad = nfc_first_unstable(cps, i);
    }
    out.insert(out.end(), cps.begin() + (long)i, cps.end());
    return out;
}

// NFC of UTF-8 text (invalid bytes become U+FFFD first).
inline std::string nfc(const std::string& s) {
    std::vector<uint32_t> cps = utf8_decode(s);
    if (nfc_first_unstable(cps, 0) == cps.size()) return utf8_sanitize(s);
    return utf8_encode(nfc(cps));
}

}  // namespace fp8rl
