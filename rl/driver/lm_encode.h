// lm_encode.h: --encode_bin OUT --data IN.jsonl: CPT documents or SFT rows tokenized once, with
// --threads workers, into a token shard (rl/io/token_shard.h) that training memory-maps. Each row is
// encoded exactly as the JSONL path of training encodes it (rl/driver/lm_data.h), so training on the
// shard is training on the JSONL, bit for bit. The input is read in blocks, so memory stays at a
// block plus the index.
#pragma once
#include <omp.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "rl/driver/args.h"
#include "rl/driver/dist.h"
#include "rl/driver/lm_data.h"
#include "rl/driver/train_config.h"
#include "rl/driver/train_setup.h"
#include "rl/io/token_shard.h"

namespace fp8rl {

inline int run_encode_bin(const Args& args) {
    const std::string out = args.str("encode_bin");
    if (!is_token_shard_path(out)) fail("--encode_bin %s: name the shard OUT.bin (training reads a .bin --data as a shard)", out.c_str());
    if (args.str("mode") == "rl")
        fail("--encode_bin needs --mode cpt ({\"text\"}/{\"ids\"} documents) or --mode sft (SFT rows and their loss mask)");
    const TrainConfig cfg = train_config_from_args(args);
    if (cfg.data.empty() || is_token_shard_path(cfg.data)) fail("--encode_bin needs --data IN.jsonl (the rows to encode)");
    if (args.integer("threads") > 0) omp_set_num_threads((int)args.integer("threads"));
    const auto t0 = std::chrono::steady_clock::now();
    Dist dist;
    const std::string dir = model_directory(args, cfg, dist);  // --model, or the fresh model of --init
    const ModelConfig mc = load_model_config(dir);
    std::unique_ptr<Tokenizer> tok = Tokenizer::load(dir + "/tokenizer.json");
    const bool sft = cfg.mode == "sft";
    const int32_t eot = sft ? end_of_turn_id(mc) : end_of_text_id(*tok, mc);
    ShardWriter writer(out, sft ? ShardKind::SftRows : ShardKind::Documents, (uint32_t)mc.vocab_size, tokenizer_hash(dir), eot);
    const int threads = omp_get_max_threads();
    std::vector<std::unique_ptr<SftEncoder>> encoders;  // one a worker: each loads its chat template
    for (int t = 0; t < threads; t++) encoders.push_back(std::make_unique<SftEncoder>(*tok, dir, cfg.enable_thinking, eot));

    std::ifstream in(cfg.data, std::ios::binary);
    if (!in) fail("--data %s: cannot open", cfg.data.c_str());
    constexpr size_t kBlockBytes = 32u << 20;
    int64_t line_no = 0, text_bytes = 0;
    std::vector<std::string> lines;
    std::vector<int64_t> numbers;
    for (bool more = true; more;) {
        lines.clear();
        numbers.clear();
        size_t bytes = 0;
        std::string line;
        while (bytes < kBlockBytes && (more = (bool)std::getline(in, line))) {
            line_no++;
            bytes += line.size() + 1;
            if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
            lines.push_back(std::move(line));
            numbers.push_back(line_no);
        }
        text_bytes += (int64_t)bytes;
        std::vector<LmSequence> rows(lines.size());
        std::vector<std::string> errors(lines.size());
#pragma omp parallel for schedule(dynamic, 16)
        for (int64_t i = 0; i < (int64_t)lines.size(); i++) {
            try {
                const std::string where = strfmt("%s:%lld", cfg.data.c_str(), (long long)numbers[(size_t)i]);
                const Json row = json_parse(lines[(size_t)i], where);
                if (sft) {
                    rows[(size_t)i] = encoders[(size_t)omp_get_thread_num()]->encode(row, where);
                } else {
                    rows[(size_t)i].ids = cpt_document_ids(row, where, tok.get(), (int)mc.vocab_size);
                    rows[(size_t)i].ids.push_back(eot);
                }
            } catch (const Error& e) {
                errors[(size_t)i] = e.what();
            }
        }
        for (size_t i = 0; i < rows.size(); i++) {
            if (!errors[i].empty()) fail("%s", errors[i].c_str());
            writer.add(rows[i].ids, sft ? &rows[i].loss : nullptr);
        }
    }
    if (writer.docs() == 0) fail("--data %s: no rows (the file is empty)", cfg.data.c_str());
    const uint64_t docs = writer.docs(), tokens = writer.tokens();
    writer.finish();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    printf("%s: %llu %s, %llu tokens from %.1f MB of JSONL in %.1f s (%.1f MB/s, %d threads)\n", out.c_str(), (unsigned long long)docs,
           sft ? "rows" : "documents", (unsigned long long)tokens, (double)text_bytes / 1e6, seconds,
           (double)text_bytes / 1e6 / std::max(seconds, 1e-9), threads);
    return 0;
}

}  // namespace fp8rl
