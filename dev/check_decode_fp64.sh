#!/bin/sh
# check_decode_fp64.sh [REV]: dev/check_decode_fp64.cpp's distances of the CPU decode attention from
# FP64, for this tree and for REV's (default: the commit before issue 47's tensor-core decode), so the
# rounding points issue 47 moved can be seen to leave the oracle no further from FP64.
set -e
cd "$(dirname "$0")/.."
rev=${1:-$(git log --format=%H -1 --grep='decode attention on tensor cores')^}
old=$(mktemp -d)
trap 'rm -rf "$old"' EXIT
git archive "$rev" cpu rl | tar -x -C "$old"
flags="-std=c++17 -O2 -ffp-contract=off -fopenmp"
g++ $flags -I. -o "$old/after" dev/check_decode_fp64.cpp
g++ $flags -I"$old" -I. -DFP8RL_DECODE_BEFORE_I47 -o "$old/before" dev/check_decode_fp64.cpp
echo "before ($(git rev-parse --short "$rev")):"; OMP_NUM_THREADS=1 "$old/before"
echo "after (this tree):"; OMP_NUM_THREADS=1 "$old/after"
