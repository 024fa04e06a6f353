// lm_sources.h: where --mode sft and cpt rows come from (docs/sft.md): a JSONL file loaded whole, or
// a token shard (rl/io/token_shard.h) memory-mapped with its windows and rows built on demand, in a
// seeded order reshuffled every epoch; or a mixture of sources (--data_mix) blended as Megatron's
// BlendedDataset does. Every row is a pure function of (seed, global position), so a resumed run and
// N ranks read exactly what one uninterrupted rank reads.
#pragma once
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "rl/driver/lm_data.h"
#include "rl/io/token_shard.h"
#include "rl/tasks/data.h"

namespace fp8rl {

// One source's rows in file order.
class LmRows {
public:
    virtual ~LmRows() = default;
    virtual int64_t size() const = 0;
    virtual LmRow row(int64_t i) const = 0;  // 0 <= i < size()
    virtual int64_t longest() const = 0;     // tokens of the longest sequence (a bound), for the memory plan
};

// Rows held in memory (the JSONL path).
class MemoryRows : public LmRows {
public:
    explicit MemoryRows(std::vector<LmRow> rows) : rows_(std::move(rows)) {}
    int64_t size() const override { return (int64_t)rows_.size(); }
    LmRow row(int64_t i) const override { return rows_[(size_t)i]; }
    int64_t longest() const override {
        int64_t n = 0;
        for (const LmRow& r : rows_)
            for (const LmSequence& s : r) n = std::max(n, (int64_t)s.ids.size());
        return n;
    }

private:
    std::vector<LmRow> rows_;
};

// CPT windows of a documents shard: window w is built from the mapped stream when asked for.
class ShardWindows : public LmRows {
public:
    ShardWindows(std::shared_ptr<const TokenShard> shard, int64_t seq_len, bool doc_mask)
        : shard_(std::move(shard)), seq_len_(seq_len), doc_mask_(doc_mask) {
        if (shard_->kind() != ShardKind::Documents)
            fail("%s: a shard of SFT rows; --mode cpt reads a shard of documents (--encode_bin without --mode sft)", shard_->path().c_str());
        if ((int64_t)shard_->tokens() < seq_len + 1)
            fail("%s: %llu tokens, fewer than one window of --seq_len %lld + 1; give more text or a smaller --seq_len",
                 shard_->path().c_str(), (unsigned long long)shard_->tokens(), (long long)seq_len);
    }
    int64_t size() const override { return cpt_window_count((int64_t)shard_->tokens(), seq_len_); }
    LmRow row(int64_t w) const override {
        const TokenShard& s = *shard_;
        return cpt_window([&s](int64_t t) { return s.token((uint64_t)t); }, w, seq_len_, doc_mask_, (int32_t)s.end_of_text());
    }
    int64_t longest() const override { return seq_len_ + 1; }

private:
    std::shared_ptr<const TokenShard> shard_;
    int64_t seq_len_;
    bool doc_mask_;
};

// SFT rows of a rows shard, those longer than max_seq_len left out (the index alone says which).
class ShardSftRows : public LmRows {
public:
    ShardSftRows(std::shared_ptr<const TokenShard> shard, int64_t max_seq_len, bool log) : shard_(std::move(shard)) {
        const TokenShard& s = *shard_;
        if (s.kind() != ShardKind::SftRows)
            fail("%s: a shard of documents; --mode sft reads a shard of SFT rows (--encode_bin with --mode sft)", s.path().c_str());
        for (uint64_t d = 0; d < s.docs(); d++) {
            const int64_t n = (int64_t)(s.doc_end(d) - s.doc_begin(d));
            if (max_seq_len > 0 && n > max_seq_len) continue;
            kept_.push_back(d);
            longest_ = std::max(longest_, n);
        }
        const uint64_t left_out = s.docs() - kept_.size();
        if (log && left_out)
            printf("left out %llu of %llu rows of %s longer than %lld tokens (--max_seq_len)\n", (unsigned long long)left_out,
                   (unsigned long long)s.docs(), s.path().c_str(), (long long)max_seq_len);
        if (kept_.empty()) fail("%s: no rows to train on%s", s.path().c_str(), left_out ? "; all are longer than --max_seq_len" : " (the shard is empty)");
    }
    int64_t size() const override { return (int64_t)kept_.size(); }
    LmRow row(int64_t i) const override {
        const TokenShard& s = *shard_;
        const uint64_t d = kept_[(size_t)i];
        LmSequence q;
        for (uint64_t t = s.doc_begin(d); t < s.doc_end(d); t++) {
            q.ids.push_back(s.token(t));
            q.loss.push_back(s.mask(t));
        }
        return {std::move(q)};
    }
    int64_t longest() const override { return longest_; }

private:
    std::shared_ptr<const TokenShard> shard_;
    std::vector<uint64_t> kept_;  // [rows] document index of each kept row
    int64_t longest_ = 0;
};

// What a source needs to turn a file into rows: the mode's options and the model's tokenizer.
struct LmSourceSpec {
    std::string mode;  // "sft" | "cpt"
    const Tokenizer* tok = nullptr;
    SftEncoder* sft = nullptr;
    int vocab = 0;
    uint64_t tokenizer_hash = 0;
    int32_t end_of_text = 0;  // cpt: what ends each document
    int64_t seq_len = 0, max_seq_len = 0;
    bool doc_mask = false, log = false;
};

// The rows of one file: a token shard (.bin) mapped, else JSONL loaded.
inline std::unique_ptr<LmRows> open_lm_rows(const std::string& path, const LmSourceSpec& spec) {
    if (is_token_shard_path(path)) {
        auto shard = std::make_shared<const TokenShard>(path, (uint32_t)spec.vocab, spec.tokenizer_hash);
        if (spec.mode == "sft") return std::make_unique<ShardSftRows>(shard, spec.max_seq_len, spec.log);
        if ((int32_t)shard->end_of_text() != spec.end_of_text && shard->kind() == ShardKind::Documents)
            fail("%s: documents end with id %u, the model's end of text is %d; re-encode it with this model", path.c_str(),
                 shard->end_of_text(), spec.end_of_text);
        return std::make_unique<ShardWindows>(shard, spec.seq_len, spec.doc_mask);
    }
    if (spec.mode == "sft") return std::make_unique<MemoryRows>(load_sft_rows(path, *spec.sft, spec.max_seq_len, spec.log));
    return std::make_unique<MemoryRows>(load_cpt_windows(path, spec.tok, spec.vocab, spec.end_of_text, spec.seq_len, spec.doc_mask));
}

// The training rows by global position: what step s's rows are, for any rank count and any resume.
class LmStream {
public:
    virtual ~LmStream() = default;
    virtual LmRow at(int64_t position) = 0;
    virtual double epoch(int64_t position) const = 0;  // passes over the data so far
    virtual int64_t longest() const = 0;
};

// One source in a seeded order reshuffled every epoch (rl/tasks/data.h, shuffled_order).
class ShuffledRows : public LmStream {
public:
    ShuffledRows(std::unique_ptr<LmRows> rows, uint64_t seed) : rows_(std::move(rows)), seed_(seed) {}
    LmRow at(int64_t position) override {
        const int64_t n = rows_->size();
        const uint32_t epoch = (uint32_t)(position / n);
        if (order_.empty() || epoch != order_epoch_) {
            order_ = shuffled_order(n, seed_, epoch);
            order_epoch_ = epoch;
        }
        return rows_->row(order_[(size_t)(position % n)]);
    }
    double epoch(int64_t position) const override { return (double)position / (double)rows_->size(); }
    int64_t longest() const override { return rows_->longest(); }
    int64_t size() const { return rows_->size(); }

private:
    std::unique_ptr<LmRows> rows_;
    uint64_t seed_;
    std::vector<int64_t> order_;
    uint32_t order_epoch_ = 0;
};

// Megatron-LM's blending (megatron/core/datasets/helpers.cpp, build_blending_indices): position i
// goes to the source whose count lags its weight the most, argmax_d w_d max(i, 1) - count_d (the
// first on a tie), and takes that source's next row; so every prefix holds each source within one
// row of its share. Each source keeps its own shuffled order (seed + its index). The counts are
// replayed from a snapshot every kSnapshotEvery positions: at(i) is a pure function of i.
class MixtureStream : public LmStream {
public:
    MixtureStream(std::vector<std::unique_ptr<ShuffledRows>> parts, std::vector<double> weights)
        : parts_(std::move(parts)), weights_(std::move(weights)) {
        double sum = 0;
        for (double w : weights_) sum += w;
        for (double& w : weights_) w /= sum;
        snapshots_.push_back(std::vector<int64_t>(parts_.size(), 0));
    }

