#!/usr/bin/env bash
# summarize_runs.sh LOGS RC: the closing lines of make test (RC: the exit status of its runs). Each test binary run by make test ends its
# log (LOGS/RUN.log) with "N passed, N failed[, N skipped]"; this prints each run's totals and their
# sum as the last line, so the whole of make test closes with one such line.
set -euo pipefail
logs=${1:?usage: test/summarize_runs.sh LOGS_DIR RC}
rc=${2:?usage: test/summarize_runs.sh LOGS_DIR RC}
passed=0 failed=0 skipped=0 runs=0
echo "== make test: the runs' closing lines"
for log in "$logs"/*.log; do
    [ -e "$log" ] || continue
    while read -r p f s; do
        printf '  %-22s %s passed, %s failed, %s skipped\n' "$(basename "$log" .log)" "$p" "$f" "$s"
        passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s)) runs=$((runs + 1))
    done < <(sed -nE 's/^([0-9]+) passed, ([0-9]+) failed(, ([0-9]+) skipped)?$/\1 \2 \4/p' "$log" | awk '{print $1, $2, ($3 == "" ? 0 : $3)}')
done
echo "  ($runs test binary runs; the fuzz runs and the CUDA compile check print their own lines above)"
# a run that crashed, or a compile check or fuzz run that failed, prints no failed test: count it
if [ "$rc" != 0 ] && [ "$failed" = 0 ]; then
    echo "  a run failed before its closing line or outside a test binary (exit $rc): see its output above"
    failed=1
fi
echo "$passed passed, $failed failed, $skipped skipped"
