#!/usr/bin/env python3
"""Does a checkpoint written by train_rl_cpu load in HF transformers, and does it do the task?

usage: python3 dev/check_trainer_checkpoint.py RUN_DIR [--prompts N]

Loads RUN_DIR/latest (a HF directory: bf16 model.safetensors, config.json, tokenizer files) with
AutoModelForCausalLM and AutoTokenizer, checks the tokenizer is the task tokenizer (one token
per character, eos = <|endoftext|>), then decodes greedily with transformers' own generate() on
random prompts of the task (addition of 1..k-digit numbers) drawn here in Python, and prints transformers' accuracy next to the trainer's last logged greedy accuracy.
Both numbers come from different code (torch bf16 weights vs the trainer's fp32 masters), so
they agree closely but not necessarily exactly.
"""
import argparse
import json
import os
import random

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--prompts", type=int, default=200)
    ap.add_argument("--digits", type=int, default=2, help="the run's --task_size: operands of 1..digits digits")
    a = ap.parse_args()
    with open(os.path.join(a.run_dir, "latest")) as f:
        ckpt = os.path.join(a.run_dir, f.read().strip())
    tok = AutoTokenizer.from_pretrained(ckpt)
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    model.eval()
    print(f"loaded {ckpt}: {type(model).__name__}, {sum(p.numel() for p in model.parameters())} parameters, "
          f"vocab {len(tok)}, eos {tok.eos_token!r} = {tok.eos_token_id}")
    ids = tok("12+34=")["input_ids"]
    assert len(ids) == 6, f"task tokenizer should give one token per character, got {ids}"
    digits = a.digits
    rng = random.Random(12345)
    correct = 0
    for _ in range(a.prompts):
        x, y = (rng.randrange(10 ** rng.randint(1, digits)) for _ in range(2))
        prompt = f"{x}+{y}="
        inp = tok(prompt, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**inp, max_new_tokens=digits + 3, do_sample=False, eos_token_id=tok.eos_token_id,
                                 pad_token_id=tok.eos_token_id)
        text = tok.decode(out[0, inp["input_ids"].shape[1]:], skip_special_tokens=True).split("\n")[0].strip()
        correct += text == str(x + y).zfill(digits + 1)  # rl/tasks/tasks.h: sums zero-padded to digits + 1
    logged = None
    with open(os.path.join(a.run_dir, "log.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            for k, v in row.items():
                if k.endswith("/acc/greedy") and v is not None:
                    logged = v
    print(f"transformers greedy accuracy on {a.prompts} random {digits}-digit additions: {correct / a.prompts:.3f}; "
          f"trainer's last logged greedy eval accuracy: {logged}")


if __name__ == "__main__":
    main()
