// Tests of rl/io/safetensors.h: the HF-written fixtures, our writer's format (alignment, order,
// metadata), sharded directories, and a battery of malformed files built here, each of which must
// give its own specific error (never a crash: the sanitizer run checks that too).
#include <sys/stat.h>

#include <cstring>

#include "rl/io/safetensors.h"
#include "test/harness.h"
#include "test/temp_dir.h"

using namespace fp8rl;


// A file from a header (no padding) and `data_bytes` bytes of data.
static std::string raw_file(const std::string& header, size_t data_bytes) {
    std::string f(8, '\0');
    for (int i = 0; i < 8; i++) f[i] = (char)((uint64_t)header.size() >> (8 * i));
    return f + header + std::string(data_bytes, '\x01');
}

static void open_file(const std::string& path) { SafetensorsFile f(path); }

TEST(safetensors_reads_hf_files) {
    SafetensorsFile f(harness::model_fixtures + "qwen3_tiny/model.safetensors");
    CHECK_EQ(f.metadata().at("format"), std::string("pt"));
    CHECK_EQ(f.tensors().size(), (size_t)24);  // embed + 2 x 11 + norm (tied: no lm_head)
    const TensorView* q = f.find("model.layers.1.self_attn.q_proj.weight");
    CHECK(q != nullptr);
    if (q) {
        CHECK(q->dtype == DType::F32);
        CHECK(q->shape == (std::vector<int64_t>{128, 64}));
        CHECK_EQ(q->nbytes, (size_t)128 * 64 * 4);
    }
    CHECK(f.find("lm_head.weight") == nullptr);
    Checkpoint sharded(harness::model_fixtures + "qwen2_tiny");
    CHECK_EQ(sharded.num_files(), (size_t)4);
    CHECK_EQ(sharded.tensors().size(), (size_t)(1 + 2 * 12 + 1));
    CHECK(sharded.find("model.layers.0.self_attn.k_proj.bias") != nullptr);
}

TEST(safetensors_writer_format) {
    harness::TempDir dir;
    std::vector<float> f32 = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 8.0f};
    std::vector<uint16_t> b16 = {0x3F80, 0xC000, 0x4049};
    std::vector<uint8_t> f8 = {0x38, 0x7E, 0x00, 0xFF, 0x01};
    float scalar = 42.0f;
    std::vector<TensorToWrite> t = {
        {"z.bf16", DType::BF16, {3}, b16.data()},
        {"a.f8", DType::F8_E4M3, {5}, f8.data()},
        {"m.f32", DType::F32, {2, 3}, f32.data()},
        {"b.f16", DType::F16, {1, 3}, b16.data()},
        {"s.scalar", DType::F32, {}, &scalar},
        {"e.empty", DType::F32, {4, 0}, f32.data()},
        {"c.e5m2", DType::F8_E5M2, {5}, f8.data()},
    };
    std::string path = dir / "t.safetensors";
    write_safetensors(path, t);
    std::string bytes = read_file(path);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | (uint8_t)bytes[i];
    CHECK_EQ(n % 8, (uint64_t)0);  // data buffer 8-byte aligned
    const std::string meta = "{\"__metadata__\":{\"format\":\"pt\"}";
    CHECK_EQ(bytes.compare(8, meta.size(), meta), 0);
    CHECK(!Checkpoint::file_exists(path + ".tmp"));
    SafetensorsFile f(path);
    // order: 4-byte dtypes by name, then 2-byte, then 1-byte
    std::vector<std::string> order;
    for (const TensorView& v : f.tensors()) order.push_back(v.name);
    CHECK(order == (std::vector<std::string>{"e.empty", "m.f32", "s.scalar", "b.f16", "z.bf16", "a.f8", "c.e5m2"}));
    for (const TensorView& v : f.tensors()) CHECK_EQ(v.offset % dtype_size(v.dtype), (size_t)0);
    const TensorView* m = f.find("m.f32");
    CHECK(m && m->shape == (std::vector<int64_t>{2, 3}) && memcmp(m->data, f32.data(), 24) == 0);
    const TensorView* s = f.find("s.scalar");
    CHECK(s && s->shape.empty() && s->numel == 1 && memcmp(s->data, &scalar, 4) == 0);
    const TensorView* e = f.find("e.empty");
    CHECK(e && e->numel == 0 && e->nbytes == 0);
    const TensorView* a = f.find("a.f8");
    CHECK(a && a->dtype == DType::F8_E4M3 && memcmp(a->data, f8.data(), 5) == 0);
    CHECK(f.find("c.e5m2") && f.find("c.e5m2")->dtype == DType::F8_E5M2);
    CHECK(f.find("b.f16") && f.find("b.f16")->dtype == DType::F16 && memcmp(f.find("b.f16")->data, b16.data(), 6) == 0);
    t.push_back(t[0]);
    CHECK_THROWS(write_safetensors(dir / "dup.safetensors", t), "tensor z.bf16 given twice");
}

