#!/usr/bin/env bash
# dev/sass_counts.sh: regenerates cuda/perf/sass_counts.h, the instruction counts per kernel that
# cuda/perf/kernel_perf_model.h prices, from the sm_90 SASS of ./train_rl (needs nvcc; no GPU). Run it
# after any kernel changes, then `make build/perf_model && build/perf_model --json` (docs/perf-model.md).
# cuobjdump comes from the nvidia-cuda-cuobjdump wheel, fetched into /tmp/nvwheels when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
make -j1 train_rl >/dev/null
if [ -z "${CUOBJDUMP:-}" ] && ! ls /tmp/nvwheels/nvidia_cuda_cuobjdump-*.whl >/dev/null 2>&1 && ! command -v cuobjdump >/dev/null; then
    pip download --no-deps -d /tmp/nvwheels nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm >/dev/null
fi
python3 dev/sass_counts.py --binary train_rl --out cuda/perf/sass_counts.h
