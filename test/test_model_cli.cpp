// Tests of the model modes of the binary (rl/driver/cli.h): --logprobs against the HF reference,
// --prompts / --prompt generation against HF greedy output, and one clear error line for bad input.
#include <cstdio>
#include <string>
#include <vector>

#include "rl/io/json.h"
#include "test/harness.h"
#include "test/model_test_util.h"
#include "test/run_binary.h"

using namespace fp8rl;

namespace {

std::string write_temp(const std::string& name, const std::string& text) {
    std::string path = harness::scratch_dir() + "/" + name;
    FILE* f = fopen(path.c_str(), "wb");
    fwrite(text.data(), 1, text.size(), f);
    fclose(f);
    return path;
}

std::string ids_line(const std::vector<int32_t>& ids) {
    std::string s = "{\"ids\":[";
    for (size_t i = 0; i < ids.size(); i++) s += (i ? "," : "") + std::to_string(ids[i]);
    return s + "]}\n";
}

std::vector<float> numbers(const Json& arr) {
    std::vector<float> v;
    for (const Json& x : arr.items) v.push_back((float)x.number);
    return v;
}

}  // namespace

// --logprobs gives HF's log-probs and entropies for positions 1..n-1 of every line.
TEST(model_cli_logprobs_match_hf) {
    model_test::Fixture f("test/fixtures/model/llama_tiny.safetensors");
    TokenBatch b = f.batch();
    std::vector<float> lp = f.get("logprobs"), ent = f.get("entropy");
    std::string in;
    for (int s = 0; s < b.num_sequences(); s++)
        in += ids_line(std::vector<int32_t>(b.ids.begin() + b.offsets[s], b.ids.begin() + b.offsets[s + 1]));
    std::string path = write_temp("model_cli_logprobs.jsonl", in);
    harness::RunResult r = harness::run_command(harness::binary() + " --model test/fixtures/models/llama_tiny --logprobs " + path);
    CHECK_EQ(r.status, 0);
    size_t line = 0, start = 0;
    for (int s = 0; s < b.num_sequences() && r.status == 0; s++) {
        size_t nl = r.output.find('\n', start);
        Json row = json_parse(r.output.substr(start, nl - start), "output");
        start = nl + 1;
        std::vector<float> got_lp = numbers(*row.find("logprobs")), got_ent = numbers(*row.find("entropy"));
        const long n = b.offsets[s + 1] - b.offsets[s];
        CHECK_EQ((long)got_lp.size(), n - 1);
        CHECK_EQ((long)got_ent.size(), n - 1);
        for (long t = 1; t < n && (long)got_lp.size() == n - 1; t++) {
            CHECK_NEAR(got_lp[t - 1], lp[b.offsets[s] + t], 1e-5, 1e-6);
            CHECK_NEAR(got_ent[t - 1], ent[b.offsets[s] + t], 1e-5, 1e-6);
        }
        line++;
    }
    CHECK_EQ(line, (size_t)b.num_sequences());
}

// --prompts with ids and --temperature 0 reproduces HF greedy generation; --prompt gives the text
// of the same completion a {"prompt": ...} line gives.
TEST(model_cli_generation) {
    model_test::Fixture f("test/fixtures/model/qwen3_gqa3_tiny.safetensors");
    std::string path = write_temp("model_cli_prompts.jsonl", ids_line(f.ints("gen.prompt.0")) + ids_line(f.ints("gen.prompt.1")) +
                                                                 "{\"prompt\":\"What is 2 + 3?\"}\n");
    const std::string common = harness::binary() + " --model test/fixtures/models/qwen3_gqa3_tiny --temperature 0 --max_new_tokens 12";
    harness::RunResult r = harness::run_command(common + " --kv_cache fp32 --prompts " + path);
    CHECK_EQ(r.status, 0);
    const std::string& out = r.output;
    std::vector<std::string> lines;
    for (size_t i = 0, nl; (nl = out.find('\n', i)) != std::string::npos; i = nl + 1) lines.push_back(out.substr(i, nl - i));
    CHECK_EQ(lines.size(), (size_t)3);
    if (lines.size() != 3) return;
    for (int i = 0; i < 2; i++) {
        Json row = json_parse(lines[i], "output");
        std::vector<float> ids = numbers(*row.find("ids"));
        std::vector<float> ref = f.get("gen.tokens." + std::to_string(i));
        CHECK(ids == ref);
        CHECK(row.find("text") && row.find("text")->is_string());
        CHECK(row.find("finish")->str == (ids.size() < 12 ? "eos" : "length"));
    }
    harness::RunResult text = harness::run_command(common + " --kv_cache fp32 --prompt 'What is 2 + 3?'");
    CHECK_EQ(text.status, 0);
    CHECK_EQ(text.output, json_parse(lines[2], "output").find("text")->str + "\n");
}

TEST(model_cli_bad_input) {
    std::string path = write_temp("model_cli_bad.jsonl", "{\"ids\":[1,2,3]}\n{\"ids\":[1,99999]}\n");
    harness::RunResult r = harness::run_command(harness::binary() + " --model test/fixtures/models/qwen3_tiny --logprobs " + path + " 2>&1");
    CHECK_EQ(r.status, 1);
    CHECK_MSG(r.output.find("model_cli_bad.jsonl:2") != std::string::npos && r.output.find("vocabulary") != std::string::npos, "%s",
              r.output.c_str());
    r = harness::run_command(harness::binary() + " --logprobs " + path + " 2>&1");
    CHECK_EQ(r.status, 1);
    CHECK_MSG(r.output.find("--model") != std::string::npos, "%s", r.output.c_str());
    r = harness::run_command(harness::binary() + " --model test/fixtures/models/qwen3_tiny --temperature 0 --logprobs " + path + " 2>&1");
    CHECK_EQ(r.status, 1);
    CHECK_MSG(r.output.find("temperature") != std::string::npos, "%s", r.output.c_str());
}
