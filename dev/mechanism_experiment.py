#!/usr/bin/env python3
"""The Calibrated Clipping paper's mechanism in miniature (issue 51), on the CPU engine: does FP8
clip more negative-advantage tokens at the lower bound than the high-precision reference does, on
the same tokens, and does Calibrated Clipping's bound track the reference?

usage: python3 dev/mechanism_experiment.py --base MODEL_DIR [--points base lr3e-5 ...] [--cc_points base ...]
                                           [--seeds 1 2 3] [--steps 32] [--jobs 2] [--out runs/mechanism]
                                           [--outliers 1e4] [--replot] [--keep]

Every run starts from --base (a checkpoint that already earns some reward, so groups have
negative-advantage tokens) and trains the add task through the FP8 pipeline at one granularity
(--fp8_scaling block, row, tensor) with the shadow passes on every --cc_interval 4 steps:
`--calibrated_clip 2` measures at the reference bounds (FP8 without CC), `--calibrated_clip 1`
lets CC move them. Two points start from other models, which the script writes under OUT/models:
  outliers  --base given the massive-activation channels of dev/paper_experiment.py --outliers
            (dev/np_model.py: 4 channels of the norms' weights and of up_proj's rows x F, the columns
            that read them / F; the same function, written in F32 so that it stays the same)
  copy12    long answers: the copy task with 12 letters (13 response tokens with the end token,
            against the add task's 3), from a fresh tiny model given 100 steps of SFT on 4000 copy
            rows (seeded; greedy copying half learned, so groups at temperature 1.5 mix rewards)
Per calibration step the log has (rl/objective/calibrated_clip.h):
  multiplier     calib/clipfrac_neg_fp8_at_ref / calib/alpha_ref (FP8's over BF16/fp32's clipped
                 fraction of A<0 tokens at L_ref; the paper's 3.94 / 5.48 / 6.68)
  noise / drift  calib/ratio_abs_diff_mean / calib/ratio_hp_drift_mean (mean |r - r_hp| over mean |r_hp - 1|)
  CC tracking    calib/clipfrac_neg_fp8 / calib/alpha_ref (what CC's new bound clips against the reference)
  where          calib/overclip_entropy_mean vs calib/neg_entropy_mean, calib/overclip_rewarded_frac
A run's multiplier is the ratio of the sums over its calibration steps (steps where the reference
clips nothing still count their FP8 clips). With CC on, a calibration with too few A<0 tokens pools
its statistics into the next one (calib/pooled = 1); the table counts its tokens once, in the
calibration that decides (whose calib/* metrics are over the pooled tokens, calib/pooled_steps). Writes OUT/steps.csv (one row per run and calibration
step), OUT/table.md (mean (min..max) over seeds) and OUT/mechanism.png (multiplier against
noise-to-drift, one point per run and calibration step with alpha > 0).
"""
import argparse
import concurrent.futures
import csv
import json
import os
import random
import shutil
import subprocess
import sys

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from np_model import add_massive_activations, read_safetensors, write_safetensors  # noqa: E402

COMMON = ["--group_size", "16", "--batch_prompts", "32", "--eval_every", "0", "--rollout_precision", "fp8",
          "--train_precision", "fp8", "--kv_cache", "fp8", "--cc_interval", "4", "--threads", "1"]
BASE = {"--task": "add", "--task_size": "1", "--max_new_tokens": "3", "--lr": "3e-4", "--minibatches": "4",
        "--temperature": "1.5"}
COPY = {"--task": "copy", "--task_size": "12", "--max_new_tokens": "13"}
POINTS = {  # name -> (starting model, flags changed from BASE): one regime axis at a time
    "base": ("base", {}),
    "lr3e-5": ("base", {"--lr": "3e-5"}),
    "lr3e-6": ("base", {"--lr": "3e-6"}),
    "mb2": ("base", {"--minibatches": "2"}),
    "T2.5": ("base", {"--temperature": "2.5"}),
    "outliers": ("outliers", {}),
    "copy12": ("copy12", COPY),
}
SCALINGS = ("block", "row", "tensor")
KEYS = ["alpha_ref", "clipfrac_neg_fp8_at_ref", "overclip_low_frac", "clipfrac_neg_fp8", "clipfrac_neg_fp8_at_target",
        "target_low", "clip_low", "ratio_abs_diff_mean", "ratio_hp_drift_mean", "neg_entropy_mean",
        "overclip_entropy_mean", "neg_high_entropy_frac", "overclip_high_entropy_frac", "neg_rewarded_frac",
        "overclip_rewarded_frac", "skipped", "pooled", "pooled_steps", "neg_tokens"]


