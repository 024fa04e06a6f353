// safetensors.h: reading and writing safetensors files and HF checkpoint directories.
//
// File layout (spec-model.md §6): an 8-byte little-endian header length N, N bytes of JSON
// header, then the data buffer. The reader memory-maps the file and validates it as the
// reference implementation does: N <= 100 MB and inside the file, the header is a JSON object,
// every dtype known, each tensor's byte size = prod(shape) x dtype size, and the tensors, sorted
// by offset, tile the data buffer from 0 to its end without gaps or overlaps. fp8rl reads F32,
// BF16, F16, F8_E4M3 and F8_E5M2; any other dtype is rejected by name.
//
// A checkpoint directory holds either model.safetensors or model.safetensors.index.json with its
// shards (model-XXXXX-of-YYYYY.safetensors); Checkpoint opens either.
//
// The writer orders tensors by dtype size (descending) then name, pads the header with spaces to
// a multiple of 8, always writes __metadata__ {"format":"pt"}, and writes to a temporary name that
// is renamed into place, so a crash never leaves a half-written file.
#pragma once
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "rl/common.h"
#include "rl/io/json.h"

namespace fp8rl {

enum class DType { F32, BF16, F16, F8_E4M3, F8_E5M2 };

inline size_t dtype_size(DType t) {
    switch (t) {
        case DType::F32: return 4;
        case DType::BF16: case DType::F16: return 2;
        case DType::F8_E4M3: case DType::F8_E5M2: return 1;
    }
    return 0;
}

inline const char* dtype_name(DType t) {
    switch (t) {
        case DType::F32: return "F32";
        case DType::BF16: return "BF16";
        case DType::F16: return "F16";
        case DType::F8_E4M3: return "F8_E4M3";
        case DType::F8_E5M2: return "F8_E5M2";
    }
    return "?";
}

// Parses a header dtype string; `where` names the file and tensor in the error.
inline DType parse_dtype(const std::string& s, const std::string& where) {
    static const DType supported[] = {DType::F32, DType::BF16, DType::F16, DType::F8_E4M3, DType::F8_E5M2};
    for (DType t : supported)
        if (s == dtype_name(t)) return t;
    static const char* other_known[] = {"BOOL", "U8", "I8", "I16", "U16", "I32", "U32", "F64", "I64", "U64",
                                        "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2", "C64"};
    for (const char* k : other_known)
        if (s == k) fail("%s: dtype %s is not supported; fp8rl reads F32, BF16, F16, F8_E4M3 and F8_E5M2", where.c_str(), s.c_str());
    fail("%s: unknown dtype %s (not a safetensors dtype)", where.c_str(), json_quote(s).c_str());
}

inline std::string shape_str(const std::vector<int64_t>& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); i++) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

// prod(shape), or -1 if it does not fit in 63 bits.
inline int64_t shape_numel(const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t d : shape) {
        if (d < 0 || (d > 0 && n > INT64_MAX / d)) return -1;
        n *= d;
    }
    return n;
}

// A read-only memory map of a whole file; unmapped when destroyed.
class MappedFile {
public:
    explicit MappedFile(const std::string& path) : path_(path) {
        int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO must not block us
        if (fd < 0) fail("%s: cannot open file (%s); check the path", path.c_str(), strerror(errno));
        struct stat st;
        if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
            close(fd);
            fail("%s: not a regular file", path.c_str());
        }
        size_ = (size_t)st.st_size;
        if (size_ > 0) {
            void* p = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
            if (p == MAP_FAILED) {
                int err = errno;
                close(fd);
                fail("%s: cannot map file (%s)", path.c_str(), strerror(err));
            }
            data_ = (const uint8_t*)p;
        }
        close(fd);
    }
    ~MappedFile() {
        if (data_) munmap((void*)data_, size_);
    }
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;

    const uint8_t* data() const { return data_; }
    size_t size() const { return size_; }
    const std::string& path() const { return path_; }

private:
    std::string path_;
    const uint8_t* data_ = nullptr;
    size_t size_ = 0;
};

// One tensor of an open file: raw little-endian bytes, C order. Valid while its file is open.
struct TensorView {
    std::string name;
    DType dtype = DType::F32;
    std::vector<int64_t> shape;
    int64_t numel = 0;
    const uint8_t* data = nullptr;  // may be unaligned: read through memcpy
    size_t nbytes = 0;
    size_t offset = 0;              // begin, relative to the data buffer
    std::string file;               // path of the file holding it, for error messages
};

