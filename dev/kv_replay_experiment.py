#!/usr/bin/env python3
"""--train_kv_replay in the miniature of dev/paper_experiment.py (issue 60): fp8 rollout and training
at block scaling with Calibrated Clipping on, and the KV cache in three forms: BF16, FP8 with the
trainer reading BF16 K/V (replay off), and FP8 with the trainer reading them through the rollout's
E4M3 codes and scales (replay on). Same task, model size, batch and learning rate as
paper_experiment.py's runs; its plain random model (its --outliers 0), so no torch is needed.
Standard library only.

usage: python3 dev/kv_replay_experiment.py [--steps N] [--seeds 1 2 3] [--jobs J] [--out runs/kv_replay]
                                           [--bin ./train_rl_cpu]

Writes OUT/table.md: per arm, mean (min..max) over the seeds of rollout_corr/k3_kl and
rollout_corr/logprob_abs_diff (at the first step, and averaged over the steps after it: the
policies those steps roll out are checkpoints no test has seen), Calibrated Clipping's reference
multiplier calib/rho_ref and its final bounds, final greedy accuracy and peak entropy.
"""
import argparse
import os
import subprocess
import sys

from miniature import MINIATURE, add_common_args, arm_dir, read_log, run_arms, spread, write_table

FP8 = ["--rollout_precision", "fp8", "--train_precision", "fp8", "--fp8_scaling", "block", "--calibrated_clip", "1",
       "--cc_interval", "5"]
ARMS = [("fp8, BF16 KV", FP8 + ["--kv_cache", "bf16"]),
        ("fp8, FP8 KV, replay off", FP8 + ["--kv_cache", "fp8", "--train_kv_replay", "0"]),
        ("fp8, FP8 KV, replay on", FP8 + ["--kv_cache", "fp8", "--train_kv_replay", "1"])]

METRICS = [  # column, key, reduction
    ("k3_kl step 1", "rollout_corr/k3_kl", "first"),
    ("k3_kl later steps", "rollout_corr/k3_kl", "rest"),
    ("\\|Δlogp\\| step 1", "rollout_corr/logprob_abs_diff", "first"),
    ("\\|Δlogp\\| later steps", "rollout_corr/logprob_abs_diff", "rest"),
    ("CC rho_ref", "calib/rho_ref", "rest_all"),
    ("final clip_low", "calib/clip_low", "last"),
    ("final clip_high", "calib/clip_high", "last"),
    ("final greedy acc", "val-core/add/acc/greedy", "last"),
    ("peak entropy", "actor/entropy", "max"),
]


def reduce(rows, key, how):
    v = [r[key] for r in rows if r.get(key) is not None]
    if not v:
        return float("nan")
    if how == "first":
        return v[0]
    if how == "last":
        return v[-1]
    if how == "max":
        return max(v)
    rest = v if how == "rest_all" else v[1:]
    return sum(rest) / len(rest) if rest else float("nan")


def run_one(a, name, flags, seed):
    out_dir = arm_dir(a, name, seed)
    cmd = [a.bin, "--init", "tiny"] + MINIATURE + ["--eval_every", str(a.steps), "--seed", str(seed), "--steps", str(a.steps),
                                                   "--threads", "1"] + flags + ["--out_dir", out_dir]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return read_log(os.path.join(out_dir, "log.jsonl"))


def main():
    ap = argparse.ArgumentParser()
    add_common_args(ap, 40, "runs/kv_replay")
    a = ap.parse_args()
    a.bin = os.path.abspath(a.bin)
    os.makedirs(a.out, exist_ok=True)
    runs = run_arms(a, ARMS, run_one)
    lines = [f"{len(a.seeds)} seeds ({', '.join(map(str, a.seeds))}), {a.steps} steps; mean (min..max) over the seeds", "",
             "| arm | " + " | ".join(m[0] for m in METRICS) + " |", "|" + "---|" * (len(METRICS) + 1)]
    for name, _ in ARMS:
        cells = [spread([reduce(runs[name][s], key, how) for s in a.seeds]) for _, key, how in METRICS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    write_table(a.out, lines)


if __name__ == "__main__":
    sys.exit(main())
