// json.h: a strict RFC 8259 JSON parser and the string escaper used by every JSON writer.
// Strict means: no comments, no trailing commas, no leading zeros, no NaN/Infinity, only valid
// UTF-8, no lone surrogates in \u escapes, no duplicate keys, bounded nesting. Errors name the
// source, line and column. Objects keep their key order (tokenizer.json relies on file order
// only through ids, but a writer that round-trips should not shuffle keys).
#pragma once
#include <charconv>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rl/common.h"

namespace fp8rl {

struct Json {
    enum Type { Null, Bool, Int, Double, String, Array, Object };
    Type type = Null;
    bool boolean = false;
    int64_t integer = 0;   // exact for integers in int64 range
    double number = 0.0;   // set for Int too, so as_double() works on both
    std::string str;
    std::vector<Json> items;                           // Array
    std::vector<std::pair<std::string, Json>> fields;  // Object, in file order

    bool is_null() const { return type == Null; }
    bool is_bool() const { return type == Bool; }
    bool is_int() const { return type == Int; }
    bool is_number() const { return type == Int || type == Double; }
    bool is_string() const { return type == String; }
    bool is_array() const { return type == Array; }
    bool is_object() const { return type == Object; }

    // Object member lookup; nullptr when absent (or when this is not an object).
    const Json* find(const std::string& key) const {
        if (type != Object) return nullptr;
        for (const auto& kv : fields)
            if (kv.first == key) return &kv.second;
        return nullptr;
    }
};

inline const char* json_type_name(Json::Type t) {
    switch (t) {
        case Json::Null: return "null";
        case Json::Bool: return "a boolean";
        case Json::Int: return "an integer";
        case Json::Double: return "a number";
        case Json::String: return "a string";
        case Json::Array: return "an array";
        case Json::Object: return "an object";
    }
    return "?";
}

class JsonParser {
public:
    static constexpr int max_depth = 512;

    JsonParser(const char* data, size_t size, std::string source)
        : p_(data), begin_(data), end_(data + size), source_(std::move(source)) {}

    Json parse_document() {
        Json v;
        skip_ws();
        parse_value(v, 0);
        skip_ws();
        if (p_ != end_) error("unexpected data after the JSON value");
        return v;
    }

private:
    const char* p_;
    const char* begin_;
    const char* end_;
    std::string source_;

    [[noreturn]] void error(const char* what) const {
        int line = 1, col = 1;
        for (const char* q = begin_; q < p_ && q < end_; q++) {
            if (*q == '\n') { line++; col = 1; } else if (((unsigned char)*q & 0xC0) != 0x80) col++;
        }
        fail("%s:%d:%d: invalid JSON: %s", source_.c_str(), line, col, what);
    }

    void skip_ws() {
        while (p_ < end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) p_++;
    }

    void expect_literal(const char* lit) {
        size_t n = strlen(lit);
        if ((size_t)(end_ - p_) < n || memcmp(p_, lit, n) != 0) error("unknown literal (expected true, false or null)");
        p_ += n;
    }

    void parse_value(Json& v, int depth) {
        if (p_ >= end_) error("unexpected end of input, expected a value");
        switch (*p_) {
            case '{': parse_object(v, depth + 1); return;
            case '[': parse_array(v, depth + 1); return;
            case '"': v.type = Json::String; parse_string(v.str); return;
            case 't': expect_literal("true"); v.type = Json::Bool; v.boolean = true; return;
            case 'f': expect_literal("false"); v.type = Json::Bool; v.boolean = false; return;
            case 'n': expect_literal("null"); v.type = Json::Null; return;
            default:
                if (*p_ == '-' || (*p_ >= '0' && *p_ <= '9')) { parse_number(v); return; }
                error("unexpected character, expected a value");
        }
    }

