// Tests of corpus-scale SFT/CPT data (docs/sft.md): token shards (rl/io/token_shard.h) written by
// --encode_bin train exactly what their JSONL trains, for CPT and SFT; a bad shard is one line and exit
// 1; --data_mix blends by weight as a pure function of the position (resume bit-exact, ranks disjoint).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "rl/driver/lm_sources.h"
#include "rl/driver/train_config.h"
#include "test/harness.h"
#include "test/training_run.h"

using namespace fp8rl;

namespace {

// A CPT corpus of `docs` documents of words (deterministic), as JSONL.
std::string shard_corpus(const std::string& path, int docs, uint64_t seed) {
    const char* words[] = {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "fast", "\u00e9t\u00e9", "42"};
    std::string text;
    uint64_t x = seed * 2654435761u + 1;
    auto next = [&x] { return (x = x * 6364136223846793005ull + 1442695040888963407ull) >> 33; };
    for (int d = 0; d < docs; d++) {
        std::string doc;
        const int n = 3 + (int)(next() % 25);
        for (int w = 0; w < n; w++) doc += std::string(w ? " " : "") + words[next() % 12];
        text += "{\"text\": \"" + doc + ".\"}\n";
    }
    write_file_atomic(path, text);
    return path;
}

// Two runs' logs (but wall-clock metrics) and final weights and moments equal bit for bit.
void shard_runs_equal(const std::string& a, const std::string& b, size_t rows) {
    const std::vector<std::string> x = log_without_timing(a), y = log_without_timing(b);
    CHECK_EQ(x.size(), rows);
    CHECK_EQ(y.size(), rows);
    for (size_t i = 0; i < std::min(x.size(), y.size()); i++) CHECK_MSG(x[i] == y[i], "row %zu:\n%s\n%s", i, x[i].c_str(), y[i].c_str());
    const TrainerState s = final_state(a), t = final_state(b);
    CHECK(!s.master.empty() && s.master == t.master && s.adam_m == t.adam_m && s.adam_v == t.adam_v);
    CHECK_EQ(s.data_cursor, t.data_cursor);
}

const char* const kShardCpt = " --mode cpt --init tiny --threads 2 --seq_len 32 --batch_seqs 4 --lr 1e-3 --train_precision fp8";

}  // namespace

// CPT: JSONL -> --encode_bin -> training equals training on the JSONL, bit for bit (every logged
// metric of every step, the held-out losses, the final weights and AdamW moments), with windows that
// cross documents and with --doc_mask 1. Under the sanitizer --doc_mask 1 alone (16 s of CI there for
// both; CPT training without the mask runs there in cpt_then_sft_from_checkpoint).
TEST(cpt_shard_trains_as_jsonl) {
    const std::string d = temp_dir("cpt_shard");
    shard_corpus(d + "/train.jsonl", 80, 1);
    shard_corpus(d + "/eval.jsonl", 12, 2);
    for (const char* f : {"train", "eval"}) {
        harness::RunResult e = run_cmd(harness::binary() + kShardCpt + strfmt(" --encode_bin %s/%s.bin --data %s/%s.jsonl --out_dir %s/enc", d.c_str(), f, d.c_str(), f, d.c_str()));
        CHECK_MSG(e.status == 0 && e.output.find("documents") != std::string::npos, "%s", e.output.c_str());
    }
    for (const char* mask : harness::sanitized ? std::vector<const char*>{"1"} : std::vector<const char*>{"0", "1"}) {
        for (const char* ext : {"jsonl", "bin"}) {
            harness::RunResult r = run_cmd(harness::binary() + kShardCpt +
                                           strfmt(" --doc_mask %s --steps 2 --eval_every 1 --data %s/train.%s --eval_data %s/eval.%s --out_dir %s/%s_%s",
                                                  mask, d.c_str(), ext, d.c_str(), ext, d.c_str(), ext, mask));
            CHECK_MSG(r.status == 0, "%s", r.output.c_str());
        }
        shard_runs_equal(d + "/jsonl_" + mask, d + "/bin_" + mask, 3);  // the step-0 eval, then 2 steps
    }
}