class SafetensorsFile {
public:
    static constexpr uint64_t max_header_bytes = 100000000;

    explicit SafetensorsFile(const std::string& path) : map_(new MappedFile(path)) { parse(); }

    const std::string& path() const { return map_->path(); }
    const std::vector<TensorView>& tensors() const { return tensors_; }  // sorted by offset
    const std::map<std::string, std::string>& metadata() const { return metadata_; }

    const TensorView* find(const std::string& name) const {
        auto it = by_name_.find(name);
        return it == by_name_.end() ? nullptr : &tensors_[it->second];
    }

private:
    std::unique_ptr<MappedFile> map_;
    std::vector<TensorView> tensors_;
    std::map<std::string, size_t> by_name_;
    std::map<std::string, std::string> metadata_;

    void parse() {
        const std::string& path = map_->path();
        size_t size = map_->size();
        if (size < 8) fail("%s: file is %zu bytes, too short for a safetensors header; the file is truncated", path.c_str(), size);
        uint64_t n = 0;
        for (int i = 7; i >= 0; i--) n = (n << 8) | map_->data()[i];
        if (n > max_header_bytes)
            fail("%s: header length %llu exceeds the 100 MB limit; not a safetensors file, or corrupt",
                 path.c_str(), (unsigned long long)n);
        if (n > size - 8)
            fail("%s: header length %llu runs past the end of the file (%zu bytes); the file is truncated or corrupt",
                 path.c_str(), (unsigned long long)n, size);
        const char* hdr = (const char*)map_->data() + 8;
        if (n == 0 || hdr[0] != '{') fail("%s: header is not a JSON object; not a safetensors file", path.c_str());
        Json h = JsonParser(hdr, (size_t)n, path + " (header)").parse_document();
        if (!h.is_object()) fail("%s: header is not a JSON object; not a safetensors file", path.c_str());
        const uint8_t* buffer = map_->data() + 8 + n;
        size_t buffer_size = size - 8 - (size_t)n;
        for (const auto& kv : h.fields) {
            if (kv.first == "__metadata__") { parse_metadata(kv.second); continue; }
            tensors_.push_back(parse_entry(kv.first, kv.second));
        }
        std::sort(tensors_.begin(), tensors_.end(), [](const TensorView& a, const TensorView& b) {
            return a.offset != b.offset ? a.offset < b.offset : a.offset + a.nbytes < b.offset + b.nbytes;
        });
        size_t expected = 0;  // the tensors must tile [0, buffer_size)
        for (const TensorView& t : tensors_) {
            if (t.offset > expected)
                fail("%s: gap in the data buffer before tensor %s (bytes %zu..%zu are not part of any tensor)",
                     path.c_str(), t.name.c_str(), expected, t.offset);
            if (t.offset < expected)
                fail("%s: tensor %s overlaps the previous tensor (it begins at byte %zu, the previous one ends at %zu)",
                     path.c_str(), t.name.c_str(), t.offset, expected);
            expected = t.offset + t.nbytes;
        }
        if (expected != buffer_size)
            fail("%s: the tensors cover %zu bytes but the data buffer holds %zu; the file is %s",
                 path.c_str(), expected, buffer_size, expected > buffer_size ? "truncated" : "corrupt (trailing bytes)");
        for (size_t i = 0; i < tensors_.size(); i++) {
            tensors_[i].data = buffer + tensors_[i].offset;
            by_name_[tensors_[i].name] = i;
        }
    }

    void parse_metadata(const Json& m) {
        if (!m.is_object()) fail("%s: __metadata__ is not an object", path().c_str());
        for (const auto& kv : m.fields) {
            if (!kv.second.is_string()) fail("%s: __metadata__ value of %s is not a string", path().c_str(), json_quote(kv.first).c_str());
            metadata_[kv.first] = kv.second.str;
        }
    }

