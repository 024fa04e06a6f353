// tokenizer.h: byte-level BPE from a HuggingFace tokenizer.json (Qwen2.5/Qwen3, Llama-3, GPT-2
// style, and small ones trained with the `tokenizers` library), giving the ids HF tokenizers gives.
//
// Encode: added tokens are cut out of the raw text first (leftmost, then longest match); each
// piece between them is normalized (NFC or nothing), split by the pre-tokenizer (native regexes of
// rl/text/pretokenize.h, optional ByteLevel prefix space), and each pre-token's UTF-8 bytes go through
// BPE: one symbol per byte, then repeatedly merge the leftmost adjacent pair of lowest merge rank
// (HF's priority-queue order). With ignore_merges a pre-token that is itself a vocab entry is
// emitted whole. Text that is not valid UTF-8 is read with the U+FFFD policy of rl/text/unicode.h.
// Decode: token bytes concatenated (special tokens optionally skipped), ids without a token give
// nothing (as in HF), then invalid UTF-8 becomes U+FFFD. StreamDecoder emits text incrementally
// without ever splitting a UTF-8 character.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <queue>
#include <string>
#include <string_view>
#include <sys/stat.h>
#include <unordered_map>
#include <vector>

#include "rl/common.h"
#include "rl/io/json.h"
#include "rl/text/pretokenize.h"
#include "rl/text/unicode.h"

namespace fp8rl {

// GPT-2's bytes_to_unicode: the printable bytes map to themselves, the other 68 to U+0100.. in order.
inline const std::vector<uint32_t>& byte_to_unicode() {
    static const std::vector<uint32_t> table = [] {
        std::vector<uint32_t> t(256);
        uint32_t next = 256;
        for (uint32_t b = 0; b < 256; b++) {
            bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
            t[b] = printable ? b : next++;
        }
        return t;
    }();
    return table;
}

// The inverse: alphabet character -> byte, or -1 for a character outside the alphabet.
inline int unicode_to_byte(uint32_t cp) {
    static const std::vector<int> table = [] {
        std::vector<int> t(324, -1);
        for (int b = 0; b < 256; b++) t[byte_to_unicode()[b]] = b;
        return t;
    }();
    return cp < table.size() ? table[cp] : -1;
}

// Bytes a token string stands for (HF's ByteLevel decoder): alphabet characters map back to their
// bytes; a token with any character outside the alphabet stands for its own UTF-8 text.
inline std::string byte_level_decode_token(const std::string& token) {
    std::string bytes;
    for (size_t i = 0; i < token.size();) {
        int b = unicode_to_byte(utf8_next(token, i));
        if (b < 0) return token;
        bytes += (char)b;
    }
    return bytes;
}

// Merge rules keyed by the pair of token ids: open addressing over one flat array, because the
// BPE inner loop looks a pair up for every adjacent symbol pair and load inserts 10^5..10^6 rules.
class MergeTable {
public:
    struct Rule { uint64_t key; int rank, merged; };

    void reserve(size_t rules) {
        size_t cap = 16;
        while (cap < rules * 2) cap *= 2;
        slots_.assign(cap, Rule{empty_key, 0, 0});
        mask_ = cap - 1;
    }

    // A repeated pair: the last rule wins, as in HF (its HashMap keeps the last insert).
    void insert(int left, int right, int rank, int merged) {
        if (size_ * 2 >= slots_.size()) grow();
        Rule* r = slot(key(left, right));
        if (r->key == empty_key) size_++;
        *r = Rule{key(left, right), rank, merged};
    }

    // nullptr when the pair has no rule.
    const Rule* find(int left, int right) const {
        if (slots_.empty()) return nullptr;
        const Rule* r = slot(key(left, right));
        return r->key == empty_key ? nullptr : r;
    }

private:
    static constexpr uint64_t empty_key = ~0ull;
    std::vector<Rule> slots_;
    size_t mask_ = 0, size_ = 0;

