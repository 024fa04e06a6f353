// dashboard.h: OUT_DIR/dashboard.html, the charts of a run in one self-contained file (inline
// SVG, no scripts, nothing fetched), so a user needs only a browser. An RL run's panels are those of
// dev/plot_log.py (reward, accuracy, entropy, clip fractions by the advantage's sign, the clip
// bounds Calibrated Clipping keeps, rollout/train mismatch and, with --mismatch_report, its share by
// source, lengths) plus throughput and time per phase; an SFT or CPT run's (--mode sft|cpt) are its loss (train, held-out, held-out in BF16),
// perplexity, token accuracy, throughput, learning rate and gradient norm. The trainer rewrites it
// at each eval and at the end, atomically.
#pragma once
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "rl/common.h"
#include "rl/io/metric_row.h"

namespace fp8rl {

struct DashSeries {
    std::string key, label;
};
struct DashPanel {
    std::string title;
    std::vector<DashSeries> series;  // empty: every val-core/ key of the run
    bool log_y = false;
};

// Which run the page draws: RL (rl/driver/driver.h) or SFT/CPT (rl/driver/lm_trainer.h).
enum class DashKind { Rl, Lm };

inline std::vector<DashPanel> dashboard_panels(DashKind kind = DashKind::Rl) {
    if (kind == DashKind::Lm)
        return {
            {"loss (nats/token)", {{"train/loss", "train"}, {"val/loss", "held-out"}, {"val/loss_bf16", "held-out, weights in BF16"}}},
            {"training perplexity", {{"train/ppl", "train"}}, true},
            {"mean token accuracy (train)", {{"train/mean_token_accuracy", "top-1 = target"}}},
            {"throughput (tokens/s)", {{"perf/tokens_per_s", "training"}}},
            {"learning rate", {{"actor/lr", "lr"}}},
            {"grad norm", {{"actor/grad_norm", "grad norm"}}},
        };
    return {
        {"reward and training accuracy", {{"critic/rewards/mean", "reward"}, {"critic/score/mean", "score"}, {"critic/correct/mean", "exactly correct"}}},
        {"eval accuracy (held-out prompts)", {}},
        {"entropy (nats/token)", {{"actor/entropy", "entropy"}}},
        {"clip fractions by advantage sign", {{"actor/pg_clipfrac_low", "A<0, r<L"}, {"actor/pg_clipfrac_high", "A>0, r>H"}, {"actor/pg_clipfrac_lower", "dual clip"}}},
        {"clip bounds in force (Calibrated Clipping)", {{"calib/clip_low", "L"}, {"calib/clip_high", "H"}, {"calib/target_low", "L* target"}, {"calib/target_high", "H* target"}}},
        {"rollout/train mismatch", {{"rollout_corr/logprob_abs_diff", "mean |lp_train - lp_rollout|"}, {"rollout_corr/k3_kl", "k3 KL"}, {"calib/ratio_abs_diff_mean", "|ratio - fp32 ratio|"}}, true},
        {"mismatch by source, k3 KL share (--mismatch_report)", {{"mismatch/fp8_weights/k3_kl", "FP8 weights"}, {"mismatch/fp8_kv_cache/k3_kl", "FP8 KV cache"}, {"mismatch/decode_path/k3_kl", "decode vs prefill path"}}},
        {"response length (tokens)", {{"response_length/mean", "mean"}, {"response_length/max", "max"}}},
        {"throughput per phase (tokens/s)", {{"perf/gen_tokens_per_s", "rollout"}, {"perf/train_tokens_per_s", "training"}}},
        {"seconds per phase", {{"timing_s/gen", "rollout"}, {"timing_s/old_log_prob", "old log-probs"}, {"timing_s/update_actor", "training"}, {"timing_s/calib", "calibration"}}},
        {"grad norm", {{"actor/grad_norm", "grad norm"}}},
    };
}

// Whether the dashboard (or the run's summary, which reads a subset) uses a metric: the run keeps
// only these rows' values for the whole run (rl/io/logger.h).
inline bool dashboard_reads(const std::string& key) {
    static const std::vector<DashPanel> rl = dashboard_panels(DashKind::Rl), lm = dashboard_panels(DashKind::Lm);
    if (key == "training/global_step" || key.rfind("val-core/", 0) == 0) return true;
    for (const std::vector<DashPanel>* panels : {&rl, &lm})
        for (const DashPanel& p : *panels)
            for (const DashSeries& s : p.series)
                if (s.key == key) return true;
    return false;
}

// Round numbers for an axis from lo to hi (about 4 intervals).
inline std::vector<double> dash_ticks(double lo, double hi) {
    double span = hi - lo, raw = span / 4, mag = std::pow(10.0, std::floor(std::log10(raw)));
    double step = mag * (raw / mag < 1.5 ? 1 : raw / mag < 3 ? 2 : raw / mag < 7 ? 5 : 10);
    std::vector<double> t;
    for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) t.push_back(std::fabs(v) < step * 1e-9 ? 0 : v);
    return t;
}