    // Which source position i reads, and its position within that source.
    std::pair<size_t, int64_t> locate(int64_t position) {
        const size_t k = (size_t)(position / kSnapshotEvery);
        while (snapshots_.size() <= k) {
            std::vector<int64_t> c = snapshots_.back();
            const int64_t from = (int64_t)(snapshots_.size() - 1) * kSnapshotEvery;
            for (int64_t i = from; i < from + kSnapshotEvery; i++) c[pick(i, c)]++;
            snapshots_.push_back(std::move(c));
        }
        std::vector<int64_t> c = snapshots_[k];
        for (int64_t i = (int64_t)k * kSnapshotEvery; i < position; i++) c[pick(i, c)]++;
        const size_t d = pick(position, c);
        return {d, c[d]};
    }

    LmRow at(int64_t position) override {
        const auto [d, local] = locate(position);
        return parts_[d]->at(local);
    }
    double epoch(int64_t position) const override {  // of the source furthest through its rows
        double e = 0;
        for (size_t d = 0; d < parts_.size(); d++) e = std::max(e, weights_[d] * (double)position / (double)parts_[d]->size());
        return e;
    }
    int64_t longest() const override {
        int64_t n = 0;
        for (const auto& p : parts_) n = std::max(n, p->longest());
        return n;
    }

private:
    static constexpr int64_t kSnapshotEvery = 512;
    std::vector<std::unique_ptr<ShuffledRows>> parts_;
    std::vector<double> weights_;
    std::vector<std::vector<int64_t>> snapshots_;  // counts before position k * kSnapshotEvery