    static uint64_t key(int a, int b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }
    Rule* slot(uint64_t k) const {
        size_t i = (size_t)((k * 0x9E3779B97F4A7C15ull) >> 20) & mask_;
        while (slots_[i].key != empty_key && slots_[i].key != k) i = (i + 1) & mask_;
        return const_cast<Rule*>(&slots_[i]);
    }
    void grow() {
        std::vector<Rule> old;
        old.swap(slots_);
        reserve(old.size() < 16 ? 16 : old.size());
        size_ = 0;
        for (const Rule& r : old)
            if (r.key != empty_key) insert((int)(r.key >> 32), (int)(uint32_t)r.key, r.rank, r.merged);
    }
};

// Token string -> id over the id -> string table it indexes (open addressing, keys not copied, a
// hash fingerprint per slot so that a probe rarely touches the strings): load looks up three
// strings per merge rule, so this map sets the load time.
class TokenIndex {
public:
    explicit TokenIndex(const std::vector<std::string>& tokens) : tokens_(tokens) {}

    void rebuild() {
        size_t cap = 16;
        while (cap < tokens_.size() * 2) cap *= 2;
        slots_.assign(cap, Slot{0, -1});
        mask_ = cap - 1;
        for (size_t id = 0; id < tokens_.size(); id++) {
            if (tokens_[id].empty()) continue;
            uint64_t h = hash(tokens_[id]);
            slots_[probe(tokens_[id], h)] = Slot{(uint32_t)h, (int)id};  // a repeated string: the larger id wins
        }
    }

    int find(std::string_view token) const { return slots_.empty() ? -1 : slots_[probe(token, hash(token))].id; }

private:
    struct Slot { uint32_t fingerprint; int id; };
    const std::vector<std::string>& tokens_;
    std::vector<Slot> slots_;
    size_t mask_ = 0;

    static uint64_t hash(std::string_view s) {
        uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a, then a final mix for the slot bits
        for (char c : s) h = (h ^ (unsigned char)c) * 0x100000001b3ull;
        return h ^ (h >> 29);
    }
    size_t probe(std::string_view s, uint64_t h) const {
        size_t i = (size_t)(h >> 32) & mask_;
        while (slots_[i].id >= 0 && (slots_[i].fingerprint != (uint32_t)h || tokens_[(size_t)slots_[i].id] != s)) i = (i + 1) & mask_;
        return i;
    }
};

struct AddedToken {
    int id;
    std::string content;
    bool special;
};

// One step of the pre-tokenizer, applied to every piece in turn.
struct PreTokenizerStep {
    enum Kind { Split, ByteLevel } kind;
    SplitPattern pattern = SplitPattern::Gpt2;  // Split's regex, or ByteLevel's when use_regex
    bool use_regex = false;                     // ByteLevel only
    bool add_prefix_space = false;              // ByteLevel only
};

class Tokenizer {
public:
    // Loads `path`: a tokenizer.json, or a directory holding one.
    static std::unique_ptr<Tokenizer> load(const std::string& path) {
        std::string file = path;
        struct stat st;
        if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) file = path + "/tokenizer.json";
        std::unique_ptr<Tokenizer> t(new Tokenizer());
        t->source_ = file;
        t->parse(json_parse_file(file));
        return t;
    }

    // Parses an already-read tokenizer.json (`source` names it in errors).
    static std::unique_ptr<Tokenizer> from_json(const Json& j, const std::string& source) {
        std::unique_ptr<Tokenizer> t(new Tokenizer());
        t->source_ = source;
        t->parse(j);
        return t;
    }

    // Token ids of text. add_special_tokens adds what the post-processor's TemplateProcessing
    // adds around a single sequence (Llama-3's <|begin_of_text|>; nothing for Qwen). Chat
    // renderings already contain their special tokens and are encoded without.
    std::vector<int> encode(const std::string& text, bool add_special_tokens = false) const {
        std::vector<int> ids;
        if (add_special_tokens) ids = prefix_ids_;
        size_t start = 0;
        for (;;) {
            size_t len = 0;
            size_t at = find_added_token(text, start, &len);
            if (start == 0 && at == text.size()) encode_ordinary(text, ids);  // no added token: no copy
            else encode_ordinary(text.substr(start, at - start), ids);
            if (at == text.size()) break;
            ids.push_back(added_id_.at(text.substr(at, len)));
            start = at + len;
        }
        if (add_special_tokens) ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
        return ids;
    }

