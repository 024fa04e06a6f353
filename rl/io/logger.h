// logger.h: what a run tells its user. One readable line per step on stdout, a progress bar on
// stderr during long phases (only on a terminal), and log.jsonl with every metric of every step
// (one JSON object per line, keys in the order they were recorded), and with --tensorboard 1 the
// same scalars as a TensorBoard event file (rl/io/tensorboard.h). It keeps the metrics the dashboard
// draws (rl/io/dashboard.h) of every step of the run. Only rank 0 logs.
#pragma once
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "rl/common.h"
#include "rl/io/dashboard.h"
#include "rl/io/json.h"
#include "rl/io/metric_row.h"
#include "rl/io/tensorboard.h"

namespace fp8rl {

// One JSON object; non-finite values become null (JSON has no NaN).
inline std::string metrics_json(const MetricRow& row) {
    std::string out = "{";
    for (size_t i = 0; i < row.items.size(); i++) {
        if (i) out += ",";
        out += json_quote(row.items[i].first);
        out += ":";
        double v = row.items[i].second;
        out += std::isfinite(v) ? strfmt("%.9g", v) : std::string("null");
    }
    return out + "}";
}

// The step's readable line: the handful of numbers a user watches.
inline std::string step_line(const MetricRow& m, int64_t steps) {
    auto g = [&](const char* k) { return m.get(k); };
    std::string s = strfmt("step %4lld/%lld | reward %6.3f correct %5.3f | len %5.1f | ent %6.3f",
                           (long long)g("training/global_step") + 1, (long long)steps, g("critic/rewards/mean"),
                           g("critic/correct/mean"), g("response_length/mean"),
                           g("actor/entropy"));
    s += strfmt(" | clip- %.3f clip+ %.3f", g("actor/pg_clipfrac_low"), g("actor/pg_clipfrac_high"));
    s += strfmt(" | bounds [%.2f,%.2f]", g("calib/clip_low"), g("calib/clip_high"));
    s += strfmt(" | mismatch %.1e", g("rollout_corr/logprob_abs_diff"));
    s += strfmt(" | gnorm %.3g lr %.2g", g("actor/grad_norm"), g("actor/lr"));
    s += strfmt(" | gen %.0f tok/s %.2fs train %.0f tok/s %.2fs | %.2fs", g("perf/gen_tokens_per_s"), g("timing_s/gen"),
                g("perf/train_tokens_per_s"), g("timing_s/update_actor"), g("timing_s/step"));
    if (m.get("training/skipped_bad", 0) > 0) s += " | SKIPPED: NaN/Inf";
    return s;
}

class Logger {
public:
    Logger() = default;
    // Opens out_dir/log.jsonl. A resumed run keeps only the lines of steps before first_step, so
    // the log reads as if the run had never stopped.
    Logger(const std::string& out_dir, bool enabled, int64_t first_step, bool tensorboard = false) : enabled_(enabled) {
        if (!enabled_) return;
        path_ = out_dir + "/log.jsonl";
        std::string kept;
        if (first_step > 0) kept = lines_before(path_, first_step, &rows_);
        write_file_atomic(path_, kept);
        file_ = fopen(path_.c_str(), "ab");
        if (!file_) fail("%s: cannot open for appending", path_.c_str());
        if (tensorboard) tb_ = std::make_unique<TensorBoardWriter>(out_dir);
    }
    ~Logger() {
        if (file_) fclose(file_);
    }
    Logger(const Logger&) = delete;
    Logger& operator=(const Logger&) = delete;
    Logger(Logger&& o) noexcept { *this = std::move(o); }
    Logger& operator=(Logger&& o) noexcept {
        std::swap(enabled_, o.enabled_);
        std::swap(path_, o.path_);
        std::swap(file_, o.file_);
        std::swap(tb_, o.tb_);
        std::swap(rows_, o.rows_);
        return *this;
    }

    bool enabled() const { return enabled_; }
    const std::string& path() const { return path_; }
    // The event file of --tensorboard 1, else "".
    std::string tensorboard_path() const { return tb_ ? tb_->path() : std::string(); }
    // Every step of the run so far (a resumed run's earlier steps included), the dashboard's metrics only.
    const std::vector<MetricRow>& rows() const { return rows_; }

    void record(const MetricRow& row) {
        if (!enabled_) return;
        std::string line = metrics_json(row) + "\n";
        if (fwrite(line.data(), 1, line.size(), file_) != line.size() || fflush(file_) != 0)
            fail("%s: write failed (disk full?)", path_.c_str());
        if (tb_) tb_->record(row);
        rows_.push_back(dashboard_part(row));
    }

    void print(const std::string& line) const {
        if (!enabled_) return;
        printf("%s\n", line.c_str());
        fflush(stdout);
    }

private:
    bool enabled_ = false;
    std::string path_;
    FILE* file_ = nullptr;
    std::unique_ptr<TensorBoardWriter> tb_;
    std::vector<MetricRow> rows_;

    static MetricRow dashboard_part(const MetricRow& row) {
        MetricRow kept;
        for (const auto& kv : row.items)
            if (dashboard_reads(kv.first)) kept.items.push_back(kv);
        return kept;
    }

    static std::string lines_before(const std::string& path, int64_t first_step, std::vector<MetricRow>* rows) {
        FILE* f = fopen(path.c_str(), "rb");
        if (!f) return "";
        fclose(f);
        std::string text = read_file(path), kept;
        size_t pos = 0;
        int line_no = 0;
        while (pos < text.size()) {
            size_t nl = text.find('\n', pos);
            if (nl == std::string::npos) break;  // a torn last line is dropped
            std::string line = text.substr(pos, nl - pos);
            pos = nl + 1;
            line_no++;
            Json j = json_parse(line, strfmt("%s:%d", path.c_str(), line_no));
            const Json* step = j.find("training/global_step");
            if (!step || !step->is_number() || step->number >= (double)first_step) continue;
            kept += line + "\n";
            MetricRow row;
            for (const auto& kv : j.fields) row.items.emplace_back(kv.first, kv.second.is_number() ? kv.second.number : NAN);
            rows->push_back(dashboard_part(row));
        }
        return kept;
    }
};

// A bar on stderr for long phases; silent unless stderr is a terminal and the phase is slow.
class Progress {
public:
    Progress(const char* label, int64_t total, bool enabled)
        : label_(label), total_(total), enabled_(enabled && isatty(2)), start_(std::chrono::steady_clock::now()) {}
    void update(int64_t done) {
        if (!enabled_) return;
        double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
        if (secs < 1.0) return;
        const int width = 30;
        int filled = total_ > 0 ? (int)((double)done / (double)total_ * width) : width;
        std::string bar(filled, '#');
        bar.resize(width, ' ');
        fprintf(stderr, "\r  %s [%s] %lld/%lld %.0fs", label_, bar.c_str(), (long long)done, (long long)total_, secs);
        shown_ = true;
    }
    ~Progress() {
        if (shown_) fprintf(stderr, "\r%*s\r", 70, "");
    }

private:
    const char* label_;
    int64_t total_;
    bool enabled_;
    bool shown_ = false;
    std::chrono::steady_clock::time_point start_;
};

}  // namespace fp8rl
