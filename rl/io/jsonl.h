// jsonl.h: the read loop of the JSON Lines modes (--score, --encode, --decode, --chat, --logprobs,
// --prompts), in one place so that every mode skips blank lines and numbers lines the same way.
// One output line per non-blank input line, in order; errors name "file:line".
#pragma once
#include <functional>
#include <string>

#include "rl/common.h"
#include "rl/io/json.h"

namespace fp8rl {

// Calls fn(line, "source:line") for every non-blank line and joins the output lines. Lines are
// counted from 1 including blank ones, so "source:line" is the line an editor shows; a trailing
// \r (CRLF files) is whitespace to json_parse, so it is left in.
inline std::string map_jsonl_lines(const std::string& text, const std::string& source,
                                   const std::function<std::string(const std::string&, const std::string&)>& fn) {
    std::string out;
    size_t line_no = 0;
    for (size_t i = 0; i < text.size();) {
        size_t nl = text.find('\n', i);
        std::string line = text.substr(i, nl == std::string::npos ? std::string::npos : nl - i);
        i = nl == std::string::npos ? text.size() : nl + 1;
        line_no++;
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        out += fn(line, strfmt("%s:%zu", source.c_str(), line_no)) + "\n";
    }
    return out;
}

// The same for modes whose every line is a JSON object: fn gets the parsed object.
inline std::string map_jsonl(const std::string& text, const std::string& source,
                             const std::function<std::string(const Json&, const std::string&)>& fn) {
    return map_jsonl_lines(text, source, [&](const std::string& line, const std::string& where) {
        Json row = json_parse(line, where);
        if (!row.is_object()) fail("%s: expected a JSON object", where.c_str());
        return fn(row, where);
    });
}

}  // namespace fp8rl
