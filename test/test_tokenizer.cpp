// Tests of rl/text/unicode.h, rl/text/pretokenize.h and rl/text/tokenizer.h against fixtures from HF tokenizers
// (dev/make_tokenizer_fixtures.py): ids on the real Qwen3 and Qwen2.5 files and on Llama-3-style
// and GPT-2-style files built with the tokenizers library, decodes, NFC, invalid UTF-8, long
// documents; plus properties (round trip, streaming decode) and malformed tokenizer.json errors.
#include <cstdlib>
#include <map>
#include <memory>

#include "rl/text/chat.h"
#include "rl/text/tokenizer.h"
#include "test/harness.h"
#include "test/run_binary.h"

using namespace fp8rl;

static const std::string tokenizer_fixtures = "test/fixtures/tokenizer/";

// Tokenizers by fixture name (the real Qwen3 and Qwen2.5 files and the built ones, all under
// test/fixtures/tokenizer/), loaded once for all tests.
static const Tokenizer& tokenizer_named(const std::string& name) {
    static std::map<std::string, std::unique_ptr<Tokenizer>> loaded;
    std::unique_ptr<Tokenizer>& t = loaded[name];
    if (!t) t = Tokenizer::load(tokenizer_fixtures + name);
    return *t;
}

static std::vector<Json> read_jsonl(const std::string& path) {
    std::vector<Json> rows;
    std::string text = read_file(path);
    size_t line = 0;
    for (size_t start = 0; start < text.size();) {
        size_t end = text.find('\n', start);
        if (end == std::string::npos) end = text.size();
        line++;
        rows.push_back(json_parse(text.substr(start, end - start), strfmt("%s:%zu", path.c_str(), line)));
        start = end + 1;
    }
    return rows;
}

static std::vector<int> ids_of(const Json& array) {
    std::vector<int> ids;
    for (const Json& v : array.items) ids.push_back((int)v.integer);
    return ids;
}

static std::string hex_bytes(const std::string& hex) {
    std::string out;
    for (size_t i = 0; i + 1 < hex.size(); i += 2) out += (char)strtol(hex.substr(i, 2).c_str(), nullptr, 16);
    return out;
}

static std::string show(const std::vector<int>& ids) {
    std::string s;
    for (size_t i = 0; i < ids.size() && i < 40; i++) s += strfmt("%d ", ids[i]);
    return s + (ids.size() > 40 ? "..." : "");
}

// The long-document rule of dev/make_tokenizer_fixtures.py.
static std::string build_long(const std::vector<std::string>& corpus, const Json& spec) {
    std::string out;
    for (int64_t r = 0; r < spec.find("repeat")->integer; r++)
        for (const Json& i : spec.find("entries")->items) out += corpus[(size_t)i.integer] + spec.find("sep")->str;
    return out;
}

static std::string fnv1a64(const std::vector<int>& ids) {
    uint64_t h = 0xCBF29CE484222325ull;
    for (int id : ids)
        for (int k = 0; k < 4; k++) h = (h ^ (((uint32_t)id >> (8 * k)) & 0xFF)) * 0x100000001B3ull;
    return strfmt("%016llx", (unsigned long long)h);
}