// SFT: conversations and prompt/completion rows, encoded with their loss masks, train as their JSONL
// does; --max_seq_len leaves out the same rows (the index alone says which) with the same count.
TEST(sft_shard_trains_as_jsonl) {
    const std::string d = temp_dir("sft_shard");
    const std::string model = " --model test/fixtures/models/qwen3_tiny --threads 2 --mode sft";
    for (const char* f : {"messages", "prompt"}) {
        harness::RunResult e = run_cmd(harness::binary() + model + strfmt(" --encode_bin %s/%s.bin --data test/fixtures/sft/%s.jsonl", d.c_str(), f, f));
        CHECK_MSG(e.status == 0 && e.output.find("rows") != std::string::npos, "%s", e.output.c_str());
    }
    std::string counts[2];
    for (int i = 0; i < 2; i++) {
        const std::string dir = i ? d + "/sft_bin" : d + "/sft_jsonl";
        const std::string train = i ? d + "/messages.bin" : "test/fixtures/sft/messages.jsonl";
        const std::string eval = i ? d + "/prompt.bin" : "test/fixtures/sft/prompt.jsonl";
        harness::RunResult r = run_cmd(harness::binary() + model + " --batch_seqs 2 --steps 3 --lr 1e-3 --train_precision bf16 --max_seq_len 150" +
                                       " --data " + train + " --eval_data " + eval + " --out_dir " + dir);
        CHECK_MSG(r.status == 0, "%s", r.output.c_str());
        const size_t at = r.output.find("left out ");
        CHECK_MSG(at != std::string::npos, "--max_seq_len 150 leaves out no row:\n%s", r.output.c_str());
        if (at != std::string::npos) counts[i] = r.output.substr(at, r.output.find(" rows", at) - at);
    }
    CHECK_MSG(counts[0] == counts[1], "JSONL: \"%s\", shard: \"%s\"", counts[0].c_str(), counts[1].c_str());
    shard_runs_equal(d + "/sft_jsonl", d + "/sft_bin", 4);
}

// Windows and rows read from a shard equal those of the JSONL path, token widths 2 and 4 (a
// vocabulary over 65536), and the SFT mask bits survive the bit plane.
TEST(token_shard_reads_what_it_wrote) {
    const std::string d = temp_dir("shard_rw");
    write_file_atomic(d + "/docs.jsonl", "{\"ids\": [1, 2, 3]}\n{\"ids\": [4, 70000]}\n\n{\"ids\": [6, 7, 8, 9, 99999]}\n");
    for (uint32_t vocab : {10u, 100000u}) {
        const bool wide = vocab > 65536;
        const std::string jsonl = wide ? d + "/docs.jsonl" : d + "/small.jsonl";
        if (!wide) write_file_atomic(jsonl, "{\"ids\": [1, 2, 3]}\n{\"ids\": [4, 5]}\n{\"ids\": [6, 7, 8, 9]}\n");
        ShardWriter w(d + "/s.bin", ShardKind::Documents, vocab, 77, 0);
        for_each_jsonl_row(jsonl, [&](const Json& row, const std::string& where) {
            std::vector<int32_t> ids = cpt_document_ids(row, where, nullptr, (int)vocab);
            ids.push_back(0);
            w.add(ids, nullptr);
        });
        w.finish();
        // header, tokens (13 of 4 bytes, or 12 of 2) padded to 8 bytes, 3 + 1 document offsets
        CHECK_EQ(std::filesystem::file_size(d + "/s.bin"), (uintmax_t)(64 + (wide ? 56 : 24) + 4 * 8));
        for (bool mask : {false, true}) {
            const std::vector<LmRow> want = load_cpt_windows(jsonl, nullptr, (int)vocab, 0, 4, mask);
            ShardWindows got(std::make_shared<const TokenShard>(d + "/s.bin", vocab, 77), 4, mask);
            CHECK_EQ(got.size(), (int64_t)want.size());
            for (int64_t i = 0; i < std::min(got.size(), (int64_t)want.size()); i++) {
                const LmRow g = got.row(i);
                CHECK_EQ(g.size(), want[(size_t)i].size());
                for (size_t k = 0; k < std::min(g.size(), want[(size_t)i].size()); k++)
                    CHECK(g[k].ids == want[(size_t)i][k].ids && g[k].loss == want[(size_t)i][k].loss);
            }
        }
    }
    ShardWriter w(d + "/rows.bin", ShardKind::SftRows, 50, 5, 3);
    std::vector<std::vector<uint8_t>> masks;
    for (int r = 0; r < 5; r++) {
        std::vector<int32_t> ids;
        masks.emplace_back();
        for (int t = 0; t < 3 + 4 * r; t++) {
            ids.push_back((r * 7 + t) % 50);
            masks.back().push_back((uint8_t)(t > 0 && (t * 5 + r) % 3 != 0));
        }
        w.add(ids, &masks.back());
    }
    w.finish();
    ShardSftRows rows(std::make_shared<const TokenShard>(d + "/rows.bin", 50, 5), 12, false);
    CHECK_EQ(rows.size(), (int64_t)3);  // rows of 3, 7, 11 tokens; 15 and 19 left out
    for (int64_t i = 0; i < std::min<int64_t>(rows.size(), 3); i++) CHECK(rows.row(i)[0].loss == masks[(size_t)i]);
}