    std::string decode(const std::vector<int>& ids, bool skip_special_tokens = false) const {
        return utf8_sanitize(decode_bytes(ids, skip_special_tokens));
    }

    // Raw bytes of the tokens (not necessarily valid UTF-8; a token may hold part of a character).
    std::string decode_bytes(const std::vector<int>& ids, bool skip_special_tokens = false) const {
        std::string bytes;
        for (int id : ids) bytes += token_bytes(id, skip_special_tokens);
        return bytes;
    }

    // The bytes one token stands for; "" for an id without a token or a skipped special token.
    const std::string& token_bytes(int id, bool skip_special_tokens = false) const {
        static const std::string empty;
        if (id < 0 || (size_t)id >= id_bytes_.size()) return empty;
        if (skip_special_tokens && special_[(size_t)id]) return empty;
        return id_bytes_[(size_t)id];
    }

    // The first byte of text that no token holds (encode() drops it, as HF does), or -1. A real
    // model's vocabulary holds every byte; a fresh model's task tokenizer only its task's.
    int first_unencodable_byte(const std::string& text) const {
        for (unsigned char c : text)
            if (byte_id_[c] < 0) return c;
        return -1;
    }

    // -1 when the token string (in the tokenizer.json spelling, e.g. "Ġthe") is not in the vocabulary.
    int token_to_id(const std::string& token) const {
        return token_id_.find(token);
    }

    // "" for an id without a token.
    const std::string& id_to_token(int id) const {
        static const std::string empty;
        return id < 0 || (size_t)id >= id_token_.size() ? empty : id_token_[(size_t)id];
    }

    bool is_special(int id) const { return id >= 0 && (size_t)id < special_.size() && special_[(size_t)id]; }

    // One more than the largest id (vocab and added tokens); ids below it may still lack a token.
    int vocab_size() const { return (int)id_token_.size(); }

    // The normalizer (NFC or none) applied to text outside added tokens; invalid UTF-8 becomes U+FFFD.
    std::string normalize(const std::string& text) const { return nfc_ ? nfc(text) : utf8_sanitize(text); }

    const std::vector<AddedToken>& added_tokens() const { return added_; }
    const std::string& source() const { return source_; }

private:
    std::string source_;
    std::vector<std::string> id_token_;               // [vocab_size] file spelling, "" = none
    TokenIndex token_id_{id_token_};                  // vocab and added tokens, file spelling
    std::vector<std::string> id_bytes_;               // [vocab_size] bytes each token stands for
    std::vector<char> special_;                       // [vocab_size]
    std::vector<AddedToken> added_;
    std::unordered_map<std::string, int> added_id_;   // added token content -> id
    bool added_first_byte_[256] = {};                 // bytes an added token can start with
    MergeTable merges_;
    int byte_id_[256];                                // id of each single byte, -1 if absent
    bool ignore_merges_ = false;
    std::unordered_map<std::string, int> bytes_id_;   // whole-token bytes -> id (ignore_merges)
    bool nfc_ = false;
    std::vector<PreTokenizerStep> pre_;
    std::vector<int> prefix_ids_, suffix_ids_;        // TemplateProcessing around a single sequence
    mutable std::mutex cache_mutex_;
    mutable std::unordered_map<std::string, std::vector<int>> cache_;  // pre-token bytes -> ids
    static constexpr size_t cache_capacity = 200000, cache_max_word = 64;

    Tokenizer() = default;

    [[noreturn]] void bad(const std::string& what) const {
        fail("%s: %s", source_.c_str(), what.c_str());
    }

