// metric_row.h: the metrics of one step, named scalars in recording order, as the driver fills
// them and every sink (log.jsonl, TensorBoard, the dashboard) reads them.
#pragma once
#include <cmath>
#include <string>
#include <utility>
#include <vector>

namespace fp8rl {

// Named scalars in recording order; a later set() of the same name overwrites.
struct MetricRow {
    std::vector<std::pair<std::string, double>> items;

    void set(const std::string& name, double v) {
        for (auto& kv : items)
            if (kv.first == name) {
                kv.second = v;
                return;
            }
        items.emplace_back(name, v);
    }
    bool has(const std::string& name) const {
        for (const auto& kv : items)
            if (kv.first == name) return true;
        return false;
    }
    double get(const std::string& name, double fallback = NAN) const {
        for (const auto& kv : items)
            if (kv.first == name) return kv.second;
        return fallback;
    }
};

}  // namespace fp8rl