// A truncated shard, one with the wrong magic, one from another tokenizer, one of the other kind:
// one line naming the file and what to do, exit 1.
TEST(token_shard_refusals) {
    const std::string d = temp_dir("shard_bad");
    shard_corpus(d + "/docs.jsonl", 30, 3);
    harness::RunResult e = run_cmd(harness::binary() + kShardCpt + " --encode_bin " + d + "/docs.bin --data " + d + "/docs.jsonl --out_dir " + d + "/enc");
    CHECK_MSG(e.status == 0, "%s", e.output.c_str());
    harness::RunResult s = run_cmd(harness::binary() + " --model test/fixtures/models/qwen3_tiny --mode sft --encode_bin " + d +
                                   "/sft.bin --data test/fixtures/sft/prompt.jsonl");
    CHECK_MSG(s.status == 0, "%s", s.output.c_str());
    const std::string bytes = read_file(d + "/docs.bin");
    write_file_atomic(d + "/short.bin", bytes.substr(0, bytes.size() - 3));
    write_file_atomic(d + "/magic.bin", "GPT2TOKS" + bytes.substr(8));
    write_file_atomic(d + "/tiny.bin", bytes.substr(0, 10));
    const std::vector<std::pair<std::string, std::string>> cases = {
        {kShardCpt + std::string(" --data ") + d + "/short.bin", "truncated or corrupt"},
        {kShardCpt + std::string(" --data ") + d + "/magic.bin", "not a token shard (wrong magic)"},
        {kShardCpt + std::string(" --data ") + d + "/tiny.bin", "shorter than a token shard's header"},
        {" --mode cpt --model test/fixtures/models/qwen3_tiny --seq_len 16 --data " + d + "/docs.bin", "encoded with another tokenizer"},
        {" --mode cpt --model test/fixtures/models/qwen3_tiny --seq_len 16 --data " + d + "/sft.bin", "a shard of SFT rows"},
        {" --mode sft --model test/fixtures/models/qwen3_tiny --data_mix " + d + "/sft.bin:0", "is not PATH:WEIGHT"},
        {kShardCpt + std::string(" --encode_bin ") + d + "/x.jsonl --data " + d + "/docs.jsonl", "name the shard OUT.bin"},
    };
    for (const auto& [flags, want] : cases) {
        harness::RunResult r = run_cmd(harness::binary() + flags + " --steps 1 --out_dir " + d + "/run");
        // stderr's line comes unbuffered, before or among stdout's config table
        const size_t at = r.output.find("error: ");
        const std::string line = at == std::string::npos ? "" : r.output.substr(at, r.output.find('\n', at) - at);
        CHECK_MSG(r.status == 1 && line.find(want) != std::string::npos && r.output.find("error: ", at + 1) == std::string::npos,
                  "%s: want one error line with \"%s\", got status %d:\n%s", flags.c_str(), want.c_str(), r.status,
                  r.output.c_str());
    }
}