    const Json& member(const Json& obj, const char* key, Json::Type type, const char* where) const {
        const Json* v = obj.find(key);
        if (!v) bad(strfmt("%s has no \"%s\"; this is not a tokenizer.json that fp8rl can read", where, key));
        if (v->type != type && !(type == Json::Double && v->is_number()))
            bad(strfmt("%s.%s is %s, expected %s", where, key, json_type_name(v->type), json_type_name(type)));
        return *v;
    }

    bool flag(const Json& obj, const char* key, bool dflt, const char* where) const {
        const Json* v = obj.find(key);
        if (!v || v->is_null()) return dflt;
        if (!v->is_bool()) bad(strfmt("%s.%s must be true or false", where, key));
        return v->boolean;
    }

    void parse(const Json& j) {
        if (!j.is_object()) bad("the top level is not a JSON object");
        const Json* model = j.find("model");
        if (!model || model->is_null()) bad("no \"model\"; a tokenizer.json needs a BPE model");
        parse_model(*model);
        if (const Json* added = j.find("added_tokens")) parse_added(*added);
        token_id_.rebuild();
        parse_normalizer(j.find("normalizer"));
        parse_pre_tokenizer(j.find("pre_tokenizer"));
        parse_decoder(j.find("decoder"));
        parse_post_processor(j.find("post_processor"));
        id_bytes_.resize(id_token_.size());
        for (size_t id = 0; id < id_token_.size(); id++) id_bytes_[id] = byte_level_decode_token(id_token_[id]);
        if (ignore_merges_)
            for (size_t id = 0; id < id_token_.size(); id++)
                if (!id_token_[id].empty()) bytes_id_.emplace(id_bytes_[id], (int)id);
    }

    void set_token(int id, const std::string& token) {
        if (id < 0 || id > 16 * 1024 * 1024) bad(strfmt("token \"%s\" has id %d, outside 0..16M", token.c_str(), id));
        if ((size_t)id >= id_token_.size()) { id_token_.resize((size_t)id + 1); special_.resize((size_t)id + 1, 0); }
        id_token_[(size_t)id] = token;
    }

    void parse_model(const Json& m) {
        if (!m.is_object()) bad("\"model\" is not an object");
        const Json* type = m.find("type");
        std::string t = type && type->is_string() ? type->str : "";
        if (t.empty() && m.find("merges")) t = "BPE";  // old files omit the type of BPE models
        if (t != "BPE") bad(strfmt("model type \"%s\" is not supported; fp8rl reads byte-level BPE tokenizers only", t.c_str()));
        const Json* cont = m.find("continuing_subword_prefix");
        const Json* suffix = m.find("end_of_word_suffix");
        if ((cont && cont->is_string() && !cont->str.empty()) || (suffix && suffix->is_string() && !suffix->str.empty()))
            bad("model.continuing_subword_prefix / end_of_word_suffix are not supported (byte-level BPE has none)");
        if (flag(m, "byte_fallback", false, "model")) bad("model.byte_fallback is not supported (byte-level BPE needs none)");
        const Json* dropout = m.find("dropout");
        if (dropout && !dropout->is_null()) bad("model.dropout is set; BPE dropout is for training only, set it to null");
        ignore_merges_ = flag(m, "ignore_merges", false, "model");

        const Json& vocab = member(m, "vocab", Json::Object, "model");
        for (const auto& kv : vocab.fields) {
            if (!kv.second.is_int()) bad(strfmt("model.vocab[\"%s\"] is not an integer id", kv.first.c_str()));
            set_token((int)kv.second.integer, kv.first);
        }
        token_id_.rebuild();
        for (int b = 0; b < 256; b++) {
            std::string ch;
            utf8_append(ch, byte_to_unicode()[(size_t)b]);
            byte_id_[b] = token_to_id(ch);
        }
        const Json* unk = m.find("unk_token");
        if (unk && !unk->is_null())
            for (int b = 0; b < 256; b++)
                if (byte_id_[b] < 0) bad("model.unk_token is set and the vocab lacks some byte characters; fp8rl does not implement unknown tokens");
        parse_merges(member(m, "merges", Json::Array, "model"));
    }

