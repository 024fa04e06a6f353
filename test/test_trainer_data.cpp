// Tests of the trainer's host pieces: JSONL datasets (errors naming file:line, seeded shuffle,
// rank slices), the trainer state round trip, log.jsonl truncation on resume, the task tokenizer.
#include <algorithm>
#include <filesystem>

#include "rl/io/checkpoint.h"
#include "rl/tasks/data.h"
#include "rl/io/logger.h"
#include "rl/text/task_tokenizer.h"
#include "test/harness.h"

using namespace fp8rl;

static std::string temp_dir(const char* name) {
    std::string d = harness::scratch_dir() + "/" + name;
    std::filesystem::remove_all(d);
    std::filesystem::create_directories(d);
    return d;
}

static std::string write(const std::string& path, const std::string& text) {
    FILE* f = fopen(path.c_str(), "wb");
    fwrite(text.data(), 1, text.size(), f);
    fclose(f);
    return path;
}

TEST(trainer_dataset_reads_both_shapes) {
    std::string d = temp_dir("dataset_ok");
    std::string p = write(d + "/a.jsonl",
                          "{\"prompt\": \"1+1=\", \"answer\": \"2\"}\n\n"
                          "{\"messages\": [{\"role\": \"system\", \"content\": \"be brief\"}, {\"role\": \"user\", \"content\": \"2+2?\"}], \"answer\": 4}\n");
    std::vector<Example> ex = load_jsonl_dataset(p);
    CHECK_EQ(ex.size(), (size_t)2);
    CHECK_EQ(ex[0].prompt, std::string("1+1="));
    CHECK_EQ(ex[0].answer, std::string("2"));
    CHECK_EQ(ex[1].messages.size(), (size_t)2);
    CHECK_EQ(ex[1].messages[1].second, std::string("2+2?"));
    CHECK_EQ(ex[1].answer, std::string("4"));
}

TEST(trainer_dataset_bad_lines_name_file_and_line) {
    std::string d = temp_dir("dataset_bad");
    auto load = [&](const char* name, const std::string& text) { return load_jsonl_dataset(write(d + "/" + name, text)); };
    std::string ok = "{\"prompt\": \"x\", \"answer\": \"1\"}\n";
    CHECK_THROWS(load("a.jsonl", ok + "{\"prompt\": \"x\"\n"), "a.jsonl:2");
    CHECK_THROWS(load("b.jsonl", ok + ok + "{\"prompt\": \"x\"}\n"), "b.jsonl:3: missing \"answer\"");
    CHECK_THROWS(load("c.jsonl", "[1,2]\n"), "c.jsonl:1: a line must be a JSON object");
    CHECK_THROWS(load("d.jsonl", "{\"prompt\": \"x\", \"messages\": [], \"answer\": \"1\"}\n"), "d.jsonl:1: give exactly one");
    CHECK_THROWS(load("e.jsonl", "{\"messages\": [{\"role\": \"bot\", \"content\": \"x\"}], \"answer\": \"1\"}\n"), "e.jsonl:1: messages[0]: role \"bot\"");
    CHECK_THROWS(load("f.jsonl", "{\"prompt\": \"x\", \"answer\": [1]}\n"), "f.jsonl:1: \"answer\" must be");
    CHECK_THROWS(load("g.jsonl", "\n\n"), "g.jsonl: no examples");
    CHECK_THROWS(load_jsonl_dataset(d + "/missing.jsonl"), "missing.jsonl: cannot open");
}

TEST(trainer_shuffle_is_a_seeded_permutation_per_epoch) {
    std::vector<int64_t> a = shuffled_order(100, 7, 0), b = shuffled_order(100, 7, 0), c = shuffled_order(100, 7, 1);
    CHECK(a == b);
    CHECK(a != c);
    std::vector<int64_t> sorted = a;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t i = 0; i < 100; i++) CHECK_EQ(sorted[(size_t)i], i);
    int fixed = 0;
    for (int64_t i = 0; i < 100; i++) fixed += a[(size_t)i] == i;
    CHECK(fixed < 10);  // a shuffle, not the identity (expected ~1 fixed point)
}

TEST(trainer_rank_positions_tile_each_minibatch) {
    // 12 prompts, 2 minibatches, 2 ranks: minibatch 0 = positions 0..5 (rank 0: 0..2, rank 1: 3..5).
    std::vector<int64_t> r0 = PromptSource::rank_positions(12, 2, 0, 2), r1 = PromptSource::rank_positions(12, 2, 1, 2);
    CHECK(r0 == std::vector<int64_t>({0, 1, 2, 6, 7, 8}));
    CHECK(r1 == std::vector<int64_t>({3, 4, 5, 9, 10, 11}));
    CHECK(PromptSource::rank_positions(12, 2, 0, 1) == std::vector<int64_t>({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}));
    CHECK_THROWS(PromptSource::rank_positions(10, 2, 0, 2), "not a multiple of --minibatches 2 x 2 MPI ranks");
    std::vector<Example> ex(10);
    for (int i = 0; i < 10; i++) ex[(size_t)i].prompt = std::to_string(i);
    PromptSource src = PromptSource::from_dataset(ex, 3);
    std::vector<std::string> seen;  // positions 0..9 of one epoch: every example once
    for (int64_t i = 0; i < 10; i++) seen.push_back(src.at(i).prompt);
    std::sort(seen.begin(), seen.end());
    for (int i = 0; i < 10; i++) CHECK_EQ(seen[(size_t)i], std::to_string(i));
}