namespace {

// Two shards of windows told apart by their ids: a's in [1, 40), b's in [40, 80).
void mixture_shards(const std::string& d) {
    for (int s = 0; s < 2; s++) {
        ShardWriter w(d + (s ? "/b.bin" : "/a.bin"), ShardKind::Documents, 100, 9, 0);
        for (int doc = 0; doc < 50 + 30 * s; doc++) {
            std::vector<int32_t> ids;
            for (int t = 0; t < 5 + doc % 7; t++) ids.push_back(1 + 40 * s + (doc * 3 + t) % 39);
            ids.push_back(0);
            w.add(ids, nullptr);
        }
        w.finish();
    }
}

std::unique_ptr<LmStream> mixture_stream(const std::string& mix, uint64_t seed) {
    LmSourceSpec spec;
    spec.mode = "cpt";
    spec.vocab = 100;
    spec.tokenizer_hash = 9;
    spec.seq_len = 8;
    return open_lm_stream("", mix, spec, seed);
}

int window_source(const LmRow& row) { return *std::max_element(row[0].ids.begin(), row[0].ids.end()) >= 40 ? 1 : 0; }

}  // namespace

// --data_mix: over 10^5 windows each source's share is within 4 binomial standard deviations of its
// weight (Megatron's greedy blending keeps it within one window of it); every window is a pure
// function of (seed, position): read cold at any position it equals the sequential read, and another
// seed gives another order.
TEST(data_mix_proportions_and_positions) {
    const std::string d = temp_dir("data_mix");
    mixture_shards(d);
    const std::string mix = d + "/a.bin:0.7," + d + "/b.bin:0.3";
    std::unique_ptr<LmStream> s = mixture_stream(mix, 5);
    const int64_t n = 100000;
    int64_t from_b = 0;
    std::vector<LmRow> first;
    for (int64_t i = 0; i < n; i++) {
        LmRow row = s->at(i);
        from_b += window_source(row);
        if (i < 300) first.push_back(std::move(row));
    }
    const double share = (double)from_b / (double)n, sd = std::sqrt(0.3 * 0.7 / (double)n);
    printf("    share of b.bin over %lld windows: %.5f (weight 0.3, binomial sd %.5f)\n", (long long)n, share, sd);
    CHECK_MSG(std::fabs(share - 0.3) <= 4 * sd, "share %.5f", share);
    for (int64_t i : {299, 17, 0, 150, 4097, 12345, 99999, 4096, 1}) {
        std::unique_ptr<LmStream> cold = mixture_stream(mix, 5);
        const LmRow got = cold->at(i), want = i < 300 ? first[(size_t)i] : s->at(i);
        CHECK_MSG(got.size() == want.size() && got[0].ids == want[0].ids, "position %lld", (long long)i);
    }
    std::unique_ptr<LmStream> other = mixture_stream(mix, 6);
    int same = 0;
    for (int64_t i = 0; i < 300; i++) same += other->at(i)[0].ids == first[(size_t)i][0].ids;
    CHECK_MSG(same < 150, "seed 6 reads %d of seed 5's first 300 windows at the same positions", same);
}