    // Merges as "a b" strings (older files, Qwen2.5) or ["a", "b"] pairs (newer files, Qwen3).
    void parse_merges(const Json& merges) {
        merges_.reserve(merges.items.size());
        std::string joined;
        for (size_t rank = 0; rank < merges.items.size(); rank++) {
            const Json& m = merges.items[rank];
            std::string_view a, b;
            if (m.is_string()) {
                size_t sp = m.str.find(' ');
                if (sp == std::string::npos || m.str.find(' ', sp + 1) != std::string::npos)
                    bad(strfmt("model.merges[%zu] \"%s\" is not two symbols separated by one space", rank, m.str.c_str()));
                a = std::string_view(m.str).substr(0, sp);
                b = std::string_view(m.str).substr(sp + 1);
            } else if (m.is_array() && m.items.size() == 2 && m.items[0].is_string() && m.items[1].is_string()) {
                a = m.items[0].str;
                b = m.items[1].str;
            } else {
                bad(strfmt("model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", rank));
            }
            joined.assign(a).append(b);
            int ia = token_id_.find(a), ib = token_id_.find(b), iab = token_id_.find(joined);
            if (ia < 0 || ib < 0 || iab < 0)
                bad(strfmt("model.merges[%zu] (\"%s\", \"%s\") uses a token that is not in model.vocab", rank,
                           std::string(a).c_str(), std::string(b).c_str()));
            merges_.insert(ia, ib, (int)rank, iab);
        }
    }

    void parse_added(const Json& added) {
        if (!added.is_array()) bad("added_tokens is not an array");
        for (size_t i = 0; i < added.items.size(); i++) {
            const Json& t = added.items[i];
            std::string where = strfmt("added_tokens[%zu]", i);
            int id = (int)member(t, "id", Json::Int, where.c_str()).integer;
            const std::string& content = member(t, "content", Json::String, where.c_str()).str;
            if (content.empty()) bad(where + " has empty content");
            for (const char* k : {"single_word", "lstrip", "rstrip"})
                if (flag(t, k, false, where.c_str()))
                    bad(strfmt("%s (\"%s\") sets %s, which fp8rl does not implement", where.c_str(), content.c_str(), k));
            bool special = flag(t, "special", false, where.c_str());
            set_token(id, content);
            special_[(size_t)id] = special;
            added_.push_back({id, content, special});
            added_id_[content] = id;
            added_first_byte_[(unsigned char)content[0]] = true;
        }
    }

    void parse_normalizer(const Json* n) {
        if (!n || n->is_null()) return;
        std::string type = member(*n, "type", Json::String, "normalizer").str;
        if (type == "NFC") { nfc_ = true; return; }
        if (type == "Sequence") {
            for (const Json& step : member(*n, "normalizers", Json::Array, "normalizer").items) parse_normalizer(&step);
            return;
        }
        bad(strfmt("normalizer \"%s\" is not supported (fp8rl implements NFC or none)", type.c_str()));
    }

    void parse_pre_tokenizer(const Json* p) {
        if (p && !p->is_null()) parse_pre_step(*p);
        bool byte_level = false;
        for (const PreTokenizerStep& s : pre_) byte_level |= s.kind == PreTokenizerStep::ByteLevel;
        if (!byte_level)
            bad("pre_tokenizer has no ByteLevel step; fp8rl reads byte-level BPE tokenizers (GPT-2, Qwen, Llama-3 style) only");
    }

