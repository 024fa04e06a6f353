#!/usr/bin/env python3
"""Writes test/fixtures/loss/*.json: the RL token losses, aggregations, KL estimators, IS weights,
loss statistics and GRPO/RLOO advantages computed independently in torch (float64, autograd),
following verl's formulas as spec-rl.md documents them (core_algos.compute_policy_loss_vanilla,
agg_loss, kl_penalty, rollout_corr_helper, compute_grpo_outcome_advantage).

Inputs are float32 values (so the C++ float math sees exactly the same numbers) and include
extreme log-ratios (beyond the ±20 clamp), zero advantages and all-masked sequences.
Rerun: python3 dev/make_loss_fixtures.py
"""
import json
import os

import numpy as np
import torch

torch.manual_seed(0)
rng = np.random.default_rng(1234)
B, T = 8, 24


def f32(x):
    return np.asarray(x, dtype=np.float32)


def make_inputs():
    lens = rng.integers(1, T + 1, size=B)
    lens[2] = 0                      # an all-masked sequence
    lens[5] = T
    mask = (np.arange(T)[None, :] < lens[:, None]).astype(np.uint8)
    old = f32(-rng.exponential(1.5, size=(B, T)))
    delta = rng.normal(0.0, 0.25, size=(B, T))
    delta[rng.random((B, T)) < 0.05] = rng.choice([-30.0, -21.0, 21.0, 30.0, 2.0, -3.0])   # extreme ratios
    logp = f32(old + delta)
    ref = f32(old + rng.normal(0.0, 0.3, size=(B, T)))
    ref[0, :3] = f32(old[0, :3] + np.array([25.0, -25.0, 15.0]))   # k3 input and output clamps
    roll = f32(old + rng.normal(0.0, 0.15, size=(B, T)))
    roll[1, :2] = f32(old[1, :2] - np.array([2.0, -2.0]))          # rho beyond the cap, and tiny
    adv_seq = rng.normal(0.0, 1.0, size=B)
    adv_seq[3] = 0.0                                                # zero advantage
    adv = f32(np.repeat(adv_seq[:, None], T, axis=1))
    adv[4, ::3] = 0.0
    ent = f32(rng.exponential(1.0, size=(B, T)))
    return dict(mask=mask, old=old, logp=logp, ref=ref, roll=roll, adv=adv, ent=ent)


def t64(x):
    return torch.tensor(np.asarray(x, dtype=np.float64), dtype=torch.float64)


def is_weights(old, roll, mask, mode, cap):
    log_ratio = old - roll
    if mode == "off":
        return torch.ones_like(old) * mask
    if mode in ("token-tis", "token-mis"):
        rho = torch.exp(torch.clamp(log_ratio, -20.0, 20.0))
        w = torch.clamp(rho, max=cap) if mode == "token-tis" else rho * (rho <= cap)
        return w * mask
    s = torch.clamp((log_ratio * mask).sum(-1, keepdim=True), -20.0, 20.0)
    rho = torch.exp(s).expand_as(old)
    w = torch.clamp(rho, max=cap) if mode == "seq-tis" else rho * (rho <= cap)
    return w * mask


def kl_penalty(logp, ref, kind):
    if kind == "k1":
        return logp - ref
    if kind == "abs":
        return (logp - ref).abs()
    if kind == "k2":
        return 0.5 * (logp - ref).square()
    kl = torch.clamp(ref - logp, min=-20.0, max=20.0)
    return torch.clamp(torch.exp(kl) - kl - 1, min=-10.0, max=10.0)


def agg(loss, mask, mode, horizon):
    n_tok = mask.sum()
    seq_len = mask.sum(-1)
    n_seq = (seq_len > 0).sum()
    if n_tok == 0:
        return (loss * mask).sum() * 0.0
    if mode == "token-mean":
        return (loss * mask).sum() / n_tok
    if mode == "token-sum":
        return (loss * mask).sum()
    if mode == "seq-mean-token-sum":
        return (loss * mask).sum() / n_seq
    if mode == "seq-mean-token-mean":
        per_seq = (loss * mask).sum(-1) / torch.clamp(seq_len, min=1)
        return per_seq.sum() / n_seq
    return (loss * mask).sum() / (n_seq * horizon)


