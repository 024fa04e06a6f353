// Tests of rl/io/dashboard.h: the page is self-contained (no script, nothing fetched), has every
// panel, draws a line per series present, says so where a panel has no data, and escapes names.
// (How it looks in a browser: dev/render_dashboard.sh renders it with headless Chromium.)
#include <cmath>
#include <string>
#include <vector>

#include "rl/io/dashboard.h"
#include "test/harness.h"

using namespace fp8rl;

static size_t count_of(const std::string& s, const std::string& what) {
    size_t n = 0;
    for (size_t pos = s.find(what); pos != std::string::npos; pos = s.find(what, pos + 1)) n++;
    return n;
}

TEST(dashboard_is_self_contained_with_every_panel) {
    std::vector<MetricRow> rows;
    for (int s = 0; s < 30; s++) {
        MetricRow m;
        m.set("training/global_step", s);
        m.set("critic/rewards/mean", 0.03 * s);
        m.set("actor/entropy", 2.0 - 0.05 * s);
        m.set("rollout_corr/logprob_abs_diff", 1e-3 * (1 + s % 3));
        if (s % 10 == 9) m.set("val-core/add/acc/greedy", 0.1 * s / 3);
        rows.push_back(m);
    }
    std::string html = dashboard_html("run <a&b>", rows);
    CHECK_EQ(count_of(html, "<svg"), dashboard_panels().size());
    CHECK_EQ(count_of(html, "<script"), (size_t)0);
    CHECK_EQ(count_of(html, "http"), count_of(html, "xmlns=\"http://www.w3.org/2000/svg\""));  // nothing fetched
    CHECK(html.find("run &lt;a&amp;b&gt;") != std::string::npos);
    for (const DashPanel& p : dashboard_panels()) CHECK_MSG(html.find(p.title) != std::string::npos, "panel %s", p.title.c_str());
    // reward, entropy, mismatch and the eval's greedy series have data: one polyline each
    CHECK_EQ(count_of(html, "<polyline"), (size_t)4);
    CHECK(html.find(">greedy<") != std::string::npos);
    CHECK(html.find("no data in this run") != std::string::npos);  // e.g. the clip bounds
}

TEST(dashboard_ticks_are_round_numbers) {
    std::vector<double> unit = dash_ticks(0, 1);
    CHECK_EQ(unit.size(), (size_t)6);
    for (size_t i = 0; i < unit.size(); i++) CHECK_NEAR(unit[i], 0.2 * (double)i, 0, 1e-12);
    std::vector<double> t = dash_ticks(1, 1200);
    CHECK(t == std::vector<double>({200, 400, 600, 800, 1000, 1200}));
}

// An SFT/CPT run's page (DashKind::Lm): its own panels and none of RL's; train/loss, val/loss and
// val/loss_bf16 in the loss panel, the step-0 eval (val/ metrics only) drawn at step 0 and a step's
// row at the step it ends; every panel has data; the headline has the last eval.
TEST(dashboard_of_sft_and_cpt_runs) {
    std::vector<MetricRow> rows;
    MetricRow start;
    start.set("training/global_step", 0);
    start.set("val/loss", 5.5);
    start.set("val/loss_bf16", 5.5);
    rows.push_back(start);
    for (int s = 0; s < 20; s++) {
        MetricRow m;
        m.set("training/global_step", s);
        m.set("train/loss", 5.0 - 0.2 * s);
        m.set("train/ppl", std::exp(5.0 - 0.2 * s));
        m.set("train/mean_token_accuracy", 0.04 * s);
        m.set("perf/tokens_per_s", 2000 + s);
        m.set("actor/lr", 1e-3);
        m.set("actor/grad_norm", 1.0 / (1 + s));
        if (s % 10 == 9) m.set("val/loss", 4.0 - 0.1 * s), m.set("val/loss_bf16", 3.9 - 0.1 * s);
        rows.push_back(m);
    }
    const std::string html = dashboard_html("sft", rows, DashKind::Lm);
    const std::vector<DashPanel> panels = dashboard_panels(DashKind::Lm);
    CHECK_EQ(count_of(html, "<svg"), panels.size());
    for (const DashPanel& p : panels) CHECK_MSG(html.find(p.title) != std::string::npos, "panel %s", p.title.c_str());
    for (const DashPanel& p : dashboard_panels(DashKind::Rl)) CHECK_MSG(html.find(p.title) == std::string::npos || p.title == "grad norm",
                                                                       "RL panel %s on an SFT page", p.title.c_str());
    for (const char* key : {"train/loss", "train/ppl", "train/mean_token_accuracy", "val/loss", "val/loss_bf16", "perf/tokens_per_s"})
        CHECK_MSG(dashboard_reads(key), "the logger drops %s", key);
    CHECK_EQ(count_of(html, "<polyline"), (size_t)8);  // 3 loss lines, then one a panel
    CHECK_EQ(count_of(html, "no data in this run"), (size_t)0);
    CHECK(html.find("held-out loss 2.1000 (weights in BF16 2.0000)") != std::string::npos);
    // the loss panel's x axis starts at the step-0 eval: a tick labelled 0
    const std::string loss = dashboard_panel_svg(panels[0], rows);
    CHECK(loss.find("text-anchor=\"middle\">0<") != std::string::npos);
    CHECK(dashboard_panel_svg(panels[1], rows).find("text-anchor=\"middle\">0<") == std::string::npos);  // train/ppl: steps 1..20
}
