#!/usr/bin/env python3
"""Expected samples for rl/numerics/sampling.h from HF transformers' own warpers and torch.

For each case (float32 logits, temperature, top_k, top_p) the final distribution is what HF's
TemperatureLogitsWarper -> TopKLogitsWarper -> TopPLogitsWarper (the order `generate` applies them)
leave, softmaxed; greedy (temperature 0) is torch.argmax, HF's greedy pick. A uniform u picks the
token by inverse CDF over ids in ascending order (the first token whose running sum exceeds u; in
float64). Expected per draw: the token, log_softmax of the warped scores at it (the sampled
distribution's log-prob; 0 for greedy), and log_softmax(logits / T) at it (T = 1 for greedy).

Cases whose outcome would hinge on rounding are redrawn: a top-p cumulative sum within 2e-5 of
the cut, or a u within 1e-5 of a CDF step. Ties in top-p order are avoided (HF's sort leaves their
order unspecified); top-k and greedy cases with tied logits are included on purpose.

Writes test/fixtures/sampling/cases.jsonl, one case per line:
  {"logits": [...], "temperature": T, "top_k": k, "top_p": p,
   "draws": [{"u": u, "token": i, "logprob": lp, "logprob_full": lpf}, ...]}
Run from the repository root: python3 dev/make_sampling_fixtures.py
"""
import json

import numpy as np
import torch
from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                    TopPLogitsWarper)

rng = np.random.default_rng(20261129)


def warp(logits, temperature, top_k, top_p):
    scores = logits.clone()[None, :]
    ids = torch.zeros((1, 1), dtype=torch.long)
    scores = TemperatureLogitsWarper(temperature)(ids, scores)
    if 0 < top_k < logits.numel():
        scores = TopKLogitsWarper(top_k)(ids, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(ids, scores)
    return scores[0]


def top_p_margin(logits, temperature, top_k, top_p):
    """Distance of the closest cumulative sum to HF's cut 1 - top_p (in float64)."""
    if top_p >= 1.0:
        return 1.0
    scores = logits / temperature
    if 0 < top_k < logits.numel():
        scores = TopKLogitsWarper(top_k)(None, scores[None, :])[0]
    probs = torch.sort(scores.double()).values.softmax(-1).cumsum(-1)
    return float((probs - (1 - top_p)).abs().min())


def f32(x):
    return str(np.float32(x))


def make_case(n, scale, temperature, top_k, top_p, ties, draws=6):
    while True:
        if ties:
            logits = torch.tensor(rng.integers(0, 4, n).astype(np.float32) * scale)
        else:
            logits = torch.tensor((rng.standard_normal(n) * scale).astype(np.float32))
        if temperature == 0.0 or top_p_margin(logits, temperature, top_k, top_p) > 2e-5:
            break
    out = []
    if temperature == 0.0:
        token = int(torch.argmax(logits))
        full = float(torch.log_softmax(logits.double(), -1)[token])
        out.append({"u": 0.5, "token": token, "logprob": 0.0, "logprob_full": full})
    else:
        warped = warp(logits, temperature, top_k, top_p).double()
        probs = torch.softmax(warped, -1)
        cdf = torch.cumsum(probs, -1)
        logp = torch.log_softmax(warped, -1)
        full = torch.log_softmax((logits / temperature).double(), -1)
        while len(out) < draws:
            u = float(np.float32(rng.integers(0, 1 << 24) / 16777216.0))
            if float((cdf - u).abs().min()) < 1e-5:
                continue
            token = int(torch.searchsorted(cdf, torch.tensor([u], dtype=torch.float64), right=True)[0])
            token = min(token, n - 1)
            while probs[token] == 0:  # a zero-probability id after the last kept one
                token -= 1
            out.append({"u": u, "token": token, "logprob": float(logp[token]),
                        "logprob_full": float(full[token])})
    return ("{\"logits\": [" + ", ".join(f32(x) for x in logits.tolist()) + "], "
            f"\"temperature\": {f32(temperature)}, \"top_k\": {top_k}, \"top_p\": {f32(top_p)}, "
            f"\"draws\": {json.dumps(out)}}}")


def main():
    lines = []
    for n in [1, 2, 5, 17, 100, 1000]:
        for temperature in [1.0, 0.7, 1.6]:
            for top_k, top_p in [(0, 1.0), (1, 1.0), (5, 1.0), (0, 0.9), (0, 0.5), (20, 0.8), (3, 0.3)]:
                lines.append(make_case(n, 3.0 if n > 17 else 1.5, temperature, top_k, top_p, ties=False))
    for n in [3, 50, 1000]:  # greedy
        lines.append(make_case(n, 2.0, 0.0, 0, 1.0, ties=False))
    lines.append(make_case(40, 1.0, 0.0, 0, 1.0, ties=True))  # greedy on ties: lowest id
    for top_k in [1, 3, 10]:  # top-k keeps every token tied with the k-th largest
        lines.append(make_case(60, 1.0, 1.0, top_k, 1.0, ties=True))
    for top_p in [1.0, 0.95, 0.6]:  # large vocabulary, flat and peaked
        lines.append(make_case(2000, 1.0, 1.0, 0, top_p, ties=False))
        lines.append(make_case(2000, 6.0, 0.8, 50, top_p, ties=False))
    with open("test/fixtures/sampling/cases.jsonl", "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