// Every line of <name>.jsonl: encodes, long documents, invalid UTF-8, decodes; and the round trip.
static void check_tokenizer_against_hf(const std::string& name) {
    const Tokenizer* tok = &tokenizer_named(name);
    std::vector<std::string> corpus;
    for (const Json& row : read_jsonl(tokenizer_fixtures + "corpus.jsonl")) corpus.push_back(row.find("text")->str);
    int checked = 0;
    for (const Json& row : read_jsonl(tokenizer_fixtures + name + ".jsonl")) {
        if (const Json* text = row.find("text"); text && row.find("ids_special")) {
            std::vector<int> ids = tok->encode(text->str);
            CHECK_MSG(ids == ids_of(*row.find("ids")), "%s: encode(%s)\n      ours %s\n      HF   %s", name.c_str(),
                      json_quote(text->str.substr(0, 80)).c_str(), show(ids).c_str(), show(ids_of(*row.find("ids"))).c_str());
            CHECK_MSG(tok->encode(text->str, true) == ids_of(*row.find("ids_special")), "%s: encode with special tokens of %s",
                      name.c_str(), json_quote(text->str.substr(0, 80)).c_str());
            if (name != "gpt2_style")  // its ByteLevel add_prefix_space puts a space in front of the text
                CHECK_MSG(tok->decode(ids) == tok->normalize(text->str), "%s: decode(encode(x)) != normalized x for %s",
                          name.c_str(), json_quote(text->str.substr(0, 80)).c_str());
        } else if (const Json* spec = row.find("long")) {
            std::vector<int> ids = tok->encode(build_long(corpus, *spec));
            CHECK_MSG((int64_t)ids.size() == row.find("n_ids")->integer && fnv1a64(ids) == row.find("fnv1a64")->str,
                      "%s: long document %s: %zu ids, HF %lld", name.c_str(), json_quote(json_quote(spec->find("sep")->str)).c_str(),
                      ids.size(), (long long)row.find("n_ids")->integer);
        } else if (const Json* hex = row.find("hex")) {
            std::string bytes = hex_bytes(hex->str);
            CHECK_MSG(utf8_sanitize(bytes) == row.find("text")->str, "%s: U+FFFD replacement of %s", name.c_str(), hex->str.c_str());
            CHECK_MSG(tok->encode(bytes) == ids_of(*row.find("ids")), "%s: encode of invalid UTF-8 %s", name.c_str(), hex->str.c_str());
        } else if (const Json* ids = row.find("decode")) {
            CHECK_MSG(tok->decode(ids_of(*ids)) == row.find("text")->str, "%s: decode(%s)", name.c_str(), show(ids_of(*ids)).c_str());
            CHECK_MSG(tok->decode(ids_of(*ids), true) == row.find("text_skip")->str, "%s: decode skipping specials (%s)",
                      name.c_str(), show(ids_of(*ids)).c_str());
        } else {
            CHECK_MSG(false, "%s.jsonl: a line of unknown kind", name.c_str());
        }
        checked++;
    }
    CHECK(checked > 100);
}

TEST(tokenizer_qwen3_matches_hf) { check_tokenizer_against_hf("qwen3"); }
TEST(tokenizer_qwen25_matches_hf) { check_tokenizer_against_hf("qwen2.5"); }
TEST(tokenizer_llama3_style_matches_hf) { check_tokenizer_against_hf("llama3_style"); }
TEST(tokenizer_gpt2_style_matches_hf) { check_tokenizer_against_hf("gpt2_style"); }

TEST(tokenizer_nfc_matches_hf) {
    int n = 0;
    for (const Json& row : read_jsonl(tokenizer_fixtures + "nfc.jsonl")) {
        const std::string& text = row.find("text")->str;
        CHECK_MSG(nfc(text) == row.find("nfc")->str, "NFC of %s", json_quote(text.substr(0, 60)).c_str());
        n++;
    }
    CHECK(n > 100);
}

// Spec test vectors (spec-model.md 7.7), independent of the fixture script.
TEST(tokenizer_qwen3_spec_vectors) {
    const Tokenizer* tok = &tokenizer_named("qwen3");
    CHECK(tok->encode("Hello world") == std::vector<int>({9707, 1879}));
    CHECK(tok->encode("12345") == std::vector<int>({16, 17, 18, 19, 20}));
    CHECK(tok->encode("I'm don't you'LL") == std::vector<int>({40, 2776, 1513, 944, 498, 6, 4086}));
    CHECK_EQ(tok->token_to_id("<|im_end|>"), 151645);
    CHECK_EQ(tok->id_to_token(198), std::string("Ċ"));
    CHECK(tok->is_special(151645) && !tok->is_special(151667) && !tok->is_special(198));
    CHECK_EQ(tok->vocab_size(), 151669);
    CHECK_EQ(tok->decode({151667, 9707, 151645}, true), std::string("<think>Hello"));
}

// Streaming: the pieces concatenate to decode(ids), and no piece ends inside a UTF-8 character.
TEST(tokenizer_stream_decoder_never_splits_characters) {
    const Tokenizer* tok = &tokenizer_named("llama3_style");
    for (const Json& row : read_jsonl(tokenizer_fixtures + "corpus.jsonl")) {
        std::vector<int> ids = tok->encode(row.find("text")->str);
        for (bool skip : {false, true}) {
            StreamDecoder stream(*tok, skip);
            std::string all;
            for (int id : ids) {
                std::string piece = stream.push(id);
                CHECK_MSG(utf8_sanitize(piece) == piece, "a streamed piece is not whole UTF-8");
                all += piece;
            }
            all += stream.flush();
            CHECK_MSG(all == tok->decode(ids, skip), "streamed text differs from decode for %s",
                      json_quote(row.find("text")->str.substr(0, 60)).c_str());
        }
    }
    StreamDecoder cut(*tok);  // a character cut short at the end becomes U+FFFD on flush
    CHECK_EQ(cut.push(tok->token_to_id("\xC3\xA2")), std::string(""));  // "â" = byte 0xE2, a 3-byte lead
    CHECK_EQ(cut.push(tok->token_to_id("\xC4\xA4")), std::string(""));  // "Ĥ" = byte 0x82, a continuation
    CHECK_EQ(cut.flush(), std::string("\xEF\xBF\xBD"));
}

