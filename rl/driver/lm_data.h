// lm_data.h: the data of --mode sft and --mode cpt (docs/sft.md): JSONL rows made into token
// sequences with a loss mask, which the LM trainer (rl/driver/lm_trainer.h) packs into micro-batches.
//
//   sft: {"messages": [...]}                rendered by the model's chat template (rl/text/chat.h);
//                                           the loss on each assistant turn's content and its
//                                           closing end-of-turn token, nothing else
//        {"prompt"|"messages", "completion"|"answer"}
//                                           the prompt as RL renders it (a plain prompt as it is,
//                                           messages with the generation prompt), then the
//                                           completion and the model's end-of-turn (eos) token,
//                                           the loss on those two
//   cpt: {"text": ...} or {"ids": [...]}    documents without a template, each followed by the
//                                           end-of-text token, concatenated and cut into windows
//                                           of seq_len + 1 tokens overlapping by one (each token
//                                           is predicted once); doc_mask splits a window at its
//                                           documents' ends, so no attention crosses them
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "rl/common.h"
#include "rl/driver/driver.h"
#include "rl/io/json.h"
#include "rl/io/token_shard.h"
#include "rl/text/chat.h"
#include "rl/text/tokenizer.h"

namespace fp8rl {

// One sequence the model reads: loss[t] = 1 when token t is trained on (predicted from those before
// it); loss[0] is always 0.
struct LmSequence {
    std::vector<int32_t> ids;
    std::vector<uint8_t> loss;
    int64_t loss_tokens() const {
        int64_t n = 0;
        for (uint8_t b : loss) n += b;
        return n;
    }
};

// One row of a step (an SFT conversation or a CPT window): one sequence, or a window's documents
// apart under --doc_mask 1.
using LmRow = std::vector<LmSequence>;

// The engine's view: the sequence from its first trained token on is the "response" (rl/driver/engine.h),
// and the mask of those positions.
inline Sequence engine_sequence(const LmSequence& s, std::vector<uint8_t>* mask) {
    int32_t first = 1;
    while (first < (int32_t)s.loss.size() && !s.loss[(size_t)first]) first++;
    mask->assign(s.loss.begin() + first, s.loss.end());
    return Sequence{s.ids, first};
}

// The token that ends a completion (SFT) and a document (CPT): the model's first eos id (Qwen's
// <|im_end|>, a fresh model's <|endoftext|>), and for documents the tokenizer's end-of-text token
// where it has one.
inline int32_t end_of_turn_id(const ModelConfig& c) {
    if (c.eos_token_ids.empty()) fail("the model has no eos_token_id (config.json, generation_config.json); SFT ends each completion with it");
    return (int32_t)c.eos_token_ids[0];
}
inline int32_t end_of_text_id(const Tokenizer& tok, const ModelConfig& c) {
    for (const char* t : {"<|endoftext|>", "<|end_of_text|>"})
        if (int id = tok.token_to_id(t); id >= 0) return id;
    return end_of_turn_id(c);
}

// The shard header's tokenizer hash: FNV-1a 64 of the model's tokenizer.json.
inline uint64_t tokenizer_hash(const std::string& model_dir) { return fnv1a64(read_file(model_dir + "/tokenizer.json")); }

// Tokens of a rendered text whose spans are trained on: the text is encoded piece by piece at the
// span boundaries, which must give the ids of encoding it whole (else a span would start or end
// inside a token, and its mask would be a guess).
inline LmSequence encode_with_spans(const Tokenizer& tok, const std::string& text, const TextSpans& spans, const std::string& where) {
    LmSequence s;
    size_t at = 0;
    auto piece = [&](size_t end, uint8_t trained) {
        for (int id : tok.encode(text.substr(at, end - at), false)) {
            s.ids.push_back(id);
            s.loss.push_back(trained);
        }
        at = end;
    };
    for (const auto& span : spans) {
        piece(span.first, 0);
        piece(span.second, 1);
    }
    piece(text.size(), 0);
    const std::vector<int> whole = tok.encode(text, false);
    if (std::vector<int>(s.ids.begin(), s.ids.end()) != whole)
        fail("%s: an assistant turn of this conversation does not start and end on token boundaries in the chat template's "
             "rendering, so its loss mask is undefined; check the turn's leading and trailing whitespace",
             where.c_str());
    if (!s.loss.empty()) s.loss[0] = 0;  // nothing predicts the first token
    return s;
}

// Turns SFT rows into sequences with the model's tokenizer and chat template.
class SftEncoder {
public:
    SftEncoder(const Tokenizer& tok, std::string model_dir, int enable_thinking, int32_t end_of_turn)
        : tok_(tok), model_dir_(std::move(model_dir)), enable_thinking_(enable_thinking), eot_(end_of_turn) {}

