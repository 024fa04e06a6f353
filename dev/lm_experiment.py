#!/usr/bin/env python3
"""InfiR2's comparison in miniature (docs/sft.md, results in docs/results.md): CPT of a fresh byte-level
`--init small` model on real English text, BF16 against FP8 (block scales with fp32 and with power-of-two
scales; row and tensor with --arms), several seeds paired by seed (the same init and data order in every arm).

The text: the licences every Debian machine has in /usr/share/common-licenses (identical files counted
once), split by document: Apache-2.0, Artistic and CC0-1.0 (no version of them in training) are the
held-out set, the other licences the training set. Each run logs val/loss (its training precision) and
val/loss_bf16 (the same weights in BF16) at step 0, every --eval_every steps and at the end.

Defined before looking: FP8 "ends within a few percent of BF16" when its mean final val/loss is within
3% of BF16's; "lossless at this scale" when, besides, its mean is within the BF16 arm's seed spread
(max - min over seeds) of BF16's mean and its paired gap (fp8 - bf16, same seed) has |mean| below that
spread.

    python3 dev/lm_experiment.py                       # ./train_rl_cpu, 3 seeds, 2 runs at a time
    python3 dev/lm_experiment.py --seeds 1 --steps 20  # a smoke run
    python3 dev/lm_experiment.py --arms 'bf16,fp8 row,fp8 tensor'  # more arms; finished runs are reused

A run whose directory in --workdir holds its wall time and the same command is not run again.
"""
import argparse
import hashlib
import json
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LICENSES = "/usr/share/common-licenses"
HELD_OUT = ("Apache-2.0", "Artistic", "CC0-1.0")
ARMS = {  # name -> flags
    "bf16": ["--train_precision", "bf16"],
    "fp8 block fp32": ["--train_precision", "fp8", "--fp8_scaling", "block", "--fp8_scales", "fp32"],
    "fp8 block pow2": ["--train_precision", "fp8", "--fp8_scaling", "block", "--fp8_scales", "pow2"],
    "fp8 row": ["--train_precision", "fp8", "--fp8_scaling", "row"],
    "fp8 tensor": ["--train_precision", "fp8", "--fp8_scaling", "tensor"],
}
FEW_PERCENT = 0.03


def corpus(work):
    seen, docs = set(), []
    for name in sorted(os.listdir(LICENSES)):
        text = open(os.path.join(LICENSES, name), encoding="utf-8").read()
        digest = hashlib.sha256(text.encode()).hexdigest()
        if digest not in seen:  # GPL = GPL-3, LGPL = LGPL-3, GFDL = GFDL-1.3
            seen.add(digest)
            docs.append((name, text))
    train, val = os.path.join(work, "train.jsonl"), os.path.join(work, "val.jsonl")
    with open(train, "w") as ft, open(val, "w") as fv:
        for name, text in docs:
            (fv if name in HELD_OUT else ft).write(json.dumps({"text": text}) + "\n")
    held = [n for n, _ in docs if n in HELD_OUT]
    assert len(held) == len(HELD_OUT), "missing held-out licences in %s" % LICENSES
    return train, val, [n for n, _ in docs if n not in HELD_OUT], held


