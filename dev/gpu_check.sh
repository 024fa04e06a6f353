#!/usr/bin/env bash
# dev/gpu_check.sh: settles, in order, whether fp8rl's GPU code is right on this machine's GPU
# (Hopper, sm_90) and how fast it is, in under 8 minutes on an H200 from a prebuilt bundle. Part 0
# first: without a usable GPU the script stops there, in seconds, with one line and exit 3. Then each
# part runs under its own time limit, even when an earlier one failed; the summary (PASS/FAIL,
# seconds, the key figure) and every benchmark table go to one file, runs/gpu_check/summary.md
# (GPU_CHECK_OUT to change it).
#
# Expected seconds on one H200 (16 cores), from the work each part does (H200.md: ~990 TFLOP/s dense
# BF16 by the datasheet, 4.8 TB/s), and the limits: parts 0 and 2-5 add up to 375 s, which leaves
# 105 s of the 8 minutes for the machine's start-up and the transfers; part 1 (the build) adds 130 s,
# which is why a lent GPU runs --prebuilt. No GPU was lent to re-measure them: they were re-estimated
# from the work counts below, part 2 now one process instead of five (one CUDA context and cuBLASLt
# load, ~1-2 s each, instead of five), part 5e's checkpoint possibly on disk (8 GB at >= 1 GB/s).
#   part                                                          expected  limit
#   0 the device: nvidia-smi, build/gpu_probe (a trivial kernel,        5      15
#     compute capability 9.x, cuBLASLt >= 12.9), free disk and /dev/shm, NCCL found or not
#   1 build train_rl, train_rl_cpu, test_gpu, the benchmarks         100     130
#     (make -j16 WERROR=0, one object per test file: the longest nvcc units, the engine's, set it;
#     --prebuilt: none, the binaries come from make gpu-bundle's build/gpu-bundle)
#   2 the PTX wrappers and the emulator's assumptions on the device    5      20
#     (mma fragment layouts, ldmatrix, shuffles, votes, atomics, shared memory, graphs, launch limits,
#     the FP8 encoder over all 2^32 floats, the hardware's E4M3 -> BF16 conversion of all 256 codes,
#     decode attention's plan replayed in a graph, cuBLASLt's VEC128/BLK128x128 scale layouts against
#     the CPU emulation and a wrong layout caught): the likeliest to find what emulation cannot
#   3 ./test_gpu: every kernel against the CPU engine                  40      75
#     (GPU time is small; the CPU references of the engine tests dominate)
#   4 the engine against train_rl_cpu on a tiny fixture model          10      30
#     (dev/check_engine.sh: log-probs, one step's gradients, greedy generation)
#   5 benchmarks, each a ratio against a baseline run in the same invocation; each also writes, per
#     kernel it times, the measured time, cuda/perf's prediction and their ratio to
#     $out/calibration/BENCH.tsv (FP8RL_CALIBRATION_DIR), and the summary ends with
#     `perf_model --calibrate $out`: the model's constants those measurements contradict
#     (cuda/perf/calibrate.h; nothing is refitted):
#     GEMM: FP8 (cuBLASLt, fp8rl's own) vs BF16 on Qwen3-0.6B/1.7B/8B   20      40
#       linear shapes at 4k, 16k
#       (2mnk summed over the shapes ~8.1 TFLOP per GEMM kind with 1.7B's fused QKV and gate|up,
#       x 3 GEMMs x 53 calls x 3 kinds: ~5 s of GEMMs at 600-1,000 TFLOP/s, plus plans, quantizers,
#       random fills)
#     attention fwd/bwd vs cuBLASLt GEMM + softmax, 4k-16k tokens        10      25
#       (causal FLOPs 1.4 TFLOP forward, 3.6 backward over the three lengths x 13 calls; the baseline
#       moves ~40 GB (forward) and ~100 GB (backward) of N x N scores at 16k: ~0.5 s; the host compares)
#     training step bf16 vs fp8, Qwen3-0.6B and 1.7B, 16 x 1,024 tokens 40      65
#       (6 x params x tokens: 0.06 and 0.2 PFLOP a step, 4 steps per precision; writing the 1.7B
#       model (4 GB) and loading it twice dominate; memory: the engine's device high-water mark
#       (DeviceArray's count) beside cudaMemGetInfo's used bytes after the steps and the memory plan;
#       then the quantizer calls of an fp8 step before issue 28, each shape timed alone: about 18
#       shapes x 53 calls of 0.03-0.7 ms, under 1 s; each figure beside cuda/perf/perf_model.h's)
#     rollout bf16/bf16, fp8/bf16, fp8/fp8, 256 x 1,024 target           25      35
#       (its own 10 s budget per model plus warm-ups; tokens/s, the engine's peak device bytes, and the
#       fractions in sampling and in decode attention, estimated after each run from those kernels
#       timed alone at its shapes; then decode attention's plan, split and combine kernels each
#       timed alone at 512 rows x 1,024 keys, bytes/s beside HBM and the model; see
#       test/gpu/bench_rollout.cu)
#     RL step bf16/bf16/bf16 vs fp8/fp8/fp8 + Calibrated Clipping        35      55
#       (Qwen3-0.6B, 16 sequences x 32 new tokens, 2 steps, twice: dev/bench_rl_step.sh, on the
#       model the training-step benchmark wrote; loading the model twice per run (the host copy
#       generates) and the final checkpoint (8 GB of FP32 state) dominate: to /dev/shm where it has
#       10 GB free, else to disk (+8 s at 1 GB/s; part 0 found the room first))
# The random models are written by the project's own code (test/gpu/bench_model.h, under
# build/bench_models/: ~6 GB of disk) with the real Qwen3 tokenizer of test/fixtures; no downloads,
# no Python.
#
# Usage: dev/gpu_check.sh             on a GPU machine (nvcc, cuBLASLt; NCCL and MPI when found):
#                                     builds first (make WERROR=0: its host compiler may warn of more)
#        dev/gpu_check.sh --prebuilt  on a GPU machine, from build/gpu-bundle (make gpu-bundle, run
#                                     where the sources are; the bundle travels with the tree): no
#                                     build; a bundle of other sources or another commit is refused
#        dev/gpu_check.sh --emu       the same parts on the emulated GPU at tiny shapes (make
#                                     test-bench-emu), limits x4: a broken part fails in CI, not on the
#                                     GPU; part 3 is make test-gpu-emu's, so it is not repeated here
set -u -o pipefail
cd "$(dirname "$0")/.."