    TensorView parse_entry(const std::string& name, const Json& e) {
        std::string where = path() + ": tensor " + name;
        if (!e.is_object()) fail("%s: header entry is not an object", where.c_str());
        const Json* dtype = e.find("dtype");
        const Json* shape = e.find("shape");
        const Json* offsets = e.find("data_offsets");
        if (!dtype || !dtype->is_string()) fail("%s: missing or non-string \"dtype\"", where.c_str());
        if (!shape || !shape->is_array()) fail("%s: missing or non-array \"shape\"", where.c_str());
        if (!offsets || !offsets->is_array() || offsets->items.size() != 2)
            fail("%s: \"data_offsets\" must be an array [begin, end]", where.c_str());
        TensorView t;
        t.name = name;
        t.file = path();
        t.dtype = parse_dtype(dtype->str, where);
        for (const Json& d : shape->items) {
            if (!d.is_int() || d.integer < 0) fail("%s: shape has an entry that is not a non-negative integer", where.c_str());
            t.shape.push_back(d.integer);
        }
        t.numel = shape_numel(t.shape);
        if (t.numel < 0 || (uint64_t)t.numel > UINT64_MAX / 8) fail("%s: shape %s is too large", where.c_str(), shape_str(t.shape).c_str());
        for (const Json& o : offsets->items)
            if (!o.is_int() || o.integer < 0) fail("%s: data_offsets must be non-negative integers", where.c_str());
        int64_t begin = offsets->items[0].integer, end = offsets->items[1].integer;
        if (end < begin) fail("%s: data_offsets [%lld, %lld] end before they begin", where.c_str(), (long long)begin, (long long)end);
        t.offset = (size_t)begin;
        t.nbytes = (size_t)(end - begin);
        size_t expected = (size_t)t.numel * dtype_size(t.dtype);
        if (t.nbytes != expected)
            fail("%s: data_offsets span %zu bytes but shape %s of %s needs %zu", where.c_str(), t.nbytes,
                 shape_str(t.shape).c_str(), dtype_name(t.dtype), expected);
        return t;  // data is set once the tiling check has proved the offsets lie inside the file
    }
};

// A HF checkpoint directory: model.safetensors, or the shards named by model.safetensors.index.json.
class Checkpoint {
public:
    explicit Checkpoint(const std::string& dir) : dir_(dir) {
        std::string single = dir + "/model.safetensors", index = dir + "/model.safetensors.index.json";
        if (file_exists(single)) {
            files_.emplace_back(new SafetensorsFile(single));
            for (const TensorView& t : files_[0]->tensors()) by_name_[t.name] = &t;
        } else if (file_exists(index)) {
            open_sharded(index);
        } else {
            fail("%s: no model.safetensors or model.safetensors.index.json; is this a HF model directory?", dir.c_str());
        }
    }

    const std::string& dir() const { return dir_; }
    const TensorView* find(const std::string& name) const {
        auto it = by_name_.find(name);
        return it == by_name_.end() ? nullptr : it->second;
    }
    // Every tensor, by name.
    const std::map<std::string, const TensorView*>& tensors() const { return by_name_; }
    size_t num_files() const { return files_.size(); }

    static bool file_exists(const std::string& path) {
        struct stat st;
        return stat(path.c_str(), &st) == 0;
    }

private:
    std::string dir_;
    std::vector<std::unique_ptr<SafetensorsFile>> files_;
    std::map<std::string, const TensorView*> by_name_;

    void open_sharded(const std::string& index_path) {
        Json index = json_parse_file(index_path);
        const Json* map = index.find("weight_map");
        if (!map || !map->is_object()) fail("%s: no \"weight_map\" object", index_path.c_str());
        std::map<std::string, SafetensorsFile*> shards;
        for (const auto& kv : map->fields) {
            if (!kv.second.is_string()) fail("%s: weight_map entry of %s is not a file name", index_path.c_str(), kv.first.c_str());
            const std::string& shard = kv.second.str;
            if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..")
                fail("%s: weight_map names %s for %s; shards must be plain file names in the same directory",
                     index_path.c_str(), json_quote(shard).c_str(), kv.first.c_str());
            if (!shards.count(shard)) {
                files_.emplace_back(new SafetensorsFile(dir_ + "/" + shard));
                shards[shard] = files_.back().get();
            }
            const TensorView* t = shards[shard]->find(kv.first);
            if (!t) fail("%s: the index puts tensor %s in %s, but that file has no such tensor", index_path.c_str(), kv.first.c_str(), shard.c_str());
            by_name_[kv.first] = t;
        }
        for (const auto& f : files_)
            for (const TensorView& t : f->tensors())
                if (by_name_.find(t.name) == by_name_.end() || by_name_[t.name] != &t)
                    fail("%s: tensor %s is in this shard but %s does not map it here", f->path().c_str(), t.name.c_str(), index_path.c_str());
    }
};