    void parse_object(Json& v, int depth) {
        if (depth > max_depth) error("nesting deeper than 512 levels");
        v.type = Json::Object;
        p_++;  // '{'
        skip_ws();
        if (p_ < end_ && *p_ == '}') { p_++; return; }
        std::vector<const char*> key_pos;  // where each key starts, to point at a duplicate
        for (;;) {
            skip_ws();
            if (p_ >= end_ || *p_ != '"') error("expected a string key in object");
            key_pos.push_back(p_);
            std::string key;
            parse_string(key);
            skip_ws();
            if (p_ >= end_ || *p_ != ':') error("expected ':' after object key");
            p_++;
            skip_ws();
            v.fields.emplace_back(std::move(key), Json());
            parse_value(v.fields.back().second, depth);
            skip_ws();
            if (p_ < end_ && *p_ == ',') { p_++; continue; }
            if (p_ < end_ && *p_ == '}') { p_++; check_duplicate_keys(v, key_pos); return; }
            error("expected ',' or '}' in object");
        }
    }

    // Checked once the object is complete, with a flat hash set of the keys (no copies, no
    // allocation per key): tokenizer.json has an object of 10^5 keys, and a node-based set of
    // key copies was most of its load time.
    void check_duplicate_keys(const Json& v, const std::vector<const char*>& key_pos) {
        size_t n = v.fields.size(), cap = 16;
        if (n < 2) return;
        while (cap < 2 * n) cap *= 2;
        std::vector<uint32_t> slots(cap, UINT32_MAX);  // field index + the empty marker
        for (uint32_t i = 0; i < n; i++) {
            const std::string& key = v.fields[i].first;
            size_t h = std::hash<std::string_view>()(key) & (cap - 1);
            for (; slots[h] != UINT32_MAX; h = (h + 1) & (cap - 1))
                if (v.fields[slots[h]].first == key) {
                    p_ = key_pos[i];
                    error(("duplicate key \"" + key + "\"").c_str());
                }
            slots[h] = i;
        }
    }

    void parse_array(Json& v, int depth) {
        if (depth > max_depth) error("nesting deeper than 512 levels");
        v.type = Json::Array;
        p_++;  // '['
        skip_ws();
        if (p_ < end_ && *p_ == ']') { p_++; return; }
        for (;;) {
            skip_ws();
            v.items.emplace_back();
            parse_value(v.items.back(), depth);
            skip_ws();
            if (p_ < end_ && *p_ == ',') { p_++; continue; }
            if (p_ < end_ && *p_ == ']') { p_++; return; }
            error("expected ',' or ']' in array");
        }
    }

    void parse_number(Json& v) {
        const char* start = p_;
        bool is_integer = true;
        if (p_ < end_ && *p_ == '-') p_++;
        if (p_ >= end_ || !(*p_ >= '0' && *p_ <= '9')) error("expected a digit in number");
        if (*p_ == '0') {
            p_++;
            if (p_ < end_ && *p_ >= '0' && *p_ <= '9') error("leading zeros are not allowed in numbers");
        } else {
            while (p_ < end_ && *p_ >= '0' && *p_ <= '9') p_++;
        }
        if (p_ < end_ && *p_ == '.') {
            is_integer = false;
            p_++;
            if (p_ >= end_ || !(*p_ >= '0' && *p_ <= '9')) error("expected a digit after '.'");
            while (p_ < end_ && *p_ >= '0' && *p_ <= '9') p_++;
        }
        if (p_ < end_ && (*p_ == 'e' || *p_ == 'E')) {
            is_integer = false;
            p_++;
            if (p_ < end_ && (*p_ == '+' || *p_ == '-')) p_++;
            if (p_ >= end_ || !(*p_ >= '0' && *p_ <= '9')) error("expected a digit in exponent");
            while (p_ < end_ && *p_ >= '0' && *p_ <= '9') p_++;
        }
        if (is_integer) {
            int64_t x = 0;
            auto r = std::from_chars(start, p_, x);
            if (r.ec == std::errc() && r.ptr == p_) {
                v.type = Json::Int;
                v.integer = x;
                v.number = (double)x;
                return;
            }
            // out of int64 range: fall through to a double, as most parsers do
        }
        double d = 0.0;
        auto r = std::from_chars(start, p_, d);
        if (r.ptr != p_) error("malformed number");
        if (r.ec == std::errc::result_out_of_range) {
            // overflow gives ±inf, underflow 0: JSON has no way to say either, so reject overflow only
            const char* digits = start + (*start == '-');
            bool huge = false;
            for (const char* q = digits; q < p_; q++) if (*q == 'e' || *q == 'E') { huge = q[1] != '-'; break; }
            if (huge || is_integer) error("number out of the range of a double");
            d = 0.0;
        }
        v.type = Json::Double;
        v.number = d;
    }