    LmSequence encode(const Json& row, const std::string& where) {
        const char* shape = "each line must be {\"messages\": [...]} (a conversation), {\"prompt\": [...], \"completion\": [...]} "
                            "(TRL's conversational rows) or {\"prompt\"|\"messages\": ..., \"completion\"|\"answer\": \"...\"}";
        if (!row.is_object()) fail("%s: a line must be a JSON object; %s", where.c_str(), shape);
        const Json* prompt = row.find("prompt");
        const Json* messages = row.find("messages");
        const Json* completion = row.find("completion");
        if (!completion) completion = row.find("answer");
        // function schemas: the chat template's tools section (Qwen; the Llama-3 template refuses them)
        const std::vector<Json> tools = row.find("tools") ? chat_tools_from_json(*row.find("tools"), where) : std::vector<Json>();
        if ((prompt != nullptr) == (messages != nullptr)) fail("%s: give exactly one of \"prompt\" and \"messages\"; %s", where.c_str(), shape);
        const Json* turns = messages ? messages : prompt->is_array() ? prompt : nullptr;  // a message list
        std::vector<ChatMessage> msgs;
        std::vector<bool> trained;  // [msgs] an assistant turn's "train" (default true)
        if (turns) add_messages(*turns, where, messages ? "messages" : "prompt", &msgs, &trained);
        LmSequence s;
        if (completion && completion->is_array()) {  // TRL: the loss on the completion's assistant turns
            if (!turns) fail("%s: a \"completion\" message list needs \"prompt\" as a message list too; %s", where.c_str(), shape);
            trained.assign(trained.size(), false);
            add_messages(*completion, where, "completion", &msgs, &trained);
            s = conversation(msgs, trained, tools, where);
        } else if (completion) {
            if (!completion->is_string() && !completion->is_int())
                fail("%s: \"completion\"/\"answer\" must be a string, an integer or a message list", where.c_str());
            Example ex;
            if (!turns) {
                if (!prompt->is_string() || prompt->str.empty()) fail("%s: \"prompt\" must be a non-empty string or a message list", where.c_str());
                ex.prompt = prompt->str;
            }
            for (const ChatMessage& m : msgs) ex.messages.emplace_back(m.role, m.content);
            if (!tools.empty() && !turns) fail("%s: \"tools\" need the prompt as chat messages, not plain text", where.c_str());
            if (tools.empty()) {
                s.ids = encode_example_prompt(tok_, ex, model_dir_, enable_thinking_, chat_);
            } else {  // the prompt as RL renders messages, with the tools section
                ChatOptions opt;
                opt.enable_thinking = enable_thinking_, opt.tools = tools;
                for (int id : chat().encode(tok_, msgs, opt)) s.ids.push_back(id);
            }
            s.loss.assign(s.ids.size(), 0);
            const std::string text = completion->is_string() ? completion->str : std::to_string(completion->integer);
            for (int id : tok_.encode(text, false)) s.ids.push_back(id);
            s.ids.push_back(eot_);
            s.loss.resize(s.ids.size(), 1);
        } else {
            if (!messages) fail("%s: a \"prompt\" row needs a \"completion\" (or \"answer\"); %s", where.c_str(), shape);
            s = conversation(msgs, trained, tools, where);
        }
        if (s.loss_tokens() == 0)
            fail("%s: the row has no tokens to train on (a conversation needs an assistant turn, not all \"train\": false); remove it",
                 where.c_str());
        return s;
    }

private:
    const Tokenizer& tok_;
    std::string model_dir_;
    int enable_thinking_;
    int32_t eot_;
    std::unique_ptr<ChatTemplate> chat_;