mode=build
case "${1:-}" in
    --emu) mode=emu ;;
    --prebuilt) mode=prebuilt ;;
    "") ;;
    *) echo "dev/gpu_check.sh: unknown argument '$1' (use --emu, --prebuilt or nothing)"; exit 2 ;;
esac
emu=0
[ "$mode" = emu ] && emu=1
bundle=build/gpu-bundle
# the tests part 2 runs on the device, by name (the runner fails on a filter that matches no test)
device_tests=(mma_ wgmma_ emu_ gpu_fp8_device_encoder gpu_fp8_gemms_match_cpu_emulation_at_each_granularity
    gpu_fp8_wrong_scale_layout ldmatrix_fragments_equal_the_plain_fragment_loads kv_decode_converts_every_e4m3_code_exactly
    kv_decode_attention_replays_in_a_graph)
benches=(fp8_gemm attention train_step rollout)
cpu_bin=./train_rl_cpu
rl_step_room_gb=10  # part 5e's checkpoint, 8 GB of FP32 state, and a margin
if [ "$emu" -eq 1 ]; then
    out=${GPU_CHECK_OUT:-build/gpu_check_emu}
    gpu_bin=./train_rl_emu test_bin=./build/test_gpu_emu bench_prefix=./build/emu_bench_ size=--tiny
    build_targets=(train_rl_emu train_rl_cpu build/test_gpu_emu build/perf_model "${benches[@]/#/build/emu_bench_}")
    perf_model=build/perf_model
    rl_step=(1 --init tiny --max_new_tokens 3 --group_size 4 --batch_prompts 4)
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
    limit_scale=4  # the emulation runs the tiny shapes on 2 cores, not the GPU's sizes on a GPU
    rl_step_room_gb=1
elif [ "$mode" = prebuilt ]; then
    out=${GPU_CHECK_OUT:-runs/gpu_check}
    gpu_bin=$bundle/train_rl test_bin=$bundle/test_gpu bench_prefix=$bundle/gpu_bench_ size= cpu_bin=$bundle/train_rl_cpu
    perf_model=$bundle/perf_model
    rl_step=(2 --model build/bench_models/Qwen3-0.6B --max_new_tokens 32 --group_size 4 --batch_prompts 4)
    limit_scale=1