    unsigned parse_hex4() {
        if (end_ - p_ < 4) error("truncated \\u escape");
        unsigned u = 0;
        for (int i = 0; i < 4; i++) {
            char c = *p_++;
            u <<= 4;
            if (c >= '0' && c <= '9') u |= (unsigned)(c - '0');
            else if (c >= 'a' && c <= 'f') u |= (unsigned)(c - 'a' + 10);
            else if (c >= 'A' && c <= 'F') u |= (unsigned)(c - 'A' + 10);
            else { p_--; error("invalid hex digit in \\u escape"); }
        }
        return u;
    }

    static void append_utf8(std::string& out, unsigned cp) {
        if (cp < 0x80) out += (char)cp;
        else if (cp < 0x800) { out += (char)(0xC0 | (cp >> 6)); out += (char)(0x80 | (cp & 0x3F)); }
        else if (cp < 0x10000) {
            out += (char)(0xE0 | (cp >> 12)); out += (char)(0x80 | ((cp >> 6) & 0x3F)); out += (char)(0x80 | (cp & 0x3F));
        } else {
            out += (char)(0xF0 | (cp >> 18)); out += (char)(0x80 | ((cp >> 12) & 0x3F));
            out += (char)(0x80 | ((cp >> 6) & 0x3F)); out += (char)(0x80 | (cp & 0x3F));
        }
    }

    // Validates one UTF-8 sequence starting at p_ (a byte >= 0x80) and copies it.
    void copy_utf8_char(std::string& out) {
        const unsigned char* s = (const unsigned char*)p_;
        size_t avail = (size_t)(end_ - p_);
        unsigned c = s[0];
        size_t n;
        unsigned cp;
        if (c >= 0xC2 && c <= 0xDF) { n = 2; cp = c & 0x1F; }
        else if (c >= 0xE0 && c <= 0xEF) { n = 3; cp = c & 0x0F; }
        else if (c >= 0xF0 && c <= 0xF4) { n = 4; cp = c & 0x07; }
        else error("invalid UTF-8 byte in string");
        if (avail < n) error("truncated UTF-8 sequence in string");
        for (size_t i = 1; i < n; i++) {
            if ((s[i] & 0xC0) != 0x80) error("invalid UTF-8 continuation byte in string");
            cp = (cp << 6) | (s[i] & 0x3F);
        }
        if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF))) error("overlong or out-of-range UTF-8 in string");
        if (cp >= 0xD800 && cp <= 0xDFFF) error("UTF-8 encoded surrogate in string");
        out.append(p_, n);
        p_ += n;
    }

    void parse_string(std::string& out) {
        p_++;  // opening quote
        for (;;) {
            // copy a run of plain ASCII at once: this is where tokenizer.json spends its time
            const char* run = p_;
            while (p_ < end_ && *p_ != '"' && *p_ != '\\' && (unsigned char)*p_ >= 0x20 && (unsigned char)*p_ < 0x80) p_++;
            out.append(run, (size_t)(p_ - run));
            if (p_ >= end_) error("unterminated string");
            unsigned char c = (unsigned char)*p_;
            if (c == '"') { p_++; return; }
            if (c < 0x20) error("control character in string (must be escaped)");
            if (c >= 0x80) { copy_utf8_char(out); continue; }
            // backslash escape
            p_++;
            if (p_ >= end_) error("unterminated escape in string");
            char e = *p_++;
            switch (e) {
                case '"': out += '"'; break;
                case '\\': out += '\\'; break;
                case '/': out += '/'; break;
                case 'b': out += '\b'; break;
                case 'f': out += '\f'; break;
                case 'n': out += '\n'; break;
                case 'r': out += '\r'; break;
                case 't': out += '\t'; break;
                case 'u': {
                    unsigned u = parse_hex4();
                    if (u >= 0xDC00 && u <= 0xDFFF) error("lone low surrogate in \\u escape");
                    if (u >= 0xD800 && u <= 0xDBFF) {
                        if (end_ - p_ < 6 || p_[0] != '\\' || p_[1] != 'u') error("high surrogate not followed by a low surrogate");
                        p_ += 2;
                        unsigned lo = parse_hex4();
                        if (lo < 0xDC00 || lo > 0xDFFF) error("high surrogate not followed by a low surrogate");
                        u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
                    }
                    append_utf8(out, u);
                    break;
                }
                default: p_--; error("invalid escape character");
            }
        }
    }
};

