// args.h: the command line. One table of flags drives the parser, the validation of values, the
// --help text (which the README reproduces) and the config table printed at start, so the four
// cannot drift apart. Flags are long and take one value (`--group_size 8`); switches (`--info`)
// take none. Unknown flags, missing values and out-of-range values are errors naming the flag.
#pragma once
#include <cmath>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "rl/common.h"

namespace fp8rl {

enum class FlagKind { Switch, Int, Float, String, Choice };

struct FlagSpec {
    const char* name;       // without the leading "--"
    const char* group;      // heading in --help
    FlagKind kind;
    const char* default_value;  // "" = unset
    const char* choices;    // Choice: "a|b|c"; Int/Float: "min..max" (either side may be empty)
    const char* help;
};

// The single table of every flag of train_rl_cpu (and, later, train_rl).
inline const std::vector<FlagSpec>& flag_table() {
    static const std::vector<FlagSpec> table = {
        // what to do (at most one mode; none = train)
        {"help", "mode", FlagKind::Switch, "", "", "print this table and exit"},
        {"info", "mode", FlagKind::Switch, "", "", "load and validate --model, print architecture, shapes, parameter count and bytes"},
        {"encode", "mode", FlagKind::String, "", "", "JSONL {\"text\":...} -> {\"ids\":[...]} per line with --tokenizer ('-' = stdin)"},
        {"decode", "mode", FlagKind::String, "", "", "JSONL {\"ids\":[...]} -> {\"text\":...} per line with --tokenizer ('-' = stdin)"},
        {"chat", "mode", FlagKind::String, "", "", "JSONL {\"messages\":[...]} -> {\"ids\":[...]} rendered with the model's chat template"},
        {"logprobs", "mode", FlagKind::String, "", "", "JSONL {\"ids\":[...]} -> {\"logprobs\":[...],\"entropy\":[...]} for positions 1..n-1"},
        {"prompt", "mode", FlagKind::String, "", "", "generate a completion of this text and print it"},
        {"prompts", "mode", FlagKind::String, "", "", "JSONL {\"prompt\":...} (or {\"ids\":[...]}) -> one completion per line"},
        {"score", "mode", FlagKind::String, "", "", "JSONL {\"task\":...,\"response\":...,\"answer\":...} -> {\"reward\":...,\"extracted\":...}"},
        {"output", "mode", FlagKind::String, "-", "", "where the JSONL modes write ('-' = stdout)"},
        // model and tokenizer
        {"model", "model", FlagKind::String, "", "", "HF model directory (config.json, *.safetensors, tokenizer.json)"},
        {"tokenizer", "model", FlagKind::String, "", "", "tokenizer.json or a directory holding one (default: --model)"},
        {"enable_thinking", "model", FlagKind::Int, "1", "0..1", "Qwen3 chat template: 1 lets the model think, 0 adds the empty think block"},
        {"precision", "model", FlagKind::Choice, "fp32", "fp32|bf16|fp8", "precision of --logprobs and generation on the CPU engine"},
        // sampling
        {"temperature", "sampling", FlagKind::Float, "1.0", "0..100", "sampling temperature (0 = greedy)"},
        {"top_p", "sampling", FlagKind::Float, "1.0", "0..1", "nucleus sampling mass (1 = off)"},
        {"top_k", "sampling", FlagKind::Int, "0", "0..", "sample among the k most likely tokens (0 = off)"},
        {"max_new_tokens", "sampling", FlagKind::Int, "256", "1..", "generation budget per completion"},
        {"kv_cache", "sampling", FlagKind::Choice, "bf16", "fp32|bf16|fp8", "KV cache storage during generation (fp32 only on the CPU engine)"},
        {"seed", "run", FlagKind::Int, "1234", "0..", "seed of every random choice (sampling, data order, init)"},
        {"threads", "run", FlagKind::Int, "0", "0..", "OpenMP threads (0 = OMP_NUM_THREADS or all cores)"},
    };
    return table;
}

class Args {
public:
    // Parses argv against the table; throws Error naming the offending flag.
    static Args parse(int argc, char** argv) {
        Args a;
        for (const FlagSpec& f : flag_table()) a.values_[f.name] = f.default_value;
        for (int i = 1; i < argc; i++) {
            std::string tok = argv[i];
            if (tok.size() < 3 || tok.compare(0, 2, "--") != 0)
                fail("argument '%s': expected a flag like --name value; see --help", tok.c_str());
            std::string name = tok.substr(2);
            const FlagSpec* spec = find(name);
            if (!spec) fail("unknown flag --%s; see --help for the list of flags", name.c_str());
            if (a.given_.count(name)) fail("flag --%s given twice", name.c_str());
            a.given_[name] = true;
            if (spec->kind == FlagKind::Switch) { a.values_[name] = "1"; continue; }
            if (i + 1 >= argc) fail("flag --%s needs a value; see --help", name.c_str());
            std::string value = argv[++i];
            validate(*spec, value);
            a.values_[name] = value;
        }
        return a;
    }

