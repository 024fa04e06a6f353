#!/usr/bin/env python3
"""Fixtures for test/test_fp8_block.cpp: blockwise E4M3 quantization and the three FP8 GEMMs of a
linear layer, computed independently with torch (float8_e4m3fn casts, float32 scale arithmetic,
float64 matrix products). Rerun from the repository root:

    python3 dev/make_fp8_fixtures.py

Writes test/fixtures/fp8/manifest.json and one raw little-endian array per tensor.
Recipe (spec-fp8.md §4.1): per block amax = max|x|; scale = 448 / amax in float32 (amax 0 or
non-finite -> 1; an infinite quotient -> FLT_MAX); optional power-of-two rounding keeps only the
sign and exponent bits; codes = e4m3(x * scale) (round to nearest even); stored scale_inv = 1 / scale.
"""
import json
import os

import torch

OUT = "test/fixtures/fp8"
T, K, N = 160, 288, 136  # tokens, in, out: none a multiple of 128, so every edge block is ragged
FLT_MAX = torch.finfo(torch.float32).max


def scale_from_amax(amax, pow2):
    ok = (amax > 0) & torch.isfinite(amax)
    scale = torch.where(ok, torch.tensor(448.0, dtype=torch.float32) / torch.where(ok, amax, 1.0), 1.0)
    scale = torch.where(torch.isinf(scale), torch.tensor(FLT_MAX), scale)
    if pow2:
        scale = (scale.view(torch.int32) & torch.tensor(0xFF800000 - (1 << 32), dtype=torch.int32)).view(torch.float32)
    return scale


def pad_to(x, dim, mult):
    extra = (-x.shape[dim]) % mult
    if extra == 0:
        return x
    shape = list(x.shape)
    shape[dim] = extra
    return torch.cat([x, torch.zeros(shape, dtype=x.dtype)], dim)


def quantize_rowwise(x, pow2):
    """1x128 groups along the columns of x [R][C]: codes [R][C], scale_inv in VEC128 layout [L][R],
    and the dequantized tensor."""
    R, C = x.shape
    xp = pad_to(x, 1, 128)
    L = xp.shape[1] // 128
    groups = xp.view(R, L, 128)
    scale = scale_from_amax(groups.abs().amax(-1), pow2)  # [R][L]
    q = (groups * scale[..., None]).to(torch.float8_e4m3fn)
    scale_inv = torch.tensor(1.0, dtype=torch.float32) / scale
    deq = (q.to(torch.float64) * scale_inv.to(torch.float64)[..., None]).reshape(R, L * 128)[:, :C]
    codes = q.view(torch.uint8).reshape(R, L * 128)[:, :C].contiguous()
    return codes, scale_inv.t().contiguous(), deq


def quantize_blockwise(x, pow2):
    """128x128 blocks: codes [R][C], scale_inv in BLK128x128 layout [Rb][roundup(Cb,4)] (padding 0)."""
    R, C = x.shape
    xp = pad_to(pad_to(x, 0, 128), 1, 128)
    Rb, Cb = xp.shape[0] // 128, xp.shape[1] // 128
    tiles = xp.view(Rb, 128, Cb, 128)
    scale = scale_from_amax(tiles.abs().amax(dim=(1, 3)), pow2)  # [Rb][Cb]
    q = (tiles * scale[:, None, :, None]).to(torch.float8_e4m3fn)
    scale_inv = torch.tensor(1.0, dtype=torch.float32) / scale
    deq = (q.to(torch.float64) * scale_inv.to(torch.float64)[:, None, :, None]).reshape(Rb * 128, Cb * 128)[:R, :C]
    codes = q.view(torch.uint8).reshape(Rb * 128, Cb * 128)[:R, :C].contiguous()
    grid = pad_to(scale_inv, 1, 4).contiguous()
    return codes, grid, deq


def bf16(x):
    return x.to(torch.bfloat16).to(torch.float32)


def main():
    g = torch.Generator().manual_seed(20261129)
    x = torch.randn(T, K, generator=g)
    x[:, 5] *= 60.0  # an outlier channel, as real activations have
    x[3, 0:128] = 0.0  # an all-zero group: scale 1
    x[7, 128:256] *= 1e-39  # FP32 subnormals: 448 / amax overflows, scale FLT_MAX
    x[9, 256:] *= 1e4  # a large group in the ragged last block
    x = bf16(x)
    w = bf16(torch.randn(N, K, generator=g) * 0.02)
    w[0:128, 256:] = 0.0  # an all-zero (ragged) weight block
    dy = bf16(torch.randn(T, N, generator=g) * 1e-3)

    arrays = {"x": x, "w": w, "dy": dy}
    for pow2 in (False, True):
        sfx = "_pow2" if pow2 else ""
        x_codes, x_s, x_dq = quantize_rowwise(x, pow2)  # fprop B operand
        xt_codes, xt_s, xt_dq = quantize_rowwise(x.t().contiguous(), pow2)  # wgrad: 1x128 along tokens
        w_codes, w_s, w_dq = quantize_blockwise(w, pow2)
        dy_codes, dy_s, dy_dq = quantize_rowwise(dy, pow2)  # dgrad B operand
        dyt_codes, dyt_s, dyt_dq = quantize_rowwise(dy.t().contiguous(), pow2)
        arrays.update({
            "x_codes" + sfx: x_codes, "x_scale_inv" + sfx: x_s,
            "xt_codes" + sfx: xt_codes, "xt_scale_inv" + sfx: xt_s,
            "w_codes" + sfx: w_codes, "w_scale_inv" + sfx: w_s,
            "dy_codes" + sfx: dy_codes, "dy_scale_inv" + sfx: dy_s,
            "dyt_codes" + sfx: dyt_codes, "dyt_scale_inv" + sfx: dyt_s,
        })
        if not pow2:  # float64 GEMMs of the dequantized operands, stored as float32
            arrays["y_ref"] = (x_dq @ w_dq.t()).to(torch.float32)  # fprop  [T][N]
            arrays["dx_ref"] = (dy_dq @ w_dq).to(torch.float32)  # dgrad  [T][K]
            arrays["dw_ref"] = (dyt_dq @ xt_dq.t()).to(torch.float32)  # wgrad  [N][K]

    os.makedirs(OUT, exist_ok=True)
    manifest = {"T": T, "K": K, "N": N, "arrays": {}}
    for name, a in arrays.items():
        dtype = {torch.float32: "f32", torch.uint8: "u8"}[a.dtype]
        a.contiguous().numpy().tofile(os.path.join(OUT, name + ".bin"))
        manifest["arrays"][name] = {"dtype": dtype, "shape": list(a.shape)}
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    print(f"wrote {len(arrays)} arrays to {OUT} (torch {torch.__version__})")


if __name__ == "__main__":
    main()