    size_t pick(int64_t i, const std::vector<int64_t>& count) const {
        const double at = (double)std::max<int64_t>(i, 1);
        size_t best = 0;
        double best_error = -INFINITY;
        for (size_t d = 0; d < weights_.size(); d++) {
            const double error = weights_[d] * at - (double)count[d];
            if (error > best_error) {
                best_error = error;
                best = d;
            }
        }
        return best;
    }
};

// --data_mix "a.bin:0.7,b.jsonl:0.3": the sources and their weights (each > 0).
inline std::vector<std::pair<std::string, double>> parse_data_mix(const std::string& spec) {
    std::vector<std::pair<std::string, double>> out;
    size_t at = 0;
    while (at <= spec.size()) {
        size_t comma = spec.find(',', at);
        if (comma == std::string::npos) comma = spec.size();
        const std::string item = spec.substr(at, comma - at);
        const size_t colon = item.rfind(':');
        char* end = nullptr;
        const double w = colon == std::string::npos ? NAN : strtod(item.c_str() + colon + 1, &end);
        if (colon == std::string::npos || colon == 0 || !end || *end || !(w > 0) || !std::isfinite(w))
            fail("--data_mix \"%s\": \"%s\" is not PATH:WEIGHT with a weight > 0; give e.g. \"a.bin:0.7,b.bin:0.3\"", spec.c_str(),
                 item.c_str());
        out.emplace_back(item.substr(0, colon), w);
        at = comma + 1;
    }
    return out;
}

// The training stream of --data or --data_mix.
inline std::unique_ptr<LmStream> open_lm_stream(const std::string& data, const std::string& data_mix, const LmSourceSpec& spec,
                                                uint64_t seed) {
    if (data_mix.empty()) return std::make_unique<ShuffledRows>(open_lm_rows(data, spec), seed);
    std::vector<std::unique_ptr<ShuffledRows>> parts;
    std::vector<double> weights;
    uint64_t k = 0;
    for (const auto& [path, w] : parse_data_mix(data_mix)) {
        parts.push_back(std::make_unique<ShuffledRows>(open_lm_rows(path, spec), seed + k++));
        weights.push_back(w);
    }
    return std::make_unique<MixtureStream>(std::move(parts), std::move(weights));
}

}  // namespace fp8rl