def case(inp, cfg):
    mask = t64(inp["mask"])
    logp = t64(inp["logp"]).requires_grad_(True)
    ent = t64(inp["ent"]).requires_grad_(True)
    old, ref, roll, adv = t64(inp["old"]), t64(inp["ref"]), t64(inp["roll"]), t64(inp["adv"])
    low, high, c = cfg["low"], cfg["high"], cfg["dual_clip"]
    w = is_weights(old, roll, mask, cfg["is_mode"], cfg["is_cap"])

    neg_kl = torch.clamp(logp - old, min=-20.0, max=20.0)
    ratio = torch.exp(neg_kl)
    l1 = -adv * ratio
    l2 = -adv * torch.clamp(ratio, low, high)
    lc = torch.maximum(l1, l2)
    if c > 0:
        l3 = -adv * c
        pg = torch.where(adv < 0, torch.min(l3, lc), lc)
        lower = ((lc > l3) & (adv < 0)).double()
    else:
        pg = lc
        lower = torch.zeros_like(lc)
    pg_w = pg * w
    mode, horizon = cfg["agg"], cfg["horizon"]
    pg_loss = agg(pg_w, mask, mode, horizon)
    kl = kl_penalty(logp, ref, cfg["kl"]) if cfg["kl_coef"] != 0 else torch.zeros_like(logp)
    kl_loss = agg(kl, mask, mode, horizon)
    ent_loss = agg(ent, mask, mode, horizon)
    loss = pg_loss + cfg["kl_coef"] * kl_loss - cfg["entropy_coef"] * ent_loss
    loss.backward()

    def masked_mean(x):
        n = mask.sum()
        return float((x * mask).sum() / n) if n > 0 else 0.0

    valid = mask > 0
    x = old - roll
    rho = torch.exp(torch.clamp(x, -20.0, 20.0))
    cap = cfg["is_cap"]
    wv = w[valid]
    pdiff = (torch.exp(old) - torch.exp(roll)).abs()
    stats = {
        "ratio_mean": masked_mean(ratio.detach()),
        "ratio_min": float(ratio.detach()[valid].min()),
        "ratio_max": float(ratio.detach()[valid].max()),
        "entropy_mean": masked_mean(ent.detach()),
        "rollout_corr/kl": masked_mean(roll - old),
        "rollout_corr/k3_kl": masked_mean(torch.exp(torch.clamp(x, -20.0, 20.0)) - torch.clamp(x, -20.0, 20.0) - 1),
        "rollout_corr/logprob_abs_diff": masked_mean(x.abs()),
        "rollout_corr/logprob_abs_diff_max": float(x.abs()[valid].max()),
        "rollout_corr/token_mult_prob_error": masked_mean(torch.exp(x.abs())),
        "rollout_corr/rollout_is_mean": float(wv.mean()),
        "rollout_corr/rollout_is_std": float(wv.std(unbiased=False)),
        "rollout_corr/rollout_is_min": float(wv.min()),
        "rollout_corr/rollout_is_max": float(wv.max()),
        "rollout_corr/rollout_is_eff_sample_size": float(1.0 / ((wv / wv.mean()) ** 2).mean()),
        "rollout_corr/rollout_is_ratio_fraction_high": masked_mean((rho > cap).double()),
        "rollout_corr/rollout_is_ratio_fraction_low": masked_mean((rho < 1.0 / cap).double()),
        "rollout_corr/chi2_token": masked_mean(rho ** 2) - 1.0,
        "training/rollout_probs_diff_mean": masked_mean(pdiff),
        "training/rollout_probs_diff_max": float(pdiff[valid].max()),
        "training/rollout_probs_diff_std": float(pdiff[valid].std(unbiased=False)),
        "pg_clipfrac": masked_mean((l2 > l1).double()),
        "pg_clipfrac_lower": masked_mean(lower),
        "pg_clipfrac_low": masked_mean(((adv < 0) & (ratio < low)).double()),
        "pg_clipfrac_high": masked_mean(((adv > 0) & (ratio > high)).double()),
        "ppo_kl": masked_mean(-neg_kl.detach()),
    }
    return {
        "config": cfg,
        "is_weight": (w.numpy().astype(np.float64)).tolist(),
        "loss": loss.item(), "pg_loss": pg_loss.item(), "kl_loss": kl_loss.item(), "entropy": ent_loss.item(),
        "grad_logp": logp.grad.numpy().tolist(), "grad_entropy": ent.grad.numpy().tolist(),
        "stats": stats,
    }


