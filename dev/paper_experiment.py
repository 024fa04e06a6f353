#!/usr/bin/env python3
"""The Calibrated Clipping paper's comparison in miniature, on the CPU engine: bf16, and fp8 at each
FP8 scaling granularity (--fp8_scaling block, row, tensor) with and without Calibrated Clipping, over
several seeds.

usage: python3 dev/paper_experiment.py [--steps N] [--seeds 1 2 3] [--outliers F] [--jobs J] [--arms NAME ...]
                                       [--out runs/paper] [--bin ./train_rl_cpu] [-- extra flags]

Runs the demo task (addition, a fresh tiny model per seed) under 8 settings (or the --arms named):
bf16 rollout and training with a BF16 KV cache; fp8 rollout and training with an FP8 KV cache at
each granularity, each with Calibrated Clipping off and on (bounds refit every 5 steps); and block
with CC and --train_kv_replay 1 (issue 60: does reading the cache as the sampler did move CC's bounds?). Every step makes several
updates from one rollout batch (--minibatches 4), so the ratios of later minibatches move away from
1 and clipping can act.

Coarser scaling is noisier only where a tensor's values span a range that one scale cannot cover: a
random tiny model has no such range. --outliers F (default 1e4) gives it the massive activations of
real LLMs (Sun et al. 2024, "Massive activations in large language models"): in every layer four
channels of the norms' weights (and of up_proj's rows, the down projection's input) are multiplied by
F and the weight columns that read them divided by F, the same function in exact arithmetic, applied to the seed's fresh model before training
(`--init tiny` writes it; this script rewrites its model.safetensors with torch). One scale per
token row or per tensor then pushes the ordinary channels toward E4M3's subnormals, while 1x128
groups confine the damage to the outliers' group. --outliers 0 trains the plain random model.

Writes OUT/table.md (per setting, mean and spread (min..max) over the seeds of: final greedy
accuracy, peak entropy, clip fractions of negative-advantage tokens (A<0, r below the lower bound)
and positive-advantage tokens (A>0, r above the upper bound), rollout/train mismatch (mean
|log p_old - log p_rollout| per token), Calibrated Clipping's reference multiplier calib/rho_ref and
its final bounds) and OUT/paper.png (accuracy, entropy and clip-fraction curves, mean over seeds with the min-max band).
Needs matplotlib for the plot (without it, the table only), and torch + safetensors for --outliers.
"""
import argparse
import os
import shutil
import subprocess
import sys

from miniature import MINIATURE, add_common_args, arm_dir, read_log, run_arms, spread, write_table

FP8 = ["--rollout_precision", "fp8", "--train_precision", "fp8", "--kv_cache", "fp8"]
CC = ["--calibrated_clip", "1", "--cc_interval", "5"]
CONFIGS = [("bf16", ["--rollout_precision", "bf16", "--train_precision", "bf16", "--kv_cache", "bf16"])]
for scaling in ("block", "row", "tensor"):
    CONFIGS.append((f"fp8 {scaling}", FP8 + ["--fp8_scaling", scaling]))
    CONFIGS.append((f"fp8 {scaling} +CC", FP8 + ["--fp8_scaling", scaling] + CC))
# the trainer reading K and V through the rollout's FP8 cache (issue 60): does it change CC's bounds?
CONFIGS.append(("fp8 block +CC +replay", FP8 + ["--fp8_scaling", "block"] + CC + ["--train_kv_replay", "1"]))

METRICS = [  # column, log key, how a run's series becomes one number
    ("final greedy acc", "val-core/add/acc/greedy", "last"),
    ("peak entropy", "actor/entropy", "max"),
    ("clip frac A<0 (r<low)", "actor/pg_clipfrac_low", "mean"),
    ("clip frac A>0 (r>high)", "actor/pg_clipfrac_high", "mean"),
    ("mismatch |lp_old - lp_roll|", "rollout_corr/logprob_abs_diff", "mean"),
    ("CC rho_ref", "calib/rho_ref", "mean"),
    ("final clip_low", "calib/clip_low", "last"),
    ("final clip_high", "calib/clip_high", "last"),
]


def column(rows, key):
    return [(r["training/global_step"] + 1, r[key]) for r in rows if r.get(key) is not None]


def reduce(series, how):
    values = [v for _, v in series]
    if not values:
        return float("nan")
    return values[-1] if how == "last" else max(values) if how == "max" else sum(values) / len(values)