TEST(trainer_state_round_trip_and_damage) {
    TrainerState s;
    s.step = 7;
    s.data_cursor = 224;
    s.optimizer_steps = 14;
    s.bad_steps = 1;
    s.clip_low = 0.62;
    s.clip_high = 1.74;
    s.cc_low_unset = false;
    s.cc_high_unset = true;
    s.cc_pooled = {5, -1, 1LL << 40};
    s.cc_pooled_steps = 2;
    s.master = {1.5f, -2.25f, 3e-8f};
    s.adam_m = {0.1f, 0.2f, 0.3f};
    s.adam_v = {1e-9f, 2e-9f, 3e-9f};
    std::string bytes = encode_trainer_state(s);
    TrainerState t = decode_trainer_state(bytes, "x");
    CHECK_EQ(t.step, s.step);
    CHECK_EQ(t.data_cursor, s.data_cursor);
    CHECK_EQ(t.optimizer_steps, s.optimizer_steps);
    CHECK_EQ(t.bad_steps, s.bad_steps);
    CHECK_EQ(t.clip_low, s.clip_low);
    CHECK_EQ(t.clip_high, s.clip_high);
    CHECK(!t.cc_low_unset && t.cc_high_unset);
    CHECK(t.cc_pooled == s.cc_pooled);
    CHECK_EQ(t.cc_pooled_steps, s.cc_pooled_steps);
    CHECK(t.master == s.master && t.adam_m == s.adam_m && t.adam_v == s.adam_v);
    // A version 1 state (no Calibrated Clipping state after the bounds) reads with both bounds
    // decided and nothing pooled.
    std::string v1 = "FP8RLST1" + bytes.substr(8, 56) + bytes.substr(64 + 32 + 3 * 8);
    TrainerState u = decode_trainer_state(v1, "v1");
    CHECK_EQ(u.clip_low, s.clip_low);
    CHECK(!u.cc_low_unset && !u.cc_high_unset && u.cc_pooled.empty() && u.cc_pooled_steps == 0);
    CHECK(u.master == s.master && u.adam_m == s.adam_m && u.adam_v == s.adam_v);
    CHECK_THROWS(decode_trainer_state(bytes.substr(0, bytes.size() - 1), "ts.bin"), "ts.bin: truncated");
    CHECK_THROWS(decode_trainer_state(bytes + "x", "ts.bin"), "trailing bytes");
    CHECK_THROWS(decode_trainer_state("NOTSTATE" + bytes.substr(8), "ts.bin"), "bad magic");
}

TEST(trainer_checkpoint_dir_latest_and_resume_lookup) {
    std::string d = temp_dir("ckpt");
    TrainerState s;
    s.step = 3;
    s.master = s.adam_m = s.adam_v = {1.0f};
    std::string dir = save_checkpoint(d, s, [](const std::string& tmp) { write(tmp + "/config.json", "{}"); });
    CHECK(std::filesystem::exists(dir + "/config.json"));
    CHECK(!std::filesystem::exists(dir + ".tmp"));
    CHECK_EQ(resolve_checkpoint(d), d + "/checkpoints/step_000003");
    CHECK_EQ(load_trainer_state(resolve_checkpoint(d)).step, (int64_t)3);
    CHECK_THROWS(resolve_checkpoint(d + "/nothing"), "neither a checkpoint");
}

TEST(trainer_log_keeps_only_earlier_steps_on_resume) {
    std::string d = temp_dir("log");
    {
        Logger log(d, true, 0);
        for (int s = 0; s < 4; s++) {
            MetricRow r;
            r.set("training/global_step", s);
            r.set("x", s == 2 ? NAN : 0.5 * s);
            log.record(r);
        }
    }
    CHECK(read_file(d + "/log.jsonl").find("\"x\":null") != std::string::npos);
    Logger resumed(d, true, 2);
    CHECK_EQ(read_file(d + "/log.jsonl"),
             std::string("{\"training/global_step\":0,\"x\":0}\n{\"training/global_step\":1,\"x\":0.5}\n"));
}

TEST(trainer_task_tokenizer_vocab) {
    std::vector<Example> ex(1);
    ex[0].prompt = "12+3= \n";
    ex[0].answer = "15";
    std::string sym = task_symbols(ex);
    CHECK_EQ(sym, std::string("\n +0123456789="));
    CHECK_EQ(task_vocab_size(sym), (int64_t)15);
    // GPT-2 byte-level characters: space is U+0120, newline U+010A, printable ASCII is itself.
    CHECK_EQ(byte_level_char(' '), std::string("\xC4\xA0"));
    CHECK_EQ(byte_level_char('\n'), std::string("\xC4\x8A"));
    CHECK_EQ(byte_level_char('+'), std::string("+"));
    Json tok = json_parse(task_tokenizer_json(sym), "tokenizer.json");
    const Json* vocab = tok.find("model")->find("vocab");
    CHECK_EQ(vocab->fields.size(), (size_t)15);
    CHECK_EQ(vocab->find("<|endoftext|>")->integer, (int64_t)14);
    CHECK_EQ(vocab->find("=")->integer, (int64_t)13);
}
