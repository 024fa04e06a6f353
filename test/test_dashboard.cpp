// Tests of rl/io/dashboard.h: the page is self-contained (no script, nothing fetched), has every
// panel, draws a line per series present, says so where a panel has no data, and escapes names.
// (How it looks in a browser: dev/render_dashboard.sh renders it with headless Chromium.)
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
