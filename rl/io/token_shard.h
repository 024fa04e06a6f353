// token_shard.h: one self-describing file of tokenized CPT documents or SFT rows (docs/sft.md, "Token
// shards"), written once by --encode_bin and memory-mapped by training, so a rank reads only the
// windows and rows it trains on and start-up does not grow with the corpus.
//
//   offset 0   header (64 bytes, little-endian):
//              char magic[8] "FP8RLTOK", u32 version (1), u32 kind (1 = documents, 2 = SFT rows),
//              u32 token_bytes (2 when every id fits 16 bits, else 4), u32 vocab_size,
//              u64 tokenizer_hash (FNV-1a 64 of the tokenizer.json bytes), u64 tokens, u64 docs,
//              u32 end_of_text (documents: the id after each; rows: the model's end of turn),
//              u32 0, u64 file_bytes (the whole file: a truncated copy is refused)
//   64         tokens [tokens] of token_bytes each (documents: each followed by end_of_text)
//   8-aligned  u64 doc_offsets [docs + 1]: document d is tokens [doc_offsets[d], doc_offsets[d+1])
//   then       SFT rows only: the loss mask, one bit a token, bit t % 8 of byte t / 8
#pragma once
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "rl/common.h"

namespace fp8rl {

enum class ShardKind : uint32_t { Documents = 1, SftRows = 2 };

struct ShardHeader {
    char magic[8];
    uint32_t version;
    uint32_t kind;
    uint32_t token_bytes;
    uint32_t vocab_size;
    uint64_t tokenizer_hash;
    uint64_t tokens;
    uint64_t docs;
    uint32_t end_of_text;
    uint32_t reserved;
    uint64_t file_bytes;
};
static_assert(sizeof(ShardHeader) == 64, "the shard header is 64 bytes on disk");

constexpr char kShardMagic[8] = {'F', 'P', '8', 'R', 'L', 'T', 'O', 'K'};
constexpr uint32_t kShardVersion = 1;

inline uint64_t fnv1a64(const std::string& bytes) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ull;
    return h;
}

// Where each part of a shard lies, from its header alone.
struct ShardLayout {
    uint64_t offsets_at, mask_at, file_bytes;
    explicit ShardLayout(const ShardHeader& h) {
        offsets_at = (64 + h.tokens * h.token_bytes + 7) / 8 * 8;
        mask_at = offsets_at + (h.docs + 1) * 8;
        file_bytes = mask_at + (h.kind == (uint32_t)ShardKind::SftRows ? (h.tokens + 7) / 8 : 0);
    }
};

// Writes a shard: documents (or rows) appended in order, the index and mask kept in memory (8 bytes a
// document, one bit a token) and written at the end; the file appears under its name only when whole.
class ShardWriter {
public:
    ShardWriter(const std::string& path, ShardKind kind, uint32_t vocab_size, uint64_t tokenizer_hash, uint32_t end_of_text)
        : path_(path), tmp_(path + ".tmp") {
        memset(&h_, 0, sizeof h_);
        memcpy(h_.magic, kShardMagic, 8);
        h_.version = kShardVersion;
        h_.kind = (uint32_t)kind;
        h_.token_bytes = vocab_size <= 65536 ? 2 : 4;
        h_.vocab_size = vocab_size;
        h_.tokenizer_hash = tokenizer_hash;
        h_.end_of_text = end_of_text;
        f_ = fopen(tmp_.c_str(), "wb");
        if (!f_) fail("--encode_bin %s: cannot create %s; check the directory exists and is writable", path.c_str(), tmp_.c_str());
        write(&h_, sizeof h_);
        offsets_.push_back(0);
    }
    ~ShardWriter() {
        if (f_) {
            fclose(f_);
            remove(tmp_.c_str());
        }
    }

    // One document or row; mask (SFT rows) one byte a token, 0 or 1.
    void add(const std::vector<int32_t>& ids, const std::vector<uint8_t>* mask) {
        std::vector<uint8_t> bytes(ids.size() * h_.token_bytes);
        for (size_t i = 0; i < ids.size(); i++) {
            const uint32_t id = (uint32_t)ids[i];
            for (uint32_t b = 0; b < h_.token_bytes; b++) bytes[i * h_.token_bytes + b] = (uint8_t)(id >> (8 * b));
        }
        write(bytes.data(), bytes.size());
        if (h_.kind == (uint32_t)ShardKind::SftRows)
            for (size_t i = 0; i < ids.size(); i++) {
                const uint64_t t = h_.tokens + i;
                if (t / 8 >= mask_.size()) mask_.push_back(0);
                if ((*mask)[i]) mask_[t / 8] |= (uint8_t)(1u << (t % 8));
            }
        h_.tokens += ids.size();
        h_.docs++;
        offsets_.push_back(h_.tokens);
    }

    uint64_t tokens() const { return h_.tokens; }
    uint64_t docs() const { return h_.docs; }

    void finish() {
        const ShardLayout at(h_);
        const uint64_t pad = at.offsets_at - (64 + h_.tokens * h_.token_bytes);
        const uint8_t zeros[8] = {};
        write(zeros, pad);
        write(offsets_.data(), offsets_.size() * 8);
        write(mask_.data(), mask_.size());
        h_.file_bytes = at.file_bytes;
        bool ok = fseek(f_, 0, SEEK_SET) == 0 && fwrite(&h_, sizeof h_, 1, f_) == 1;
        ok = fclose(f_) == 0 && ok;
        f_ = nullptr;
        if (!ok || rename(tmp_.c_str(), path_.c_str()) != 0) {
            remove(tmp_.c_str());
            fail("--encode_bin %s: write failed (disk full or not writable?)", path_.c_str());
        }
    }

private:
    std::string path_, tmp_;
    ShardHeader h_;
    FILE* f_ = nullptr;
    std::vector<uint64_t> offsets_;
    std::vector<uint8_t> mask_;

