#!/usr/bin/env python3
"""The Calibrated Clipping paper's comparison in miniature, on the CPU engine.

usage: python3 dev/paper_experiment.py [--steps N] [--out runs/paper] [--bin ./train_rl_cpu] [-- extra flags]

Runs the demo task (addition, a fresh tiny model) with the same seed under four (rollout, train)
precision settings: bf16/bf16, fp8/bf16, fp8/fp8, and fp8/fp8 with Calibrated Clipping. Every
step makes several updates from one rollout batch (--minibatches 4), so the ratios of later
minibatches move away from 1 and clipping can act. Writes OUT/table.md (final greedy accuracy,
peak entropy, clip fraction of negative-advantage tokens, mismatch k3 KL) and OUT/paper.png.
"""
import argparse
import json
import os
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

CONFIGS = [
    ("bf16/bf16", ["--rollout_precision", "bf16", "--train_precision", "bf16", "--kv_cache", "bf16"]),
    ("fp8/bf16", ["--rollout_precision", "fp8", "--train_precision", "bf16", "--kv_cache", "fp8"]),
    ("fp8/fp8", ["--rollout_precision", "fp8", "--train_precision", "fp8", "--kv_cache", "fp8"]),
    ("fp8/fp8+CC", ["--rollout_precision", "fp8", "--train_precision", "fp8", "--kv_cache", "fp8",
                    "--calibrated_clip", "1", "--cc_interval", "5"]),
]


def read_log(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def column(rows, key):
    return [(r["training/global_step"] + 1, r[key]) for r in rows if r.get(key) is not None]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", default="runs/paper")
    ap.add_argument("--bin", default="./train_rl_cpu")
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    base = [a.bin, "--init", "tiny", "--task", "add", "--task_size", "1", "--max_new_tokens", "3", "--group_size", "16",
            "--batch_prompts", "32", "--minibatches", "4", "--lr", "3e-4", "--temperature", "1.5", "--eval_every", "20",
            "--eval_prompts", "100", "--eval_k", "0", "--seed", "1234", "--steps", str(a.steps)] + a.extra
    os.makedirs(a.out, exist_ok=True)
    results = []
    for name, flags in CONFIGS:
        out_dir = os.path.join(a.out, name.replace("/", "_").replace("+", "_"))
        print("==", name, flush=True)
        subprocess.run(base + flags + ["--out_dir", out_dir], check=True, stdout=subprocess.DEVNULL)
        rows = read_log(os.path.join(out_dir, "log.jsonl"))
        acc = column(rows, "val-core/add/acc/greedy")
        results.append(dict(
            name=name, rows=rows,
            final_acc=acc[-1][1] if acc else float("nan"),
            peak_entropy=max(v for _, v in column(rows, "actor/entropy")),
            clip_neg=sum(v for _, v in column(rows, "actor/pg_clipfrac_low")) / max(1, len(rows)),
            mismatch=sum(v for _, v in column(rows, "rollout_corr/k3_kl")) / max(1, len(rows)),
        ))
    lines = ["| rollout/train | final greedy acc | peak entropy | mean clip frac A<0 (r<L) | mean mismatch k3 KL |",
             "|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['name']} | {r['final_acc']:.3f} | {r['peak_entropy']:.3f} | {r['clip_neg']:.4f} | {r['mismatch']:.2e} |")
    table = "\n".join(lines) + "\n"
    with open(os.path.join(a.out, "table.md"), "w") as f:
        f.write(table)
    print(table)
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    for (ax, key, title) in zip(axes.flat, ["val-core/add/acc/greedy", "actor/entropy", "actor/pg_clipfrac_low",
                                            "rollout_corr/k3_kl"],
                                ["greedy eval accuracy", "entropy", "clip fraction, A<0 and r<L", "mismatch k3 KL"]):
        for r in results:
            xs, ys = zip(*column(r["rows"], key)) if column(r["rows"], key) else ([], [])
            ax.plot(xs, ys, label=r["name"])
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(a.out, "paper.png"), dpi=80)
    print("wrote", os.path.join(a.out, "table.md"), os.path.join(a.out, "paper.png"))


if __name__ == "__main__":
    sys.exit(main())
