// score.h: the --score mode. Reads JSON Lines {"task": ..., "response": ..., "answer": ...} and
// writes one {"reward": ..., "extracted": ...} per line (extracted is null when the verifier
// found no answer), so users can check a verifier on their own model outputs. A bad line is an
// Error naming file:line.
#pragma once
#include <charconv>
#include <string>

#include "rl/common.h"
#include "rl/io/json.h"
#include "rl/io/jsonl.h"
#include "rl/tasks/reward.h"

namespace fp8rl {

// Shortest decimal that reads back as the same double.
inline std::string format_double(double x) {
    char buf[32];
    auto res = std::to_chars(buf, buf + sizeof buf, x);
    return std::string(buf, res.ptr);
}

inline const std::string& score_field(const Json& row, const char* key, const std::string& where) {
    const Json* v = row.find(key);
    if (!v) fail("%s: missing \"%s\"; each line must be {\"task\":...,\"response\":...,\"answer\":...}", where.c_str(), key);
    if (!v->is_string()) fail("%s: \"%s\" must be a string, got %s", where.c_str(), key, json_type_name(v->type));
    return v->str;
}

// One output line for one input line (without the newline).
inline std::string score_line(const std::string& line, const std::string& where) {
    Json row = json_parse(line, where);
    if (!row.is_object()) fail("%s: expected a JSON object, got %s", where.c_str(), json_type_name(row.type));
    const std::string& task = score_field(row, "task", where);
    const std::string& response = score_field(row, "response", where);
    const std::string& answer = score_field(row, "answer", where);
    Verdict v;
    try {
        v = score_response(task, response, answer);
    } catch (const Error& e) {
        if (std::string(e.what()).rfind(where, 0) == 0) throw;
        fail("%s: %s", where.c_str(), e.what());
    }
    std::string out = "{\"reward\":" + format_double(v.reward) + ",\"extracted\":";
    if (v.has_extracted) json_append_string(out, v.extracted);
    else out += "null";
    return out + "}";
}

// The whole --score output for the text of a JSONL file named `source`; blank lines are skipped.
inline std::string score_jsonl(const std::string& text, const std::string& source) {
    return map_jsonl_lines(text, source, score_line);
}

}  // namespace fp8rl
