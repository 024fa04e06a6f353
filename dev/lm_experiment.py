#!/usr/bin/env python3
"""InfiR2's comparison in miniature (docs/sft.md, results in docs/results.md): CPT of a fresh byte-level
`--init small` model on real English text, BF16 against FP8 (block scales with fp32 and with power-of-two
scales, row, tensor), several seeds paired by seed (the same init and data order in every arm).

The text is this repository's own documentation (docs/*.md and README.md, prose and tables): paragraphs
of 40+ characters, every 10th held out for val/loss. Each run logs val/loss (its training precision)
and val/loss_bf16 (the same weights in BF16) at step 0, every --eval_every steps and at the end.

"Lossless at this scale" is defined before looking: an FP8 arm's mean final val/loss is within the
BF16 arm's seed spread (max - min over seeds) of BF16's mean, and its paired gap (fp8 - bf16, same
seed) has |mean| below that spread.

    python3 dev/lm_experiment.py                       # ./train_rl_cpu, 3 seeds
    python3 dev/lm_experiment.py --seeds 1 --steps 40  # a smoke run
"""
import argparse
import glob
import json
import os
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARMS = [  # name, flags
    ("bf16", ["--train_precision", "bf16"]),
    ("fp8 block fp32", ["--train_precision", "fp8", "--fp8_scaling", "block", "--fp8_scales", "fp32"]),
    ("fp8 block pow2", ["--train_precision", "fp8", "--fp8_scaling", "block", "--fp8_scales", "pow2"]),
    ("fp8 row", ["--train_precision", "fp8", "--fp8_scaling", "row"]),
    ("fp8 tensor", ["--train_precision", "fp8", "--fp8_scaling", "tensor"]),
]


def corpus(work):
    paras = []
    for path in sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + [os.path.join(ROOT, "README.md")]:
        for p in open(path, encoding="utf-8").read().split("\n\n"):
            p = p.strip()
            if len(p) >= 40:
                paras.append(p)
    train = os.path.join(work, "train.jsonl")
    val = os.path.join(work, "val.jsonl")
    with open(train, "w") as ft, open(val, "w") as fv:
        for i, p in enumerate(paras):
            (fv if i % 10 == 0 else ft).write(json.dumps({"text": p}) + "\n")
    return train, val, len(paras)


def run(binary, arm_flags, seed, args, train, val, out):
    cmd = [binary, "--mode", "cpt", "--init", "small", "--tokenizer", "bytes", "--data", train, "--eval_data", val,
           "--seq_len", str(args.seq_len), "--batch_seqs", str(args.batch_seqs), "--steps", str(args.steps),
           "--lr", str(args.lr), "--lr_schedule", "wsd", "--warmup_steps", str(args.steps // 10),
           "--decay_steps", str(args.steps // 5), "--eval_every", str(args.eval_every), "--seed", str(seed),
           "--threads", str(args.threads), "--out_dir", out] + arm_flags
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(l) for l in open(os.path.join(out, "log.jsonl"))]
    evals = [(int(r["training/global_step"]) + (1 if "train/loss" in r else 0), r["val/loss"], r["val/loss_bf16"])
             for r in rows if "val/loss" in r]
    return evals


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default=os.path.join(ROOT, "train_rl_cpu"))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--eval_every", type=int, default=50)
    ap.add_argument("--seq_len", type=int, default=128)
    ap.add_argument("--batch_seqs", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workdir", default="/tmp/fp8rl_lm_experiment")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    train, val, n = corpus(args.workdir)
    print("corpus: %d paragraphs of docs/*.md and README.md, every 10th held out" % n)
    results = {}
    t0 = time.time()
    for name, flags in ARMS:
        for seed in range(1, args.seeds + 1):
            out = os.path.join(args.workdir, "%s_seed%d" % (name.replace(" ", "_"), seed))
            results[(name, seed)] = run(args.binary, flags, seed, args, train, val, out)
    seeds = range(1, args.seeds + 1)
    final = {k: v[-1][1] for k, v in results.items()}
    bf = [final[("bf16", s)] for s in seeds]
    spread = max(bf) - min(bf)
    mean = lambda xs: sum(xs) / len(xs)
    print("\n%d steps x %d windows of %d+1 bytes, wsd lr %g, %d seeds, %.0f s" %
          (args.steps, args.batch_seqs, args.seq_len, args.lr, args.seeds, time.time() - t0))
    print("val/loss at steps " + ", ".join(str(e[0]) for e in results[("bf16", 1)]) + " (mean over seeds)\n")
    print("| arm | val/loss curve | final val/loss (min..max) | paired gap vs bf16 (min..max) | val/loss - val/loss_bf16 | lossless |")
    print("|---|---|---|---|---|---|")
    for name, _ in ARMS:
        curve = [mean([results[(name, s)][i][1] for s in seeds]) for i in range(len(results[(name, 1)]))]
        f = [final[(name, s)] for s in seeds]
        gap = [final[(name, s)] - final[("bf16", s)] for s in seeds]
        qgap = [results[(name, s)][-1][1] - results[(name, s)][-1][2] for s in seeds]
        lossless = abs(mean(f) - mean(bf)) <= spread and abs(mean(gap)) <= spread
        print("| %s | %s | %.4f (%.4f..%.4f) | %+.4f (%+.4f..%+.4f) | %+.4f | %s |" %
              (name, " ".join("%.3f" % c for c in curve), mean(f), min(f), max(f), mean(gap), min(gap), max(gap),
               mean(qgap), "-" if name == "bf16" else ("yes" if lossless else "no")))
    print("\nbf16 seed spread (max - min of final val/loss): %.4f" % spread)


if __name__ == "__main__":
    main()
