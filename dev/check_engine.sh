#!/usr/bin/env bash
# dev/check_engine.sh: the GPU binary against the CPU binary (the oracle) on a tiny fixture model,
# through their command lines: part 4 of dev/gpu_check.sh, and in make test-bench-emu with
# ./train_rl_emu, so a broken check fails in CI first.
#   log-probs    --logprobs on random id sequences in bf16 and fp8: RMS of (GPU - CPU same precision)
#                at most 0.1 x the RMS of (CPU same precision - CPU fp32), log-probs and entropies
#                (test/gpu/test_engine.cu's bound: the CPU engine rounds where the kernels round, so
#                only FP32 rounding may part them; in emulation they agree bit for bit);
#   gradients    one backward of the engine against the CPU engine, tensor by tensor
#                (TEST_BIN's gpu_engine_matches_cpu_engine_qwen3: test/gpu/test_engine.cu);
#   greedy       --prompts at temperature 0, 16 new tokens: the fraction of completions equal to the
#                CPU's; only a near tie decided by FP32 rounding may flip an argmax (test/gpu/
#                test_rollout.cu checks the margin of each), so it passes at >= 3/4 (in emulation
#                all are equal). Each binary generates on its own engine (rl/driver/cli.h's --prompts:
#                rollout.cu on the GPU, cpu/generate.h on the CPU).
# Usage: dev/check_engine.sh GPU_BIN TEST_BIN [CPU_BIN]   (from the repository root; prints one
# summary line last)
set -u -o pipefail
gpu=$1 test_bin=$2 cpu=${3:-./train_rl_cpu}
threads=(--threads 2)  # the fixture model is tiny: more threads only wait on each other
model=test/fixtures/models/qwen3_tiny
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
vocab=$(sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' "$model/config.json")

# 8 random id sequences of 5..68 tokens (fixed seed), as JSONL
awk -v V="$vocab" 'BEGIN { srand(7); for (s = 0; s < 8; s++) { n = 5 + int(rand() * 64); line = "{\"ids\":[";
    for (i = 0; i < n; i++) line = line (i ? "," : "") int(rand() * V); print line "]}" } }' > "$work/ids.jsonl"

failed=0
"$cpu" "${threads[@]}" --model "$model" --logprobs "$work/ids.jsonl" --precision fp32 --output "$work/cpu_fp32.jsonl" || failed=1
summary="log-prob RMS gpu-cpu:"
for p in bf16 fp8; do
    "$cpu" "${threads[@]}" --model "$model" --logprobs "$work/ids.jsonl" --precision "$p" --output "$work/cpu_$p.jsonl" || failed=1
    "$gpu" "${threads[@]}" --model "$model" --logprobs "$work/ids.jsonl" --precision "$p" --output "$work/gpu_$p.jsonl" || failed=1
    # per key: rms(gpu - cpu), rms(gpu - fp32), rms(cpu - fp32); "ok" when the first is <= 0.1x the last
    line=$(paste -d'|' "$work/gpu_$p.jsonl" "$work/cpu_$p.jsonl" "$work/cpu_fp32.jsonl" | awk -F'|' '
        function vals(s, key, out) {
            match(s, "\"" key "\":\\[[^]]*\\]")
            return split(substr(s, RSTART + length(key) + 4, RLENGTH - length(key) - 5), out, ",")
        }
        { for (k = 1; k <= 2; k++) { key = k == 1 ? "logprobs" : "entropy"
            n = vals($1, key, g)
            if (n == 0 || vals($2, key, c) != n || vals($3, key, f) != n) bad = 1
            for (i = 1; i <= n; i++) { gc[k] += (g[i] - c[i]) ^ 2; gf[k] += (g[i] - f[i]) ^ 2; cf[k] += (c[i] - f[i]) ^ 2 }
            count[k] += n } }
        END { ok = NR == 8 && !bad ? "ok" : "FAIL (missing or unequal outputs)"
            for (k = 1; k <= 2; k++) { a = sqrt(gc[k] / count[k]); b = sqrt(gf[k] / count[k]); r = sqrt(cf[k] / count[k])
                if (!(a <= 0.1 * r)) ok = "FAIL"
                printf "%s %.3g %.3g (%.3g) ", k == 1 ? "log-probs" : "entropies", a, b, r }
            print ok }')
    echo "$p: gpu-cpu, gpu-fp32 (cpu-fp32): $line"
    [[ $line == *" ok" ]] || failed=1
    summary+=" $p $(echo "$line" | awk '{ gsub(/[()]/, "", $4); printf "%s (bound 0.1 x %s)", $2, $4 }')"
done

# PASS only when the test ran and passed (a skipped test, no GPU, is not a pass)
if "$test_bin" gpu_engine_matches_cpu_engine_qwen3 | tee "$work/gradients.out" && grep -q '^1 passed' "$work/gradients.out"; then
    gradients=PASS
else
    gradients=FAIL failed=1
fi

awk -v V="$vocab" 'BEGIN { srand(11); for (s = 0; s < 8; s++) { n = 1 + int(rand() * 12); line = "{\"ids\":[";
    for (i = 0; i < n; i++) line = line (i ? "," : "") int(rand() * V); print line "]}" } }' > "$work/prompts.jsonl"
flags=("${threads[@]}" --model "$model" --prompts "$work/prompts.jsonl" --temperature 0 --max_new_tokens 16 --precision bf16)
"$cpu" "${flags[@]}" --output "$work/cpu_gen.jsonl" || failed=1
"$gpu" "${flags[@]}" --output "$work/gpu_gen.jsonl" || failed=1
greedy=$(paste -d'|' "$work/gpu_gen.jsonl" "$work/cpu_gen.jsonl" | awk -F'|' '
    { split($1, a, "\"text\""); split($2, b, "\"text\""); same += a[1] == b[1] }
    END { printf "%d of %d", same, NR; exit !(NR == 8 && 4 * same >= 3 * NR) }') || failed=1
echo "greedy completions equal to the CPU's: $greedy"

[ "$failed" -eq 0 ] && verdict=PASS || verdict=FAIL
echo "engine vs CPU: $verdict; $summary; gradients $gradients; greedy equal $greedy"
exit "$failed"
