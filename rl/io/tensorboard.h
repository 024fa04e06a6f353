// tensorboard.h: --tensorboard 1 writes the metrics of every step as TensorBoard scalars, so
// `tensorboard --logdir runs/` and the tools that read event files see the run. An event file is a
// sequence of TFRecords: uint64 length, masked CRC32C of the length, the bytes, masked CRC32C of
// the bytes (little-endian). Each record is an Event protobuf, encoded here by hand (no protobuf
// library): the first holds file_version "brain.Event:2", then one per step with a Summary of
// (tag, simple_value) pairs. The step is the one the step line prints (training/global_step + 1).
// Test: test/test_tensorboard.cpp, against bytes written by the tensorboard package
// (dev/make_tensorboard_fixtures.py); dev/check_tensorboard.py reads a run back.
#pragma once
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>

#include "rl/common.h"
#include "rl/io/metric_row.h"

namespace fp8rl {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), bytewise table.
inline uint32_t crc32c(const void* data, size_t n) {
    static const struct Table {
        uint32_t t[256];
        Table() {
            for (uint32_t i = 0; i < 256; i++) {
                uint32_t c = i;
                for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
                t[i] = c;
            }
        }
    } table;
    uint32_t c = 0xFFFFFFFFu;
    const uint8_t* p = (const uint8_t*)data;
    for (size_t i = 0; i < n; i++) c = table.t[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

// TFRecord's mask: a CRC of data that itself holds CRCs is weak, so the stored value is rotated and offset.
inline uint32_t masked_crc32c(const void* data, size_t n) {
    uint32_t c = crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

inline std::string tf_record(const std::string& data) {
    std::string out;
    auto put_le = [&](uint64_t v, int bytes) {
        for (int i = 0; i < bytes; i++) out += (char)((v >> (8 * i)) & 0xFF);
    };
    put_le(data.size(), 8);
    put_le(masked_crc32c(out.data(), 8), 4);
    out += data;
    put_le(masked_crc32c(data.data(), data.size()), 4);
    return out;
}

// Protobuf wire format, the three kinds an Event needs.
namespace pb {
inline void varint(std::string& out, uint64_t v) {
    do {
        uint8_t b = v & 0x7F;
        v >>= 7;
        out += (char)(v ? b | 0x80 : b);
    } while (v);
}
inline void bytes_field(std::string& out, int field, const std::string& bytes) {
    varint(out, (uint64_t)field << 3 | 2);
    varint(out, bytes.size());
    out += bytes;
}
template <typename T>
inline void fixed_field(std::string& out, int field, T v) {  // double: wire type 1, float: 5
    varint(out, (uint64_t)field << 3 | (sizeof(T) == 8 ? 1 : 5));
    char raw[sizeof(T)];
    memcpy(raw, &v, sizeof(T));
    out.append(raw, sizeof(T));
}
}  // namespace pb

// Event{wall_time = 1, step = 2, file_version = 3}; proto3 leaves a zero step out.
inline std::string tb_file_version_event(double wall_time) {
    std::string e;
    pb::fixed_field(e, 1, wall_time);
    pb::bytes_field(e, 3, "brain.Event:2");
    return e;
}

// Event{wall_time, step, summary = 5: Summary{repeated value = 1: Value{tag = 1, simple_value = 2}}}.
// Non-finite values are left out, as log.jsonl writes them null.
inline std::string tb_scalars_event(double wall_time, int64_t step, const MetricRow& row) {
    std::string summary;
    for (const auto& kv : row.items) {
        if (!std::isfinite(kv.second)) continue;
        std::string value;
        pb::bytes_field(value, 1, kv.first);
        pb::fixed_field(value, 2, (float)kv.second);
        pb::bytes_field(summary, 1, value);
    }
    std::string e;
    pb::fixed_field(e, 1, wall_time);
    if (step != 0) {
        pb::varint(e, 2 << 3 | 0);
        pb::varint(e, (uint64_t)step);
    }
    pb::bytes_field(e, 5, summary);
    return e;
}

inline double wall_time_now() {
    timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

// One event file per run (a resumed run starts a new one, as TensorBoard's own writers do),
// appended and flushed step by step.
class TensorBoardWriter {
public:
    TensorBoardWriter() = default;
    explicit TensorBoardWriter(const std::string& out_dir) {
        char host[256] = "localhost";
        gethostname(host, sizeof host - 1);
        const double now = wall_time_now();
        path_ = strfmt("%s/events.out.tfevents.%010lld.%s.%d", out_dir.c_str(), (long long)now, host, (int)getpid());
        file_ = fopen(path_.c_str(), "wb");
        if (!file_) fail("--tensorboard: cannot create %s; check --out_dir is writable", path_.c_str());
        write(tb_file_version_event(now));
    }
    ~TensorBoardWriter() {
        if (file_) fclose(file_);
    }
    TensorBoardWriter(const TensorBoardWriter&) = delete;
    TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

    const std::string& path() const { return path_; }

    void record(const MetricRow& row) { write(tb_scalars_event(wall_time_now(), (int64_t)row.get("training/global_step", -1) + 1, row)); }

private:
    std::string path_;
    FILE* file_ = nullptr;

    void write(const std::string& event) {
        std::string rec = tf_record(event);
        if (fwrite(rec.data(), 1, rec.size(), file_) != rec.size() || fflush(file_) != 0)
            fail("%s: write failed (disk full?)", path_.c_str());
    }
};

}  // namespace fp8rl