def outlier_model(a, seed, out):
    """The seed's fresh `--init tiny` model with massive-activation channels (module docstring)."""
    import torch
    from np_model import add_massive_activations
    from safetensors.torch import load_file, save_file
    init_run = os.path.join(out, "init_run")
    subprocess.run([a.bin, "--init", "tiny", "--task", "add", "--task_size", "1", "--seed", str(seed), "--steps", "1",
                    "--batch_prompts", "2", "--group_size", "2", "--max_new_tokens", "3", "--eval_every", "0",
                    "--out_dir", init_run], check=True, stdout=subprocess.DEVNULL)
    model = os.path.join(out, "model")
    shutil.copytree(os.path.join(init_run, "init_model"), model, dirs_exist_ok=True)
    shutil.rmtree(init_run)
    path = os.path.join(model, "model.safetensors")
    w = {k: v.to(torch.float64) for k, v in load_file(path).items()}
    add_massive_activations(w, a.outliers, sorted({int(k.split(".")[2]) for k in w if k.startswith("model.layers.")}))
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in w.items()}, path, metadata={"format": "pt"})
    return model


def run_one(a, name, flags, seed):
    out_dir = arm_dir(a, name, seed)
    model = ["--init", "tiny"]
    if a.outliers > 1:
        model = ["--model", os.path.join(a.out, f"seed{seed}", "model")]
    cmd = [a.bin] + model + MINIATURE + ["--eval_every", "20", "--seed", str(seed), "--steps", str(a.steps)] + flags + \
        a.extra + ["--out_dir", out_dir]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
    return read_log(os.path.join(out_dir, "log.jsonl"))


def main():
    ap = argparse.ArgumentParser()
    add_common_args(ap, 300, "runs/paper")
    ap.add_argument("--outliers", type=float, default=1e4)
    ap.add_argument("--arms", nargs="+", default=[name for name, _ in CONFIGS], help="the settings to run, by name")
    ap.add_argument("--replot", action="store_true", help="read the runs' logs under --out again: the table and plot only")
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    a.bin = os.path.abspath(a.bin)
    os.makedirs(a.out, exist_ok=True)
    configs = [(name, flags) for name, flags in CONFIGS if name in a.arms]
    if len(configs) != len(a.arms):
        ap.error(f"--arms: each of {a.arms} must be one of {[name for name, _ in CONFIGS]}")
    if a.replot:
        runs = {name: {seed: read_log(os.path.join(arm_dir(a, name, seed), "log.jsonl")) for seed in a.seeds}
                for name, _ in configs}
    else:
        if a.outliers > 1:
            for seed in a.seeds:
                outlier_model(a, seed, os.path.join(a.out, f"seed{seed}"))
        runs = run_arms(a, configs, run_one)
    header = "| setting | " + " | ".join(m[0] for m in METRICS) + " |"
    lines = [f"{len(a.seeds)} seeds ({', '.join(map(str, a.seeds))}), {a.steps} steps, outliers "
             f"{a.outliers if a.outliers > 1 else 'none'}; mean (min..max) over the seeds", "", header,
             "|" + "---|" * (len(METRICS) + 1)]
    for name, _ in configs:
        cells = [spread([reduce(column(runs[name][s], key), how) for s in a.seeds]) for _, key, how in METRICS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    write_table(a.out, lines)
    plot(a, configs, runs)


def plot(a, configs, runs):
    try:
        import matplotlib
    except ImportError:
        print("no matplotlib: the table only")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 2, figsize=(13, 8))
    curves_of = [("greedy eval accuracy", METRICS[0][1]), ("entropy", METRICS[1][1]),
                 ("clip fraction, A<0 and r below the lower bound", METRICS[2][1]),
                 ("rollout/train mismatch, mean |log p_old - log p_rollout|", METRICS[4][1])]
    for ax, (title, key) in zip(axes.flat, curves_of):
        for name, _ in configs:
            curves = [dict(column(runs[name][s], key)) for s in a.seeds]
            steps = sorted(set.intersection(*(set(c) for c in curves)))
            if not steps:
                continue
            mean = [sum(c[x] for c in curves) / len(curves) for x in steps]
            line, = ax.plot(steps, mean, label=name, linestyle="--" if "CC" in name else "-")
            ax.fill_between(steps, [min(c[x] for c in curves) for x in steps], [max(c[x] for c in curves) for x in steps],
                            color=line.get_color(), alpha=0.12)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(a.out, "paper.png"), dpi=60)
    print("wrote", os.path.join(a.out, "table.md"), os.path.join(a.out, "paper.png"))


if __name__ == "__main__":
    sys.exit(main())
