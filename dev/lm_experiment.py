#!/usr/bin/env python3
"""InfiR2's comparison in miniature (docs/sft.md, results in docs/results.md): CPT of a fresh byte-level
`--init small` model on real English text, then SFT of each CPT model on 2-digit addition, BF16 against
FP8 (block scales with fp32 and with power-of-two scales; row and tensor with --arms), several seeds paired
by seed (the same init and data order in every arm; each arm's SFT starts from its own CPT checkpoint and
trains in the same precision).

The text: the licences every Debian machine has in /usr/share/common-licenses (identical files counted
once), split by document: Apache-2.0, Artistic and CC0-1.0 (no version of them in training) are the
held-out set, the other licences the training set. Each run logs val/loss (its training precision) and
val/loss_bf16 (the same weights in BF16) at step 0, every --eval_every steps and at the end.

The SFT task (--sft_steps > 0): "a+b=" -> the sum in 3 digits (the add task of rl/tasks/tasks.h at size 2:
a and b of 1-2 digits), prompt/completion rows; 4000 training rows and 200 held-out rows whose (a, b) is
not in training, drawn by Python's seeded random. val/loss is on the held-out rows; the task accuracy is
the greedy exact-match accuracy on them, measured by the RL binary's own eval (--task add --eval_data
--eval_only 1, which loads, evaluates and writes eval.jsonl without a training step; the results of
docs/results.md were measured by the earlier one step at --lr 0, the same weights) with generation in
BF16 and in the arm's precision.

Defined before looking: FP8 "ends within a few percent of BF16" when its mean final val/loss is within
3% of BF16's; "lossless at this scale" when, besides, its mean is within the BF16 arm's seed spread
(max - min over seeds) of BF16's mean and its paired gap (fp8 - bf16, same seed) has |mean| below that
spread.

    python3 dev/lm_experiment.py                       # ./train_rl_cpu, 3 seeds, 2 runs at a time
    python3 dev/lm_experiment.py --seeds 1 --steps 20  # a smoke run
    python3 dev/lm_experiment.py --arms 'bf16,fp8 row,fp8 tensor'  # more arms; finished runs are reused
    python3 dev/lm_experiment.py --sft_steps 0         # CPT only

A run whose directory in --workdir holds its wall time and the same command is not run again.
"""
import argparse
import hashlib
import json
import os
import random
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


def sft_data(work, n_train=4000, n_val=200):
    """2-digit addition rows (prompt "a+b=", the sum zero-padded to 3 digits), held-out pairs disjoint."""
    row = lambda a, b, key: json.dumps({"prompt": "%d+%d=" % (a, b), key: "%03d" % (a + b)}) + "\n"
    rng = random.Random(2)
    pairs = [(rng.randrange(100), rng.randrange(100)) for _ in range(n_train)]
    seen, val, rng = set(pairs), [], random.Random(99)
    while len(val) < n_val:
        ab = (rng.randrange(100), rng.randrange(100))
        if ab not in seen:
            seen.add(ab)
            val.append(ab)
    train_path, val_path = os.path.join(work, "sft_train.jsonl"), os.path.join(work, "sft_val.jsonl")
    with open(train_path, "w") as f:
        f.writelines(row(a, b, "completion") for a, b in pairs)
    with open(val_path, "w") as f:  # "answer": the RL eval's verifier reads it; SFT takes it as the completion
        f.writelines(row(a, b, "answer") for a, b in val)
    return train_path, val_path