// Parses a whole document; `source` names it in error messages (a file path, or "<stdin>:3").
inline Json json_parse(const std::string& text, const std::string& source) {
    return JsonParser(text.data(), text.size(), source).parse_document();
}

inline Json json_parse_file(const std::string& path) { return json_parse(read_file(path), path); }

// Appends s as a JSON string literal (quotes included). Input is assumed to be UTF-8; bytes that
// are not valid UTF-8 are written as U+FFFD so that the output is always valid JSON.
inline void json_append_string(std::string& out, const std::string& s) {
    out += '"';
    const unsigned char* p = (const unsigned char*)s.data();
    size_t n = s.size();
    for (size_t i = 0; i < n;) {
        unsigned char c = p[i];
        if (c == '"') { out += "\\\""; i++; }
        else if (c == '\\') { out += "\\\\"; i++; }
        else if (c == '\n') { out += "\\n"; i++; }
        else if (c == '\r') { out += "\\r"; i++; }
        else if (c == '\t') { out += "\\t"; i++; }
        else if (c < 0x20) { out += strfmt("\\u%04x", c); i++; }
        else if (c < 0x80) { out += (char)c; i++; }
        else {
            size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
            bool ok = len > 0 && c <= 0xF4 && i + len <= n;
            unsigned cp = len == 2 ? (c & 0x1Fu) : len == 3 ? (c & 0x0Fu) : (c & 0x07u);
            for (size_t k = 1; ok && k < len; k++) {
                if ((p[i + k] & 0xC0) != 0x80) ok = false;
                else cp = (cp << 6) | (p[i + k] & 0x3Fu);
            }
            if (ok && ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)))) ok = false;
            if (ok) { out.append((const char*)p + i, len); i += len; }
            else { out += "\xEF\xBF\xBD"; i++; }
        }
    }
    out += '"';
}

inline std::string json_quote(const std::string& s) {
    std::string out;
    json_append_string(out, s);
    return out;
}

// Writes a value as JSON text: objects in their stored key order, `indent` spaces per level
// (0 = one line). Doubles use the shortest text that reads back exactly and keep a '.' or an
// exponent, so a number that was a float in the source stays one.
inline void json_dump_to(std::string& out, const Json& v, int indent, int level = 0) {
    auto newline = [&](int lvl) {
        if (indent > 0) { out += '\n'; out.append((size_t)(indent * lvl), ' '); }
    };
    switch (v.type) {
        case Json::Null: out += "null"; return;
        case Json::Bool: out += v.boolean ? "true" : "false"; return;
        case Json::Int: out += std::to_string(v.integer); return;
        case Json::Double: {
            char buf[64];
            auto r = std::to_chars(buf, buf + sizeof buf, v.number);
            std::string num(buf, r.ptr);
            if (num.find_first_of(".eEn") == std::string::npos) num += ".0";
            out += num;
            return;
        }
        case Json::String: json_append_string(out, v.str); return;
        case Json::Array:
            out += '[';
            for (size_t i = 0; i < v.items.size(); i++) {
                if (i) out += ',';
                newline(level + 1);
                json_dump_to(out, v.items[i], indent, level + 1);
            }
            if (!v.items.empty()) newline(level);
            out += ']';
            return;
        case Json::Object:
            out += '{';
            for (size_t i = 0; i < v.fields.size(); i++) {
                if (i) out += ',';
                newline(level + 1);
                json_append_string(out, v.fields[i].first);
                out += indent > 0 ? ": " : ":";
                json_dump_to(out, v.fields[i].second, indent, level + 1);
            }
            if (!v.fields.empty()) newline(level);
            out += '}';
            return;
    }
}

inline std::string json_dump(const Json& v, int indent = 0) {
    std::string out;
    json_dump_to(out, v, indent);
    return out;
}

}  // namespace fp8rl
