// Tests of rl/driver/args.h: parsing, rejection of bad flags, and the README carrying the --help table.
#include "rl/driver/args.h"
#include "test/harness.h"

using namespace fp8rl;

static Args parse(std::vector<std::string> words) {
    std::vector<char*> argv = {(char*)"train_rl_cpu"};
    for (std::string& w : words) argv.push_back(&w[0]);
    return Args::parse((int)argv.size(), argv.data());
}

TEST(args_parse_values_and_defaults) {
    Args a = parse({"--top_k", "5", "--temperature", "0.5", "--info"});
    CHECK_EQ(a.integer("top_k"), (int64_t)5);
    CHECK_EQ(a.number("temperature"), 0.5);
    CHECK(a.flag("info"));
    CHECK(a.given("top_k"));
    CHECK(!a.given("top_p"));
    CHECK_EQ(a.number("top_p"), 1.0);
}

TEST(args_reject_bad_input) {
    CHECK_THROWS(parse({"--nope", "1"}), "unknown flag --nope");
    CHECK_THROWS(parse({"--top_k"}), "needs a value");
    CHECK_THROWS(parse({"--top_k", "x"}), "expected an integer");
    CHECK_THROWS(parse({"--top_p", "1.5"}), "out of range");
    CHECK_THROWS(parse({"--top_p", "nan"}), "finite number");
    CHECK_THROWS(parse({"--precision", "fp16"}), "must be one of");
    CHECK_THROWS(parse({"--top_k", "1", "--top_k", "2"}), "given twice");
    CHECK_THROWS(parse({"top_k"}), "expected a flag");
}

TEST(args_readme_documents_every_flag) {
    std::string readme = read_file("README.md");
    CHECK_MSG(readme.find(help_text()) != std::string::npos,
              "README.md's flag table differs from --help; paste `./train_rl_cpu --help | tail -n +3` into it");
}