    const ChatTemplate& chat() {
        if (!chat_) chat_ = std::make_unique<ChatTemplate>(ChatTemplate::load(model_dir_));
        return *chat_;
    }

    // The messages of a list (`key` names it in errors), each with its "train" flag.
    static void add_messages(const Json& list, const std::string& where, const char* key, std::vector<ChatMessage>* msgs,
                             std::vector<bool>* trained) {
        const std::vector<ChatMessage> m = chat_messages_from_json(list, where + ": \"" + key + "\"");
        for (size_t i = 0; i < m.size(); i++) {
            // tool: a tool's result, context like a user turn (Qwen's <tool_response>; the Llama-3 template refuses it)
            if (m[i].role != "system" && m[i].role != "user" && m[i].role != "assistant" && m[i].role != "tool")
                fail("%s: %s[%zu]: role \"%s\" is not system, user, assistant or tool", where.c_str(), key, i, m[i].role.c_str());
            const Json* train = list.items[i].find("train");
            if (train && !train->is_bool()) fail("%s: %s[%zu].train must be true or false", where.c_str(), key, i);
            msgs->push_back(m[i]);
            trained->push_back(!train || train->boolean);
        }
    }

    // A conversation rendered by the chat template, the loss on its assistant turns whose flag is set
    // (the template's spans are its assistant turns, in order).
    LmSequence conversation(const std::vector<ChatMessage>& msgs, const std::vector<bool>& trained, const std::vector<Json>& tools,
                            const std::string& where) {
        ChatOptions opt;
        opt.add_generation_prompt = false;
        opt.enable_thinking = enable_thinking_;
        opt.tools = tools;
        TextSpans spans, kept;
        const std::string text = chat().render(msgs, opt, &spans);
        size_t k = 0;
        for (size_t i = 0; i < msgs.size(); i++)
            if (msgs[i].role == "assistant" && k < spans.size()) {
                if (trained[i]) kept.push_back(spans[k]);
                k++;
            }
        return encode_with_spans(tok_, text, kept, where);
    }
};

// Every non-blank line of a JSONL file, with its "file:line".
inline void for_each_jsonl_row(const std::string& path, const std::function<void(const Json&, const std::string&)>& f) {
    const std::string text = read_file(path);
    size_t pos = 0;
    int line_no = 0;
    while (pos < text.size()) {
        size_t nl = text.find('\n', pos);
        if (nl == std::string::npos) nl = text.size();
        const std::string line = text.substr(pos, nl - pos);
        pos = nl + 1;
        line_no++;
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        const std::string where = strfmt("%s:%d", path.c_str(), line_no);
        f(json_parse(line, where), where);
    }
}

// SFT rows of a file, those longer than max_seq_len left out with a printed count (log: this rank prints).
inline std::vector<LmRow> load_sft_rows(const std::string& path, SftEncoder& enc, int64_t max_seq_len, bool log) {
    std::vector<LmRow> rows;
    int64_t long_rows = 0;
    for_each_jsonl_row(path, [&](const Json& row, const std::string& where) {
        LmSequence s = enc.encode(row, where);
        if (max_seq_len > 0 && (int64_t)s.ids.size() > max_seq_len) long_rows++;
        else rows.push_back({std::move(s)});
    });
    if (log && long_rows)
        printf("left out %lld of %lld rows of %s longer than %lld tokens (--max_seq_len)\n", (long long)long_rows,
               (long long)(long_rows + (int64_t)rows.size()), path.c_str(), (long long)max_seq_len);
    if (rows.empty()) fail("%s: no rows to train on%s", path.c_str(), long_rows ? "; all are longer than --max_seq_len" : " (the file is empty)");
    return rows;
}

// A CPT document's token ids: {"text"} through the tokenizer, or {"ids"} checked against the
// vocabulary (the end-of-text id is the caller's to append).
inline std::vector<int32_t> cpt_document_ids(const Json& row, const std::string& where, const Tokenizer* tok, int vocab) {
    const Json* text = row.is_object() ? row.find("text") : nullptr;
    const Json* ids = row.is_object() ? row.find("ids") : nullptr;
    std::vector<int32_t> out;
    if (text && text->is_string()) {
        if (!tok) fail("%s: a \"text\" row needs a tokenizer", where.c_str());
        for (int id : tok->encode(text->str, false)) out.push_back(id);
    } else if (ids && ids->is_array()) {
        for (const Json& id : ids->items) {
            if (!id.is_int() || id.integer < 0 || id.integer >= vocab)
                fail("%s: \"ids\" must be token ids in the vocabulary [0, %d)", where.c_str(), vocab);
            out.push_back((int32_t)id.integer);
        }
    } else {
        fail("%s: each line must be {\"text\": \"...\"} or {\"ids\": [...]} (--mode cpt)", where.c_str());
    }
    return out;
}

// How many windows of seq_len + 1 tokens a stream of `tokens` holds (the tail short of one is left out).
inline int64_t cpt_window_count(int64_t tokens, int64_t seq_len) { return tokens < seq_len + 1 ? 0 : (tokens - 1) / seq_len; }

// Window w of a token stream (token_at(t): the stream's token t): tokens [w seq_len, w seq_len + seq_len + 1),
// one sequence, or under doc_mask cut after each end-of-text (a piece of one token, which predicts
// nothing, left out).
template <class TokenAt>
LmRow cpt_window(const TokenAt& token_at, int64_t w, int64_t seq_len, bool doc_mask, int32_t end_of_text) {
    LmRow row;
    const int64_t b = w * seq_len, end = b + seq_len + 1;
    std::vector<int32_t> ids;
    for (int64_t t = b; t < end; t++) {
        ids.push_back(token_at(t));
        const bool cut = doc_mask && ids.back() == end_of_text && t + 1 < end;
        if (!cut && t + 1 < end) continue;
        if (ids.size() >= 2) {
            LmSequence s;
            s.ids = ids;
            s.loss.assign(s.ids.size(), 1);
            s.loss[0] = 0;
            row.push_back(std::move(s));
        }
        ids.clear();
    }
    return row;
}

// CPT windows of a file: documents + end-of-text, concatenated, cut into windows of seq_len + 1 tokens
// (the last token of a window is the first of the next); the tail short of a window is left out.
inline std::vector<LmRow> load_cpt_windows(const std::string& path, const Tokenizer* tok, int vocab, int32_t end_of_text,
                                           int64_t seq_len, bool doc_mask) {
    std::vector<int32_t> stream;
    for_each_jsonl_row(path, [&](const Json& row, const std::string& where) {
        for (int32_t id : cpt_document_ids(row, where, tok, vocab)) stream.push_back(id);
        stream.push_back(end_of_text);
    });
    if ((int64_t)stream.size() < seq_len + 1)
        fail("%s: %zu tokens, fewer than one window of --seq_len %lld + 1; give more text or a smaller --seq_len", path.c_str(),
             stream.size(), (long long)seq_len);
    std::vector<LmRow> rows;
    const auto token_at = [&](int64_t t) { return stream[(size_t)t]; };
    for (int64_t w = 0; w < cpt_window_count((int64_t)stream.size(), seq_len); w++)
        rows.push_back(cpt_window(token_at, w, seq_len, doc_mask, end_of_text));
    return rows;
}

}  // namespace fp8rl