// The ranks' shares of each step (PromptSource::rank_positions) read, over 2 ranks, disjoint
// windows whose union is what one rank reads, through a mixture's epochs.
TEST(data_mix_ranks_read_disjoint_windows) {
    const std::string d = temp_dir("data_mix_ranks");
    mixture_shards(d);
    const std::string mix = d + "/a.bin:0.5," + d + "/b.bin:0.5";
    auto read = [&](int rank, int ranks) {
        std::unique_ptr<LmStream> s = mixture_stream(mix, 3);
        std::vector<std::vector<int32_t>> windows;
        for (int64_t step = 0, cursor = 0; step < 40; step++, cursor += 8)
            for (int64_t pos : PromptSource::rank_positions(8, 1, rank, ranks)) windows.push_back(s->at(cursor + pos)[0].ids);
        return windows;
    };
    std::vector<std::vector<int32_t>> one = read(0, 1), r0 = read(0, 2), r1 = read(1, 2);
    CHECK_EQ(r0.size() + r1.size(), one.size());
    std::multiset<std::vector<int32_t>> all(one.begin(), one.end()), two(r0.begin(), r0.end());
    two.insert(r1.begin(), r1.end());
    CHECK(all == two);
    // disjoint: the windows of each step are rank 0's first half and rank 1's second
    for (size_t step = 0; step < 40; step++)
        for (size_t k = 0; k < 4; k++)
            CHECK(r0[step * 4 + k] == one[step * 8 + k] && r1[step * 4 + k] == one[step * 8 + 4 + k]);
}

// A CPT run on a mixture stopped after 2 steps and resumed equals the uninterrupted run bit for bit.
TEST(data_mix_resume_is_bit_exact) {
    const std::string d = temp_dir("data_mix_resume");
    shard_corpus(d + "/a.jsonl", 40, 4);
    shard_corpus(d + "/b.jsonl", 40, 5);
    for (const char* f : {"a", "b"}) {
        harness::RunResult e = run_cmd(harness::binary() + kShardCpt + strfmt(" --encode_bin %s/%s.bin --data %s/%s.jsonl --out_dir %s/enc", d.c_str(), f, d.c_str(), f, d.c_str()));
        CHECK_MSG(e.status == 0, "%s", e.output.c_str());
    }
    const std::string run = harness::binary() + kShardCpt + " --data_mix " + d + "/a.bin:0.6," + d + "/b.jsonl:0.4";
    harness::RunResult full = run_cmd(run + " --steps 4 --out_dir " + d + "/full");
    harness::RunResult first = run_cmd(run + " --steps 2 --out_dir " + d + "/split");
    harness::RunResult second = run_cmd(run + " --steps 4 --out_dir " + d + "/split --resume " + d + "/split");
    CHECK_MSG(full.status == 0 && first.status == 0 && second.status == 0, "%s\n%s\n%s", full.output.c_str(), first.output.c_str(),
              second.output.c_str());
    if (full.status || first.status || second.status) return;
    shard_runs_equal(d + "/full", d + "/split", 4);
}

// 2 MPI ranks on a mixture of shards train what 1 rank trains (the sums grouped by rank: to rounding).
TEST(data_mix_two_ranks_match_one) {
    if (std::system("command -v mpirun > /dev/null 2>&1") != 0) SKIP("mpirun not found (install openmpi-bin)");
    const std::string d = temp_dir("data_mix_mpi");
    shard_corpus(d + "/a.jsonl", 40, 6);
    harness::RunResult e = run_cmd(harness::binary() + kShardCpt + " --encode_bin " + d + "/a.bin --data " + d + "/a.jsonl --out_dir " + d + "/enc");
    CHECK_MSG(e.status == 0, "%s", e.output.c_str());
    const std::string mpirun = "ASAN_OPTIONS=detect_leaks=0 OMPI_MCA_btl=self,vader mpirun --allow-run-as-root --oversubscribe -np ";
    // bf16: the ranks' sums only regroup (fp8 would also regroup the wgrad's 1x128 token groups: a
    // rounding of the gradient itself, 4e-3 in the weights after 2 steps, measured)
    std::string flags = kShardCpt + std::string(" --steps 2 --data_mix ") + d + "/a.bin:0.5," + d + "/a.jsonl:0.5";
    flags.replace(flags.find("--train_precision fp8"), 21, "--train_precision bf16");
    harness::RunResult one = run_cmd(mpirun + "1 " + harness::binary() + flags + " --out_dir " + d + "/r1");
    harness::RunResult two = run_cmd(mpirun + "2 " + harness::binary() + flags + " --out_dir " + d + "/r2");
    CHECK_MSG(one.status == 0 && two.status == 0, "%s\n%s", one.output.c_str(), two.output.c_str());
    if (one.status || two.status) return;
    check_runs_agree(d + "/r1", d + "/r2", 1e-3, 1e-6, 1e-4, 10);
}

