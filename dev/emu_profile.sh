#!/usr/bin/env bash
# dev/emu_profile.sh: the emulation's profile (docs/gpu-emulation.md, "The profile") of three runs of
# ./train_rl_emu, each under FP8RL_EMU_STATS, then a table per range of each (dev/emu_profile.py):
#   train_step  one RL step of the --init tiny model on the add task: rollout, old log-probs, the
#               training forward, backward and AdamW
#   logprobs    --logprobs of 8 random id sequences (5..68 tokens) on test/fixtures/models/qwen3_tiny
#   generate    --prompts: 8 random id prompts, 16 new tokens each (greedy), on the same model, in
#               decode steps replayed from CUDA graphs
# Counts of what the host asks of the GPU (launches, GEMMs, host syncs, copies, sets), not times.
# usage: dev/emu_profile.sh [PRECISION: bf16|fp8, default fp8 (linear layers and KV cache)] [OUT_DIR, default runs/emu_profile]
set -euo pipefail
cd "$(dirname "$0")/.."
precision=${1:-fp8} out=${2:-runs/emu_profile}
case $precision in bf16|fp8) ;; *) echo "usage: dev/emu_profile.sh [bf16|fp8] [OUT_DIR]" >&2; exit 2 ;; esac
make -j1 train_rl_emu >/dev/null
mkdir -p "$out"
model=test/fixtures/models/qwen3_tiny
vocab=$(sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' "$model/config.json")
threads=(--threads 2)  # tiny models: more threads only wait on each other

rm -rf "$out/train"
FP8RL_EMU_STATS=$out/train_step.json ./train_rl_emu "${threads[@]}" --init tiny --task add --task_size 1 --max_new_tokens 3 \
    --group_size 4 --batch_prompts 4 --lr 3e-3 --steps 1 --eval_every 0 --seed 7 --rollout_precision "$precision" \
    --train_precision "$precision" --kv_cache "$precision" --out_dir "$out/train" >"$out/train_step.log"

# random id sequences and prompts (fixed seeds), as dev/check_engine.sh writes them
awk -v V="$vocab" 'BEGIN { srand(7); for (s = 0; s < 8; s++) { n = 5 + int(rand() * 64); line = "{\"ids\":[";
    for (i = 0; i < n; i++) line = line (i ? "," : "") int(rand() * V); print line "]}" } }' >"$out/ids.jsonl"
awk -v V="$vocab" 'BEGIN { srand(11); for (s = 0; s < 8; s++) { n = 1 + int(rand() * 12); line = "{\"ids\":[";
    for (i = 0; i < n; i++) line = line (i ? "," : "") int(rand() * V); print line "]}" } }' >"$out/prompts.jsonl"
FP8RL_EMU_STATS=$out/logprobs.json ./train_rl_emu "${threads[@]}" --model "$model" --logprobs "$out/ids.jsonl" \
    --precision "$precision" --output "$out/logprobs.jsonl"
FP8RL_EMU_STATS=$out/generate.json ./train_rl_emu "${threads[@]}" --model "$model" --prompts "$out/prompts.jsonl" \
    --temperature 0 --max_new_tokens 16 --precision "$precision" --kv_cache "$precision" --output "$out/generate.jsonl"

echo "# The emulation's profile, $precision (dev/emu_profile.sh; the runs' outputs in $out)"
echo
python3 dev/emu_profile.py "$out/train_step.json" "$out/logprobs.json" "$out/generate.json"
