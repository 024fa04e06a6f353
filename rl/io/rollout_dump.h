// rollout_dump.h: --dump_rollouts N writes OUT/rollouts/step_K.jsonl every N steps (K =
// training/global_step of log.jsonl), one JSON line per trained sample of all ranks, so that the
// responses behind a step's numbers (the Calibrated Clipping paper's garbled high-entropy
// negative-advantage answers) can be read token by token (dev/plot_rollouts.py draws one step).
//
// A line: step, prompt, response (decoded text), ids (response token ids), reward, advantage, and per
// response token: rollout_lp (sampler), old_lp (trainer), entropy and ratio π_θ/π_old of the
// sample's first training forward, is_weight (the --is_correction weight) and clipped (-1 / 1 where
// the clipped branch of the surrogate won below / above the ratio bounds, else 0), and loss_mask (1 =
// a token the loss trains; 0 = an environment's observation (--env_cmd), whose entropy and ratio
// are null and is_weight 0).
#pragma once
#include <stdint.h>
#include <stdio.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "rl/common.h"
#include "rl/io/json.h"

namespace fp8rl {

struct RolloutDumpSample {
    int64_t step = 0;
    std::string prompt, response;
    const int32_t* ids = nullptr;  // [T] response tokens
    double reward = 0, advantage = 0;
    int T = 0;
    const float *rollout_lp = nullptr, *old_lp = nullptr, *entropy = nullptr;  // [T]
    const double *is_weight = nullptr, *ratio = nullptr;                       // [T]
    const int8_t* clipped = nullptr;                                           // [T]
    const uint8_t* loss_mask = nullptr;                                        // [T]
};

// One sample as one JSON line (non-finite values as null, as log.jsonl).
inline std::string rollout_dump_line(const RolloutDumpSample& s) {
    auto num = [](double v) { return std::isfinite(v) ? strfmt("%.9g", v) : std::string("null"); };
    auto array = [&](const char* key, auto value) {
        std::string out = ",\"" + std::string(key) + "\":[";
        for (int t = 0; t < s.T; t++) out += (t ? "," : "") + value(t);
        return out + "]";
    };
    std::string line = strfmt("{\"step\":%lld,\"prompt\":", (long long)s.step) + json_quote(s.prompt) +
                       ",\"response\":" + json_quote(s.response);
    line += array("ids", [&](int t) { return std::to_string(s.ids[t]); });
    line += ",\"reward\":" + strfmt("%.17g", s.reward) + ",\"advantage\":" + strfmt("%.17g", s.advantage);
    line += array("rollout_lp", [&](int t) { return num(s.rollout_lp[t]); });
    line += array("old_lp", [&](int t) { return num(s.old_lp[t]); });
    line += array("entropy", [&](int t) { return num(s.entropy[t]); });
    line += array("is_weight", [&](int t) { return num(s.is_weight[t]); });
    line += array("ratio", [&](int t) { return num(s.ratio[t]); });
    line += array("clipped", [&](int t) { return std::to_string((int)s.clipped[t]); });
    line += array("loss_mask", [&](int t) { return std::to_string((int)s.loss_mask[t]); });
    return line + "}\n";
}

inline std::string rollout_dump_dir(const std::string& out_dir) { return out_dir + "/rollouts"; }
inline std::string rollout_dump_path(const std::string& out_dir, int64_t step) {
    return rollout_dump_dir(out_dir) + strfmt("/step_%lld.jsonl", (long long)step);
}

// At startup, so that a run does not fail hours in: the dump directory exists and takes a file.
inline void prepare_rollout_dump_dir(const std::string& out_dir) {
    const std::string dir = rollout_dump_dir(out_dir), probe = dir + "/.write_probe";
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    FILE* f = ec ? nullptr : fopen(probe.c_str(), "wb");
    if (!f || fclose(f) != 0 || remove(probe.c_str()) != 0)
        fail("--dump_rollouts: cannot write into %s (%s); give an --out_dir where it can be created and written",
             dir.c_str(), ec ? ec.message().c_str() : strerror(errno));
}

}  // namespace fp8rl