    bool given(const std::string& name) const { return given_.count(check(name)) > 0; }
    const std::string& str(const std::string& name) const { return values_.at(check(name)); }
    int64_t integer(const std::string& name) const { return strtoll(str(name).c_str(), nullptr, 10); }
    double number(const std::string& name) const { return strtod(str(name).c_str(), nullptr); }
    bool flag(const std::string& name) const { return str(name) == "1"; }

    static const FlagSpec* find(const std::string& name) {
        for (const FlagSpec& f : flag_table())
            if (name == f.name) return &f;
        return nullptr;
    }

private:
    std::map<std::string, std::string> values_;
    std::map<std::string, bool> given_;

    static const std::string& check(const std::string& name) {
        if (!find(name)) fail("internal: flag --%s is not in the flag table", name.c_str());
        return name;
    }

    static void validate(const FlagSpec& f, const std::string& v) {
        std::string range = f.choices;
        if (f.kind == FlagKind::Choice) {
            std::string opts = "|" + range + "|";
            if (v.empty() || opts.find("|" + v + "|") == std::string::npos)
                fail("--%s %s: must be one of %s", f.name, v.c_str(), f.choices);
            return;
        }
        if (f.kind != FlagKind::Int && f.kind != FlagKind::Float) return;
        char* end = nullptr;
        double x;
        if (f.kind == FlagKind::Int) {
            errno = 0;
            long long n = strtoll(v.c_str(), &end, 10);
            if (v.empty() || *end != '\0' || errno == ERANGE) fail("--%s %s: expected an integer", f.name, v.c_str());
            x = (double)n;
        } else {
            x = strtod(v.c_str(), &end);
            if (v.empty() || *end != '\0' || !std::isfinite(x)) fail("--%s %s: expected a finite number", f.name, v.c_str());
        }
        size_t dots = range.find("..");
        if (dots == std::string::npos) return;
        std::string lo = range.substr(0, dots), hi = range.substr(dots + 2);
        if ((!lo.empty() && x < strtod(lo.c_str(), nullptr)) || (!hi.empty() && x > strtod(hi.c_str(), nullptr)))
            fail("--%s %s: out of range [%s, %s]", f.name, v.c_str(), lo.empty() ? "-inf" : lo.c_str(),
                 hi.empty() ? "inf" : hi.c_str());
    }
};

inline const char* flag_kind_name(FlagKind k) {
    switch (k) {
        case FlagKind::Switch: return "switch";
        case FlagKind::Int: return "int";
        case FlagKind::Float: return "float";
        case FlagKind::String: return "string";
        case FlagKind::Choice: return "choice";
    }
    return "?";
}

// The --help text: a Markdown table, pasted as is into the README's flag section.
inline std::string help_text() {
    std::string out = "| flag | type | default | values | meaning |\n|---|---|---|---|---|\n";
    std::string group;
    for (const FlagSpec& f : flag_table()) {
        if (group != f.group) {
            group = f.group;
            out += strfmt("| **%s** | | | | |\n", f.group);
        }
        std::string help = f.help;
        std::string escaped;
        for (char c : help) escaped += c == '|' ? std::string("\\|") : std::string(1, c);
        std::string choices;
        for (char c : std::string(f.choices)) choices += c == '|' ? std::string("\\|") : std::string(1, c);
        out += strfmt("| `--%s` | %s | %s | %s | %s |\n", f.name, flag_kind_name(f.kind), f.default_value, choices.c_str(),
                      escaped.c_str());
    }
    return out;
}

// The config table printed at start: every flag with its value, marked when given.
inline std::string config_table(const Args& a) {
    std::string out;
    for (const FlagSpec& f : flag_table()) {
        if (f.kind == FlagKind::Switch || std::string(f.group) == "mode") continue;
        out += strfmt("  %-22s %-24s%s\n", f.name, a.str(f.name).c_str(), a.given(f.name) ? "  (given)" : "");
    }
    return out;
}

}  // namespace fp8rl