    void parse_pre_step(const Json& p) {
        std::string type = member(p, "type", Json::String, "pre_tokenizer").str;
        PreTokenizerStep s;
        if (type == "Sequence") {
            for (const Json& step : member(p, "pretokenizers", Json::Array, "pre_tokenizer").items) parse_pre_step(step);
            return;
        } else if (type == "Split") {
            const Json& pattern = member(p, "pattern", Json::Object, "pre_tokenizer Split");
            const Json* regex = pattern.find("Regex");
            if (!regex || !regex->is_string()) bad("pre_tokenizer Split: only {\"Regex\": ...} patterns are supported");
            const Json* behavior = p.find("behavior");
            if (!behavior || !behavior->is_string() || behavior->str != "Isolated" || flag(p, "invert", false, "pre_tokenizer Split"))
                bad("pre_tokenizer Split: only behavior \"Isolated\" without invert is supported");
            s.kind = PreTokenizerStep::Split;
            s.pattern = split_pattern_from_regex(regex->str, source_ + ": pre_tokenizer");
        } else if (type == "ByteLevel") {
            s.kind = PreTokenizerStep::ByteLevel;
            s.use_regex = flag(p, "use_regex", true, "pre_tokenizer ByteLevel");
            s.add_prefix_space = flag(p, "add_prefix_space", true, "pre_tokenizer ByteLevel");
        } else {
            bad(strfmt("pre_tokenizer \"%s\" is not supported (fp8rl implements Split, ByteLevel and Sequence)", type.c_str()));
        }
        pre_.push_back(s);
    }

    void parse_decoder(const Json* d) {
        std::string type = d && d->is_object() && d->find("type") && d->find("type")->is_string() ? d->find("type")->str : "";
        if (type != "ByteLevel") bad("decoder must be ByteLevel (fp8rl reads byte-level BPE tokenizers only)");
    }

    void parse_post_processor(const Json* p) {
        if (!p || p->is_null()) return;
        std::string type = member(*p, "type", Json::String, "post_processor").str;
        if (type == "ByteLevel") return;  // offsets only
        if (type == "Sequence") {
            for (const Json& step : member(*p, "processors", Json::Array, "post_processor").items) parse_post_processor(&step);
            return;
        }
        if (type != "TemplateProcessing")
            bad(strfmt("post_processor \"%s\" is not supported (fp8rl implements ByteLevel and TemplateProcessing)", type.c_str()));
        bool after = false;
        for (const Json& piece : member(*p, "single", Json::Array, "post_processor").items) {
            if (piece.find("Sequence")) { after = true; continue; }
            const Json* sp = piece.find("SpecialToken");
            if (!sp) bad("post_processor.single holds an entry that is neither Sequence nor SpecialToken");
            std::string name = member(*sp, "id", Json::String, "post_processor SpecialToken").str;
            const Json* entry = member(*p, "special_tokens", Json::Object, "post_processor").find(name);
            const Json* ids = entry ? entry->find("ids") : nullptr;
            if (!ids || !ids->is_array()) bad(strfmt("post_processor.special_tokens has no ids for \"%s\"", name.c_str()));
            for (const Json& id : ids->items) {
                if (!id.is_int() || id_to_token((int)id.integer).empty())
                    bad(strfmt("post_processor adds \"%s\" with an id that is not a token", name.c_str()));
                (after ? suffix_ids_ : prefix_ids_).push_back((int)id.integer);
            }
        }
    }

    // Byte offset of the leftmost added token at or after `from` (longest one there), or text.size().
    size_t find_added_token(const std::string& text, size_t from, size_t* len) const {
        for (size_t i = from; i < text.size(); i++) {
            if (!added_first_byte_[(unsigned char)text[i]]) continue;
            size_t best = 0;
            for (const AddedToken& t : added_)
                if (t.content.size() > best && text.compare(i, t.content.size(), t.content) == 0) best = t.content.size();
            if (best) { *len = best; return i; }
        }
        return text.size();
    }

    // Text without added tokens: normalize, pre-tokenize, BPE.
    void encode_ordinary(const std::string& raw, std::vector<int>& ids) const {
        if (raw.empty()) return;
        std::vector<std::string> pieces = {normalize(raw)}, next;
        for (const PreTokenizerStep& s : pre_) {
            next.clear();
            for (std::string& piece : pieces) {
                if (s.kind == PreTokenizerStep::ByteLevel && s.add_prefix_space && piece[0] != ' ') piece.insert(0, 1, ' ');
                if (s.kind == PreTokenizerStep::Split || s.use_regex) split_pretokens(piece, s.pattern, next);
                else next.push_back(std::move(piece));
            }
            pieces.swap(next);
        }
        for (const std::string& piece : pieces) bpe_cached(piece, ids);
    }

