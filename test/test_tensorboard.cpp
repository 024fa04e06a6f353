// Tests of rl/io/tensorboard.h: CRC-32C against its published check value, and whole event records
// against the bytes the tensorboard package's own writer produced for the same events
// (dev/make_tensorboard_fixtures.py), then a run's event file read back record by record.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>

#include "rl/common.h"
#include "rl/io/logger.h"
#include "rl/io/tensorboard.h"
#include "test/harness.h"
#include "test/temp_dir.h"

using namespace fp8rl;

// The check value of CRC-32C over "123456789" (the CRC catalogue's "check" for CRC-32/ISCSI).
TEST(tensorboard_crc32c_check_value) {
    CHECK_EQ(crc32c("123456789", 9), 0xE3069283u);
    CHECK_EQ(crc32c("", 0), 0u);
}

TEST(tensorboard_events_match_the_tensorboard_writer) {
    std::string expected = read_file("test/fixtures/tensorboard/events.out.tfevents.fixture");
    MetricRow a, b;
    a.set("critic/rewards/mean", 0.25);
    a.set("actor/lr", 3e-4);
    a.set("perf/gen_tokens_per_s", 123456.789);
    a.set("val-core/add/acc/greedy", NAN);  // left out, as log.jsonl writes null
    b.set("actor/pg_clipfrac_low", 0.0);
    std::string ours = tf_record(tb_file_version_event(1700000000.5)) + tf_record(tb_scalars_event(1700000001.25, 7, a)) +
                       tf_record(tb_scalars_event(1700000002.0, 0, b));
    CHECK_EQ(ours.size(), expected.size());
    for (size_t i = 0; i < std::min(ours.size(), expected.size()); i++)
        if (ours[i] != expected[i]) {
            CHECK_MSG(false, "first differing byte at offset %zu: ours 0x%02x, tensorboard's 0x%02x", i, (uint8_t)ours[i],
                      (uint8_t)expected[i]);
            break;
        }
}

// The Logger with tensorboard on: one event file under out_dir, the version record then one
// record per step, each with a valid framing.
TEST(tensorboard_logger_writes_one_record_per_step) {
    harness::TempDir tmp;
    const std::string& dir = tmp.path;
    std::string path;
    {
        Logger log(dir, true, 0, true);
        path = log.tensorboard_path();
        for (int s = 0; s < 3; s++) {
            MetricRow m;
            m.set("training/global_step", s);
            m.set("critic/rewards/mean", 0.1 * s);
            log.record(m);
        }
        CHECK_EQ(log.rows().size(), (size_t)3);
    }
    CHECK(std::filesystem::path(path).filename().string().rfind("events.out.tfevents.", 0) == 0);
    std::string data = read_file(path);
    size_t pos = 0, records = 0;
    while (pos + 12 <= data.size()) {
        uint64_t len;
        uint32_t len_crc, data_crc;
        memcpy(&len, data.data() + pos, 8);
        memcpy(&len_crc, data.data() + pos + 8, 4);
        CHECK_EQ(len_crc, masked_crc32c(data.data() + pos, 8));
        CHECK(pos + 16 + len <= data.size());
        if (pos + 16 + len > data.size()) break;
        memcpy(&data_crc, data.data() + pos + 12 + len, 4);
        CHECK_EQ(data_crc, masked_crc32c(data.data() + pos + 12, len));
        pos += 16 + len;
        records++;
    }
    CHECK_EQ(pos, data.size());
    CHECK_EQ(records, (size_t)4);
}
