#!/usr/bin/env python3
"""Dashboard of a train_rl_cpu run as a PNG with matplotlib: reads OUT_DIR/log.jsonl. The trainer
itself writes OUT_DIR/dashboard.html with these panels and more (rl/io/dashboard.h; no Python needed).

usage: python3 dev/plot_log.py RUN_DIR_OR_LOG [--out FILE.png] [--title TEXT]

Panels: reward and training accuracy, greedy eval accuracy and mean@k, entropy, clip fractions
split by the sign of the advantage, the clip bounds in force (Calibrated Clipping), rollout/train
mismatch, response lengths, grad norm and learning rate.
"""
import argparse
import json
import math
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_log(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                rows.append(json.loads(line))
    return rows


def series(rows, key):
    xs, ys = [], []
    for r in rows:
        v = r.get(key)
        if v is not None and not (isinstance(v, float) and math.isnan(v)):
            xs.append(r.get("training/global_step", len(xs)) + 1)
            ys.append(v)
    return xs, ys


PANELS = [
    ("reward and training accuracy", [("critic/rewards/mean", "reward"), ("critic/score/mean", "score"), ("critic/correct/mean", "exactly correct")]),
    ("eval accuracy", None),  # filled with every val-core/*/acc key found
    ("entropy", [("actor/entropy", "entropy (nats/token)")]),
    ("clip fractions by advantage sign", [("actor/pg_clipfrac_low", "A<0, r<L"), ("actor/pg_clipfrac_high", "A>0, r>H"),
                                          ("actor/pg_clipfrac_lower", "dual clip")]),
    ("clip bounds in force", [("calib/clip_low", "L"), ("calib/clip_high", "H"), ("calib/target_low", "L* (target)"),
                              ("calib/target_high", "H* (target)")]),
    ("rollout/train mismatch", [("rollout_corr/logprob_abs_diff", "mean |l_old - l_roll|"), ("rollout_corr/k3_kl", "k3 KL")]),
    ("response length", [("response_length/mean", "mean"), ("response_length/max", "max"), ("response_length/clip_ratio", "clip ratio")]),
    ("grad norm and lr", [("actor/grad_norm", "grad norm"), ("actor/lr", "lr (right axis)")]),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--out")
    ap.add_argument("--title", default="")
    a = ap.parse_args()
    path = os.path.join(a.log, "log.jsonl") if os.path.isdir(a.log) else a.log
    rows = read_log(path)
    out = a.out or os.path.join(os.path.dirname(path), "dashboard.png")
    fig, axes = plt.subplots(4, 2, figsize=(13, 13))
    for ax, (title, keys) in zip(axes.flat, PANELS):
        if keys is None:
            names = sorted({k for r in rows for k in r if k.startswith("val-core/")})
            keys = [(k, k.split("/", 2)[-1]) for k in names]
        for key, label in keys:
            xs, ys = series(rows, key)
            if not xs:
                continue
            if label.endswith("(right axis)"):
                ax2 = ax.twinx()
                ax2.plot(xs, ys, color="gray", linestyle="--", label=label)
                ax2.set_ylabel("lr")
                continue
            ax.plot(xs, ys, marker="." if len(xs) < 40 else None, label=label)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(a.title or path)
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    print("wrote", out)


if __name__ == "__main__":
    main()
