#!/usr/bin/env python3
"""Seed corpus of the safetensors fuzz target (test/fuzz/fuzz_safetensors.cpp): small valid files
written by python safetensors, so the fuzzer starts from the real format.

    python dev/make_fuzz_seeds.py      # writes test/fuzz/safetensors_seeds/
"""
import os

import torch
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "test", "fuzz", "safetensors_seeds")


def main():
    os.makedirs(OUT, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    save_file({"w": torch.randn(2, 3, generator=g), "b": torch.randn(3, generator=g).to(torch.bfloat16)},
              os.path.join(OUT, "f32_bf16.safetensors"), metadata={"format": "pt"})
    save_file({"h": torch.randn(4, generator=g).to(torch.float16), "s": torch.tensor(1.5),
               "e": torch.zeros(0, 2), "q": torch.randn(3, generator=g).to(torch.float8_e4m3fn)},
              os.path.join(OUT, "f16_scalar_empty_f8.safetensors"), metadata={"format": "pt"})
    save_file({}, os.path.join(OUT, "empty.safetensors"))


if __name__ == "__main__":
    main()