TEST(safetensors_writer_shards_with_index) {
    harness::TempDir dir;
    std::vector<float> x(1000);
    for (size_t i = 0; i < x.size(); i++) x[i] = (float)i;
    std::vector<TensorToWrite> t;
    for (int i = 0; i < 5; i++) t.push_back({"t" + std::to_string(i), DType::F32, {250}, x.data()});  // 1000 bytes each
    write_checkpoint_weights(dir.path, t, 2500);
    for (const char* name : {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                             "model-00003-of-00003.safetensors", "model.safetensors.index.json"})
        CHECK_MSG(Checkpoint::file_exists(dir / name), "%s not written", name);
    Json index = json_parse_file(dir / "model.safetensors.index.json");
    CHECK_EQ(index.find("metadata")->find("total_size")->integer, (int64_t)5000);
    CHECK_EQ(index.find("weight_map")->find("t4")->str, std::string("model-00003-of-00003.safetensors"));
    Checkpoint ck(dir.path);
    CHECK_EQ(ck.tensors().size(), (size_t)5);
    CHECK(ck.find("t3") && memcmp(ck.find("t3")->data, x.data(), 1000) == 0);
}

TEST(safetensors_rejects_malformed_files) {
    harness::TempDir dir;
    std::string p = dir / "bad.safetensors";
    auto expect = [&](const std::string& bytes, const char* needle) {
        harness::write_text(p, bytes);
        CHECK_THROWS(open_file(p), needle);
    };
    const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
    harness::write_text(p, raw_file(ok, 8));
    CHECK(SafetensorsFile(p).find("a") != nullptr);  // the base case is valid

    expect("", "too short for a safetensors header");
    expect(std::string("\x05\0\0", 3), "too short");
    expect(raw_file(ok, 8).substr(0, 20), "runs past the end of the file");            // truncated inside the header
    expect(raw_file(ok, 4), "the file is truncated");                                   // truncated inside the data
    expect(raw_file(ok, 12), "trailing bytes");
    expect(std::string("\x01\xe1\xf5\x05\x00\x00\x00\x00", 8) + ok, "exceeds the 100 MB limit");  // 100000001
    expect(std::string("\xff\xff\xff\xff\xff\xff\xff\xff", 8) + ok, "exceeds the 100 MB limit");
    std::string lying = raw_file(ok, 8);
    lying[0] = (char)(ok.size() + 64);  // lying header length, inside the 100 MB limit
    expect(lying, "runs past the end of the file");
    lying[0] = (char)(ok.size() - 3);  // too short: the JSON is cut
    expect(lying, "invalid JSON");
    expect(raw_file("{not json}", 0), "invalid JSON");
    expect(raw_file("[1, 2]", 0), "header is not a JSON object");
    expect(raw_file(R"({"a":{"dtype":"F7","shape":[2],"data_offsets":[0,8]}})", 8), "unknown dtype \"F7\"");
    expect(raw_file(R"({"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8), "dtype I64 is not supported");
    expect(raw_file(R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,8]}})", 8), "shape [2, 3] of F32 needs 24");
    expect(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})", 20),
           "gap in the data buffer before tensor b");
    expect(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
           "tensor b overlaps");
    expect(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12), "gap in the data buffer before tensor a");
    expect(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 16),
           "duplicate key \"a\"");
    expect(raw_file(R"({"a":{"dtype":"F32","shape":[2]}})", 0), "\"data_offsets\" must be an array");
    expect(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8), "end before they begin");
    expect(raw_file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8), "not a non-negative integer");
    expect(raw_file(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8), "is too large");
    expect(raw_file(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", 8), "missing or non-string \"dtype\"");
    expect(raw_file(R"({"__metadata__":{"format":1}})", 0), "__metadata__ value of \"format\" is not a string");
    CHECK_THROWS(open_file(dir / "absent.safetensors"), "cannot open file");
    CHECK_THROWS(open_file(dir.path), "not a regular file");
}