def bounds(eps_low, eps_high):
    return float(np.float32(1.0) - np.float32(eps_low)), float(np.float32(1.0) + np.float32(eps_high))


def configs():
    out = []
    aggs = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
    kls = ["k1", "abs", "k2", "k3"]
    is_modes = ["off", "token-tis", "token-mis", "seq-tis", "seq-mis"]
    for k, mode in enumerate(aggs):
        low, high = bounds(0.2, 0.28 if k % 2 else 0.24)
        out.append(dict(agg=mode, horizon=float(T + 8), low=low, high=high, dual_clip=[3.0, 0.0, 10.0][k % 3],
                        kl=kls[k % 4], kl_coef=[0.0, 0.001, 0.1][k % 3], entropy_coef=[0.0, 0.01][k % 2],
                        is_mode=is_modes[k % 5], is_cap=2.0))
    for k, kl in enumerate(kls):
        out.append(dict(agg="token-mean", horizon=float(T), low=bounds(0.2, 0.28)[0], high=bounds(0.2, 0.28)[1],
                        dual_clip=3.0, kl=kl, kl_coef=0.5, entropy_coef=0.0, is_mode=is_modes[(k + 1) % 5],
                        is_cap=[2.0, 1.5, 3.0, 2.0][k]))
    for k, mode in enumerate(is_modes):
        low, high = bounds(0.4, 0.6)   # calibrated-style bounds 0.6 / 1.6
        out.append(dict(agg=aggs[k], horizon=float(T), low=low, high=high, dual_clip=1.5, kl="k3", kl_coef=0.0,
                        entropy_coef=0.05, is_mode=mode, is_cap=2.0))
    return out


def advantages():
    groups = [[0.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.5, -1.0, 2.0, 0.25, 0.0, 1.0, -1.0, 3.0], [1.0, -1.0]]
    out = []
    for r in groups:
        t = t64(r)
        out.append({
            "rewards": r,
            "grpo": ((t - t.mean()) / (t.std() + 1e-6)).tolist(),
            "grpo_population_std": ((t - t.mean()) / (t.std(unbiased=False) + 1e-6)).tolist(),
            "drgrpo": (t - t.mean()).tolist(),
            "rloo": (t * len(r) / (len(r) - 1) - t.mean() * len(r) / (len(r) - 1)).tolist(),
        })
    return out


def main():
    inp = make_inputs()
    out_dir = os.path.join("test", "fixtures", "loss")
    os.makedirs(out_dir, exist_ok=True)
    doc = {
        "B": B, "T": T,
        "inputs": {k: np.asarray(v).astype(np.float64).tolist() for k, v in inp.items()},
        "cases": [case(inp, cfg) for cfg in configs()],
        "advantages": advantages(),
    }
    path = os.path.join(out_dir, "token_losses.json")
    with open(path, "w") as f:
        json.dump(doc, f)
    print("%s: %d cases, %d bytes" % (path, len(doc["cases"]), os.path.getsize(path)))


if __name__ == "__main__":
    main()
