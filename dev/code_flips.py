#!/usr/bin/env python3
"""Where FP8's ratio error comes from (issue 51): between the old and the new weights' FP8 copies,
which codes flip, and what that does, per granularity (block: 128x128 tiles, row: one scale per
output channel, tensor: one scale).

usage: python3 dev/code_flips.py MODEL_DIR [--lrs 3e-4 3e-5 3e-6] [--seed 1]
       python3 dev/code_flips.py MODEL_DIR --ratio [--lrs ...] [--out DIR] [--bin ./train_rl_cpu]

At the weights (the first form): for update sizes of an AdamW step (|θ' - θ| = lr per weight,
random signs), how much of the error of the FP8 weight change (Q(θ') - Q(θ)) - (θ' - θ) sits on
codes that did not flip (the drift FP8 never sees: the copy stays put) and how much on codes that
flipped (a whole E4M3 step where the weight moved a fraction of one).

At the log-ratio (--ratio): θ = MODEL_DIR (the add task's base model of dev/mechanism_experiment.py),
θ' = θ after one real training step of that experiment's base point (4 minibatch updates of the
FP8 pipeline at block scaling, 32 prompts x 16 samples) at each --lr, on the projection weights
only (embeddings and norms kept at θ). Over the response tokens of 512 completions sampled from θ
(temperature 1.5, FP8), with every log-prob from `train_rl_cpu --logprobs` (temperature 1.5) on
F32 checkpoints written here: the fp32 log-ratio (the drift) D = lp32(θ') - lp32(θ) and the FP8
log-ratio's error e = [lp8(θ') - lp8(θ)] - D. With θ* = θ' with the flipped codes reset to θ's
codes (every code θ's, at θ''s scales: written as code x scale_inv, which the binary quantizes
back to the same codes and scales), e splits exactly into
    e_jump = lp8(θ') - lp8(θ*) - D   the codes that flipped: their whole E4M3 steps (and the
                                     activation codes they flip downstream) against the drift
    e_stay = lp8(θ*) - lp8(θ)        the codes that stayed, read at the new scales: FP8's ratio
                                     when no code flips
and the drift splits by the weights that carry it: D_stay = lp32(θ') - lp32(θ + Δ·F) on the
weights whose codes stayed (F: the flipped ones), which FP8 never sees. A check per granularity:
θ' rebuilt from its own codes gives lp8(θ') to float rounding, which holds only if the quantizer
here groups the weights as the binary does.

The quantizer follows rl/numerics/fp8_block.h (scale = 448 / amax in float32, codes e4m3(x * scale)
rounded to nearest even, no power-of-two scales) on the projections the FP8 GEMMs read, fused as
cpu/model.h fuses them: [q|k|v], o, [gate|up], down per layer. numpy only.
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys

import numpy as np

from np_model import read_master, read_safetensors, write_safetensors

# The projections as the FP8 GEMMs read them (cpu/model.h): one quantized matrix per group.
FUSED = (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), ("self_attn.o_proj",),
         ("mlp.gate_proj", "mlp.up_proj"), ("mlp.down_proj",))
SCALINGS = ("block", "row", "tensor")


def fused(w):
    """[(names, matrix)] of every layer's fused projections in w."""
    layers = sorted({int(k.split(".")[2]) for k in w if k.startswith("model.layers.")})
    out = []
    for l in layers:
        for group in FUSED:
            names = [f"model.layers.{l}.{p}.weight" for p in group]
            out.append((names, np.concatenate([w[n] for n in names], axis=0).astype(np.float32)))
    return out


def unfuse(names, m, w):
    """Writes the rows of fused matrix m back into w's tensors names."""
    r = 0
    for n in names:
        w[n] = m[r:r + w[n].shape[0]]
        r += w[n].shape[0]


def e4m3(x):
    """Values of E4M3 nearest to x (float32 array, |x| <= 448), ties to even."""
    x = x.astype(np.float64)
    e = np.floor(np.log2(np.maximum(np.abs(x), 2.0 ** -9)))
    step = 2.0 ** (np.maximum(e, -6) - 3)  # 3 mantissa bits; subnormals below 2^-6 share step 2^-9
    return np.clip(np.round(x / step) * step, -448, 448)