TEST(tokenizer_utf8_policy) {
    CHECK_EQ(utf8_sanitize("a\xFF" "b"), std::string("a\xEF\xBF\xBD" "b"));
    CHECK_EQ(utf8_sanitize("\xE2\x82" "A"), std::string("\xEF\xBF\xBD" "A"));  // one U+FFFD for a maximal subpart
    CHECK_EQ(utf8_sanitize("\xED\xA0\x80"), std::string("\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"));  // surrogate: 3
    CHECK_EQ(utf8_incomplete_tail("ab\xE2\x82"), (size_t)2);
    CHECK_EQ(utf8_incomplete_tail("ab\xE2\x82\xAC"), (size_t)0);
    CHECK_EQ(utf8_incomplete_tail("ab\xFF"), (size_t)0);
    CHECK_EQ(utf8_decode("\xF0\x9F\x98\x80").at(0), (uint32_t)0x1F600);
}

static void expect_load_error(const std::string& json, const char* message) {
    CHECK_THROWS(Tokenizer::from_json(json_parse(json, "t.json"), "t.json"), message);
}

TEST(tokenizer_malformed_json_is_a_clear_error) {
    const std::string pre = "\"pre_tokenizer\":{\"type\":\"ByteLevel\"},\"decoder\":{\"type\":\"ByteLevel\"}";
    expect_load_error("{" + pre + "}", "t.json: no \"model\"");
    expect_load_error("{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}," + pre + "}", "model type \"WordPiece\" is not supported");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a b\"]}," + pre + "}",
                      "model.merges[0] (\"a\", \"b\") uses a token that is not in model.vocab");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a\"]}," + pre + "}",
                      "model.merges[0] \"a\" is not two symbols");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[[\"a\"]]}," + pre + "}",
                      "model.merges[0] is neither");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":\"x\"},\"merges\":[]}," + pre + "}",
                      "model.vocab[\"a\"] is not an integer id");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]},\"decoder\":{\"type\":\"ByteLevel\"}}",
                      "pre_tokenizer has no ByteLevel step");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]},\"decoder\":{\"type\":\"ByteLevel\"},"
                      "\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\w+\"},\"behavior\":\"Isolated\"}}",
                      "Split regex \"\\w+\" is not one fp8rl implements");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]},\"normalizer\":{\"type\":\"Lowercase\"}," + pre + "}",
                      "normalizer \"Lowercase\" is not supported");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]},\"added_tokens\":[{\"id\":5,\"content\":\"<x>\","
                      "\"lstrip\":true}]," + pre + "}",
                      "sets lstrip");
    CHECK_THROWS(Tokenizer::load(tokenizer_fixtures + "no_such_dir"), "cannot open file");
}

// Chat renderings and their ids against transformers' apply_chat_template (`fixtures`: chat_<name>,
// or chat_tools_<name> with function schemas, dev/make_chat_tools_fixtures.py).
static void check_chat(const std::string& name, const std::string& fixtures = "chat_") {
    const Tokenizer* tok = &tokenizer_named(name);
    ChatTemplate chat = ChatTemplate::load(tokenizer_fixtures + name);
    int n = 0;
    for (const Json& row : read_jsonl(tokenizer_fixtures + fixtures + name + ".jsonl")) {
        ChatOptions opt;
        if (const Json* tools = row.find("tools")) opt.tools = chat_tools_from_json(*tools, name);
        opt.add_generation_prompt = row.find("add_generation_prompt")->boolean;
        const Json* thinking = row.find("enable_thinking");
        opt.enable_thinking = thinking->is_null() ? -1 : thinking->boolean ? 1 : 0;
        std::vector<ChatMessage> messages = chat_messages_from_json(*row.find("messages"), name);
        std::string text = chat.render(messages, opt);
        CHECK_MSG(text == row.find("text")->str, "%s chat rendering\n      ours %s\n      HF   %s", name.c_str(),
                  json_quote(text).c_str(), json_quote(row.find("text")->str).c_str());
        CHECK_MSG(chat.encode(*tok, messages, opt) == ids_of(*row.find("ids")), "%s chat ids", name.c_str());
        n++;
    }
    CHECK(n >= (fixtures == "chat_" ? 6 : 4));
}

