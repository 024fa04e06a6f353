#!/usr/bin/env bash
# Renders a run's dashboard.html with headless Chromium to a PNG, to see it as a browser shows it.
#   apt-get install chromium && dev/render_dashboard.sh RUN_DIR [OUT.png]   (default RUN_DIR/dashboard.png)
set -euo pipefail
run=${1:?usage: dev/render_dashboard.sh RUN_DIR [OUT.png]}
out=${2:-$run/dashboard.png}
html=$(realpath "$run/dashboard.html")
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
[ -n "$browser" ] || { echo "render_dashboard: chromium not found (apt-get install chromium)" >&2; exit 1; }
# 2 columns of 520 px panels, 5 rows of 260 px, plus the heading
"$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1100,1560 \
  --screenshot="$(realpath -m "$out")" "file://$html" 2>/dev/null
echo "wrote $out"
