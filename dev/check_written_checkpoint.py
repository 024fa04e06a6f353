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

FP8 exports (--save_format fp8, rl/model/fp8_export.h; `--fp8` checks only these and needs only numpy
and safetensors): for each tiny model, with scales as they are and as powers of two, the CPU engine's
export is read with safetensors.deserialize (raw bytes) and checked against the block-FP8 format's
published definition (DeepSeek-V3's weight_block_size [128, 128]: W = code x weight_scale_inv per tile)
computed here in numpy from the source's FP32 weights: fuse [q|k|v] and [gate|up] as the engine does,
quantize each 128x128 tile (scale = 448 / amax in float32, rounded down to a power of two for pow2;
E4M3 codes by round-to-nearest-even, saturating at 448; scale_inv = 1 / scale), cut the HF tensors out
at their rows (a tensor not starting at a multiple of 128 quantized on its own tiles), and require
every code and scale, and so every dequantized value, to be identical; norms and embeddings must be
the source rounded to BF16 (round to nearest even), and config.json must carry quantization_config.

    python dev/check_written_checkpoint.py            # from the repository root
    python dev/check_written_checkpoint.py --fp8      # the FP8 exports alone
"""
import os
import subprocess
import sys
import tempfile

import json

import numpy as np
import safetensors

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "test", "fixtures", "models")
MODELS = ["qwen3_tiny", "qwen2_tiny", "llama_tiny"]


def build(tmp):
    exe = os.path.join(tmp, "resave_model")
    subprocess.run(["g++", "-std=c++17", "-O2", "-fopenmp", "-I", ROOT, "-o", exe, os.path.join(ROOT, "dev", "resave_model.cpp")],
                   check=True)
    return exe


def check(exe, name, out, shard_bytes, generate_config):
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

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


# ---- FP8 exports, from the format's definition ----

E4M3_MAX = np.float32(448.0)


def e4m3_values():
    """float value of every code 0..255 (OCP E4M3: bias 7, no infinities, 0x7F and 0xFF NaN)."""
    out = np.zeros(256, np.float64)
    for c in range(256):
        sign, exp, man = -1.0 if c & 0x80 else 1.0, (c >> 3) & 0xF, c & 7
        if c & 0x7F == 0x7F:
            out[c] = np.nan
        elif exp == 0:
            out[c] = sign * man * 2.0 ** -9
        else:
            out[c] = sign * (1 + man / 8) * 2.0 ** (exp - 7)
    return out


E4M3 = e4m3_values()


def e4m3_encode(x):
    """float32 array -> E4M3 codes, round to nearest even, saturating at +-448, NaN -> 0x7F."""
    pos = E4M3[:127]  # codes 0..126: 0 .. 448, increasing
    a = np.abs(x.astype(np.float64))
    hi = np.clip(np.searchsorted(pos, a), 1, 126)
    lo = hi - 1
    d_lo, d_hi = a - pos[lo], pos[hi] - a
    code = np.where(d_lo < d_hi, lo, np.where(d_hi < d_lo, hi, np.where(lo % 2 == 0, lo, hi)))
    code = np.where(a >= 448.0, 126, code)
    code = code | np.where(np.signbit(x), 0x80, 0)
    return np.where(np.isnan(x), 0x7F, code).astype(np.uint8)


def quantize_blocks(w, pow2):
    """w float32 [N, K] -> codes uint8 [N, K], scale_inv float32 [ceil(N/128), ceil(K/128)]."""
    n, k = w.shape
    codes = np.zeros((n, k), np.uint8)
    sinv = np.zeros(((n + 127) // 128, (k + 127) // 128), np.float32)
    for rb in range(sinv.shape[0]):
        for kb in range(sinv.shape[1]):
            tile = w[rb * 128:(rb + 1) * 128, kb * 128:(kb + 1) * 128]
            amax = np.float32(np.nanmax(np.abs(tile)))
            scale = np.float32(1.0)
            if amax > 0 and np.isfinite(amax):
                with np.errstate(over="ignore"):
                    scale = np.float32(E4M3_MAX / amax)
                if np.isinf(scale):
                    scale = np.float32(np.finfo(np.float32).max)
            if pow2:
                scale = np.float32(np.ldexp(1.0, np.frexp(scale)[1] - 1))  # keep sign and exponent
            codes[rb * 128:(rb + 1) * 128, kb * 128:(kb + 1) * 128] = e4m3_encode((tile * scale).astype(np.float32))
            sinv[rb, kb] = np.float32(1.0) / scale
    return codes, sinv


def read_tensors(path):
    """name -> numpy array; F8_E4M3 as its uint8 codes (read from the raw bytes safetensors gives)."""
    out = {}
    with open(path, "rb") as f:
        for name, t in safetensors.deserialize(f.read()):
            raw = np.frombuffer(bytes(t["data"]), np.uint8)
            if t["dtype"] == "F8_E4M3":
                out[name] = ("F8_E4M3", raw.reshape(t["shape"]))
            elif t["dtype"] == "F32":
                out[name] = ("F32", raw.view("<f4").reshape(t["shape"]))
            elif t["dtype"] == "BF16":
                out[name] = ("BF16", raw.view("<u2").reshape(t["shape"]))
            else:
                raise AssertionError(f"{path}: {name} has dtype {t['dtype']}")
    return out


def to_bf16_bits(x):
    """float32 -> bf16 bits, round to nearest even (NaN not expected in weights)."""
    b = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def check_fp8(exe, name, out, pow2):
    src = os.path.join(FIXTURES, name)
    args = [exe, "--fp8", src, out] + (["pow2"] if pow2 else [])
    notice = subprocess.run(args, check=True, capture_output=True, text=True).stdout.strip()
    cfg = json.load(open(os.path.join(src, "config.json")))
    qc = json.load(open(os.path.join(out, "config.json")))["quantization_config"]
    assert qc == {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}, qc
    source = {}  # a single file or shards
    for f in sorted(os.listdir(src)):
        if f.endswith(".safetensors"):
            source.update(read_tensors(os.path.join(src, f)))
    src_f32 = {}
    for k, (dt, v) in source.items():
        src_f32[k] = v if dt == "F32" else (v.astype(np.uint32) << 16).view(np.float32)
    got = read_tensors(os.path.join(out, "model.safetensors"))
    head_dim = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    q_rows, kv_rows, inter = cfg["num_attention_heads"] * head_dim, cfg["num_key_value_heads"] * head_dim, cfg["intermediate_size"]
    fused = [(["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"], [0, q_rows, q_rows + kv_rows]),
             (["self_attn.o_proj"], [0]), (["mlp.gate_proj", "mlp.up_proj"], [0, inter]), (["mlp.down_proj"], [0])]
    exact = requantized = 0
    projections = set()
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        for parts, rows0 in fused:
            whole = np.concatenate([src_f32[p + t + ".weight"] for t in parts]).astype(np.float32)
            codes, sinv = quantize_blocks(whole, pow2)
            for t, r0 in zip(parts, rows0):
                wname = p + t + ".weight"
                projections.update([wname, wname + "_scale_inv"])
                n = src_f32[wname].shape[0]
                if r0 % 128 == 0:
                    want_c, want_s = codes[r0:r0 + n], sinv[r0 // 128:(r0 + n + 127) // 128]
                    exact += 1
                else:
                    want_c, want_s = quantize_blocks(src_f32[wname].astype(np.float32), pow2)
                    requantized += 1
                    assert f"{t}.weight (from row {r0})" in notice, (wname, notice)
                dt, c = got[wname]
                ds, s = got[wname + "_scale_inv"]
                assert dt == "F8_E4M3" and ds == "F32", (wname, dt, ds)
                assert c.shape == want_c.shape and s.shape == want_s.shape, (wname, c.shape, s.shape)
                assert np.array_equal(c, want_c), f"{wname}: {(c != want_c).sum()} codes differ"
                assert np.array_equal(s.view(np.uint32), want_s.view(np.uint32)), f"{wname}: scales differ"
                if pow2:
                    assert np.all(np.frexp(s)[0] == 0.5), wname
                deq = (E4M3[c].astype(np.float32) * np.repeat(np.repeat(s, 128, 0), 128, 1)[:c.shape[0], :c.shape[1]])
                ref = (E4M3[want_c].astype(np.float32) * np.repeat(np.repeat(want_s, 128, 0), 128, 1)[:c.shape[0], :c.shape[1]])
                assert np.array_equal(deq.view(np.uint32), ref.view(np.uint32)), wname
    assert not requantized or notice, notice
    others = 0
    for k, (dt, v) in got.items():
        if k in projections:
            continue
        assert dt == "BF16" and np.array_equal(v, to_bf16_bits(src_f32[k])), k
        others += 1
    print(f"{name:12s} fp8{' pow2' if pow2 else '     '}: {exact} projections cut from the fused copy and {requantized} "
          f"quantized alone equal the numpy reference bit for bit (codes, scales, dequantized values); {others} BF16 tensors")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(tmp)
        for name in MODELS:
            for pow2 in (False, True):
                check_fp8(exe, name, os.path.join(tmp, f"{name}_fp8_{pow2}"), pow2)
        if "--fp8" in sys.argv[1:]:
            return
        for name in MODELS:
            for shard_bytes, generate_config in ((0, False), (60000, False), (0, True)):
                check(exe, name, os.path.join(tmp, f"{name}_{shard_bytes}_{generate_config}"), shard_bytes, generate_config)
    print("all written checkpoints load in safetensors and transformers")


if __name__ == "__main__":
    sys.exit(main())
