#!/usr/bin/env python3
"""Where FP8's ratio error comes from, at the weights (issue 51): between the old and the new
weights' FP8 copies, which codes flip, and how much of the error of the FP8 weight change
(Q(θ') - Q(θ)) - (θ' - θ) sits on codes that did not flip (the drift FP8 never sees: the copy
stays put) and how much on codes that flipped (a whole E4M3 step where the weight moved a
fraction of one), per granularity (block: 128x128 tiles, row: one scale per output channel,
tensor: one scale), for update sizes of an AdamW step (|θ' - θ| = lr per weight, random signs).

usage: python3 dev/code_flips.py MODEL_DIR [--lrs 3e-4 3e-5 3e-6] [--seed 1]

The quantizer follows rl/numerics/fp8_block.h (scale = 448 / amax in float32, codes e4m3(x * scale)
rounded to nearest even, no power-of-two scales); the projection weights of every layer (q, k, v,
o, gate, up, down) are the ones the FP8 GEMMs read. numpy only (the bf16 safetensors are read by hand).
"""
import argparse
import json
import struct
import sys

import numpy as np

PROJ = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
        "mlp.down_proj")


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        raw = data[a:b]
        if t["dtype"] == "BF16":
            x = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif t["dtype"] == "F32":
            x = np.frombuffer(raw, dtype=np.float32)
        else:
            continue
        out[name] = x.reshape(t["shape"]).astype(np.float32)
    return out


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--lrs", type=float, nargs="+", default=[3e-4, 3e-5, 3e-6])
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    w = read_safetensors(a.model + "/model.safetensors")
    mats = [v for k, v in sorted(w.items()) if any(p + ".weight" in k for p in PROJ)]
    rng = np.random.default_rng(a.seed)
    print(f"{len(mats)} projection weights, {sum(m.size for m in mats)} values, mean |w| "
          f"{np.mean(np.concatenate([np.abs(m).ravel() for m in mats])):.3g}")
    print("| lr | scaling | codes flipped | mean E4M3 step / lr | error of the FP8 change, rms / rms drift | "
          "share of squared error on unchanged codes | on flipped codes |")
    print("|---|---|---|---|---|---|---|")
    for lr in a.lrs:
        deltas = [(lr * rng.choice([-1.0, 1.0], size=m.shape)).astype(np.float32) for m in mats]
        for scaling in ("block", "row", "tensor"):
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
