// data.h: where prompts come from. A JSONL dataset ({"prompt": .., "answer": ..} or
// {"messages": [..], "answer": ..} per line) is visited in a seeded shuffled order, a new
// permutation per epoch; a synthetic task generates example i from (seed, i). Either way the
// example at a global index is a pure function of (seed, index), so the only data state a
// checkpoint needs is the cursor (prompts consumed so far), and every rank computes the same
// global batch and takes its own contiguous slice of whole prompts (a group is never split).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "rl/common.h"
#include "rl/io/json.h"
#include "rl/numerics/rng.h"

namespace fp8rl {

struct Example {
    std::string prompt;                                         // plain prompt, or empty
    std::vector<std::pair<std::string, std::string>> messages;  // (role, content), or empty
    std::string answer;                                         // ground truth for the verifier
    std::string data = "{}";  // the row's other fields, a JSON object, sent to --reward_cmd as "data"
};

// The data row's fields other than prompt, messages and answer, as one JSON object.
inline std::string data_fields_json(const Json& row) {
    Json data;
    data.type = Json::Object;
    for (const auto& kv : row.fields)
        if (kv.first != "prompt" && kv.first != "messages" && kv.first != "answer") data.fields.push_back(kv);
    return json_dump(data);
}

// One JSONL line -> Example; `where` is "file:line" for errors.
inline Example parse_example(const std::string& line, const std::string& where) {
    const char* shape = "each line must be {\"prompt\": \"...\", \"answer\": ...} or {\"messages\": [{\"role\": ..., \"content\": ...}], \"answer\": ...}";
    Json j = json_parse(line, where);
    if (!j.is_object()) fail("%s: a line must be a JSON object; %s", where.c_str(), shape);
    Example ex;
    const Json* answer = j.find("answer");
    if (!answer) fail("%s: missing \"answer\"; %s", where.c_str(), shape);
    if (answer->is_string()) ex.answer = answer->str;
    else if (answer->is_int()) ex.answer = std::to_string(answer->integer);
    else fail("%s: \"answer\" must be a string or an integer, not %s", where.c_str(), json_type_name(answer->type));
    ex.data = data_fields_json(j);
    const Json* prompt = j.find("prompt");
    const Json* messages = j.find("messages");
    if ((prompt != nullptr) == (messages != nullptr))
        fail("%s: give exactly one of \"prompt\" and \"messages\"; %s", where.c_str(), shape);
    if (prompt) {
        if (!prompt->is_string() || prompt->str.empty())
            fail("%s: \"prompt\" must be a non-empty string", where.c_str());
        ex.prompt = prompt->str;
        return ex;
    }
    if (!messages->is_array() || messages->items.empty())
        fail("%s: \"messages\" must be a non-empty array of {\"role\", \"content\"} objects", where.c_str());
    for (size_t i = 0; i < messages->items.size(); i++) {
        const Json& m = messages->items[i];
        const Json* role = m.find("role");
        const Json* content = m.find("content");
        if (!role || !role->is_string() || !content || !content->is_string())
            fail("%s: messages[%zu] needs string \"role\" and \"content\"", where.c_str(), i);
        if (role->str != "system" && role->str != "user" && role->str != "assistant")
            fail("%s: messages[%zu]: role \"%s\" is not system, user or assistant", where.c_str(), i, role->str.c_str());
        ex.messages.emplace_back(role->str, content->str);
    }
    return ex;
}

// Every non-blank line of a JSONL file; errors name file:line.
inline std::vector<Example> load_jsonl_dataset(const std::string& path) {
    std::string text = read_file(path);
    std::vector<Example> out;
    size_t pos = 0;
    int line_no = 0;
    while (pos < text.size()) {
        size_t nl = text.find('\n', pos);
        if (nl == std::string::npos) nl = text.size();
        std::string line = text.substr(pos, nl - pos);
        pos = nl + 1;
        line_no++;
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        out.push_back(parse_example(line, strfmt("%s:%d", path.c_str(), line_no)));
    }
    if (out.empty()) fail("%s: no examples (the file is empty); expected one JSON object per line", path.c_str());
    return out;
}

// Position p of the seeded permutation of n items for one epoch (Fisher-Yates, Philox draws).
inline std::vector<int64_t> shuffled_order(int64_t n, uint64_t seed, uint32_t epoch) {
    std::vector<int64_t> order((size_t)n);
    for (int64_t i = 0; i < n; i++) order[(size_t)i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        Philox4 r = rng_bits(seed, epoch, 0, (uint32_t)i, kRngShuffle);
        uint64_t x = ((uint64_t)r.w[1] << 32) | r.w[0];
        std::swap(order[(size_t)i], order[(size_t)(x % (uint64_t)(i + 1))]);
    }
    return order;
}

// The prompts of a run: example(global index) is deterministic.
class PromptSource {
public:
    using Generator = std::function<Example(uint64_t seed, int64_t index)>;

    static PromptSource from_dataset(std::vector<Example> examples, uint64_t seed) {
        PromptSource s;
        s.examples_ = std::move(examples);
        s.seed_ = seed;
        return s;
    }
    static PromptSource from_generator(Generator gen, uint64_t seed) {
        PromptSource s;
        s.generator_ = std::move(gen);
        s.seed_ = seed;
        return s;
    }

    // A dataset's size; 0 for a generator (unbounded).
    int64_t size() const { return (int64_t)examples_.size(); }

    Example at(int64_t index) {
        if (generator_) return generator_(seed_, index);
        int64_t n = size();
        uint32_t epoch = (uint32_t)(index / n);
        if (epoch != order_epoch_ || order_.empty()) {
            order_ = shuffled_order(n, seed_, epoch);
            order_epoch_ = epoch;
        }
        return examples_[(size_t)order_[(size_t)(index % n)]];
    }

    // This rank's positions in a global batch of `global` prompts that is split into `minibatches`
    // minibatches, each split evenly over the ranks: rank r holds, for every minibatch j, the
    // contiguous positions [j*global/minibatches + r*per, +per), per = global/(minibatches*ranks).
    // Minibatch j is then the same set of prompts for any number of ranks, and a prompt's group
    // stays on one rank.
    static std::vector<int64_t> rank_positions(int64_t global, int minibatches, int rank, int ranks) {
        if (global % ((int64_t)minibatches * ranks) != 0)
            fail("--batch_prompts %lld is not a multiple of --minibatches %d x %d MPI ranks; each minibatch's prompts (and their groups) are split evenly over the ranks",
                 (long long)global, minibatches, ranks);
        int64_t per = global / ((int64_t)minibatches * ranks), mb = global / minibatches;
        std::vector<int64_t> out;
        for (int j = 0; j < minibatches; j++)
            for (int64_t i = 0; i < per; i++) out.push_back(j * mb + rank * per + i);
        return out;
    }

private:
    std::vector<Example> examples_;
    Generator generator_;
    uint64_t seed_ = 0;
    std::vector<int64_t> order_;
    uint32_t order_epoch_ = 0;
};

}  // namespace fp8rl