def run_dir(a, point, scaling, cc, seed):
    return os.path.join(a.out, point, f"{scaling}_cc{cc}_seed{seed}")


def outlier_model(a, out):
    w, _ = read_safetensors(os.path.join(a.base, "model.safetensors"))
    w = {k: v.astype(np.float64) for k, v in w.items()}
    add_massive_activations(w, a.outliers, sorted({int(k.split(".")[2]) for k in w if k.startswith("model.layers.")}))
    shutil.copytree(a.base, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns("trainer_state.bin"))
    write_safetensors(os.path.join(out, "model.safetensors"), w, "F32")


def copy_model(a, out):
    quiet = dict(check=True, stdout=subprocess.DEVNULL)
    subprocess.run([a.bin, "--init", "tiny", "--task", "copy", "--task_size", "12", "--steps", "0", "--eval_every", "0",
                    "--out_dir", out + "_init"], **quiet)
    r = random.Random(7)
    data = out + "_sft.jsonl"
    with open(data, "w") as f:
        for _ in range(4000):
            s = "".join(r.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(12))
            f.write(json.dumps({"prompt": f"C:{s}=", "completion": s}) + "\n")
    subprocess.run([a.bin, "--mode", "sft", "--model", out + "_init/init_model", "--data", data, "--batch_seqs", "32",
                    "--steps", "100", "--lr", "3e-3", "--warmup_steps", "10", "--seed", "1", "--threads", "1",
                    "--out_dir", out + "_sft"], **quiet)
    shutil.copytree(out + "_sft/checkpoints/step_000100", out, dirs_exist_ok=True)


def model_dir(a, name):
    """The starting model of a point (module docstring), written on first use."""
    if name == "base":
        return a.base
    out = os.path.join(a.out, "models", name)
    if not os.path.exists(os.path.join(out, "model.safetensors")):
        os.makedirs(os.path.dirname(out), exist_ok=True)
        (outlier_model if name == "outliers" else copy_model)(a, out)
    return out


def run_one(a, point, scaling, cc, seed):
    out = run_dir(a, point, scaling, cc, seed)
    if a.keep and os.path.exists(os.path.join(out, "log.jsonl")):
        return point, scaling, cc, seed
    model, changed = POINTS[point]
    flags = dict(BASE, **changed)
    cmd = [a.bin, "--model", model_dir(a, model)] + COMMON + [x for kv in flags.items() for x in kv] + [
        "--fp8_scaling", scaling, "--calibrated_clip", str(cc), "--seed", str(seed), "--steps", str(a.steps), "--out_dir", out]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return point, scaling, cc, seed