def quantize(w, scaling):
    """Codes (as scaled E4M3 values) and per-element scales of W [N][K]."""
    w = w.astype(np.float32)
    if scaling == "tensor":
        amax = np.full(w.shape, np.abs(w).max(), dtype=np.float32)
    elif scaling == "row":
        amax = np.repeat(np.abs(w).max(axis=1, keepdims=True), w.shape[1], axis=1)
    else:
        amax = np.empty_like(w)
        for r in range(0, w.shape[0], 128):
            for c in range(0, w.shape[1], 128):
                amax[r:r + 128, c:c + 128] = np.abs(w[r:r + 128, c:c + 128]).max()
    scale = np.float32(448.0) / np.where(amax > 0, amax, np.float32(448.0))
    codes = e4m3(w * scale)
    return codes, scale


def codes_at(codes, scale):
    """The F32 weights that quantize to these codes at these scales: code x scale_inv."""
    return codes.astype(np.float32) * (np.float32(1.0) / scale)


def write_model(src, dst, w):
    shutil.copytree(src, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns("trainer_state.bin", "*.safetensors"))
    write_safetensors(os.path.join(dst, "model.safetensors"), w, "F32")
    return dst


def run(a, *args, stdin=None):
    return subprocess.run([a.bin, *args, "--threads", "1"], check=True, capture_output=True, text=True, input=stdin).stdout


def logprobs(a, model, seqs, precision, scaling="block"):
    out = run(a, "--model", model, "--logprobs", "-", "--precision", precision, "--fp8_scaling", scaling,
              "--temperature", "1.5", stdin="".join(json.dumps({"ids": s}) + "\n" for s, _ in seqs))
    lps = [json.loads(line)["logprobs"] for line in out.splitlines()]
    return np.concatenate([np.array(lp[p - 1:], dtype=np.float64) for lp, (_, p) in zip(lps, seqs)])


