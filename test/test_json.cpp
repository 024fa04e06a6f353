// Tests of rl/io/json.h: RFC 8259 acceptance and rejection, positions in errors, escapes.
#include "rl/io/json.h"
#include "test/harness.h"

using namespace fp8rl;

static Json parse(const std::string& s) { return json_parse(s, "t.json"); }

TEST(json_scalars) {
    CHECK(parse("null").is_null());
    CHECK(parse(" true ").boolean);
    CHECK(!parse("false").boolean);
    CHECK_EQ(parse("9223372036854775807").integer, INT64_C(9223372036854775807));
    CHECK_EQ(parse("-9223372036854775808").integer, INT64_MIN);
    CHECK(parse("9223372036854775808").type == Json::Double);
    CHECK_EQ(parse("-0.5e2").number, -50.0);
    CHECK_EQ(parse("1E+2").number, 100.0);
    CHECK(parse("1e-400").number == 0.0);
}

TEST(json_strings_and_escapes) {
    CHECK_EQ(parse("\"a\\\"\\\\\\/\\b\\f\\n\\r\\t\"").str, std::string("a\"\\/\b\f\n\r\t"));
    CHECK_EQ(parse("\"\\u00e9\\u4e2d\"").str, std::string("\xC3\xA9\xE4\xB8\xAD"));
    CHECK_EQ(parse("\"\\ud83d\\ude00\"").str, std::string("\xF0\x9F\x98\x80"));  // surrogate pair -> U+1F600
    CHECK_EQ(parse("\"\xF0\x9F\x98\x80\"").str, std::string("\xF0\x9F\x98\x80"));
}

TEST(json_containers_keep_order) {
    Json v = parse("{\"b\": [1, 2, {\"c\": null}], \"a\": {}}");
    CHECK(v.is_object());
    CHECK_EQ(v.fields.size(), (size_t)2);
    CHECK_EQ(v.fields[0].first, std::string("b"));
    CHECK_EQ(v.find("b")->items.size(), (size_t)3);
    CHECK(v.find("b")->items[2].find("c")->is_null());
    CHECK(v.find("zz") == nullptr);
}

TEST(json_rejects_invalid) {
    const char* bad[] = {"", "{", "[1,]", "{\"a\":1,}", "01", "1.", ".5", "+1", "-", "1e", "NaN", "Infinity",
                         "'a'", "\"abc", "\"\\x\"", "\"\\u12\"", "\"\\ud800\"", "\"\\udc00\"", "\"\\ud800\\u0041\"",
                         "\"\x01\"", "\"\xC0\xAF\"", "\"\xED\xA0\x80\"", "\"\xF5\x80\x80\x80\"", "\"\xE4\xB8\"",
                         "tru", "nul", "[1 2]", "{\"a\" 1}", "{1:2}", "1 2", "1e999", "/*c*/1"};
    for (const char* s : bad) CHECK_THROWS(parse(s), "invalid JSON");
}

TEST(json_duplicate_keys_and_depth) {
    CHECK_THROWS(parse("{\"a\":1,\"a\":2}"), "duplicate key \"a\"");
    std::string deep(600, '[');
    CHECK_THROWS(parse(deep), "nesting deeper");
    std::string ok(500, '[');
    ok += std::string(500, ']');
    CHECK(parse(ok).is_array());
}

TEST(json_error_position) {
    CHECK_THROWS(parse("{\n  \"a\": 1,\n  \"b\": x\n}"), "t.json:3:8:");
}

TEST(json_quote_round_trip) {
    std::string s = "q\"\\\n\t\x01 \xC3\xA9 \xF0\x9F\x98\x80";
    CHECK_EQ(parse(json_quote(s)).str, s);
    CHECK_EQ(json_quote("\xFF"), std::string("\"\xEF\xBF\xBD\""));  // invalid UTF-8 -> U+FFFD
}

TEST(json_duplicate_key_in_large_object_is_located) {
    std::string s = "{";
    for (int i = 0; i < 5000; i++) s += "\"k" + std::to_string(i) + "\":" + std::to_string(i) + ",\n";
    s += "\"k4321\":0}";
    CHECK_THROWS(parse(s), "t.json:5001:1: invalid JSON: duplicate key \"k4321\"");
    std::string many = "{";
    for (int i = 0; i < 20000; i++) many += "\"a\":1,";  // identical keys: found at once, no quadratic scan
    many += "\"a\":1}";
    CHECK_THROWS(parse(many), "t.json:1:8: invalid JSON: duplicate key \"a\"");
}

TEST(json_dump_round_trip) {
    const char* text = R"({"b": [1, -2, 3.5, 1e+300, 0.1, true, null], "a": {"s": "x\"\n\u00e9", "e": {}, "l": []}, "f": 2.0})";
    Json v = parse(text);
    for (int indent : {0, 2}) {
        std::string out = json_dump(v, indent);
        Json w = parse(out);
        CHECK_EQ(json_dump(w, indent), out);
        CHECK(w.find("f")->type == Json::Double);  // 2.0 stays a float
        CHECK_EQ(w.find("b")->items[4].number, 0.1);
        CHECK_EQ(w.fields[0].first, std::string("b"));  // key order kept
    }
    CHECK_EQ(json_dump(parse("[1,{\"a\":2.5}]")), std::string("[1,{\"a\":2.5}]"));
}
