#!/usr/bin/env bash
# dev/gpu_bundle_stamp.sh: what a GPU bundle (make gpu-bundle) was built from, for its STAMP file:
#   commit   git rev-parse HEAD, "-dirty" when tracked files differ from it ("unknown" without git)
#   sources  one SHA-256 over every file the binaries compile from (path and content, in path order),
#            computable without git, so a GPU machine that got the tree without its .git can still
#            tell a bundle of other sources
#   built    when, and with which compilers and host flags (for the reader)
# Usage: dev/gpu_bundle_stamp.sh            the whole stamp (make gpu-bundle writes it)
#        dev/gpu_bundle_stamp.sh --commit   the commit line's value alone
#        dev/gpu_bundle_stamp.sh --sources  the sources line's value alone (dev/gpu_check.sh --prebuilt)
set -u -o pipefail
cd "$(dirname "$0")/.."

commit() {
    local head
    head=$(git rev-parse HEAD 2>/dev/null) || { echo unknown; return; }
    git diff --quiet HEAD -- 2>/dev/null && echo "$head" || echo "$head-dirty"
}

sources() {
    { find . -maxdepth 1 -type f \( -name '*.cu' -o -name '*.cuh' -o -name '*.h' -o -name '*.cpp' -o -name Makefile \)
      find cpu cuda rl test -type f \( -name '*.cu' -o -name '*.cuh' -o -name '*.h' -o -name '*.cpp' -o -name '*.ld' \)
      echo dev/perf_model.cpp
    } | LC_ALL=C sort | while read -r f; do printf '%s\n' "$f"; cat "$f"; done | sha256sum | cut -d' ' -f1
}

case "${1:-}" in
    --commit) commit ;;
    --sources) sources ;;
    *)
        echo "commit $(commit)"
        echo "sources $(sources)"
        echo "built $(date -u '+%Y-%m-%d %H:%M UTC') with $(g++ --version | head -n 1), $(nvcc --version 2>/dev/null | tail -n 1);" \
             "host code -O3 -march=x86-64-v3, device code sm_90, no MPI or NCCL"
        ;;
esac