inline std::string dash_escape(const std::string& s) {
    std::string out;
    for (char c : s) out += c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '&' ? "&amp;" : std::string(1, c);
    return out;
}

// The eval an SFT/CPT run logs before its first step (only val/ metrics at step 0): drawn at step 0, a
// training step's row at the step it ends.
inline bool dash_before_first_step(const MetricRow& r) {
    return std::all_of(r.items.begin(), r.items.end(), [](const std::pair<std::string, double>& kv) {
        return kv.first == "training/global_step" || kv.first.rfind("val/", 0) == 0;
    });
}

// One panel as an SVG: a polyline per series found in the rows, axes, ticks, a legend.
inline std::string dashboard_panel_svg(const DashPanel& p, const std::vector<MetricRow>& rows) {
    static const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"};
    const double W = 520, H = 260, L = 62, R = 12, T = 28, B = 66;
    std::vector<DashSeries> series = p.series;
    if (series.empty()) {
        for (const MetricRow& r : rows)
            for (const auto& kv : r.items)
                if (kv.first.rfind("val-core/", 0) == 0 &&
                    std::none_of(series.begin(), series.end(), [&](const DashSeries& s) { return s.key == kv.first; }))
                    series.push_back({kv.first, kv.first.substr(kv.first.rfind("/acc/") + 5)});
    }
    struct Line {
        std::string label;
        std::vector<std::pair<double, double>> pts;
    };
    std::vector<Line> lines;
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (const DashSeries& s : series) {
        Line line{s.label, {}};
        const size_t stride = rows.size() / 2000 + 1;  // at most ~2,000 points a line
        for (size_t i = 0; i < rows.size(); i += stride) {
            const MetricRow& r = rows[i];
            double v = r.get(s.key), step = r.get("training/global_step") + (dash_before_first_step(r) ? 0 : 1);
            if (!std::isfinite(v) || !std::isfinite(step) || (p.log_y && v <= 0)) continue;
            if (p.log_y) v = std::log10(v);
            line.pts.push_back({step, v});
            x0 = std::min(x0, step), x1 = std::max(x1, step), y0 = std::min(y0, v), y1 = std::max(y1, v);
        }
        if (!line.pts.empty()) lines.push_back(line);
    }
    std::string svg = strfmt("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\">"
                             "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>"
                             "<text x=\"%.0f\" y=\"18\" font-size=\"14\" font-weight=\"bold\">%s</text>",
                             W, H, W, H, L, dash_escape(p.title).c_str());
    if (lines.empty()) return svg + strfmt("<text x=\"%.0f\" y=\"%.0f\" fill=\"#888\">no data in this run</text></svg>", L, H / 2);
    if (x1 == x0) x1 = x0 + 1;
    if (y1 - y0 < 1e-12 * std::max(1.0, std::fabs(y0))) y0 -= 0.5, y1 += 0.5;
    const double pad = (y1 - y0) * 0.05;
    y0 -= pad, y1 += pad;
    auto X = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
    auto Y = [&](double y) { return T + (y1 - y) / (y1 - y0) * (H - T - B); };
    svg += strfmt("<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"#444\"/>", L, T, W - L - R, H - T - B);
    for (double v : dash_ticks(y0, y1)) {
        std::string label = p.log_y ? strfmt("1e%g", v) : strfmt("%g", v);
        if (p.log_y && v != std::floor(v)) continue;
        svg += strfmt("<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                      "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%s</text>",
                      L, W - R, Y(v), Y(v), L - 4, Y(v) + 4, label.c_str());
    }
    for (double v : dash_ticks(x0, x1))
        svg += strfmt("<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\">%g</text>", X(v), H - B + 15, v);
    svg += strfmt("<text x=\"%.0f\" y=\"%.0f\" font-size=\"11\" text-anchor=\"middle\">step</text>", L + (W - L - R) / 2, H - B + 28);
    double lx = L, ly = H - 20;  // the legend flows left to right, about 7 px a character
    for (size_t i = 0; i < lines.size(); i++) {
        const char* color = colors[i % (sizeof colors / sizeof colors[0])];
        std::string pts;
        for (const auto& xy : lines[i].pts) pts += strfmt("%.1f,%.1f ", X(xy.first), Y(xy.second));
        if (lines[i].pts.size() == 1) pts += strfmt("%.1f,%.1f", X(lines[i].pts[0].first) + 2, Y(lines[i].pts[0].second));
        svg += strfmt("<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"%s\"/>", color, pts.c_str());
        const double width = 26 + 7.0 * (double)lines[i].label.size();
        if (lx > L && lx + width > W - R) lx = L, ly += 14;
        svg += strfmt("<rect x=\"%.0f\" y=\"%.0f\" width=\"12\" height=\"3\" fill=\"%s\"/>"
                      "<text x=\"%.0f\" y=\"%.0f\" font-size=\"11\">%s</text>",
                      lx, ly - 4, color, lx + 16, ly, dash_escape(lines[i].label).c_str());
        lx += width;
    }
    return svg + "</svg>";
}

// The last held-out value of `key` in the rows (NaN when none).
inline double dash_last(const std::vector<MetricRow>& rows, const std::string& key) {
    for (size_t i = rows.size(); i-- > 0;)
        if (rows[i].has(key)) return rows[i].get(key);
    return NAN;
}

// The eval panel (no series of its own) as one panel per held-out set of the rows, each with the
// set's val-core/NAME/acc/ curves; any other panel as it is.
inline std::vector<DashPanel> dash_eval_panels(const DashPanel& p, const std::vector<MetricRow>& rows) {
    if (!p.series.empty()) return {p};
    std::vector<DashPanel> out;
    for (const MetricRow& r : rows)
        for (const auto& kv : r.items) {
            const size_t acc = kv.first.find("/acc/");
            if (kv.first.rfind("val-core/", 0) != 0 || acc == std::string::npos) continue;
            const std::string set = kv.first.substr(9, acc - 9);
            auto it = std::find_if(out.begin(), out.end(), [&](const DashPanel& d) { return d.title.rfind(set + ": ", 0) == 0; });
            if (it == out.end()) it = out.insert(out.end(), DashPanel{set + ": " + p.title, {}});
            if (std::none_of(it->series.begin(), it->series.end(), [&](const DashSeries& d) { return d.key == kv.first; }))
                it->series.push_back({kv.first, kv.first.substr(acc + 5)});
        }
    if (out.empty()) out.push_back(p);
    return out;
}

// The whole page: a heading, the last step's headline numbers, the panels in a grid.
inline std::string dashboard_html(const std::string& title, const std::vector<MetricRow>& rows, DashKind kind = DashKind::Rl) {
    std::string html = "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" + dash_escape(title) +
                       "</title>\n<style>body{font-family:sans-serif;margin:16px;background:#f4f4f4}"
                       ".grid{display:grid;grid-template-columns:repeat(auto-fill,520px);gap:12px}"
                       "svg{border:1px solid #ccc}</style></head><body>\n<h2>" + dash_escape(title) + "</h2>\n";
    if (!rows.empty() && kind == DashKind::Lm)
        html += strfmt("<p>%lld steps logged; last step: loss %.4f, token accuracy %.3f; last eval: held-out loss %.4f "
                       "(weights in BF16 %.4f)</p>\n",
                       (long long)rows.back().get("training/global_step") + 1, rows.back().get("train/loss"),
                       rows.back().get("train/mean_token_accuracy"), dash_last(rows, "val/loss"), dash_last(rows, "val/loss_bf16"));
    else if (!rows.empty())
        html += strfmt("<p>%lld steps logged; last step: reward %.3f, exactly correct %.3f, entropy %.3f</p>\n",
                       (long long)rows.back().get("training/global_step") + 1, rows.back().get("critic/rewards/mean"),
                       rows.back().get("critic/correct/mean"), rows.back().get("actor/entropy"));
    html += "<div class=\"grid\">\n";
    for (const DashPanel& p : dashboard_panels(kind))
        for (const DashPanel& q : dash_eval_panels(p, rows)) html += dashboard_panel_svg(q, rows) + "\n";
    return html + "</div>\n</body></html>\n";
}

inline void write_dashboard(const std::string& path, const std::string& title, const std::vector<MetricRow>& rows,
                            DashKind kind = DashKind::Rl) {
    write_file_atomic(path, dashboard_html(title, rows, kind));
}

}  // namespace fp8rl