def command(binary, arm, seed, args, train, val, out):
    return [binary, "--mode", "cpt", "--init", "small", "--tokenizer", "bytes", "--data", train,
            "--eval_data", val, "--seq_len", str(args.seq_len), "--batch_seqs", str(args.batch_seqs),
            "--steps", str(args.steps), "--lr", str(args.lr), "--lr_schedule", "wsd",
            "--warmup_steps", str(args.steps // 10), "--decay_steps", str(args.steps // 5),
            "--eval_every", str(args.eval_every), "--seed", str(seed), "--threads", str(args.threads),
            "--out_dir", out] + ARMS[arm]


def run(cmd, out):
    done = os.path.join(out, "wall_s")  # a finished run (same command): its log is reused
    if os.path.exists(done) and open(os.path.join(out, "command")).read() == " ".join(cmd):
        wall = float(open(done).read())
    else:
        t0 = time.time()
        env = dict(os.environ, OMP_NUM_THREADS=cmd[cmd.index("--threads") + 1])
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
        wall = time.time() - t0
        open(os.path.join(out, "command"), "w").write(" ".join(cmd))
        open(done, "w").write("%.1f\n" % wall)
    rows = [json.loads(l) for l in open(os.path.join(out, "log.jsonl"))]
    evals = [(int(r["training/global_step"]) + (1 if "train/loss" in r else 0), r["val/loss"], r["val/loss_bf16"])
             for r in rows if "val/loss" in r]
    return evals, wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default=os.path.join(ROOT, "train_rl_cpu"))
    ap.add_argument("--arms", default="bf16,fp8 block fp32,fp8 block pow2", help="comma-separated: " + ", ".join(ARMS))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=250)
    ap.add_argument("--eval_every", type=int, default=50)
    ap.add_argument("--seq_len", type=int, default=128)
    ap.add_argument("--batch_seqs", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time")
    ap.add_argument("--workdir", default="/tmp/fp8rl_lm_experiment")
    args = ap.parse_args()
    arms = args.arms.split(",")
    for a in arms:
        if a not in ARMS:
            ap.error("unknown arm %r (one of: %s)" % (a, ", ".join(ARMS)))
    if "bf16" not in arms:
        ap.error("--arms needs bf16, the baseline")
    os.makedirs(args.workdir, exist_ok=True)
    train, val, train_docs, held = corpus(args.workdir)
    print("corpus: %s; train %d bytes (%s), held out %d bytes (%s)" % (LICENSES, os.path.getsize(train),
          " ".join(train_docs), os.path.getsize(val), " ".join(held)))
    seeds = list(range(1, args.seeds + 1))
    jobs = {}
    for arm in arms:
        for seed in seeds:
            out = os.path.join(args.workdir, "%s_seed%d" % (arm.replace(" ", "_"), seed))
            jobs[(arm, seed)] = command(args.binary, arm, seed, args, train, val, out), out
    print("one run: " + " ".join(("'%s'" % c if " " in c else c) for c in jobs[(arms[-1], 1)][0]))
    reused = sum(os.path.exists(os.path.join(out, "wall_s")) for _, out in jobs.values())
    t0 = time.time()
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = {k: pool.submit(run, *v) for k, v in jobs.items()}
        results = {k: f.result() for k, f in futures.items()}
    total = time.time() - t0
    mean = lambda xs: sum(xs) / len(xs)
    final = {k: v[0][-1][1] for k, v in results.items()}
    bf = [final[("bf16", s)] for s in seeds]
    spread = max(bf) - min(bf)
    print("\n%d steps x %d windows of %d+1 bytes, wsd lr %g (warmup %d, decay %d), %d seeds, %d runs (%d of them reused) "
          "%d at a time with %d thread(s) each: %.1f min wall" % (args.steps, args.batch_seqs, args.seq_len, args.lr,
          args.steps // 10, args.steps // 5, len(seeds), len(jobs), reused, args.jobs, args.threads, total / 60))
    print("val/loss at steps " + ", ".join(str(e[0]) for e in results[("bf16", 1)][0]) + " (mean over seeds)\n")
    print("| arm | start val/loss | val/loss curve | final val/loss mean (min..max) | fp8/bf16 - 1 (paired, min..max) "
          "| paired gap vs bf16 (min..max) | val/loss - val/loss_bf16 | wall min/run | within 3% | lossless |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for arm in arms:
        ev = [results[(arm, s)][0] for s in seeds]
        curve = [mean([e[i][1] for e in ev]) for i in range(len(ev[0]))]
        f = [final[(arm, s)] for s in seeds]
        gap = [final[(arm, s)] - final[("bf16", s)] for s in seeds]
        rel = [final[(arm, s)] / final[("bf16", s)] - 1 for s in seeds]
        qgap = [e[-1][1] - e[-1][2] for e in ev]
        wall = mean([results[(arm, s)][1] for s in seeds]) / 60
        within = abs(mean(f) / mean(bf) - 1) <= FEW_PERCENT
        lossless = within and abs(mean(f) - mean(bf)) <= spread and abs(mean(gap)) <= spread
        base = arm == "bf16"
        print("| %s | %.4f | %s | %.4f (%.4f..%.4f) | %s | %s | %+.5f | %.1f | %s | %s |" %
              (arm, mean([e[0][1] for e in ev]), " ".join("%.3f" % c for c in curve), mean(f), min(f), max(f),
               "-" if base else "%+.2f%% (%+.2f%%..%+.2f%%)" % (100 * mean(rel), 100 * min(rel), 100 * max(rel)),
               "-" if base else "%+.4f (%+.4f..%+.4f)" % (mean(gap), min(gap), max(gap)),
               mean(qgap), wall, "-" if base else ("yes" if within else "no"),
               "-" if base else ("yes" if lossless else "no")))
    print("\nbf16 seed spread (max - min of final val/loss): %.4f" % spread)
    with open(os.path.join(args.workdir, "results.json"), "w") as fo:
        json.dump({"%s|%d" % k: {"evals": v[0], "wall_s": v[1]} for k, v in results.items()}, fo)


if __name__ == "__main__":
    main()
