#!/usr/bin/env bash
# dev/gpu_check.sh: builds and runs every GPU check of fp8rl on a machine with an NVIDIA GPU
# (Hopper, sm_90, for the FP8 block-scaled GEMMs) and ends with a summary. Each part runs even when
# an earlier one failed, under its own time limit; the limits add up to under 8 minutes.
#   part 1: build ./test_gpu and the GPU benchmarks (nvcc, cuBLASLt)
#   part 2: ./test_gpu emu_  - what the CUDA emulation assumes, on the hardware: shuffles of every
#           variant and width, votes, atomics, dynamic shared memory, graphs, launch limits (seconds;
#           the likeliest to find what emulation cannot)
#   part 3: ./test_gpu  - every GPU test, as in emulation: device FP8 encoder vs CUDA over all 2^32
#           inputs; quantize kernels vs the CPU quantizers bit for bit; cuBLASLt fprop/dgrad/wgrad vs
#           the CPU emulation; a wrong scale layout must fail; BF16 GEMM vs CPU; sampling, token loss
#   part 4: FP8 block-scaled vs BF16 GEMM TFLOP/s over Qwen3-0.6B / Qwen3-8B linear shapes
# Usage: dev/gpu_check.sh   (from anywhere; it works in the repository root)
set -u -o pipefail
cd "$(dirname "$0")/.."

summary=()
part() {  # part NAME LIMIT_SECONDS COMMAND...
    local name=$1 limit=$2
    shift 2
    echo
    echo "=== $name: $* (limit ${limit}s)"
    local t0=$SECONDS rc log
    log=$(mktemp)
    timeout "$limit" "$@" 2>&1 | tee "$log"
    rc=$?
    local secs=$((SECONDS - t0)) last
    last=$(tail -n 1 "$log")
    rm -f "$log"
    if [ "$rc" -eq 0 ]; then
        summary+=("PASS  $name (${secs}s): $last")
    elif [ "$rc" -eq 124 ]; then
        summary+=("FAIL  $name: timed out after ${limit}s")
    else
        summary+=("FAIL  $name: exit status $rc (${secs}s): $last")
    fi
}

echo "=== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1 || echo "nvidia-smi failed"
command -v nvcc >/dev/null && nvcc --version | tail -n 2
echo "cores: $(nproc)"

part "build test_gpu and GPU benchmarks" 200 make -j"$(nproc)" test_gpu build/gpu_bench_fp8_gemm
part "emulator assumptions on the device" 30 ./test_gpu emu_
part "test_gpu" 120 ./test_gpu
part "benchmark: FP8 block-scaled vs BF16 GEMMs" 150 ./build/gpu_bench_fp8_gemm

echo
echo "=== summary"
printf '%s\n' "${summary[@]}"