// Every prefix length class of a real file fails cleanly (the tiling check catches a cut buffer).
TEST(safetensors_truncated_real_file) {
    harness::TempDir dir;
    std::string real = read_file(harness::model_fixtures + "llama_tiny/model.safetensors");
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | (uint8_t)real[i];
    for (size_t len : {(size_t)0, (size_t)1, (size_t)7, (size_t)8, (size_t)9, (size_t)(8 + n / 2), (size_t)(8 + n - 1),
                       (size_t)(8 + n), (size_t)(8 + n + 1), real.size() / 2, real.size() - 1}) {
        harness::write_text(dir / "cut.safetensors", real.substr(0, len));
        bool threw = false;
        try {
            open_file(dir / "cut.safetensors");
        } catch (const Error& e) {
            threw = true;
            CHECK_MSG(strstr(e.what(), "cut.safetensors") != nullptr, "error does not name the file: %s", e.what());
        }
        CHECK_MSG(threw, "a file cut to %zu bytes was accepted", len);
    }
}

TEST(safetensors_rejects_bad_sharded_checkpoints) {
    harness::TempDir dir;
    CHECK_THROWS(Checkpoint(dir.path), "no model.safetensors or model.safetensors.index.json");
    std::vector<float> x(4, 1.0f);
    // shard 1 holds a and b, shard 2 holds c
    write_checkpoint_weights(dir.path, {{"a", DType::F32, {4}, x.data()}, {"b", DType::F32, {4}, x.data()}, {"c", DType::F32, {4}, x.data()}}, 32);
    CHECK_EQ(Checkpoint(dir.path).tensors().size(), (size_t)3);
    std::string index = dir / "model.safetensors.index.json";
    std::string good = read_file(index);
    harness::write_text(index, "{\"weight_map\": ");
    CHECK_THROWS(Checkpoint(dir.path), "model.safetensors.index.json:1:16: invalid JSON");
    harness::write_text(index, "{\"metadata\": {}}");
    CHECK_THROWS(Checkpoint(dir.path), "no \"weight_map\" object");
    const std::string s1 = "\"model-00001-of-00002.safetensors\"", s2 = "\"model-00002-of-00002.safetensors\"";
    harness::write_text(index, "{\"weight_map\": {\"a\": " + s1 + ", \"b\": " + s1 + ", \"c\": \"model-00009-of-00009.safetensors\"}}");
    CHECK_THROWS(Checkpoint(dir.path), "model-00009-of-00009.safetensors: cannot open file");
    harness::write_text(index, "{\"weight_map\": {\"a\": " + s1 + ", \"b\": " + s1 + ", \"c\": " + s1 + "}}");
    CHECK_THROWS(Checkpoint(dir.path), "the index puts tensor c in model-00001-of-00002.safetensors, but that file has no such tensor");
    harness::write_text(index, "{\"weight_map\": {\"a\": " + s1 + ", \"c\": " + s2 + "}}");
    CHECK_THROWS(Checkpoint(dir.path), "tensor b is in this shard but");
    harness::write_text(index, R"({"weight_map": {"a": "../model-00001-of-00002.safetensors"}})");
    CHECK_THROWS(Checkpoint(dir.path), "shards must be plain file names");
    harness::write_text(index, good);
    CHECK_EQ(Checkpoint(dir.path).tensors().size(), (size_t)3);
}

// A FIFO where a weights file should be: an error at once, never a hang waiting for a writer.
TEST(safetensors_fifo_is_rejected_without_blocking) {
    harness::TempDir dir;
    std::string p = dir / "model.safetensors";
    if (mkfifo(p.c_str(), 0600) != 0) fail("test setup: mkfifo %s failed", p.c_str());
    CHECK_THROWS(open_file(p), "not a regular file");
}
