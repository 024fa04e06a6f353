#!/usr/bin/env python3
"""Checks that checkpoints written by fp8rl (rl/model/weights.h save_hf) load in python safetensors and
HF transformers, and equal their source rounded to bf16.

For each tiny fixture model it builds dev/resave_model.cpp, writes the model back (as a single file,
sharded with an index, and with config.json generated from fp8rl's parsed fields instead of copied,
as for a model made from scratch), then:
  * opens every file with safetensors.safe_open (metadata format "pt", every tensor bf16),
  * loads the directory with transformers AutoModelForCausalLM.from_pretrained,
  * compares every parameter to the source model's parameter cast to bf16 (must be bit-identical),
  * compares logits of the loaded model and of the source loaded by transformers in bf16 (the same
    loading path, so the two must be bit-identical).

    python dev/check_written_checkpoint.py            # from the repository root
"""
import os
import subprocess
import sys
import tempfile

import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "test", "fixtures", "models")
MODELS = ["qwen3_tiny", "qwen2_tiny", "llama_tiny"]


def build(tmp):
    exe = os.path.join(tmp, "resave_model")
    subprocess.run(["g++", "-std=c++17", "-O2", "-I", ROOT, "-o", exe, os.path.join(ROOT, "dev", "resave_model.cpp")], check=True)
    return exe


def check(exe, name, out, shard_bytes, generate_config):
    src = os.path.join(FIXTURES, name)
    args = [exe, src, out, str(shard_bytes), str(int(generate_config))]
    subprocess.run(args, check=True)
    files = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
    assert (len(files) > 1) == bool(shard_bytes), files
    for f in files:
        with safe_open(os.path.join(out, f), framework="pt") as st:
            assert st.metadata() == {"format": "pt"}, st.metadata()
            for k in st.keys():
                assert st.get_tensor(k).dtype == torch.bfloat16, k
    ref = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    got = AutoModelForCausalLM.from_pretrained(out).eval()  # dtype from config.json: bfloat16
    assert got.dtype == torch.bfloat16, got.dtype
    ref_params, got_params = dict(ref.named_parameters()), dict(got.named_parameters())
    assert ref_params.keys() == got_params.keys(), set(ref_params) ^ set(got_params)
    for k, p in ref_params.items():
        assert torch.equal(p.detach().to(torch.bfloat16), got_params[k].detach()), k
    assert got.config.tie_word_embeddings == ref.config.tie_word_embeddings
    ref_bf16 = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16).eval()
    ids = torch.tensor([[1, 5, 9, 42, 100, 7, 3]])
    with torch.no_grad():
        a = ref_bf16(ids).logits.float()
        b = got(ids).logits.float()
    diff = (a - b).abs().max().item()
    assert diff == 0.0, diff
    kind = "generated config" if generate_config else "sharded" if shard_bytes else "single file"
    print(f"{name:12s} {kind:16s}: {len(files)} file(s), {len(got_params)} parameters "
          f"bit-identical to the bf16-cast source, logits max |diff| {diff}")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(tmp)
        for name in MODELS:
            for shard_bytes, generate_config in ((0, False), (60000, False), (0, True)):
                check(exe, name, os.path.join(tmp, f"{name}_{shard_bytes}_{generate_config}"), shard_bytes, generate_config)
    print("all written checkpoints load in safetensors and transformers")


if __name__ == "__main__":
    sys.exit(main())