// ---- writing ----

// A tensor to write: `data` points to numel * dtype_size bytes, little-endian, C order.
struct TensorToWrite {
    std::string name;
    DType dtype = DType::BF16;
    std::vector<int64_t> shape;
    const void* data = nullptr;
    size_t nbytes() const { return (size_t)shape_numel(shape) * dtype_size(dtype); }
};

// The reference writer's order: larger dtypes first (keeps every tensor aligned), then by name.
inline void sort_for_writing(std::vector<TensorToWrite>& tensors) {
    std::sort(tensors.begin(), tensors.end(), [](const TensorToWrite& a, const TensorToWrite& b) {
        if (dtype_size(a.dtype) != dtype_size(b.dtype)) return dtype_size(a.dtype) > dtype_size(b.dtype);
        return a.name < b.name;
    });
}

inline void write_safetensors(const std::string& path, std::vector<TensorToWrite> tensors) {
    sort_for_writing(tensors);
    for (size_t i = 1; i < tensors.size(); i++)
        if (tensors[i].name == tensors[i - 1].name) fail("%s: tensor %s given twice", path.c_str(), tensors[i].name.c_str());
    std::string header = "{\"__metadata__\":{\"format\":\"pt\"}";
    size_t offset = 0;
    for (const TensorToWrite& t : tensors) {
        if (t.name == "__metadata__") fail("%s: a tensor cannot be named __metadata__", path.c_str());
        header += ',';
        json_append_string(header, t.name);
        header += strfmt(":{\"dtype\":\"%s\",\"shape\":[", dtype_name(t.dtype));
        for (size_t i = 0; i < t.shape.size(); i++) header += (i ? "," : "") + std::to_string(t.shape[i]);
        header += strfmt("],\"data_offsets\":[%zu,%zu]}", offset, offset + t.nbytes());
        offset += t.nbytes();
    }
    header += '}';
    header.append((8 - header.size() % 8) % 8, ' ');  // data buffer starts 8-byte aligned
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)header.size() >> (8 * i));
    std::vector<std::pair<const void*, size_t>> parts = {{len, 8}, {header.data(), header.size()}};
    for (const TensorToWrite& t : tensors) parts.emplace_back(t.data, t.nbytes());
    write_file_atomic(path, parts);
}

inline std::string shard_file_name(size_t i, size_t n) {
    return strfmt("model-%05zu-of-%05zu.safetensors", i + 1, n);
}

// Writes the weights of a checkpoint into directory `dir` (which must exist): model.safetensors,
// or, when max_shard_bytes > 0 and the tensors exceed it, shards of at most that many tensor bytes
// (a larger tensor gets a shard of its own) in the given order, plus model.safetensors.index.json.
inline void write_checkpoint_weights(const std::string& dir, const std::vector<TensorToWrite>& tensors, size_t max_shard_bytes = 0) {
    std::vector<std::vector<TensorToWrite>> shards(1);
    size_t in_shard = 0, total = 0;
    for (const TensorToWrite& t : tensors) {
        if (max_shard_bytes > 0 && in_shard > 0 && in_shard + t.nbytes() > max_shard_bytes) {
            shards.emplace_back();
            in_shard = 0;
        }
        shards.back().push_back(t);
        in_shard += t.nbytes();
        total += t.nbytes();
    }
    if (shards.size() == 1) {
        write_safetensors(dir + "/model.safetensors", shards[0]);
        return;
    }
    std::map<std::string, std::string> weight_map;  // sorted by tensor name, as transformers writes it
    for (size_t i = 0; i < shards.size(); i++) {
        std::string name = shard_file_name(i, shards.size());
        write_safetensors(dir + "/" + name, shards[i]);
        for (const TensorToWrite& t : shards[i]) weight_map[t.name] = name;
    }
    std::string index = strfmt("{\n  \"metadata\": {\n    \"total_size\": %zu\n  },\n  \"weight_map\": {", total);
    bool first = true;
    for (const auto& kv : weight_map) {
        index += first ? "\n    " : ",\n    ";
        first = false;
        json_append_string(index, kv.first);
        index += ": ";
        json_append_string(index, kv.second);
    }
    index += "\n  }\n}\n";
    write_file_atomic(dir + "/model.safetensors.index.json", index);
}

}  // namespace fp8rl
