// lr_schedule.h: learning rate per optimizer update: linear warm-up from lr/warmup to lr, then
// constant, cosine decay to min_ratio*lr at the last update, or warmup-stable-decay (WSD, the CPT
// schedule of InfiR2 and MiniCPM): constant, then a decay over the last `decay` updates to
// min_ratio*lr at the last one, linear or (InfiR2's) cosine.
#pragma once
#include <cmath>
#include <cstdint>
#include <string>

#include "rl/common.h"

namespace fp8rl {

struct LrSchedule {
    double lr = 1e-6;
    int64_t warmup = 0;      // updates
    int64_t total = 1;       // updates in the whole run
    bool cosine = false;
    bool wsd = false;
    int64_t decay = 0;       // wsd: updates of the final decay
    bool wsd_cosine = false;  // wsd: the decay's shape, half a cosine instead of a line
    double min_ratio = 0.0;

    // update = 0-based index of the optimizer update.
    double at(int64_t update) const {
        if (update < warmup) return lr * (double)(update + 1) / (double)warmup;
        if (wsd) {
            const int64_t start = total - decay;  // the first decaying update
            if (update < start || decay <= 0) return lr;
            double progress = decay > 1 ? (double)(update - start) / (double)(decay - 1) : 1.0;
            if (progress > 1.0) progress = 1.0;
            if (wsd_cosine) return lr * (min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + std::cos(M_PI * progress)));
            return lr * (1.0 - (1.0 - min_ratio) * progress);
        }
        if (!cosine) return lr;
        int64_t span = total - warmup;
        double progress = span > 1 ? (double)(update - warmup) / (double)(span - 1) : 1.0;
        if (progress > 1.0) progress = 1.0;
        double c = 0.5 * (1.0 + std::cos(M_PI * progress));
        return lr * (min_ratio + (1.0 - min_ratio) * c);
    }
};

}  // namespace fp8rl