def command(binary, arm, seed, args, train, val, out):
    return [binary, "--mode", "cpt", "--init", "small", "--tokenizer", "bytes", "--data", train,
            "--eval_data", val, "--seq_len", str(args.seq_len), "--batch_seqs", str(args.batch_seqs),
            "--steps", str(args.steps), "--lr", str(args.lr), "--lr_schedule", "wsd",
            "--warmup_steps", str(args.steps // 10), "--decay_steps", str(args.steps // 5),
            "--eval_every", str(args.eval_every), "--seed", str(seed), "--threads", str(args.threads),
            "--out_dir", out] + ARMS[arm]


def sft_command(binary, arm, seed, args, cpt_out, train, val, out):
    return [binary, "--mode", "sft", "--model", cpt_out, "--data", train, "--eval_data", val,
            "--batch_seqs", str(args.sft_batch_seqs), "--steps", str(args.sft_steps), "--lr", str(args.sft_lr),
            "--lr_schedule", "cosine", "--warmup_steps", str(args.sft_steps // 50),
            "--eval_every", str(args.sft_steps // 4), "--seed", str(seed), "--threads", str(args.threads),
            "--out_dir", out] + ARMS[arm]


def accuracy_command(binary, arm, args, sft_out, val, out, in_arm_precision):
    """The RL binary's greedy eval of the SFT model on the held-out rows (--eval_only: no training step)."""
    rollout = ARMS[arm][1] if in_arm_precision else "bf16"
    return [binary, "--model", sft_out, "--task", "add", "--task_size", "2", "--eval_data", val,
            "--eval_prompts", "200", "--eval_k", "0", "--max_new_tokens", "4", "--eval_only", "1",
            "--threads", str(args.threads), "--out_dir", out, "--rollout_precision", rollout] + ARMS[arm]


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


def greedy_accuracy(cmd, out, sft_out):
    """Reused only when both its command and the SFT run it measures (that run's command) are the same."""
    run_once, key = os.path.join(out, "wall_s"), " ".join(cmd) + "\nof: " + open(os.path.join(sft_out, "command")).read()
    if not (os.path.exists(run_once) and open(os.path.join(out, "command")).read() == key):
        env = dict(os.environ, OMP_NUM_THREADS=cmd[cmd.index("--threads") + 1])
        t0 = time.time()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
        open(os.path.join(out, "command"), "w").write(key)
        open(run_once, "w").write("%.1f\n" % (time.time() - t0))
    return json.loads(open(os.path.join(out, "eval.jsonl")).readline())["val-core/add/acc/greedy"]


def pipeline(args, arm, seed, data):
    """CPT, then (with --sft_steps) SFT from its checkpoint and the task accuracy: one arm and seed."""
    name = os.path.join(args.workdir, "%s_seed%d" % (arm.replace(" ", "_"), seed))
    res = {"cpt": run(command(args.binary, arm, seed, args, data["train"], data["val"], name), name)}
    if args.sft_steps > 0:
        sft = name + "_sft"
        res["sft"] = run(sft_command(args.binary, arm, seed, args, name, data["sft_train"], data["sft_val"], sft), sft)
        res["acc_bf16"] = greedy_accuracy(accuracy_command(args.binary, arm, args, sft, data["sft_val"], sft + "_acc_bf16", False),
                                          sft + "_acc_bf16", sft)
        res["acc_arm"] = greedy_accuracy(accuracy_command(args.binary, arm, args, sft, data["sft_val"], sft + "_acc_arm", True),
                                         sft + "_acc_arm", sft)
    return res


def table(title, arms, seeds, results, stage):
    """The stage's markdown table of final val/loss, paired gaps, quantization gap and wall time."""
    mean = lambda xs: sum(xs) / len(xs)
    final = {k: v[stage][0][-1][1] for k, v in results.items()}
    bf = [final[("bf16", s)] for s in seeds]
    spread = max(bf) - min(bf)
    print("\n%s: val/loss at steps %s (mean over seeds)\n" % (title, ", ".join(str(e[0]) for e in results[("bf16", seeds[0])][stage][0])))
    acc = stage == "sft"
    print("| arm | start val/loss | val/loss curve | final val/loss mean (min..max) | fp8/bf16 - 1 (paired, min..max) "
          "| paired gap vs bf16 (min..max) | val/loss - val/loss_bf16 | wall min/run | within 3% | lossless |" +
          (" accuracy, bf16 generation (min..max) | accuracy, arm's generation (min..max) | paired accuracy gap (min..max) |" if acc else ""))
    print("|---|---|---|---|---|---|---|---|---|---|" + ("---|---|---|" if acc else ""))
    for arm in arms:
        ev = [results[(arm, s)][stage][0] for s in seeds]
        curve = [mean([e[i][1] for e in ev]) for i in range(len(ev[0]))]
        f = [final[(arm, s)] for s in seeds]
        gap = [final[(arm, s)] - final[("bf16", s)] for s in seeds]
        rel = [final[(arm, s)] / final[("bf16", s)] - 1 for s in seeds]
        qgap = [e[-1][1] - e[-1][2] for e in ev]
        wall = mean([results[(arm, s)][stage][1] for s in seeds]) / 60
        within = abs(mean(f) / mean(bf) - 1) <= FEW_PERCENT
        lossless = within and abs(mean(f) - mean(bf)) <= spread and abs(mean(gap)) <= spread
        base = arm == "bf16"
        line = "| %s | %.4f | %s | %.4f (%.4f..%.4f) | %s | %s | %+.5f | %.1f | %s | %s |" % (
            arm, mean([e[0][1] for e in ev]), " ".join("%.3f" % c for c in curve), mean(f), min(f), max(f),
            "-" if base else "%+.2f%% (%+.2f%%..%+.2f%%)" % (100 * mean(rel), 100 * min(rel), 100 * max(rel)),
            "-" if base else "%+.4f (%+.4f..%+.4f)" % (mean(gap), min(gap), max(gap)),
            mean(qgap), wall, "-" if base else ("yes" if within else "no"), "-" if base else ("yes" if lossless else "no"))
        if acc:
            a = [results[(arm, s)]["acc_bf16"] for s in seeds]
            b = [results[(arm, s)]["acc_arm"] for s in seeds]
            d = [results[(arm, s)]["acc_bf16"] - results[("bf16", s)]["acc_bf16"] for s in seeds]
            line += " %.3f (%.3f..%.3f) | %.3f (%.3f..%.3f) | %s |" % (
                mean(a), min(a), max(a), mean(b), min(b), max(b), "-" if base else "%+.3f (%+.3f..%+.3f)" % (mean(d), min(d), max(d)))
        print(line)
    print("\nbf16 seed spread (max - min of final val/loss): %.4f" % spread)
    print("per seed, final val/loss: " + "; ".join("%s %s" % (arm, ", ".join("%.4f" % final[(arm, s)] for s in seeds)) for arm in arms))
    if acc:
        print("per seed, accuracy (bf16 generation): " + "; ".join(
            "%s %s" % (arm, ", ".join("%.3f" % results[(arm, s)]["acc_bf16"] for s in seeds)) for arm in arms))


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
    ap.add_argument("--sft_steps", type=int, default=1000, help="SFT steps after CPT (0 = CPT only)")
    ap.add_argument("--sft_batch_seqs", type=int, default=32)
    ap.add_argument("--sft_lr", type=float, default=2e-3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=2, help="pipelines (CPT, SFT, accuracy of one arm and seed) at a time")
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
    data = {"train": train, "val": val}
    data["sft_train"], data["sft_val"] = sft_data(args.workdir)
    print("corpus: %s; train %d bytes (%s), held out %d bytes (%s)" % (LICENSES, os.path.getsize(train),
          " ".join(train_docs), os.path.getsize(val), " ".join(held)))
    seeds = list(range(1, args.seeds + 1))
    example = os.path.join(args.workdir, "%s_seed1" % arms[-1].replace(" ", "_"))
    show = lambda cmd: " ".join(("'%s'" % c if " " in c else c) for c in cmd)
    print("one CPT run: " + show(command(args.binary, arms[-1], 1, args, train, val, example)))
    if args.sft_steps > 0:
        print("its SFT run: " + show(sft_command(args.binary, arms[-1], 1, args, example, data["sft_train"], data["sft_val"], example + "_sft")))
        print("its accuracy: " + show(accuracy_command(args.binary, arms[-1], args, example + "_sft", data["sft_val"],
                                                        example + "_sft_acc_arm", True)))
    t0 = time.time()
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = {(arm, s): pool.submit(pipeline, args, arm, s, data) for arm in arms for s in seeds}
        results = {k: f.result() for k, f in futures.items()}
    total = time.time() - t0
    print("\n%d arms x %d seeds, %d pipeline(s) at a time with %d thread(s) each: %.1f min wall (finished runs reused)" %
          (len(arms), len(seeds), args.jobs, args.threads, total / 60))
    table("CPT: %d steps x %d windows of %d+1 bytes, wsd lr %g (warmup %d, decay %d)" % (
        args.steps, args.batch_seqs, args.seq_len, args.lr, args.steps // 10, args.steps // 5), arms, seeds, results, "cpt")
    if args.sft_steps > 0:
        table("SFT: %d steps x %d rows of 2-digit addition, cosine lr %g (warmup %d)" % (
            args.sft_steps, args.sft_batch_seqs, args.sft_lr, args.sft_steps // 50), arms, seeds, results, "sft")
    with open(os.path.join(args.workdir, "results.json"), "w") as fo:
        json.dump({"%s|%d" % k: v for k, v in results.items()}, fo)


if __name__ == "__main__":
    main()
