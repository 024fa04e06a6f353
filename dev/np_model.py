"""A tiny Qwen3 checkpoint in numpy, for the dev scripts that edit or compare weights without torch:
read and write model.safetensors (BF16 and F32; BF16 written rounded to nearest even from float32,
as rl/numerics/bf16.h rounds), read trainer_state.bin's FP32 master weights by HF name (the
canonical layout of rl/model/weights.h), and give a model the massive-activation channels of
dev/paper_experiment.py --outliers.
"""
import json
import struct

import numpy as np

OUTLIER_CHANNELS = [5, 17, 40, 60]  # of hidden 64


def read_safetensors(path):
    """{name: float32 array} and {name: dtype} of a safetensors file (BF16 and F32 tensors)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out, dtypes = {}, {}
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
            raise SystemExit(f"{path}: {name}: dtype {t['dtype']} is not read here (BF16, F32)")
        out[name] = x.reshape(t["shape"]).astype(np.float32)
        dtypes[name] = t["dtype"]
    return out, dtypes


def to_bf16_bits(x):
    """BF16 bits of float32 x, rounded to nearest even (no NaNs here)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def write_safetensors(path, tensors, dtype="F32"):
    """Writes {name: array} as one safetensors file, every tensor in dtype (F32 or BF16)."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        x = np.asarray(tensors[name], dtype=np.float32)
        blob = to_bf16_bits(x).tobytes() if dtype == "BF16" else x.tobytes()
        header[name] = {"dtype": dtype, "shape": list(x.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def master_layout(config):
    """[(name, shape, offset)] of rl/model/weights.h's canonical master layout (Qwen3: no biases)."""
    C, I, V, L = config["hidden_size"], config["intermediate_size"], config["vocab_size"], config["num_hidden_layers"]
    Q, KV = config["num_attention_heads"] * config["head_dim"], config["num_key_value_heads"] * config["head_dim"]
    D = config["head_dim"]
    out, offset = [], 0

    def add(name, shape, pad=True):
        nonlocal offset
        out.append((name, shape, offset))
        offset += int(np.prod(shape))
        if pad:
            offset = (offset + 63) // 64 * 64

    add("model.embed_tokens.weight", (V, C))
    for i in range(L):
        p = f"model.layers.{i}."
        add(p + "input_layernorm.weight", (C,))
        add(p + "self_attn.q_proj.weight", (Q, C), pad=False)
        add(p + "self_attn.k_proj.weight", (KV, C), pad=False)
        add(p + "self_attn.v_proj.weight", (KV, C))
        add(p + "self_attn.q_norm.weight", (D,))
        add(p + "self_attn.k_norm.weight", (D,))
        add(p + "self_attn.o_proj.weight", (C, Q))
        add(p + "post_attention_layernorm.weight", (C,))
        add(p + "mlp.gate_proj.weight", (I, C), pad=False)
        add(p + "mlp.up_proj.weight", (I, C))
        add(p + "mlp.down_proj.weight", (C, I))
    add("model.norm.weight", (C,))
    if not config.get("tie_word_embeddings", True):
        add("lm_head.weight", (V, C))
    return out, offset


def read_master(checkpoint_dir):
    """{name: float32 array}: the FP32 master weights of a checkpoint's trainer_state.bin."""
    with open(checkpoint_dir + "/config.json") as f:
        config = json.load(f)
    with open(checkpoint_dir + "/trainer_state.bin", "rb") as f:
        data = f.read()
    if data[:8] not in (b"FP8RLST1", b"FP8RLST2"):
        raise SystemExit(f"{checkpoint_dir}/trainer_state.bin: not an fp8rl trainer state")
    count = struct.unpack("<5q", data[8:48])[4]
    offset = 64  # magic, 5 int64, the two bounds (rl/io/checkpoint.h)
    if data[:8] == b"FP8RLST2":  # then 4 int64 of Calibrated Clipping's state, the last its pooled count
        offset += 32 + 8 * struct.unpack("<4q", data[64:96])[3]
    master = np.frombuffer(data, dtype=np.float32, count=count, offset=offset)
    layout, total = master_layout(config)
    if total != count:
        raise SystemExit(f"{checkpoint_dir}: {count} master floats, the layout of config.json has {total}")
    return {name: master[o:o + int(np.prod(s))].reshape(s).copy() for name, s, o in layout}


def add_massive_activations(w, factor, layers):
    """dev/paper_experiment.py --outliers: in every layer the norms' weights (and up_proj's rows, the
    down projection's input) of OUTLIER_CHANNELS times factor, the columns that read them divided by
    it, the same function in exact arithmetic. w: {name: array or torch tensor}, edited in place."""
    channels = OUTLIER_CHANNELS
    for l in layers:
        p = f"model.layers.{l}."
        for norm, projections in (("input_layernorm", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
                                  ("post_attention_layernorm", ("mlp.gate_proj", "mlp.up_proj"))):
            w[p + norm + ".weight"][channels] *= factor
            for proj in projections:
                w[p + proj + ".weight"][:, channels] /= factor
        # the down projection's input (SwiGLU is linear in up), whose 192 channels make two 128-groups
        w[p + "mlp.up_proj.weight"][channels, :] *= factor
        w[p + "mlp.down_proj.weight"][:, channels] /= factor
