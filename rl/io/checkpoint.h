// checkpoint.h: a checkpoint is a HF model directory (bf16 model.safetensors, config.json,
// tokenizer files: loadable by transformers as it is) plus trainer_state.bin, everything a
// resumed run needs to continue bit-exactly: FP32 master weights, AdamW moments and step count,
// the data cursor, the Calibrated Clipping controller's state (bounds, pooled statistics), the step and the
// NaN/Inf counters (sampling and data order are pure functions of (seed, step, index), so they
// have no state). The directory is written under a temporary name and renamed, then the run's
// `latest` file is replaced atomically, so a crash never leaves a half-written checkpoint.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "rl/common.h"
#include "rl/io/logger.h"

namespace fp8rl {

struct TrainerState {
    int64_t step = 0;              // steps completed; the resumed run starts at this step
    int64_t data_cursor = 0;       // global prompts consumed
    int64_t optimizer_steps = 0;   // AdamW's t
    int64_t bad_steps = 0;         // steps skipped for NaN/Inf, in total
    double clip_low = 0, clip_high = 0;  // ratio bounds in force (Calibrated Clipping state)
    bool cc_low_unset = false, cc_high_unset = false;  // bounds no calibration has decided yet
    std::vector<int64_t> cc_pooled;  // statistics of skipped calibrations pooled into the next one
    int64_t cc_pooled_steps = 0;
    std::vector<float> master;     // [P] FP32 master weights
    std::vector<float> adam_m;     // [P]
    std::vector<float> adam_v;     // [P]
};

// Version 2 adds Calibrated Clipping's unset flags and pooled statistics after the bounds; a
// version 1 state reads with both bounds decided and nothing pooled (what version 1 runs did).
static const char kStateMagic[8] = {'F', 'P', '8', 'R', 'L', 'S', 'T', '2'};
static const char kStateMagicV1[8] = {'F', 'P', '8', 'R', 'L', 'S', 'T', '1'};

inline std::string encode_trainer_state(const TrainerState& s) {
    std::string out(kStateMagic, 8);
    auto put = [&](const void* p, size_t n) { out.append((const char*)p, n); };
    const int64_t ints[5] = {s.step, s.data_cursor, s.optimizer_steps, s.bad_steps, (int64_t)s.master.size()};
    put(ints, sizeof ints);
    put(&s.clip_low, 8);
    put(&s.clip_high, 8);
    const int64_t cc[4] = {s.cc_low_unset, s.cc_high_unset, s.cc_pooled_steps, (int64_t)s.cc_pooled.size()};
    put(cc, sizeof cc);
    put(s.cc_pooled.data(), s.cc_pooled.size() * sizeof(int64_t));
    if (s.adam_m.size() != s.master.size() || s.adam_v.size() != s.master.size())
        fail("internal: optimizer state size differs from the weights");
    for (const std::vector<float>* v : {&s.master, &s.adam_m, &s.adam_v}) put(v->data(), v->size() * sizeof(float));
    return out;
}

inline TrainerState decode_trainer_state(const std::string& data, const std::string& path) {
    TrainerState s;
    size_t pos = 8;
    auto get = [&](void* p, size_t n) {
        if (pos + n > data.size()) fail("%s: truncated trainer state (%zu bytes); the checkpoint is damaged", path.c_str(), data.size());
        if (n) memcpy(p, data.data() + pos, n);  // an empty vector's data() may be null, which memcpy forbids
        pos += n;
    };
    const bool v1 = data.size() >= 8 && memcmp(data.data(), kStateMagicV1, 8) == 0;
    if (data.size() < 8 || (!v1 && memcmp(data.data(), kStateMagic, 8) != 0))
        fail("%s: not an fp8rl trainer state (bad magic)", path.c_str());
    int64_t ints[5];
    get(ints, sizeof ints);
    s.step = ints[0];
    s.data_cursor = ints[1];
    s.optimizer_steps = ints[2];
    s.bad_steps = ints[3];
    if (ints[4] < 0 || (uint64_t)ints[4] > data.size()) fail("%s: bad parameter count %lld", path.c_str(), (long long)ints[4]);
    get(&s.clip_low, 8);
    get(&s.clip_high, 8);
    if (!v1) {
        int64_t cc[4];
        get(cc, sizeof cc);
        if (cc[3] < 0 || (uint64_t)cc[3] > data.size())
            fail("%s: bad pooled statistics count %lld; the checkpoint is damaged", path.c_str(), (long long)cc[3]);
        s.cc_low_unset = cc[0] != 0;
        s.cc_high_unset = cc[1] != 0;
        s.cc_pooled_steps = cc[2];
        s.cc_pooled.resize((size_t)cc[3]);
        get(s.cc_pooled.data(), s.cc_pooled.size() * sizeof(int64_t));
    }
    for (std::vector<float>* v : {&s.master, &s.adam_m, &s.adam_v}) {
        v->resize((size_t)ints[4]);
        get(v->data(), v->size() * sizeof(float));
    }
    if (pos != data.size()) fail("%s: %zu trailing bytes; the checkpoint is damaged", path.c_str(), data.size() - pos);
    return s;
}

inline std::string checkpoint_name(int64_t step) { return strfmt("checkpoints/step_%06lld", (long long)step); }

// Writes out_dir/checkpoints/step_N (HF files via write_hf, then trainer_state.bin) under a
// temporary name, renames it into place, then points out_dir/latest at it. Returns its path.
inline std::string save_checkpoint(const std::string& out_dir, const TrainerState& s,
                                   const std::function<void(const std::string& dir)>& write_hf) {
    namespace fs = std::filesystem;
    std::string rel = checkpoint_name(s.step);
    std::string final_dir = out_dir + "/" + rel, tmp_dir = final_dir + ".tmp";
    std::error_code ec;
    fs::remove_all(tmp_dir, ec);
    fs::create_directories(tmp_dir, ec);
    if (ec) fail("%s: cannot create checkpoint directory: %s", tmp_dir.c_str(), ec.message().c_str());
    write_hf(tmp_dir);
    write_file_atomic(tmp_dir + "/trainer_state.bin", encode_trainer_state(s));
    fs::remove_all(final_dir, ec);
    fs::rename(tmp_dir, final_dir, ec);
    if (ec) fail("%s: cannot rename to %s: %s", tmp_dir.c_str(), final_dir.c_str(), ec.message().c_str());
    write_file_atomic(out_dir + "/latest", rel + "\n");
    return final_dir;
}

// --keep_checkpoints: removes all but the newest `keep` step_N directories of out_dir/checkpoints
// (names sort by step: zero-padded), never the one `latest` names. Returns the removed paths.
inline std::vector<std::string> prune_checkpoints(const std::string& out_dir, int64_t keep) {
    namespace fs = std::filesystem;
    std::vector<std::string> names, removed;
    std::error_code ec;
    for (const fs::directory_entry& e : fs::directory_iterator(out_dir + "/checkpoints", ec)) {
        std::string name = e.path().filename().string();
        if (e.is_directory() && name.rfind("step_", 0) == 0 && name.find('.') == std::string::npos) names.push_back(name);
    }
    std::sort(names.begin(), names.end());
    std::string latest = fs::exists(out_dir + "/latest") ? read_file(out_dir + "/latest") : "";
    for (size_t i = 0; i + (size_t)keep < names.size(); i++) {
        if (latest.find("checkpoints/" + names[i] + "\n") == 0) continue;
        std::string dir = out_dir + "/checkpoints/" + names[i];
        fs::remove_all(dir, ec);
        if (ec) fail("--keep_checkpoints: cannot remove %s: %s", dir.c_str(), ec.message().c_str());
        removed.push_back(dir);
    }
    return removed;
}

// --resume PATH: a checkpoint directory, or a run directory whose `latest` names one.
inline std::string resolve_checkpoint(const std::string& path) {
    namespace fs = std::filesystem;
    if (fs::exists(path + "/trainer_state.bin")) return path;
    if (fs::exists(path + "/latest")) {
        std::string rel = read_file(path + "/latest");
        while (!rel.empty() && (rel.back() == '\n' || rel.back() == '\r')) rel.pop_back();
        std::string dir = path + "/" + rel;
        if (!fs::exists(dir + "/trainer_state.bin"))
            fail("--resume %s: latest points at %s, which has no trainer_state.bin", path.c_str(), dir.c_str());
        return dir;
    }
    fail("--resume %s: neither a checkpoint (no trainer_state.bin) nor a run directory (no latest file)", path.c_str());
}

inline TrainerState load_trainer_state(const std::string& checkpoint_dir) {
    std::string path = checkpoint_dir + "/trainer_state.bin";
    return decode_trainer_state(read_file(path), path);
}

}  // namespace fp8rl