def calib_rows(a, point, scaling, cc, seed):
    rows = []
    with open(os.path.join(run_dir(a, point, scaling, cc, seed), "log.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if "calib/alpha_ref" in r:
                row = {"point": point, "scaling": scaling, "cc": cc, "seed": seed, "step": r["training/global_step"],
                       "entropy": r.get("actor/entropy")}
                row.update({k: r.get("calib/" + k, float("nan")) for k in KEYS})
                rows.append(row)
    return rows


def ratio_of_sums(rows, num, den, first=0):
    # a calibration with too few A<0 tokens for Stage 1 logs no CC fraction (NaN): left out of both sums
    rows = [r for r in rows if r["step"] >= first and r[num] == r[num] and r[den] == r[den]]
    n, d = sum(r[num] for r in rows), sum(r[den] for r in rows)
    return n / d if d > 0 else float("inf") if n > 0 else float("nan")


def spread(values):
    values = [v for v in values if v == v]
    if not values:
        return "n/a"
    fmt = lambda v: "inf" if v == float("inf") else f"{v:.2f}"  # noqa: E731
    return f"{fmt(sum(values) / len(values))} ({fmt(min(values))}..{fmt(max(values))})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="starting model (a checkpoint directory)")
    ap.add_argument("--points", nargs="+", default=list(POINTS))
    ap.add_argument("--cc_points", nargs="*", default=["base"], help="points also run with Calibrated Clipping on")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--outliers", type=float, default=1e4, help="factor of the outliers point's channels")
    ap.add_argument("--replot", action="store_true")
    ap.add_argument("--keep", action="store_true", help="skip runs whose log.jsonl exists (rerun what was deleted)")
    ap.add_argument("--out", default="runs/mechanism")
    ap.add_argument("--bin", default="./train_rl_cpu")
    a = ap.parse_args()
    a.bin = os.path.abspath(a.bin)
    runs = [(p, s, cc, seed) for p in a.points for cc in ((2, 1) if p in a.cc_points else (2,)) for s in SCALINGS
            for seed in a.seeds]
    if not a.replot:
        for p in a.points:
            model_dir(a, POINTS[p][0])  # before the pool: the runs of a point share its model
        with concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs) as pool:
            for f in concurrent.futures.as_completed([pool.submit(run_one, a, *r) for r in runs]):
                print("done", *f.result(), flush=True)
    rows = {r: calib_rows(a, *r) for r in runs}
    # pooled ones are counted in the next (CC on only: a run that measures keeps nothing)
    decided = {r: [x for x in rs if r[2] != 1 or x["pooled"] != 1] for r, rs in rows.items()}
    with open(os.path.join(a.out, "steps.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(next(iter(rows.values()))[0].keys()))
        w.writeheader()
        for rs in rows.values():
            w.writerows(rs)
    lines = [f"{len(a.seeds)} seeds, {a.steps} steps from {a.base}; per run the ratio of sums over its calibration "
             "steps; mean (min..max) over seeds", "",
             "| point | scaling | CC | multiplier (FP8/ref clip frac A<0 at L_ref) | alpha_ref | noise/drift | "
             "overclip frac | entropy overclip / all A<0 | overclip from rewarded | CC clip / ref (from step 12; "
             "decisions of L over the seeds) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for p in a.points:
        for cc in ((2, 1) if p in a.cc_points else (2,)):
            for s in SCALINGS:
                rs = [decided[(p, s, cc, seed)] for seed in a.seeds]
                mult = [ratio_of_sums(r, "clipfrac_neg_fp8_at_ref", "alpha_ref") for r in rs]
                alpha = [sum(x["alpha_ref"] for x in r) / len(r) for r in rs]
                nd = [ratio_of_sums(r, "ratio_abs_diff_mean", "ratio_hp_drift_mean") for r in rs]
                over = [sum(x["overclip_low_frac"] for x in r) / len(r) for r in rs]
                ent = [ratio_of_sums([x for x in r if x["overclip_entropy_mean"] == x["overclip_entropy_mean"]],
                                     "overclip_entropy_mean", "neg_entropy_mean") for r in rs]
                rew = [sum(x["overclip_rewarded_frac"] for x in r if x["overclip_rewarded_frac"] == x["overclip_rewarded_frac"])
                       / max(1, sum(1 for x in r if x["overclip_rewarded_frac"] == x["overclip_rewarded_frac"])) for r in rs]
                track = [ratio_of_sums(r, "clipfrac_neg_fp8", "alpha_ref", first=12) for r in rs] if cc == 1 else []
                acted = sum(1 for r in rs for x in r if x["step"] >= 12 and x["clipfrac_neg_fp8"] == x["clipfrac_neg_fp8"])
                lines.append(f"| {p} | {s} | {'on' if cc == 1 else 'off'} | {spread(mult)} | "
                             f"{spread([100 * x for x in alpha])}% | {spread(nd)} | {spread([100 * x for x in over])}% | "
                             f"{spread(ent)} | {spread(rew)} | {spread(track) + f'; {acted}' if track else '-'} |")
    table = "\n".join(lines) + "\n"
    with open(os.path.join(a.out, "table.md"), "w") as f:
        f.write(table)
    print(table)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    markers = {"block": "o", "row": "s", "tensor": "^"}
    for (p, s, cc, seed), rs in rows.items():
        pts = [(x["ratio_abs_diff_mean"] / x["ratio_hp_drift_mean"], x["clipfrac_neg_fp8_at_ref"] / x["alpha_ref"])
               for x in rs if cc == 2 and x["alpha_ref"] > 0 and x["ratio_hp_drift_mean"] > 0]
        if pts:
            ax.scatter(*zip(*pts), s=12, marker=markers[s], alpha=0.5,
                       color=f"C{a.points.index(p)}", label=f"{p} {s}" if seed == a.seeds[0] else None)
    for y, name in ((3.94, "paper block"), (5.48, "paper row"), (6.68, "paper tensor")):
        ax.axhline(y, color="grey", lw=0.6, ls=":")
        ax.text(0.01, y, name, fontsize=6, va="bottom", transform=ax.get_yaxis_transform())
    ax.axhline(1, color="k", lw=0.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("noise / drift = mean |r - r_hp| / mean |r_hp - 1|")
    ax.set_ylabel("multiplier (FP8 / ref clip frac of A<0 at L_ref)")
    ax.legend(fontsize=5, ncol=3)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(a.out, "mechanism.png"), dpi=80)
    print("wrote", os.path.join(a.out, "table.md"), os.path.join(a.out, "mechanism.png"))


if __name__ == "__main__":
    sys.exit(main())
