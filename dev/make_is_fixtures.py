#!/usr/bin/env python3
"""Writes test/fixtures/loss/is_corrections.json: the IcePop and geometric-mask rollout-correction
weights and rollout_corr/rollout_rs_masked_fraction in float64, from the published definitions
(verl, verl/trainer/ppo/rollout_corr_helper.py, as of its `rollout_corr` rework):

  log_ratio = old_log_prob - rollout_log_prob, exponentiated after a clamp to ±SAFETY_BOUND = 20.
  IcePop   = compute_rollout_rejection_mask(rollout_rs="token", threshold=hi, threshold_lower=lo):
             token kept when lo <= exp(clamp(log_ratio)) <= hi; its weight is the token IS weight
             exp(clamp(log_ratio)) (the truncation at hi of compute_rollout_correction_weights does
             nothing on kept tokens), 0 when rejected.
  geo-mask = compute_rollout_rejection_mask(rollout_rs="geometric", threshold=C, lower default 1/C):
             the sequence is kept when 1/C <= exp(clamp(masked_mean(log_ratio))) <= C; kept tokens take
             compute_rollout_correction_weights(rollout_is="token", threshold=C) = min(exp(clamp), C).
  rollout_rs_masked_fraction = masked_mean(1 - mask, response_mask) over the whole batch.

Pure Python: its floats are IEEE float64, and inputs are rounded to float32 (what the C++ reads).
No value lies within 1e-6 (relative) of a bound, so float rounding cannot flip a decision.
Rerun: python3 dev/make_is_fixtures.py
"""
import json
import math
import os
import random
import struct

SAFETY_BOUND = 20.0
B, T = 10, 32


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def clamp(x):
    return min(max(x, -SAFETY_BOUND), SAFETY_BOUND)


def make_inputs(rng):
    lens = [rng.randint(1, T) for _ in range(B)]
    lens[2], lens[5], lens[7] = 0, T, T          # an all-masked sequence, two full-length ones
    drift = [0.0] * B
    drift[3], drift[4], drift[6] = 0.9, -0.8, 0.02  # geometric means outside [1/2, 2], and near 1
    old, roll, mask = [], [], []
    for i in range(B):
        for t in range(T):
            o = f32(-rng.expovariate(1 / 1.5))
            x = drift[i] + rng.gauss(0.0, 0.3)
            if i == 7:
                x = 30.0 if t % 2 else 25.0          # beyond the ±20 clamp, token and sequence
            if i == 1 and t < 3:
                x = [-25.0, 1.5, -1.2][t]
            old.append(o)
            roll.append(f32(o - x))
            mask.append(1 if t < lens[i] else 0)
    return old, roll, mask


def icepop(old, roll, mask, lo, hi):
    w = []
    for o, r, m in zip(old, roll, mask):
        rho = math.exp(clamp(o - r))
        if m:
            assert abs(rho - lo) > 1e-6 * lo and abs(rho - hi) > 1e-6 * hi, "a ratio sits on a bound"
        w.append(rho if m and lo <= rho <= hi else 0.0)
    return w


def geo_mask(old, roll, mask, cap):
    w = []
    for i in range(B):
        s = slice(i * T, (i + 1) * T)
        lr = [o - r for o, r in zip(old[s], roll[s])]
        ms = mask[s]
        n = sum(ms)
        kept = True
        if n:
            acc = 0.0
            for x, m in zip(lr, ms):   # left-to-right, as the C++ sums
                if m:
                    acc += x
            g = math.exp(clamp(acc / n))
            assert abs(g - cap) > 1e-6 * cap and abs(g - 1 / cap) > 1e-6 / cap, "a sequence sits on a bound"
            kept = 1 / cap <= g <= cap
        w += [min(math.exp(clamp(x)), cap) if m and kept else 0.0 for x, m in zip(lr, ms)]
    return w


def masked_fraction(w, mask):
    valid = sum(mask)
    return sum(1 for x, m in zip(w, mask) if m and x == 0.0) / valid


def main():
    rng = random.Random(60)
    old, roll, mask = make_inputs(rng)
    cases = []
    for lo, hi in [(0.5, 2.0), (0.8, 1.25), (0.0, 5.0), (0.5, 5.0)]:
        w = icepop(old, roll, mask, lo, hi)
        cases.append(dict(mode="icepop", floor=lo, cap=hi, is_weight=w, rollout_rs_masked_fraction=masked_fraction(w, mask)))
    for cap in [2.0, 1.5, 1.05]:
        w = geo_mask(old, roll, mask, cap)
        cases.append(dict(mode="geo-mask", floor=0.0, cap=cap, is_weight=w, rollout_rs_masked_fraction=masked_fraction(w, mask)))
    doc = dict(source="dev/make_is_fixtures.py (float64, verl rollout_corr_helper definitions)", B=B, T=T,
               inputs=dict(old=old, roll=roll, mask=mask), cases=cases)
    out = os.path.join(os.path.dirname(__file__), "..", "test", "fixtures", "loss", "is_corrections.json")
    with open(out, "w") as f:
        json.dump(doc, f, indent=None, separators=(",", ":"))
        f.write("\n")
    for c in cases:
        print(c["mode"], c["floor"], c["cap"], "masked fraction %.4f" % c["rollout_rs_masked_fraction"])


if __name__ == "__main__":
    main()