def ratio_split(a):
    os.makedirs(a.out, exist_ok=True)
    old, _ = read_safetensors(a.model + "/model.safetensors")
    # 512 completions of 1-digit sums from θ, as the rollout samples them (FP8, temperature 1.5)
    r = random.Random(a.seed)
    texts = [f"{r.randrange(10)}+{r.randrange(10)}=" for _ in range(32)]
    enc = run(a, "--encode", "-", "--tokenizer", a.model, stdin="".join(json.dumps({"text": t}) + "\n" for t in texts))
    prompts = [json.loads(line)["ids"] for line in enc.splitlines() for _ in range(16)]
    gen = run(a, "--model", a.model, "--prompts", "-", "--precision", "fp8", "--kv_cache", "fp8", "--temperature", "1.5",
              "--max_new_tokens", "3", "--seed", str(a.seed), stdin="".join(json.dumps({"ids": p}) + "\n" for p in prompts))
    seqs = [(p + json.loads(line)["ids"], len(p)) for p, line in zip(prompts, gen.splitlines())]
    tokens = sum(len(s) - p for s, p in seqs)
    print(f"{len(seqs)} completions, {tokens} response tokens; θ = {a.model}")
    print("| lr | scaling | codes flipped | rms drift D | rms FP8 error e | e / D | D_stay / D (missed) | "
          "FP8 change via flips / D (corr) | share of e²: e_jump | e_stay | cross | check max abs |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    base_old = write_model(a.model, os.path.join(a.out, "old"), old)
    lp32_old = logprobs(a, base_old, seqs, "fp32")
    for lr in a.lrs:
        run_dir = os.path.join(a.out, f"step_lr{lr:g}")
        run(a, "--model", a.model, "--task", "add", "--task_size", "1", "--max_new_tokens", "3", "--group_size", "16",
            "--batch_prompts", "32", "--minibatches", "4", "--lr", str(lr), "--temperature", "1.5", "--eval_every", "0",
            "--rollout_precision", "fp8", "--train_precision", "fp8", "--kv_cache", "fp8", "--fp8_scaling", "block",
            "--seed", str(a.seed), "--steps", "1", "--out_dir", run_dir)
        master = read_master(os.path.join(run_dir, "checkpoints", "step_000001"))
        new = dict(old)
        for names, _ in fused(old):
            for n in names:
                new[n] = master[n]
        lp32_new = logprobs(a, write_model(a.model, os.path.join(a.out, "new"), new), seqs, "fp32")
        drift = lp32_new - lp32_old
        for scaling in SCALINGS:
            lp8_old = logprobs(a, base_old, seqs, "fp8", scaling)
            lp8_new = logprobs(a, os.path.join(a.out, "new"), seqs, "fp8", scaling)
            partial, star, check = dict(old), dict(new), dict(new)  # θ + Δ·F, θ*, θ' from its codes
            flipped = total = 0
            for (names, m0), (_, m1) in zip(fused(old), fused(new)):
                c0, _ = quantize(m0, scaling)
                c1, s1 = quantize(m1, scaling)
                f = c1 != c0
                flipped += int(f.sum())
                total += f.size
                unfuse(names, np.where(f, m1, m0), partial)
                unfuse(names, codes_at(c0, s1), star)
                unfuse(names, codes_at(c1, s1), check)
            lp32_part = logprobs(a, write_model(a.model, os.path.join(a.out, "partial"), partial), seqs, "fp32")
            lp8_star = logprobs(a, write_model(a.model, os.path.join(a.out, "star"), star), seqs, "fp8", scaling)
            lp8_check = logprobs(a, write_model(a.model, os.path.join(a.out, "check"), check), seqs, "fp8", scaling)
            rms = lambda x: float(np.sqrt(np.mean(x ** 2)))  # noqa: E731
            e = (lp8_new - lp8_old) - drift
            jumps = lp8_new - lp8_star
            e_jump, e_stay = jumps - drift, lp8_star - lp8_old
            se = float((e ** 2).sum())
            print(f"| {lr:g} | {scaling} | {100 * flipped / total:.2f}% | {rms(drift):.3g} | {rms(e):.3g} | "
                  f"{rms(e) / rms(drift):.3g} | {rms(lp32_new - lp32_part) / rms(drift):.2f} | "
                  f"{rms(jumps) / rms(drift):.2f} ({np.corrcoef(jumps, drift)[0, 1]:.3f}) | "
                  f"{100 * (e_jump ** 2).sum() / se:.1f}% | {100 * (e_stay ** 2).sum() / se:.1f}% | "
                  f"{100 * 2 * (e_jump * e_stay).sum() / se:.1f}% | {np.abs(lp8_check - lp8_new).max():.1g} |", flush=True)

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--lrs", type=float, nargs="+", default=[3e-4, 3e-5, 3e-6])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--ratio", action="store_true", help="the split of the log-ratio's error (module docstring)")
    ap.add_argument("--out", default="runs/code_flips")
    ap.add_argument("--bin", default="./train_rl_cpu")
    a = ap.parse_args()
    a.bin = os.path.abspath(a.bin)
    if a.ratio:
        return ratio_split(a)
    w, _ = read_safetensors(a.model + "/model.safetensors")
    mats = [m for _, m in fused(w)]
    rng = np.random.default_rng(a.seed)
    print(f"{len(mats)} fused projection weights, {sum(m.size for m in mats)} values, mean |w| "
          f"{np.mean(np.concatenate([np.abs(m).ravel() for m in mats])):.3g}")
    print("| lr | scaling | codes flipped | mean E4M3 step / lr | error of the FP8 change, rms / rms drift | "
          "share of squared error on unchanged codes | on flipped codes |")
    print("|---|---|---|---|---|---|---|")
    for lr in a.lrs:
        deltas = [(lr * rng.choice([-1.0, 1.0], size=m.shape)).astype(np.float32) for m in mats]
        for scaling in SCALINGS:
            flipped = total = 0
            err_unch = err_flip = drift = 0.0
            steps = []
            for m, d in zip(mats, deltas):
                new = (m + d).astype(np.float32)
                c0, s0 = quantize(m, scaling)
                c1, s1 = quantize(new, scaling)
                dq = c1.astype(np.float64) / s1 - c0.astype(np.float64) / s0  # the FP8 copies' change
                true = new.astype(np.float64) - m
                err = dq - true
                f = c1 != c0
                flipped += int(f.sum())
                total += m.size
                err_unch += float((err[~f] ** 2).sum())
                err_flip += float((err[f] ** 2).sum())
                drift += float((true ** 2).sum())
                mag = np.abs(c0)
                steps.append((2.0 ** (np.floor(np.log2(np.maximum(mag, 2.0 ** -6))) - 3) / s0).ravel())
            se = err_unch + err_flip
            print(f"| {lr:g} | {scaling} | {100 * flipped / total:.3f}% | {np.mean(np.concatenate(steps)) / lr:.3g} | "
                  f"{np.sqrt(se / drift):.3g} | {100 * err_unch / se:.1f}% | {100 * err_flip / se:.1f}% |")


if __name__ == "__main__":
    sys.exit(main())
