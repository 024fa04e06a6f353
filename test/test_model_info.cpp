// Tests of `train_rl_cpu --model DIR --info` (the binary in $FP8RL_BIN): the report on the HF
// fixtures, and for broken directories one line on stderr naming the file, exit status 1, no signal.
#include <filesystem>
#include <string>

#include "rl/common.h"
#include "test/harness.h"
#include "test/run_binary.h"
#include "test/temp_dir.h"

using namespace fp8rl;

// What the binary printed, stdout and stderr kept apart: an error must be the only thing on stderr.
struct Printed {
    int status;  // -1: killed by a signal
    std::string out, err;
};

static Printed run_binary(const std::string& args, const harness::TempDir& tmp) {
    harness::RunResult r = harness::run_command(harness::binary() + " " + args + " 2>" + (tmp / "stderr"));
    return {r.status, r.output, read_file(tmp / "stderr")};
}

TEST(model_info_reports_fixtures) {
    harness::TempDir tmp;
    Printed r = run_binary("--model test/fixtures/models/qwen3_tiny --info", tmp);
    CHECK_EQ(r.status, 0);
    CHECK(r.err.empty());
    CHECK(r.out.find("architecture   qwen3 (Qwen3ForCausalLM)") != std::string::npos);
    CHECK(r.out.find("4 query heads, 2 kv heads (GQA 2:1), head_dim 32, q/k RMSNorm") != std::string::npos);
    CHECK(r.out.find("model.layers.{0..1}.self_attn.q_proj.weight") != std::string::npos);
    CHECK(r.out.find("parameters     119,232") != std::string::npos);  // torch's count (expected_qwen3_tiny.json)
    CHECK(r.out.find("238,464 as BF16") != std::string::npos);
    r = run_binary("--model test/fixtures/models/llama_tiny --info", tmp);
    CHECK_EQ(r.status, 0);
    CHECK(r.out.find("rope           llama3, theta 500000 (factor 32, low 1, high 4, original max positions 64)") != std::string::npos);
    CHECK(r.out.find("untied (lm_head.weight)") != std::string::npos);
    CHECK(r.out.find("parameters     110,912") != std::string::npos);
    r = run_binary("--model test/fixtures/models/qwen2_tiny --info", tmp);
    CHECK_EQ(r.status, 0);
    CHECK(r.out.find("q/k/v biases") != std::string::npos);
    CHECK(r.out.find("parameters     94,784") != std::string::npos);
}

TEST(model_info_broken_directories_fail_cleanly) {
    harness::TempDir tmp;
    namespace fs = std::filesystem;
    std::string d = tmp / "m";
    fs::create_directories(d);
    for (const char* f : {"config.json", "model.safetensors"})
        fs::copy_file("test/fixtures/models/qwen3_tiny/" + std::string(f), d + "/" + f);
    std::string weights = read_file(d + "/model.safetensors");
    std::string config = read_file(d + "/config.json");
    struct Case {
        const char* what;
        std::string config, weights;
        const char* needle;
    };
    std::string lying = weights;
    lying[2] = 0x7F;  // header length far past the end of the file
    const Case cases[] = {
        {"truncated weights", config, weights.substr(0, weights.size() / 2), "model.safetensors: the tensors cover"},
        {"lying header length", config, lying, "model.safetensors: header length"},
        {"empty weights", config, "", "model.safetensors: file is 0 bytes"},
        {"non-JSON config", "{\"model_type\": ", weights, "config.json:1:16: invalid JSON"},
        {"unknown architecture", "{\"model_type\": \"mamba\"}", weights, "config.json: model_type \"mamba\" is not supported"},
    };
    for (const Case& c : cases) {
        harness::write_text(d + "/config.json", c.config);
        harness::write_text(d + "/model.safetensors", c.weights);
        Printed r = run_binary("--model " + d + " --info", tmp);
        CHECK_MSG(r.status != -1, "%s: killed by a signal", c.what);
        CHECK_MSG(r.status == 1, "%s: exit status %d", c.what, r.status);
        CHECK_MSG(r.out.empty(), "%s: printed on stdout", c.what);
        size_t newlines = 0;
        for (char ch : r.err) newlines += ch == '\n';
        CHECK_MSG(newlines == 1 && r.err.compare(0, 7, "error: ") == 0, "%s: stderr is not one error line: %s", c.what, r.err.c_str());
        CHECK_MSG(r.err.find(c.needle) != std::string::npos, "%s: stderr lacks \"%s\": %s", c.what, c.needle, r.err.c_str());
    }
    Printed r = run_binary("--model " + tmp / "absent" + " --info", tmp);
    CHECK_EQ(r.status, 1);
    CHECK(r.err.find("absent/config.json: cannot open file") != std::string::npos);
    r = run_binary("--info", tmp);
    CHECK_EQ(r.status, 1);
    CHECK(r.err.find("--info needs --model DIR") != std::string::npos);
}