else
    out=${GPU_CHECK_OUT:-runs/gpu_check}
    gpu_bin=./train_rl test_bin=./test_gpu bench_prefix=./build/gpu_bench_ size=
    build_targets=(train_rl train_rl_cpu test_gpu build/perf_model "${benches[@]/#/build/gpu_bench_}")
    perf_model=build/perf_model
    export PATH=$PATH:/usr/local/cuda/bin
    rl_step=(2 --model build/bench_models/Qwen3-0.6B --max_new_tokens 32 --group_size 4 --batch_prompts 4)
    limit_scale=1
fi
# Part 0: one line and exit 3 where the check cannot run, before anything is built or written.
stop() {
    echo "dev/gpu_check.sh: part 0: $*"
    exit 3
}
free_gb() { df -Pk "$1" 2>/dev/null | awk 'NR == 2 { printf "%d", $4 / 1048576 }'; }
part0=""
if [ "$mode" = prebuilt ]; then
    [ -f "$bundle/STAMP" ] || stop "no bundle at $bundle (make gpu-bundle, where the sources are, then carry $bundle)"
    built_commit=$(sed -n 's/^commit //p' "$bundle/STAMP") here_commit=$(dev/gpu_bundle_stamp.sh --commit)
    [ "$here_commit" = unknown ] || [ "$built_commit" = "$here_commit" ] ||
        stop "$bundle was built from commit $built_commit, this tree is $here_commit: make gpu-bundle again"
    [ "$(sed -n 's/^sources //p' "$bundle/STAMP")" = "$(dev/gpu_bundle_stamp.sh --sources)" ] ||
        stop "$bundle was built from other sources than this tree's (commit $built_commit): make gpu-bundle again"
    missing=$(ldd "$bundle"/* 2>/dev/null | grep 'not found' | sort -u | tr -s ' \t' ' ' | paste -sd, -)
    [ -z "$missing" ] || stop "the bundle's binaries need libraries this machine lacks:$missing"
    part0="bundle of commit $built_commit; "
fi
if [ "$emu" -eq 0 ]; then
    command -v nvidia-smi > /dev/null || stop "no usable GPU: nvidia-smi not found (no NVIDIA driver)"
    smi=$(timeout 15 nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -n 1) ||
        stop "no usable GPU: nvidia-smi failed: $smi"
    if [ "$mode" = prebuilt ]; then
        probe=$bundle/gpu_probe
    else
        probe=build/gpu_probe
        made=$(make -s WERROR=0 "$probe" 2>&1) || stop "build/gpu_probe did not build: $(tail -n 1 <<< "$made")"
    fi
    probed=$(timeout 30 "$probe" 2>&1) || stop "${probed:-$probe timed out}"
    disk=$(free_gb .) shm=$(free_gb /dev/shm)
    [ "${disk:-0}" -ge 8 ] || stop "${disk:-0} GB free on disk here; the benchmark models need 6 GB (build/bench_models)"
    if [ "${shm:-0}" -ge "$rl_step_room_gb" ]; then
        export BENCH_RL_STEP_DIR=/dev/shm
    elif [ "${disk:-0}" -ge $((6 + rl_step_room_gb)) ]; then
        export BENCH_RL_STEP_DIR=$PWD/build
    else
        stop "no room for part 5e's 8 GB checkpoint: /dev/shm ${shm:-0} GB free, disk ${disk:-0} GB (6 of them for the models)"
    fi
    nccl=$( (ldconfig -p 2>/dev/null | grep -q libnccl.so) && echo "NCCL found" || echo "NCCL not found")
    part0+="$smi; $probed; disk ${disk} GB free, /dev/shm ${shm:-0} GB free (part 5e writes to $BENCH_RL_STEP_DIR); $nccl (the check runs one process)"
    echo "=== part 0: $part0"
fi
rm -rf "$out/logs" "$out/calibration"
mkdir -p "$out/logs"
export FP8RL_CALIBRATION_DIR=$out/calibration
summary_file=$out/summary.md
rows=()
tables=()
total_limit=0

part() {  # part ID NAME LIMIT_SECONDS EXPECTED_SECONDS COMMAND...
    local number=$1 name=$2 limit=$(($3 * limit_scale)) expected=$4
    shift 4
    total_limit=$((total_limit + limit))
    local log
    log=$out/logs/$number-$(tr -cs 'A-Za-z0-9' '-' <<< "$name" | cut -c1-40 | sed 's/-$//').log
    echo
    echo "=== part $number: $name: $* (limit ${limit}s, expected ${expected}s)"
    local t0=$SECONDS rc
    timeout "$limit" "$@" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    local secs=$((SECONDS - t0)) last verdict
    last=$(grep -v '^[[:space:]]*$' "$log" | tail -n 1 | cut -c1-300)
    local skipped
    skipped=$(grep -c '^SKIP ' "$log")
    if [ "$rc" -eq 0 ] && grep -q ': SKIPPED: ' "$log"; then
        verdict=SKIP  # a benchmark that found no usable GPU
    elif [ "$rc" -eq 0 ]; then
        verdict=PASS
        [ "$skipped" -gt 0 ] && verdict="PASS ($skipped tests skipped)"
    elif [ "$rc" -eq 124 ]; then
        verdict=FAIL last="timed out after ${limit}s; last line: $last"
    else
        verdict=FAIL last="exit status $rc: $last"
    fi
    rows+=("| $number | $verdict | $name | $secs | $expected | $limit | ${last//|/\\|} |")
    [[ $name == benchmark* ]] && tables+=("$number. $name|$log")
}

machine=$( (nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1 ||
    echo "nvidia-smi failed") | head -n 4)
[ "$emu" -eq 1 ] && machine="emulated GPU (cuda/emu/emu.h) on $(nproc) CPU cores: times are not GPU figures"
echo "=== machine: $machine; nvcc: $(command -v nvcc >/dev/null && nvcc --version | tail -n 1 || echo none); cores: $(nproc)"

if [ "$emu" -eq 0 ]; then
    rows+=("| 0 | PASS | the device | | 5 | 15 | ${part0//|/\\|} |")
    total_limit=15
fi
if [ "$mode" = prebuilt ]; then
    rows+=("| 1 | SKIP | build | | | | prebuilt: $(sed -n 's/^built //p' "$bundle/STAMP") |")
else
    werror=$([ "$emu" -eq 0 ] && echo WERROR=0)  # a new warning of the device's host compiler must not stop the check
    part 1 "build" 130 100 bash -c "make -j$(nproc) $werror ${build_targets[*]} && echo built ${build_targets[*]}"
fi
part 2 "PTX wrappers and emulator assumptions on the device" 20 5 bash -c "$test_bin ${device_tests[*]} && \
    echo 'passed: mma and ldmatrix layouts, emulator assumptions, FP8 encoder, E4M3 decode, decode attention in a graph, cuBLASLt scale layouts'"
if [ "$emu" -eq 0 ]; then
    part 3 "test_gpu: every kernel against the CPU engine" 75 40 "$test_bin"
else
    rows+=("| 3 | SKIP | test_gpu: every kernel against the CPU engine | | | | make test-gpu-emu runs build/test_gpu_emu |")
fi
part 4 "engine against train_rl_cpu (tiny fixture model)" 30 10 dev/check_engine.sh "$gpu_bin" "$test_bin" "$cpu_bin"
part 5a "benchmark: FP8 block-scaled (cuBLASLt, own) vs BF16 GEMMs" 40 20 "${bench_prefix}fp8_gemm" $size
part 5b "benchmark: attention vs cuBLASLt GEMM + softmax" 25 10 "${bench_prefix}attention" $size
part 5c "benchmark: training step bf16 vs fp8, tokens/s and peak memory" 65 40 "${bench_prefix}train_step" $size
part 5d "benchmark: rollout tokens/s, sampling and attention shares" 35 25 "${bench_prefix}rollout" $size
part 5e "benchmark: RL step bf16 vs fp8 + Calibrated Clipping" 55 35 dev/bench_rl_step.sh "$gpu_bin" "${rl_step[@]}"
# the benchmarks' measured / predicted lines against the model's constants (reported, never refitted)
calibration=$( ("$perf_model" --calibrate "$out" 2>&1 || true) | tee "$out/logs/calibration.log")

{
    echo "# dev/gpu_check.sh $([ "$mode" = build ] || echo "--$mode")"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown); machine: $machine;" \
        "$(nproc) cores; limits add up to ${total_limit}s, the run took ${SECONDS}s"
    echo
    echo "| part | verdict | what | seconds | expected | limit | key figure (last line) |"
    echo "|---|---|---|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
    for table in "${tables[@]}"; do
        echo
        echo "## ${table%%|*}"
        echo
        cat "${table#*|}"
    done
    echo
    echo "## the model's constants against the measurements (build/perf_model --calibrate $out)"
    echo
    echo "$calibration"
} > "$summary_file"
echo
echo "=== summary (also in $summary_file)"
printf '%s\n' "${rows[@]}"
! grep -q '^| [0-9a-z]* | FAIL' <(printf '%s\n' "${rows[@]}")  # SKIP and PASS pass; the table shows which