    void bpe_cached(const std::string& word, std::vector<int>& ids) const {
        if (word.size() > cache_max_word) { bpe(word, ids); return; }
        {
            std::lock_guard<std::mutex> lock(cache_mutex_);
            auto it = cache_.find(word);
            if (it != cache_.end()) { ids.insert(ids.end(), it->second.begin(), it->second.end()); return; }
        }
        size_t start = ids.size();
        bpe(word, ids);
        std::lock_guard<std::mutex> lock(cache_mutex_);
        if (cache_.size() >= cache_capacity) cache_.clear();
        cache_.emplace(word, std::vector<int>(ids.begin() + (long)start, ids.end()));
    }

    // BPE of one pre-token's bytes: merge the lowest-rank adjacent pair, leftmost first, until no
    // pair has a rule. A min-heap of (rank, position) over a linked list of symbols, as HF does.
    void bpe(const std::string& word, std::vector<int>& ids) const {
        if (ignore_merges_) {
            auto it = bytes_id_.find(word);
            if (it != bytes_id_.end()) { ids.push_back(it->second); return; }
        }
        std::vector<int> sym;  // [n] token id of each symbol; -1 once merged away
        for (unsigned char c : word)
            if (byte_id_[c] >= 0) sym.push_back(byte_id_[c]);  // HF drops bytes without a token
        size_t n = sym.size();
        std::vector<int> next(n), prev(n);  // [n] linked list of live symbols
        for (size_t i = 0; i < n; i++) { next[i] = (int)i + 1; prev[i] = (int)i - 1; }
        struct Cand { int rank, pos, left, right; };  // left/right ids at push time, to detect stale entries
        auto later = [](const Cand& x, const Cand& y) { return x.rank != y.rank ? x.rank > y.rank : x.pos > y.pos; };
        std::priority_queue<Cand, std::vector<Cand>, decltype(later)> heap(later);
        auto push = [&](int pos) {
            if (pos < 0 || next[(size_t)pos] >= (int)n) return;
            int r = next[(size_t)pos];
            if (const MergeTable::Rule* rule = merges_.find(sym[(size_t)pos], sym[(size_t)r]))
                heap.push({rule->rank, pos, sym[(size_t)pos], sym[(size_t)r]});
        };
        for (size_t i = 0; i + 1 < n; i++) push((int)i);
        while (!heap.empty()) {
            Cand c = heap.top();
            heap.pop();
            size_t p = (size_t)c.pos;
            if (sym[p] != c.left || next[p] >= (int)n || sym[(size_t)next[p]] != c.right) continue;  // stale
            size_t r = (size_t)next[p];
            sym[p] = merges_.find(c.left, c.right)->merged;
            sym[r] = -1;
            next[p] = next[r];
            if (next[r] < (int)n) prev[(size_t)next[r]] = (int)p;
            push(prev[p]);
            push((int)p);
        }
        for (size_t i = 0; i < n; i = (size_t)next[i]) ids.push_back(sym[i]);
    }
};

// Incremental decoding for streaming output: push ids one at a time and get the text that is
// complete so far; bytes of a character split across tokens are held back until it completes.
// The concatenation of every push() and the final flush() equals Tokenizer::decode of all ids.
class StreamDecoder {
public:
    explicit StreamDecoder(const Tokenizer& tok, bool skip_special_tokens = false)
        : tok_(tok), skip_special_(skip_special_tokens) {}

    std::string push(int id) {
        pending_ += tok_.token_bytes(id, skip_special_);
        size_t keep = utf8_incomplete_tail(pending_);
        std::string out = utf8_sanitize(pending_.substr(0, pending_.size() - keep));
        pending_.erase(0, pending_.size() - keep);
        return out;
    }

    // Whatever is left (an unfinished character becomes U+FFFD).
    std::string flush() {
        std::string out = utf8_sanitize(pending_);
        pending_.clear();
        return out;
    }

private:
    const Tokenizer& tok_;
    bool skip_special_;
    std::string pending_;
};

}  // namespace fp8rl