TEST(tokenizer_chat_qwen3_matches_transformers) { check_chat("qwen3"); }
TEST(tokenizer_chat_qwen25_matches_transformers) { check_chat("qwen2.5"); }
TEST(tokenizer_chat_llama3_matches_transformers) { check_chat("llama3_style"); }
TEST(tokenizer_chat_qwen3_tools_match_transformers) { check_chat("qwen3", "chat_tools_"); }
TEST(tokenizer_chat_qwen25_tools_match_transformers) { check_chat("qwen2.5", "chat_tools_"); }

TEST(tokenizer_chat_unknown_template_is_a_clear_error) {
    CHECK_THROWS(ChatTemplate::load(tokenizer_fixtures + "gpt2_style"), "not found, so the chat template is unknown");
    CHECK_THROWS(ChatTemplate::load(tokenizer_fixtures + "gpt2_style/tokenizer.json"), "give raw prompts");
    CHECK_THROWS(chat_messages_from_json(json_parse("[]", "x"), "x"), "non-empty array");
    CHECK_THROWS(chat_messages_from_json(json_parse("[{\"role\":\"user\"}]", "x"), "x"), "needs string \"role\" and \"content\"");
    CHECK_EQ(tokenizer_config_token(tokenizer_fixtures + "llama3_style/tokenizer.json", "eos_token"), std::string("<|eot_id|>"));
    CHECK_EQ(tokenizer_config_token(tokenizer_fixtures + "llama3_style", "pad_token"), std::string(""));
    CHECK_EQ(tokenizer_config_token(tokenizer_fixtures + "gpt2_style", "eos_token"), std::string(""));
    ChatTemplate llama = ChatTemplate::load(tokenizer_fixtures + "llama3_style");
    CHECK_EQ(std::string(chat_family_name(llama.family())), std::string("llama3"));
    CHECK_THROWS(llama.render(chat_messages_from_json(json_parse("[{\"role\":\"tool\",\"content\":\"x\"}]", "x"), "x"), ChatOptions()),
                 "role \"tool\"");
    ChatOptions with_tools;
    with_tools.tools = chat_tools_from_json(json_parse("[{\"type\":\"function\"}]", "x"), "x");
    CHECK_THROWS(llama.render(chat_messages_from_json(json_parse("[{\"role\":\"user\",\"content\":\"x\"}]", "x"), "x"), with_tools),
                 "no function schemas");
    CHECK_THROWS(chat_tools_from_json(json_parse("[1]", "x"), "row 3"), "tools[0] must be an object");
}

static std::vector<Json> parse_lines(const std::string& text, const char* source) {
    std::vector<Json> rows;
    for (size_t i = 0; i < text.size();) {
        size_t nl = text.find('\n', i);
        if (nl == std::string::npos) nl = text.size();
        rows.push_back(json_parse(text.substr(i, nl - i), source));
        i = nl + 1;
    }
    return rows;
}

// --encode of the corpus gives HF's ids; --decode gives the text back; --chat gives HF's chat ids.
TEST(tokenizer_cli_encode_decode_chat) {
    const std::string tok = " --tokenizer " + tokenizer_fixtures + "llama3_style";
    harness::RunResult encoded = harness::run_command(harness::binary() + tok + " --encode " + tokenizer_fixtures + "corpus.jsonl");
    CHECK_EQ(encoded.status, 0);
    std::vector<Json> got = parse_lines(encoded.output, "--encode output");
    std::vector<Json> want = read_jsonl(tokenizer_fixtures + "llama3_style.jsonl");
    std::vector<Json> corpus = read_jsonl(tokenizer_fixtures + "corpus.jsonl");
    CHECK_EQ(got.size(), corpus.size());
    for (size_t i = 0; i < got.size() && i < want.size(); i++)
        CHECK_MSG(ids_of(*got[i].find("ids")) == ids_of(*want[i].find("ids")), "--encode line %zu", i + 1);

    const std::string ids_file = harness::scratch_dir() + "/tokenizer_cli_ids.jsonl";
    const char* ids_path = ids_file.c_str();
    FILE* f = fopen(ids_path, "wb");
    CHECK(f != nullptr);
    if (!f) return;
    fwrite(encoded.output.data(), 1, encoded.output.size(), f);
    fclose(f);
    harness::RunResult decoded = harness::run_command("cat " + std::string(ids_path) + " | " + harness::binary() + tok + " --decode -");
    CHECK_EQ(decoded.status, 0);
    std::vector<Json> texts = parse_lines(decoded.output, "--decode output");
    CHECK_EQ(texts.size(), corpus.size());
    for (size_t i = 0; i < texts.size() && i < corpus.size(); i++)
        CHECK_MSG(texts[i].find("text")->str == corpus[i].find("text")->str, "--decode line %zu", i + 1);

    harness::RunResult chat = harness::run_command(harness::binary() + tok + " --chat " + tokenizer_fixtures + "chat_llama3_style.jsonl");
    CHECK_EQ(chat.status, 0);
    std::vector<Json> chat_got = parse_lines(chat.output, "--chat output");
    std::vector<Json> chat_want = read_jsonl(tokenizer_fixtures + "chat_llama3_style.jsonl");
    CHECK_EQ(chat_got.size(), chat_want.size());
    for (size_t i = 0; i < chat_got.size() && i < chat_want.size(); i++)
        CHECK_MSG(ids_of(*chat_got[i].find("ids")) == ids_of(*chat_want[i].find("ids")), "--chat line %zu", i + 1);
}