    void write(const void* p, size_t n) {
        if (n && fwrite(p, 1, n, f_) != n) fail("--encode_bin %s: write failed (disk full?)", path_.c_str());
    }
};

// A shard mapped read-only: the header checked against the model that trains on it, pages read
// from disk only when a window or row touches them.
class TokenShard {
public:
    TokenShard(const std::string& path, uint32_t vocab_size, uint64_t tokenizer_hash) : path_(path) {
        const int fd = open(path.c_str(), O_RDONLY);
        if (fd < 0) fail("%s: cannot open the token shard; check the path", path.c_str());
        struct stat st;
        if (fstat(fd, &st) != 0) {
            close(fd);
            fail("%s: cannot stat the token shard", path.c_str());
        }
        bytes_ = (size_t)st.st_size;
        if (bytes_ < sizeof(ShardHeader)) {
            close(fd);
            fail("%s: %zu bytes, shorter than a token shard's header; write it with --encode_bin", path.c_str(), bytes_);
        }
        base_ = (const uint8_t*)mmap(nullptr, bytes_, PROT_READ, MAP_SHARED, fd, 0);
        close(fd);
        if (base_ == MAP_FAILED) fail("%s: cannot memory-map the token shard", path.c_str());
        memcpy(&h_, base_, sizeof h_);
        if (memcmp(h_.magic, kShardMagic, 8) != 0)
            refuse("not a token shard (wrong magic); write one with --encode_bin OUT --data IN.jsonl");
        if (h_.version != kShardVersion) refuse(strfmt("version %u, this build reads version %u; re-encode it", h_.version, kShardVersion));
        if ((h_.token_bytes != 2 && h_.token_bytes != 4) || (h_.kind != 1 && h_.kind != 2)) refuse("corrupt header");
        if (h_.file_bytes != ShardLayout(h_).file_bytes || bytes_ != h_.file_bytes)
            refuse(strfmt("%zu bytes, the header says %llu: truncated or corrupt; re-encode it", bytes_, (unsigned long long)h_.file_bytes));
        if (h_.vocab_size != vocab_size || h_.tokenizer_hash != tokenizer_hash)
            refuse(strfmt("encoded with another tokenizer (vocabulary %u, hash %016llx; the model's: %u, %016llx); re-encode it with "
                       "--encode_bin and this model's --model or --init/--tokenizer",
                       h_.vocab_size, (unsigned long long)h_.tokenizer_hash, vocab_size, (unsigned long long)tokenizer_hash));
        offsets_ = (const uint64_t*)(base_ + ShardLayout(h_).offsets_at);
        mask_ = base_ + ShardLayout(h_).mask_at;
        if (offsets_[0] != 0 || offsets_[h_.docs] != h_.tokens) refuse("corrupt document index; re-encode it");
    }
    ~TokenShard() { munmap((void*)base_, bytes_); }
    TokenShard(const TokenShard&) = delete;
    TokenShard& operator=(const TokenShard&) = delete;

    const std::string& path() const { return path_; }
    ShardKind kind() const { return (ShardKind)h_.kind; }
    uint64_t tokens() const { return h_.tokens; }
    uint64_t docs() const { return h_.docs; }
    uint32_t end_of_text() const { return h_.end_of_text; }

    // Document d's token range [begin, end).
    uint64_t doc_begin(uint64_t d) const { return offsets_[d]; }
    uint64_t doc_end(uint64_t d) const {
        const uint64_t e = offsets_[d + 1];
        if (e < offsets_[d] || e > h_.tokens) bad(strfmt("corrupt document index at document %llu; re-encode it", (unsigned long long)d));
        return e;
    }

    int32_t token(uint64_t t) const {
        const uint8_t* p = base_ + 64 + t * h_.token_bytes;
        const uint32_t id = h_.token_bytes == 2 ? (uint32_t)p[0] | (uint32_t)p[1] << 8
                                                : (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
        if (id >= h_.vocab_size) bad(strfmt("token %llu is id %u, outside the vocabulary; corrupt, re-encode it", (unsigned long long)t, id));
        return (int32_t)id;
    }
    uint8_t mask(uint64_t t) const { return (mask_[t / 8] >> (t % 8)) & 1; }

private:
    std::string path_;
    const uint8_t* base_ = nullptr;
    size_t bytes_ = 0;
    ShardHeader h_;
    const uint64_t* offsets_ = nullptr;  // [docs + 1]
    const uint8_t* mask_ = nullptr;       // SFT rows: [ceil(tokens / 8)]

    [[noreturn]] void bad(const std::string& what) const { fail("%s: %s", path_.c_str(), what.c_str()); }
    // A refusal while the constructor runs: the mapping goes first (no destructor will).
    [[noreturn]] void refuse(const std::string& what) {
        munmap((void*)base_, bytes_);
        bad(what);
    }
};

inline bool is_token_shard_path(const std::string& path) {
    return path.size() > 4 && path.compare(path.size() - 4, 4, ".bin") == 0;
}

}  // namespace fp8rl
