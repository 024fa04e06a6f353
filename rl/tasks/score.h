// score.h: the scorer the flags name, and the --score mode. --score reads JSON Lines {"task": ...,
// "response": ..., "answer": ...} and writes one {"reward": ..., "extracted": ...} per line
// (extracted is null when the verifier found no answer), so users can check a verifier on their own
// model outputs. With --reward_cmd or --reward_url the lines go to that scorer as training sends
// them (a line may also give "prompt", "data", "id", "step", "sample"; "task" defaults to --task,
// "answer" to null) and each output line adds "correct" (and "metrics" when the scorer gave some).
// A bad line is an Error naming file:line.
#pragma once
#include <charconv>
#include <memory>
#include <string>
#include <vector>

#include "rl/common.h"
#include "rl/io/json.h"
#include "rl/io/jsonl.h"
#include "rl/tasks/reward.h"
#include "rl/tasks/reward_http.h"
#include "rl/tasks/reward_workers.h"
#include "rl/tasks/scorer.h"

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

// The whole --score output for the text of a JSONL file named `source` with the built-in verifiers;
// blank lines are skipped.
inline std::string score_jsonl(const std::string& text, const std::string& source) {
    return map_jsonl_lines(text, source, score_line);
}

// The scorer the flags name.
inline std::unique_ptr<Scorer> make_scorer(const RewardConfig& c) {
    if (!c.cmd.empty() && !c.url.empty()) fail("give at most one of --reward_cmd and --reward_url");
    if (!c.cmd.empty()) return std::make_unique<RewardWorkers>(c);
    if (!c.url.empty()) return std::make_unique<RewardHttp>(c);
    return std::make_unique<BuiltinScorer>();
}

// One --score line as the request training would send; `index` is its id unless it gives one.
inline ScoreRequest score_request_of_line(const std::string& line, const std::string& where, const std::string& task, int64_t index) {
    Json row = json_parse(line, where);
    if (!row.is_object()) fail("%s: expected a JSON object, got %s", where.c_str(), json_type_name(row.type));
    auto string_or = [&](const char* key, const std::string& fallback) {
        const Json* v = row.find(key);
        if (!v) return fallback;
        if (!v->is_string()) fail("%s: \"%s\" must be a string, got %s", where.c_str(), key, json_type_name(v->type));
        return v->str;
    };
    auto int_or = [&](const char* key, int64_t fallback) {
        const Json* v = row.find(key);
        if (!v) return fallback;
        if (!v->is_int()) fail("%s: \"%s\" must be an integer, got %s", where.c_str(), key, json_type_name(v->type));
        return v->integer;
    };
    ScoreRequest r;
    r.id = int_or("id", index);
    r.task = string_or("task", task);
    r.prompt = string_or("prompt", "");
    r.response = score_field(row, "response", where);
    const Json* answer = row.find("answer");
    r.has_answer = answer && !answer->is_null();
    if (r.has_answer) r.answer = score_field(row, "answer", where);
    if (const Json* data = row.find("data")) {
        if (!data->is_object()) fail("%s: \"data\" must be an object, got %s", where.c_str(), json_type_name(data->type));
        r.data = json_dump(*data);
    }
    r.step = int_or("step", 0);
    r.sample = int_or("sample", 0);
    return r;
}

// The --score output with an external scorer: every line is one request of one batch.
inline std::string score_jsonl_external(const std::string& text, const std::string& source, Scorer& scorer, const std::string& task) {
    std::vector<ScoreRequest> requests;
    map_jsonl_lines(text, source, [&](const std::string& line, const std::string& where) {
        requests.push_back(score_request_of_line(line, where, task, (int64_t)requests.size()));
        return std::string();
    });
    std::vector<ScoreResult> results = scorer.score(requests);
    std::string out;
    for (const ScoreResult& r : results) {
        out += "{\"reward\":" + format_double(r.verdict.reward) + ",\"extracted\":";
        if (r.verdict.has_extracted) json_append_string(out, r.verdict.extracted);
        else out += "null";
        out += strfmt(",\"correct\":%d", r.verdict.correct ? 1 : 0);
        if (r.timed_out) out += ",\"timed_out\":true";
        if (!r.metrics.empty()) {
            out += ",\"metrics\":{";
            for (size_t i = 0; i < r.metrics.size(); i++) {
                if (i) out += ",";
                json_append_string(out, r.metrics[i].first);
                out += ":" + format_double(r.metrics[i].second);
            }
            out += "}";
        }
        out += "}\n";
    }
    return out;
}

}  // namespace fp8rl