TEST(tokenizer_cli_rejects_bad_input) {
    const std::string file = harness::scratch_dir() + "/tokenizer_cli_bad.jsonl";
    const char* path = file.c_str();
    FILE* f = fopen(path, "wb");
    CHECK(f != nullptr);
    if (!f) return;
    fputs("{\"text\": \"fine\"}\n\n{\"text\": 5}\n", f);
    fclose(f);
    const std::string tok = " --tokenizer " + tokenizer_fixtures + "llama3_style";
    harness::RunResult r = harness::run_command(harness::binary() + tok + " --encode " + path + " 2>&1");
    CHECK_EQ(r.status, 1);
    CHECK_MSG(r.output.find("error: " + file + ":3: expected {\"text\": \"...\"}") != std::string::npos, "%s", r.output.c_str());
    r = harness::run_command(harness::binary() + tok + " --decode " + path + " 2>&1");
    CHECK_EQ(r.status, 1);
    CHECK_MSG(r.output.find("tokenizer_cli_bad.jsonl:1: expected {\"ids\": [...]}") != std::string::npos, "%s", r.output.c_str());
    r = harness::run_command("echo '{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}' | " + harness::binary() +
                             " --tokenizer " + tokenizer_fixtures + "gpt2_style --chat - 2>&1");
    CHECK_EQ(r.status, 1);
    CHECK_MSG(r.output.find("give raw prompts") != std::string::npos, "%s", r.output.c_str());
    r = harness::run_command(harness::binary() + " --encode " + std::string(path) + " 2>&1");
    CHECK_EQ(r.status, 1);
    CHECK_MSG(r.output.find("--encode needs --tokenizer PATH") != std::string::npos, "%s", r.output.c_str());
    r = harness::run_command(harness::binary() + " --tokenizer build/no_such_tokenizer --encode " + std::string(path) + " 2>&1");
    CHECK_EQ(r.status, 1);
    CHECK_MSG(r.output.find("build/no_such_tokenizer: cannot open file") != std::string::npos, "%s", r.output.c_str());
}

// ignore_merges (Llama-3): a pre-token that is itself a vocab entry is emitted whole, even where
// the merges would split it. The fixture tokenizer holds whole words ("Ġhello", "quick") that its
// merges do not build; with ignore_merges turned off the same file splits them.
TEST(tokenizer_ignore_merges_emits_whole_vocab_words) {
    const Tokenizer* tok = &tokenizer_named("llama3_style");
    int hello = tok->token_to_id("Ġhello"), quick = tok->token_to_id("quick");
    CHECK(hello >= 0 && quick >= 0);
    CHECK(tok->encode(" hello") == std::vector<int>({hello}));
    CHECK(tok->encode("quick") == std::vector<int>({quick}));
    Json j = json_parse_file(tokenizer_fixtures + "llama3_style/tokenizer.json");
    for (auto& kv : j.fields)
        if (kv.first == "model")
            for (auto& m : kv.second.fields)
                if (m.first == "ignore_merges") m.second.boolean = false;
    std::unique_ptr<Tokenizer> merged = Tokenizer::from_json(j, "llama3_style without ignore_merges");
    CHECK(merged->encode(" hello").size() > 1);
    CHECK(merged->encode("quick").size() > 1);
    CHECK(tok->encode("Hi", true).front() == tok->token_to_id("<|begin_of_text|>"));
}