// WSD with a cosine decay (--wsd_decay cosine) against its closed form written another way,
// lr (m + (1 - m) cos^2(pi p / 2)) with p the decay's progress, and --warmup_frac as whole steps.
TEST(lr_schedule_wsd_cosine_and_warmup_frac) {
    const char* argv[] = {"x", "--lr_schedule", "wsd", "--wsd_decay", "cosine", "--warmup_frac", "0.2", "--steps", "20",
                          "--decay_steps", "7", "--min_lr_ratio", "0.1", "--lr", "2e-3", "--task", "add"};
    const TrainConfig c = train_config_from_args(Args::parse(17, (char**)argv, FlagEngine::Cpu));
    CHECK_EQ(c.lr.warmup, (int64_t)4);
    CHECK(c.lr.wsd && c.lr.wsd_cosine && c.lr.decay == 7 && c.lr.total == 20);
    for (int64_t u = 0; u < 20; u++) {
        long double want = 2e-3L;
        if (u < 4) want *= (long double)(u + 1) / 4;
        else if (u >= 13) {
            const long double p = (long double)(u - 13) / 6, h = std::cos(3.14159265358979323846264338327950288L * p / 2);
            want *= 0.1L + 0.9L * h * h;
        }
        CHECK_MSG(std::fabs((long double)c.lr.at(u) - want) <= 1e-15L, "update %lld: %.17g, want %.17Lg", (long long)u, c.lr.at(u), want);
    }
    CHECK_NEAR(c.lr.at(16), 2e-3 * (0.1 + 0.9 * 0.5), 1e-15, 0);  // halfway through the decay: halfway down
    const char* both[] = {"x", "--warmup_frac", "0.2", "--warmup_steps", "3", "--steps", "20", "--task", "add"};
    bool refused = false;
    try {
        train_config_from_args(Args::parse(9, (char**)both, FlagEngine::Cpu));
    } catch (const Error& e) {
        refused = std::string(e.what()).find("one of --warmup_steps and --warmup_frac") != std::string::npos;
    }
    CHECK(refused);
}

namespace {

// The runs of 1s of a mask, as [begin, end) index pairs.
std::vector<std::pair<size_t, size_t>> mask_runs(const std::vector<int64_t>& mask) {
    std::vector<std::pair<size_t, size_t>> runs;
    for (size_t i = 0; i < mask.size(); i++)
        if (mask[i] && (i == 0 || !mask[i - 1])) runs.push_back({i, i});
        else if (!mask[i] && i > 0 && mask[i - 1]) runs.back().second = i;
    if (!runs.empty() && runs.back().second == runs.back().first) runs.back().second = mask.size();
    return runs;
}

std::vector<int64_t> formats_ints(const Json& a) {
    std::vector<int64_t> out;
    for (const Json& x : a.items) out.push_back(x.integer);
    return out;
}

}  // namespace

