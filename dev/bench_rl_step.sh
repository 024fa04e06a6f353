#!/usr/bin/env bash
# dev/bench_rl_step.sh: whole RL steps of the GPU binary (rollout + old log-probs + update), bf16
# rollout / bf16 training / bf16 KV cache against fp8 / fp8 / fp8 with Calibrated Clipping (every
# step, --cc_interval 1, so its shadow pass shows in each step's time), on the add task, through the
# binary itself: the seconds per phase are the trainer's own (log.jsonl's timing_s/*, perf/*; the
# last step's row, the first one warming up). So it measures whatever generate() runs: today the CPU
# model on the host (cuda/engine/engine_gpu.cuh), rollout.cu once merged.
# Usage: dev/bench_rl_step.sh BIN STEPS FLAGS...   (FLAGS: the model and sizes, e.g. --model DIR
# --batch_prompts 4 --group_size 4 --max_new_tokens 32); prints a Markdown table and one summary line.
set -u -o pipefail
bin=$1 steps=$2
shift 2
# the final checkpoint is the FP32 state (8 GB for Qwen3-0.6B): BENCH_RL_STEP_DIR, where dev/gpu_check.sh's
# part 0 found room for it (/dev/shm when it has, else the disk), else /dev/shm if it has 10 GB free, else $TMPDIR
room=${BENCH_RL_STEP_DIR:-}
if [ -z "$room" ]; then
    shm_free_kb=$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 { print $4 }')
    [ "${shm_free_kb:-0}" -ge $((10 * 1048576)) ] && room=/dev/shm || room=${TMPDIR:-/tmp}
fi
work=$(mktemp -d -p "$room") || { echo "bench_rl_step: cannot make a folder under $room"; exit 1; }
trap 'rm -rf "$work"' EXIT

# value KEY ROW: a number of a log.jsonl row (0 when absent)
value() { sed -n "s|.*\"$1\":\([-0-9.e+]*\).*|\1|p" <<< "$2" | grep . || echo 0; }

echo "bench_rl_step: $bin, $steps step(s), the last one's phases, the checkpoint under $room; flags: $*"
echo
echo "| rollout / train / KV | clip | gen s | gen tokens/s | old log-probs s | update s | train tokens/s | calibration s | step s | speedup |"
echo "|---|---|---|---|---|---|---|---|---|---|"
failed=0 bf16_step=""
for config in bf16 fp8; do
    if [ "$config" = bf16 ]; then clip=(--calibrated_clip 0); else clip=(--calibrated_clip 1 --cc_interval 1); fi
    if ! "$bin" "$@" --task add --task_size 1 --eval_every 0 --steps "$steps" --seed 1 --rollout_precision "$config" \
        --train_precision "$config" --kv_cache "$config" "${clip[@]}" --out_dir "$work/$config" > "$work/$config.out" 2>&1; then
        echo "| $config | ERROR: $(tail -n 1 "$work/$config.out") |"
        failed=1
        continue
    fi
    row=$(tail -n 1 "$work/$config/log.jsonl")
    rm -rf "${work:?}/$config"
    step=$(value timing_s/step "$row")
    [ "$config" = bf16 ] && bf16_step=$step
    speedup=$(awk -v a="${bf16_step:-0}" -v b="$step" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
    printf "| %s / %s / %s | %s | %.3f | %.0f | %.3f | %.3f | %.0f | %.3f | %.3f | %s |\n" "$config" "$config" "$config" \
        "$([ "$config" = fp8 ] && echo "Calibrated Clipping" || echo "fixed")" "$(value timing_s/gen "$row")" \
        "$(value perf/gen_tokens_per_s "$row")" "$(value timing_s/old_log_prob "$row")" "$(value timing_s/update_actor "$row")" \
        "$(value perf/train_tokens_per_s "$row")" "$(value timing_s/calib "$row")" "$step" "$speedup"
done
echo
[ "$failed" -eq 0 ] && echo "bench_rl_step: bf16 step ${bf16_step}s, fp8 step ${step}s" || echo "bench_rl_step: a configuration failed"
exit "$failed"
