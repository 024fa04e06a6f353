// Tests of rl/driver/args.h: parsing, rejection of bad flags, each binary's defaults and choices, and
// docs/flags.md carrying both binaries' --help tables.
#include "rl/driver/args.h"
#include "test/harness.h"

using namespace fp8rl;

static Args parse(std::vector<std::string> words, FlagEngine engine = FlagEngine::Cpu) {
    std::vector<char*> argv = {(char*)"train_rl_cpu"};
    for (std::string& w : words) argv.push_back(&w[0]);
    return Args::parse((int)argv.size(), argv.data(), engine);
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

// train_rl has no fp32: its defaults are bf16 and an fp32 value is refused with one line naming the
// binary that runs it.
TEST(args_gpu_binary_defaults_and_refusals) {
    Args cpu = parse({}), gpu = parse({}, FlagEngine::Gpu);
    CHECK_EQ(cpu.str("precision"), std::string("fp32"));
    CHECK_EQ(gpu.str("precision"), std::string("bf16"));
    for (const char* f : {"--precision", "--rollout_precision", "--train_precision", "--kv_cache"}) {
        CHECK_THROWS(parse({f, "fp32"}, FlagEngine::Gpu), "the GPU engine runs bf16|fp8 (fp32 is the CPU engine's");
        CHECK_EQ(parse({f, "fp32"}).str(f + 2), std::string("fp32"));
        CHECK_EQ(parse({f, "fp8"}, FlagEngine::Gpu).str(f + 2), std::string("fp8"));
    }
    CHECK_THROWS(parse({"--precision", "fp16"}, FlagEngine::Gpu), "must be one of bf16|fp8");
    std::string help = help_text(FlagEngine::Gpu);
    CHECK(help.find("| `--precision` | choice | bf16 | bf16\\|fp8 |") != std::string::npos);
    CHECK(help.find("fp32\\|") == std::string::npos);
    CHECK(help_text(FlagEngine::Cpu).find("| `--precision` | choice | fp32 | fp32\\|bf16\\|fp8 |") != std::string::npos);
}

TEST(args_docs_document_every_flag_of_both_binaries) {
    std::string doc = read_file("docs/flags.md");
    CHECK_MSG(doc.find(help_text(FlagEngine::Gpu)) != std::string::npos,
              "docs/flags.md's train_rl table differs from --help; paste `./train_rl_emu --help | tail -n +3` into it");
    CHECK_MSG(doc.find(help_text(FlagEngine::Cpu)) != std::string::npos,
              "docs/flags.md's train_rl_cpu table differs from --help; paste `./train_rl_cpu --help | tail -n +3` into it");
}