// TRL's conversational rows ({"prompt": [messages], "completion": [messages]}) train on the
// completion's assistant turns only, and "train": false takes an assistant turn out of the loss:
// each against HF's mask of the whole conversation (test/fixtures/sft/masks_*.jsonl) with the
// other turns' runs of 1s zeroed.
TEST(sft_formats_trl_conversational_and_train_false) {
    int checked = 0;
    for (const char* name : {"qwen3", "qwen2.5", "llama3_style"}) {
        const std::string dir = std::string("test/fixtures/tokenizer/") + name;
        std::unique_ptr<Tokenizer> tok = Tokenizer::load(dir);
        SftEncoder enc(*tok, dir, 1, 0);
        const std::string fixture = std::string("test/fixtures/sft/masks_") + (std::string(name) == "llama3_style" ? "llama3" : name) + ".jsonl";
        for_each_jsonl_row(fixture, [&](const Json& row, const std::string& where) {
            const Json& messages = *row.find("messages");
            const std::vector<int64_t> ids = formats_ints(*row.find("ids")), mask = formats_ints(*row.find("mask"));
            const auto runs = mask_runs(mask);
            std::vector<size_t> assistant;
            for (size_t i = 0; i < messages.items.size(); i++)
                if (messages.items[i].find("role")->str == "assistant") assistant.push_back(i);
            if (runs.size() != assistant.size() || assistant.size() < 2) return;  // rows with 2+ assistant turns, one run each
            // the last assistant turn and what follows it as the completion
            Json trl;
            trl.type = Json::Object;
            Json prompt, completion;
            prompt.type = completion.type = Json::Array;
            for (size_t i = 0; i < messages.items.size(); i++) (i < assistant.back() ? prompt : completion).items.push_back(messages.items[i]);
            trl.fields.emplace_back("prompt", prompt);
            trl.fields.emplace_back("completion", completion);
            std::vector<int64_t> want = mask;
            for (size_t r = 0; r + 1 < runs.size(); r++) std::fill(want.begin() + (long)runs[r].first, want.begin() + (long)runs[r].second, 0);
            LmSequence s = enc.encode(trl, where);
            CHECK_MSG(std::vector<int64_t>(s.ids.begin(), s.ids.end()) == ids, "%s %s: TRL ids", name, where.c_str());
            CHECK_MSG(std::vector<int64_t>(s.loss.begin(), s.loss.end()) == want, "%s %s: TRL mask", name, where.c_str());
            // "train": false on the first assistant turn
            Json conv;
            conv.type = Json::Object;
            Json msgs = messages;
            Json no;
            no.type = Json::Bool;
            no.boolean = false;
            msgs.items[assistant[0]].fields.emplace_back("train", no);
            conv.fields.emplace_back("messages", msgs);
            want = mask;
            std::fill(want.begin() + (long)runs[0].first, want.begin() + (long)runs[0].second, 0);
            s = enc.encode(conv, where);
            CHECK_MSG(std::vector<int64_t>(s.ids.begin(), s.ids.end()) == ids, "%s %s: train-false ids", name, where.c_str());
            CHECK_MSG(std::vector<int64_t>(s.loss.begin(), s.loss.end()) == want, "%s %s: train-false mask", name, where.c_str());
            checked++;
        });
    }
    printf("    %d conversations with 2+ assistant turns checked\n", checked);
    CHECK(checked >= 3);
}

// The engine a run gets: bf16 rollout and training hold no FP8 weights; sft/cpt in fp8 at block
// scaling one FP8 copy without --rollout_precision fp8 (they generate nothing); RL keeps two FP8
// copies unless its rollout is fp8 too.
TEST(training_engine_options_fp8_weight_copies) {
    const struct {
        std::vector<const char*> flags;
        bool fp8_weights, one_copy;
    } cases[] = {{{"--mode", "sft", "--data", "x.jsonl"}, false, false},
                 {{"--mode", "cpt", "--data", "x.jsonl", "--train_precision", "fp8"}, true, true},
                 {{"--mode", "sft", "--data", "x.jsonl", "--train_precision", "fp8", "--fp8_scaling", "row"}, true, false},
                 {{"--task", "add"}, false, false},
                 {{"--task", "add", "--train_precision", "fp8"}, true, false},
                 {{"--task", "add", "--rollout_precision", "fp8"}, true, false},
                 {{"--task", "add", "--rollout_precision", "fp8", "--train_precision", "fp8"}, true, true}};
    for (const auto& c : cases) {
        std::vector<const char*> argv = {"x"};
        argv.insert(argv.end(), c.flags.begin(), c.flags.end());
        const Args a = Args::parse((int)argv.size(), (char**)argv.data(), FlagEngine::Gpu);
        const EngineOptions o = training_engine_options(a, train_config_from_args(a));
        std::string all;
        for (const char* f : c.flags) all += std::string(" ") + f;
        CHECK_MSG(o.fp8_weights == c.fp8_weights && o.one_fp8_weight_copy == c.one_copy, "%s: fp8_weights %d, one copy %d", all.c_str(),
                  (int)o.fp8_weights, (int)o.one_fp8_weight_copy);
    }
}
