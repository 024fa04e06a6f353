// chat.h: the chat templates of the model families fp8rl supports, written out in C++ (no Jinja
// engine): Qwen3 (ChatML with thinking), Qwen2.5 (ChatML with a default system prompt) and
// Llama-3 (header tokens, dated system block). The family is recognized from the chat_template in
// the model directory's tokenizer_config.json; renderings equal transformers' apply_chat_template
// (fixtures in test/fixtures/tokenizer/chat_*.jsonl). Qwen's templates also render function schemas
// (`tools`, as their system turn's tools section: chat_tools_*.jsonl); tool calls are not rendered.
#pragma once
#include <charconv>
#include <cmath>
#include <cstring>
#include <string>
#include <sys/stat.h>
#include <utility>
#include <vector>

#include "rl/common.h"
#include "rl/io/json.h"
#include "rl/text/tokenizer.h"

namespace fp8rl {

struct ChatMessage {
    std::string role;     // system, user, assistant (Qwen also: tool)
    std::string content;
    std::string reasoning_content;  // Qwen3 assistant turns: thinking given apart from content
    bool has_reasoning = false;
};

struct ChatOptions {
    bool add_generation_prompt = true;  // end with the opening of an assistant turn
    std::vector<Json> tools;            // function schemas (Qwen: the system turn's tools section); empty: none
    int enable_thinking = -1;           // Qwen3: -1 unset (= the model may think), 1 true, 0 false
    std::string date_string = "26 Jul 2024";  // Llama-3's "Today Date", fixed for reproducible prompts
};

enum class ChatFamily { Qwen3, Qwen25, Llama3 };

// [begin, end) byte ranges of a rendered text.
using TextSpans = std::vector<std::pair<size_t, size_t>>;

inline const char* chat_family_name(ChatFamily f) {
    switch (f) {
        case ChatFamily::Qwen3: return "qwen3";
        case ChatFamily::Qwen25: return "qwen2.5";
        case ChatFamily::Llama3: return "llama3";
    }
    return "?";
}

// Messages from JSON ([{"role": ..., "content": ...}, ...]); `where` names the source in errors.
inline std::vector<ChatMessage> chat_messages_from_json(const Json& messages, const std::string& where) {
    if (!messages.is_array() || messages.items.empty()) fail("%s: \"messages\" must be a non-empty array", where.c_str());
    std::vector<ChatMessage> out;
    for (size_t i = 0; i < messages.items.size(); i++) {
        const Json& m = messages.items[i];
        const Json* role = m.find("role");
        const Json* content = m.find("content");
        if (!role || !role->is_string() || !content || !content->is_string())
            fail("%s: messages[%zu] needs string \"role\" and \"content\"", where.c_str(), i);
        if (m.find("tool_calls")) fail("%s: messages[%zu] has tool_calls, which fp8rl does not render", where.c_str(), i);
        ChatMessage msg{role->str, content->str, "", false};
        if (const Json* r = m.find("reasoning_content"); r && !r->is_null()) {
            if (!r->is_string()) fail("%s: messages[%zu].reasoning_content must be a string", where.c_str(), i);
            msg.reasoning_content = r->str;
            msg.has_reasoning = true;
        }
        out.push_back(std::move(msg));
    }
    return out;
}

// Python's str.strip(chars) family, which the templates call.
inline std::string lstrip_chars(const std::string& s, const char* chars) {
    size_t b = s.find_first_not_of(chars);
    return b == std::string::npos ? "" : s.substr(b);
}
inline std::string rstrip_chars(const std::string& s, const char* chars) {
    size_t e = s.find_last_not_of(chars);
    return e == std::string::npos ? "" : s.substr(0, e + 1);
}

// Jinja's trim (Python str.strip()): removes characters Python calls whitespace at both ends.
inline std::string python_strip(const std::string& s) {
    auto is_space = [](uint32_t c) { return unicode_class(c) == UC_SPACE || (c >= 0x1C && c <= 0x1F); };
    std::vector<uint32_t> cps = utf8_decode(s);
    size_t b = 0, e = cps.size();
    while (b < e && is_space(cps[b])) b++;
    while (e > b && is_space(cps[e - 1])) e--;
    return utf8_encode(std::vector<uint32_t>(cps.begin() + (long)b, cps.begin() + (long)e));
}

// Python's repr of a float (json.dumps writes floats so): the shortest digits that read back, fixed
// notation for decimal exponents -4..15 (with ".0" when integral), else d.ddde+XX.
inline std::string python_float_repr(double x) {
    if (!std::isfinite(x)) fail("chat: a tool schema holds a non-finite number, which JSON cannot write");
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
    std::string sci(buf, r.ptr);
    const bool negative = sci[0] == '-';
    if (negative) sci.erase(0, 1);
    const size_t e = sci.find('e');
    const int exp = std::stoi(sci.substr(e + 1));
    std::string digits = sci.substr(0, e);
    if (digits.size() > 1) digits.erase(1, 1);  // the '.'
    std::string out;
    if (exp >= 16 || exp < -4) {
        out = digits.substr(0, 1) + (digits.size() > 1 ? "." + digits.substr(1) : "") + (exp < 0 ? "e-" : "e+") +
              (std::abs(exp) < 10 ? "0" : "") + std::to_string(std::abs(exp));
    } else if (exp < 0) {
        out = "0." + std::string((size_t)(-exp - 1), '0') + digits;
    } else {
        const size_t whole = (size_t)exp + 1;
        if (digits.size() <= whole) out = digits + std::string(whole - digits.size(), '0') + ".0";
        else out = digits.substr(0, whole) + "." + digits.substr(whole);
    }
    return negative ? "-" + out : out;
}

// A value as Python's json.dumps(v, ensure_ascii=False) writes it, transformers' `tojson` filter:
// ", " and ": " separators, keys in their order, non-ASCII text as it is.
inline void python_json_to(std::string& out, const Json& v) {
    switch (v.type) {
        case Json::Null: out += "null"; return;
        case Json::Bool: out += v.boolean ? "true" : "false"; return;
        case Json::Int: out += std::to_string(v.integer); return;
        case Json::Double: out += python_float_repr(v.number); return;
        case Json::String:
            out += '"';
            for (unsigned char c : v.str) {
                const char* esc = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t"
                                : c == '\b' ? "\\b" : c == '\f' ? "\\f" : nullptr;
                if (esc) out += esc;
                else if (c < 0x20) out += strfmt("\\u%04x", c);
                else out += (char)c;
            }
            out += '"';
            return;
        case Json::Array:
            out += '[';
            for (size_t i = 0; i < v.items.size(); i++) {
                if (i) out += ", ";
                python_json_to(out, v.items[i]);
            }
            out += ']';
            return;
        case Json::Object:
            out += '{';
            for (size_t i = 0; i < v.fields.size(); i++) {
                if (i) out += ", ";
                Json key;
                key.type = Json::String, key.str = v.fields[i].first;
                python_json_to(out, key);
                out += ": ";
                python_json_to(out, v.fields[i].second);
            }
            out += '}';
            return;
    }
}

// Function schemas from a row's "tools" (an array of objects, as transformers takes them).
inline std::vector<Json> chat_tools_from_json(const Json& tools, const std::string& where) {
    if (!tools.is_array()) fail("%s: \"tools\" must be an array of function schemas (objects)", where.c_str());
    for (size_t i = 0; i < tools.items.size(); i++)
        if (!tools.items[i].is_object()) fail("%s: tools[%zu] must be an object (a function schema)", where.c_str(), i);
    return tools.items;
}

// tokenizer_config.json beside `path` (a model directory, or a file in it such as tokenizer.json).
inline std::string tokenizer_config_path(const std::string& path) {
    struct stat st;
    std::string dir = path;
    if (stat(path.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
        size_t slash = path.find_last_of('/');
        dir = slash == std::string::npos ? "." : path.substr(0, slash);
    }
    return dir + "/tokenizer_config.json";
}

// A token named in tokenizer_config.json ("eos_token", "bos_token", "pad_token"), as a string or
// {"content": ...}; "" when the file or the key is absent or null. The stop set of generation is
// this eos_token together with generation_config.json's eos_token_id (spec-model.md section 9).
inline std::string tokenizer_config_token(const std::string& path, const char* key) {
    std::string file = tokenizer_config_path(path);
    struct stat st;
    if (stat(file.c_str(), &st) != 0) return "";
    Json config = json_parse_file(file);
    const Json* v = config.find(key);
    if (v && v->is_string()) return v->str;
    if (const Json* c = v ? v->find("content") : nullptr; c && c->is_string()) return c->str;
    return "";
}

class ChatTemplate {
public:
    // Recognizes the family from tokenizer_config.json in `path` (a model directory, or the
    // directory of the tokenizer.json given).
    static ChatTemplate load(const std::string& path) {
        struct stat st;
        std::string file = tokenizer_config_path(path);
        const char* hint = "fp8rl renders the Qwen3, Qwen2.5 and Llama-3 chat templates; for other models give raw "
                           "prompts ({\"prompt\": ...} lines) instead of chat messages";
        if (stat(file.c_str(), &st) != 0) fail("%s: not found, so the chat template is unknown; %s", file.c_str(), hint);
        Json config = json_parse_file(file);
        const Json* tmpl = config.find("chat_template");
        // transformers >= 4.43 saves the template beside the config as chat_template.jinja
        const std::string jinja = file.substr(0, file.size() - strlen("tokenizer_config.json")) + "chat_template.jinja";
        std::string s;
        if (tmpl && tmpl->is_string()) s = tmpl->str;
        else if (stat(jinja.c_str(), &st) == 0) s = read_file(jinja);
        else fail("%s: no chat_template string and no %s; %s", file.c_str(), jinja.c_str(), hint);
        ChatTemplate t;
        if (s.find("enable_thinking") != std::string::npos && s.find("<think>") != std::string::npos) t.family_ = ChatFamily::Qwen3;
        else if (s.find("You are Qwen, created by Alibaba Cloud.") != std::string::npos) t.family_ = ChatFamily::Qwen25;
        else if (s.find("<|start_header_id|>") != std::string::npos && s.find("Cutting Knowledge Date") != std::string::npos)
            t.family_ = ChatFamily::Llama3;
        else fail("%s: chat_template is not one fp8rl knows; %s", file.c_str(), hint);
        t.bos_token_ = tokenizer_config_token(path, "bos_token");
        if (t.family_ == ChatFamily::Llama3 && t.bos_token_.empty()) fail("%s: Llama-3 template without bos_token", file.c_str());
        return t;
    }

    ChatFamily family() const { return family_; }

    // The prompt text, as transformers' apply_chat_template(tokenize=False) renders it. spans, when
    // given, receives each assistant turn's [begin, end) in the text: what the model writes after the
    // turn's header, its content through the closing end-of-turn token (ChatML's <|im_end|>, not the
    // newline after it; Llama-3's <|eot_id|>): the tokens SFT trains on (rl/tasks/sft_data.h).
    std::string render(const std::vector<ChatMessage>& messages, const ChatOptions& opt, TextSpans* spans = nullptr) const {
        if (messages.empty()) fail("chat: no messages to render");
        TextSpans ignored;
        TextSpans& s = spans ? *spans : ignored;
        switch (family_) {
            case ChatFamily::Qwen3: return render_qwen3(messages, opt, s);
            case ChatFamily::Qwen25: return render_qwen25(messages, opt, s);
            case ChatFamily::Llama3: return render_llama3(messages, opt, s);
        }
        return "";
    }

    // Token ids of the rendering (special tokens come from the text; nothing else is added).
    std::vector<int> encode(const Tokenizer& tok, const std::vector<ChatMessage>& messages, const ChatOptions& opt) const {
        return tok.encode(render(messages, opt), false);
    }

    // The text that follows an assistant turn the model wrote (its end-of-turn token included when
    // ended_on_eos) in a multi-turn rollout: the closing of that turn (its end-of-turn token if it was
    // cut), the observation as a `role` message ("tool": Qwen's <tool_response> block in a user turn;
    // "user"), and the opening of the next assistant turn. It is the rendering of the conversation
    // with the observation less the rendering without it (test_environment.cpp checks this).
    std::string continuation(const std::string& role, const std::string& content, bool ended_on_eos, const ChatOptions& opt) const {
        if (role != "tool" && role != "user") fail("chat: an observation's role is \"tool\" or \"user\", not \"%s\"", role.c_str());
        if (family_ == ChatFamily::Llama3) {
            if (role == "tool") fail("chat: the Llama-3 template here renders no tool turns; have the environment reply with \"role\": \"user\"");
            return std::string(ended_on_eos ? "" : "<|eot_id|>") + "<|start_header_id|>user<|end_header_id|>\n\n" + python_strip(content) +
                   "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";
        }
        std::string out = ended_on_eos ? "\n" : "<|im_end|>\n";
        if (role == "tool") qwen_tool_turn({{"tool", content, "", false}}, 0, out);
        else out += turn("user", content);
        out += "<|im_start|>assistant\n";
        if (family_ == ChatFamily::Qwen3 && opt.enable_thinking == 0) out += "<think>\n\n</think>\n\n";
        return out;
    }

private:
    ChatFamily family_ = ChatFamily::Qwen3;
    std::string bos_token_;

    // Qwen's tools section, what its system turn holds after the system prompt.
    static std::string qwen_tools(const std::vector<Json>& tools) {
        std::string out = "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
                          "function signatures within <tools></tools> XML tags:\n<tools>";
        for (const Json& t : tools) {
            out += "\n";
            python_json_to(out, t);
        }
        return out + "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
                     "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                     "<args-json-object>}\n</tool_call><|im_end|>\n";
    }

    [[noreturn]] void bad_role(size_t i, const std::string& role) const {
        fail("chat: messages[%zu] has role \"%s\", which the %s template does not render", i, role.c_str(),
             chat_family_name(family_));
    }

    // Qwen's tool results: consecutive tool messages share one user turn.
    static void qwen_tool_turn(const std::vector<ChatMessage>& m, size_t i, std::string& out) {
        if (i == 0 || m[i - 1].role != "tool") out += "<|im_start|>user";
        out += "\n<tool_response>\n" + m[i].content + "\n</tool_response>";
        if (i + 1 == m.size() || m[i + 1].role != "tool") out += "<|im_end|>\n";
    }

    static std::string turn(const std::string& role, const std::string& content) {
        return "<|im_start|>" + role + "\n" + content + "<|im_end|>\n";
    }

    // Appends a rendered ChatML assistant turn ("<|im_start|>assistant\n" ... "<|im_end|>\n"), its
    // span from after the header through <|im_end|>.
    static void chatml_assistant(const std::string& rendered, std::string& out, TextSpans& spans) {
        static const size_t header = strlen("<|im_start|>assistant\n");
        spans.push_back({out.size() + header, out.size() + rendered.size() - 1});
        out += rendered;
    }

    std::string render_qwen25(const std::vector<ChatMessage>& m, const ChatOptions& opt, TextSpans& spans) const {
        const std::string system =
            m[0].role == "system" ? m[0].content : "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
        std::string out = opt.tools.empty() ? turn("system", system) : "<|im_start|>system\n" + system + "\n\n" + qwen_tools(opt.tools);
        for (size_t i = 0; i < m.size(); i++) {
            const std::string& role = m[i].role;
            if (role == "user" || (role == "system" && i > 0)) out += turn(role, m[i].content);
            else if (role == "assistant") chatml_assistant(turn(role, m[i].content), out, spans);
            else if (role == "tool") qwen_tool_turn(m, i, out);
            else if (role != "system") bad_role(i, role);
        }
        if (opt.add_generation_prompt) out += "<|im_start|>assistant\n";
        return out;
    }

    // Index of the last user message that is not a wrapped tool response (Qwen3's last query).
    static size_t qwen3_last_query(const std::vector<ChatMessage>& m) {
        for (size_t k = m.size(); k-- > 0;) {
            const std::string& c = m[k].content;
            bool tool_response = c.rfind("<tool_response>", 0) == 0 && c.size() >= 16 &&
                                 c.compare(c.size() - 16, 16, "</tool_response>") == 0;
            if (m[k].role == "user" && !tool_response) return k;
        }
        return m.size() - 1;
    }

    std::string render_qwen3(const std::vector<ChatMessage>& m, const ChatOptions& opt, TextSpans& spans) const {
        std::string out;
        if (!opt.tools.empty()) out = "<|im_start|>system\n" + (m[0].role == "system" ? m[0].content + "\n\n" : "") + qwen_tools(opt.tools);
        else if (m[0].role == "system") out += turn("system", m[0].content);
        size_t last_query = qwen3_last_query(m);
        for (size_t i = 0; i < m.size(); i++) {
            const std::string& role = m[i].role;
            if (role == "user" || (role == "system" && i > 0)) out += turn(role, m[i].content);
            else if (role == "assistant") chatml_assistant(qwen3_assistant(m[i], i > last_query, i + 1 == m.size()), out, spans);
            else if (role == "tool") qwen_tool_turn(m, i, out);
            else if (role != "system") bad_role(i, role);
        }
        if (opt.add_generation_prompt) {
            out += "<|im_start|>assistant\n";
            if (opt.enable_thinking == 0) out += "<think>\n\n</think>\n\n";
        }
        return out;
    }

    // An assistant turn: reasoning from reasoning_content or split out of content at </think>; it
    // is shown only for turns after the last user query (always for the final one).
    static std::string qwen3_assistant(const ChatMessage& msg, bool after_last_query, bool last) {
        std::string content = msg.content, reasoning;
        if (msg.has_reasoning) {
            reasoning = msg.reasoning_content;
        } else if (size_t end = content.find("</think>"); end != std::string::npos) {
            std::string before = rstrip_chars(content.substr(0, end), "\n");
            size_t open = before.rfind("<think>");
            reasoning = lstrip_chars(open == std::string::npos ? before : before.substr(open + 7), "\n");
            content = lstrip_chars(content.substr(content.rfind("</think>") + 8), "\n");
        }
        std::string out = "<|im_start|>assistant\n";
        if (after_last_query && (last || !reasoning.empty()))
            out += "<think>\n" + lstrip_chars(rstrip_chars(reasoning, "\n"), "\n") + "\n</think>\n\n" + lstrip_chars(content, "\n");
        else
            out += content;
        return out + "<|im_end|>\n";
    }

    std::string render_llama3(const std::vector<ChatMessage>& m, const ChatOptions& opt, TextSpans& spans) const {
        if (!opt.tools.empty())
            fail("chat: the Llama-3 template here renders no function schemas (\"tools\"); describe the tools in a system message");
        size_t first = m[0].role == "system" ? 1 : 0;
        std::string out = bos_token_ + "<|start_header_id|>system<|end_header_id|>\n\n";
        out += "Cutting Knowledge Date: December 2023\nToday Date: " + opt.date_string + "\n\n";
        out += (first ? python_strip(m[0].content) : std::string()) + "<|eot_id|>";
        for (size_t i = first; i < m.size(); i++) {
            const std::string& role = m[i].role;
            if (role != "system" && role != "user" && role != "assistant") bad_role(i, role);
            out += "<|start_header_id|>" + role + "<|end_header_id|>\n\n";
            const size_t begin = out.size();
            out += python_strip(m[i].content) + "<|eot_id|>";
            if (role == "assistant") spans.push_back({begin, out.size()});
        }
        if (opt.add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
        return out;
    }
};

}  // namespace fp8rl
