// tokenizer_cli.h: the JSON Lines modes of the binaries that use the tokenizer:
//   --encode: {"text": "..."}                       -> {"ids": [...]}
//   --decode: {"ids": [...], "skip_special_tokens"?} -> {"text": "..."}
//   --chat:   {"messages": [...], "add_generation_prompt"?, "tools"?} -> {"ids": [...]} (the model's chat template)
// One output line per input line, in order; blank lines are skipped; a bad line is an error naming
// file:line.
#pragma once
#include <string>

#include "rl/text/chat.h"
#include "rl/common.h"
#include "rl/io/json.h"
#include "rl/io/jsonl.h"
#include "rl/text/tokenizer.h"

namespace fp8rl {

inline std::string ids_json(const std::vector<int>& ids) {
    std::string out = "{\"ids\":[";
    for (size_t i = 0; i < ids.size(); i++) out += (i ? "," : "") + std::to_string(ids[i]);
    return out + "]}";
}

inline std::string encode_jsonl(const Tokenizer& tok, const std::string& text, const std::string& source) {
    return map_jsonl(text, source, [&](const Json& row, const std::string& where) {
        const Json* t = row.find("text");
        if (!t || !t->is_string()) fail("%s: expected {\"text\": \"...\"}", where.c_str());
        return ids_json(tok.encode(t->str));
    });
}

inline std::string decode_jsonl(const Tokenizer& tok, const std::string& text, const std::string& source) {
    return map_jsonl(text, source, [&](const Json& row, const std::string& where) {
        const Json* ids = row.find("ids");
        if (!ids || !ids->is_array()) fail("%s: expected {\"ids\": [...]}", where.c_str());
        std::vector<int> v;
        for (const Json& id : ids->items) {
            if (!id.is_int() || id.integer < 0 || id.integer > INT32_MAX)
                fail("%s: ids must be non-negative integers", where.c_str());
            v.push_back((int)id.integer);
        }
        const Json* skip = row.find("skip_special_tokens");
        if (skip && !skip->is_bool()) fail("%s: skip_special_tokens must be true or false", where.c_str());
        return "{\"text\":" + json_quote(tok.decode(v, skip && skip->boolean)) + "}";
    });
}

inline std::string chat_jsonl(const Tokenizer& tok, const ChatTemplate& chat, ChatOptions opt, const std::string& text,
                              const std::string& source) {
    return map_jsonl(text, source, [&](const Json& row, const std::string& where) {
        const Json* messages = row.find("messages");
        if (!messages) fail("%s: expected {\"messages\": [...]}", where.c_str());
        ChatOptions line_opt = opt;
        if (const Json* gen = row.find("add_generation_prompt")) {
            if (!gen->is_bool()) fail("%s: add_generation_prompt must be true or false", where.c_str());
            line_opt.add_generation_prompt = gen->boolean;
        }
        if (const Json* tools = row.find("tools")) line_opt.tools = chat_tools_from_json(*tools, where);
        return ids_json(chat.encode(tok, chat_messages_from_json(*messages, where), line_opt));
    });
}

}  // namespace fp8rl
