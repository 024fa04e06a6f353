#!/usr/bin/env python3
"""Fixtures for the trainer's optimizer tests, from torch (an independent reference):
torch.optim.AdamW over a few steps, and torch.nn.utils.clip_grad_norm_.
Writes test/fixtures/trainer/adamw.json. Rerun: python3 dev/make_trainer_fixtures.py"""
import json, os
import torch

torch.manual_seed(0)
n = 37
w = torch.randn(n, dtype=torch.float32)
grads = [torch.randn(n, dtype=torch.float32) * s for s in (1.0, 3.0, 0.1, 2.0)]
cfg = dict(lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
p = torch.nn.Parameter(w.clone())
opt = torch.optim.AdamW([p], lr=cfg["lr"], betas=cfg["betas"], eps=cfg["eps"], weight_decay=cfg["weight_decay"], foreach=False)
lrs = [0.01, 0.005, 0.02, 0.01]
steps = []
for g, lr in zip(grads, lrs):
    for group in opt.param_groups:
        group["lr"] = lr
    p.grad = g.clone()
    clipped = torch.nn.Parameter(torch.zeros(n))
    clipped.grad = g.clone()
    norm = torch.nn.utils.clip_grad_norm_([clipped], max_norm=1.5)
    opt.step()
    steps.append(dict(grad=g.tolist(), lr=lr, w_after=p.detach().tolist(), norm=float(norm),
                      clipped_grad=clipped.grad.tolist()))
out = dict(source="torch %s torch.optim.AdamW(foreach=False), clip_grad_norm_(max_norm=1.5)" % torch.__version__,
           w0=w.tolist(), beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, max_norm=1.5, steps=steps)
path = os.path.join(os.path.dirname(__file__), "..", "test", "fixtures", "trainer", "adamw.json")
with open(path, "w") as f:
    json.dump(out, f)
print("wrote", path)
