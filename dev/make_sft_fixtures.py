#!/usr/bin/env python3
"""Fixtures for --mode sft (docs/sft.md), made without fp8rl's code: renderings, token ids and loss masks
from HF transformers, and the masked token-mean NLL from a float64 numpy forward of the tiny Qwen3.

  test/fixtures/sft/masks_<family>.jsonl   {"messages", "ids", "mask"} per conversation, for the Qwen3,
      Qwen2.5 and Llama-3 tokenizers of test/fixtures/tokenizer (and the tiny Qwen3 model's own): the text
      is transformers' apply_chat_template(messages, tokenize=False); the mask marks, as
      return_assistant_tokens_mask does for a template whose assistant turns are wrapped in
      {% generation %} ... {% endgeneration %} through the end-of-turn token, the tokens (HF offsets) that
      start inside an assistant turn after its header, through its closing <|im_end|> / <|eot_id|>.
  test/fixtures/sft/{messages,prompt}.jsonl  training rows for the tiny Qwen3 (test/fixtures/models/qwen3_tiny)
      of the two shapes: conversations, and prompt/completion rows (the prompt as it is, then the completion
      and the model's eos, <|im_end|>).
  test/fixtures/sft/expected_loss.json  per file, the token mean over all rows' masked tokens of
      -log p(token | the tokens before it), the model run in float64 on its stored weights.
  test/fixtures/sft/expected_accuracy.json  per file, train/mean_token_accuracy of that forward: the
      fraction of the masked tokens whose logit is the largest at their position, with the hits, the
      token count and the smallest |logit - best other logit| (asserted far above float32's errors,
      so an fp32 forward cannot flip a hit).

The rows are drawn from a seeded word list, so they are new to every other test. Rerunning writes the same files.

    python3 dev/make_sft_fixtures.py
"""
import json
import os
import random

import numpy as np
from safetensors.numpy import load_file
from transformers import AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "test", "fixtures", "sft")
MODEL = os.path.join(ROOT, "test", "fixtures", "models", "qwen3_tiny")
TOKENIZERS = {
    "qwen3": os.path.join(ROOT, "test", "fixtures", "tokenizer", "qwen3"),
    "qwen2.5": os.path.join(ROOT, "test", "fixtures", "tokenizer", "qwen2.5"),
    "llama3": os.path.join(ROOT, "test", "fixtures", "tokenizer", "llama3_style"),
    "qwen3_tiny": MODEL,
}
HEADERS = {  # (an assistant turn's header, its end-of-turn token)
    "qwen3": ("<|im_start|>assistant\n", "<|im_end|>"),
    "qwen2.5": ("<|im_start|>assistant\n", "<|im_end|>"),
    "qwen3_tiny": ("<|im_start|>assistant\n", "<|im_end|>"),
    "llama3": ("<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"),
}
WORDS = ("apple river stone seven blue quick lamp north garden copper violin ember twelve silent orbit maple "
         "harbor pixel thunder crisp lantern meadow nine velvet").split()


def sentence(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def conversations(rng, count):
    out = []
    for i in range(count):
        msgs = []
        if i % 3 == 0:
            msgs.append({"role": "system", "content": "Answer in words. " + sentence(rng, 2)})
        for t in range(1 + i % 3):
            msgs.append({"role": "user", "content": sentence(rng, rng.randint(2, 6)) + "?"})
            reply = sentence(rng, rng.randint(1, 5)) + "."
            if t == 0 and i % 2 == 1:  # thinking in a turn: Qwen3 drops it from turns before the last query
                reply = "<think>\n" + sentence(rng, 3) + "\n</think>\n\n" + reply
            msgs.append({"role": "assistant", "content": reply})
        out.append(msgs)
    return out


def hf_mask(family, tok, messages):
    """ids and the assistant-turn mask of HF's rendering, from HF's offsets."""
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=False, date_string="26 Jul 2024")
    header, end = HEADERS[family]
    spans, at = [], 0
    while True:
        h = text.find(header, at)
        if h < 0:
            break
        b = h + len(header)
        e = text.index(end, b) + len(end)
        spans.append((b, e))
        at = e
    assert len(spans) == sum(m["role"] == "assistant" for m in messages)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(b <= s < e for b, e in spans)) for s, _ in enc["offset_mapping"]]
    mask[0] = 0
    return enc["input_ids"], mask


# ---- the tiny Qwen3 in float64 ----------------------------------------------------------------------

def rmsnorm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rope(x, theta):  # x [T, H, D], HF's rotate_half convention
    T, _, D = x.shape
    inv = 1.0 / theta ** (np.arange(0, D, 2, dtype=np.float64) / D)
    ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
    cos = np.concatenate([np.cos(ang)] * 2, -1)[:, None, :]
    sin = np.concatenate([np.sin(ang)] * 2, -1)[:, None, :]
    rot = np.concatenate([-x[..., D // 2:], x[..., :D // 2]], -1)
    return x * cos + rot * sin


def logprobs64(w, cfg, ids):
    """log p(ids[t] | ids[:t]) and ids[t]'s logit less the largest other logit, for t >= 1 (index 0 unused)."""
    H, KV, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps, theta = cfg["rms_norm_eps"], cfg["rope_parameters"]["rope_theta"]
    x = w["model.embed_tokens.weight"][ids]
    T = len(ids)
    causal = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        h = rmsnorm(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, H, D)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(T, KV, D)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(T, KV, D)
        q = rope(rmsnorm(q, w[p + "self_attn.q_norm.weight"], eps), theta)
        k = rope(rmsnorm(k, w[p + "self_attn.k_norm.weight"], eps), theta)
        heads = []
        for hh in range(H):
            kv = hh // (H // KV)
            s = q[:, hh, :] @ k[:, kv, :].T / np.sqrt(D) + causal
            s = np.exp(s - s.max(-1, keepdims=True))
            heads.append((s / s.sum(-1, keepdims=True)) @ v[:, kv, :])
        x = x + np.concatenate(heads, -1) @ w[p + "self_attn.o_proj.weight"].T
        h = rmsnorm(x, w[p + "post_attention_layernorm.weight"], eps)
        g = h @ w[p + "mlp.gate_proj.weight"].T
        u = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ w[p + "mlp.down_proj.weight"].T
    x = rmsnorm(x, w["model.norm.weight"], eps)
    logits = x @ w.get("lm_head.weight", w["model.embed_tokens.weight"]).T
    m = logits.max(-1, keepdims=True)
    lsm = logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))
    out, margin = np.zeros(T), np.zeros(T)
    rows = np.arange(T - 1)
    out[1:] = lsm[rows, ids[1:]]
    others = logits[:-1].copy()
    others[rows, ids[1:]] = -np.inf
    margin[1:] = logits[rows, ids[1:]] - others.max(-1)
    return out, margin


def masked_stats(w, cfg, rows):
    """The masked token-mean NLL, and the top-1 hits, token count and smallest |margin| over the masked tokens."""
    nll, n, hits, margins = 0.0, 0, 0, []
    for ids, mask in rows:
        lp, margin = logprobs64(w, cfg, np.array(ids))
        m = np.array(mask, dtype=bool)
        nll -= float((lp * np.array(mask)).sum())
        n += int(m.sum())
        hits += int((margin[m] >= 0).sum())
        margins.extend(np.abs(margin[m]))
    return nll / n, {"accuracy": hits / n, "hits": hits, "tokens": n, "min_margin": float(min(margins))}


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = random.Random(50)
    convs = conversations(rng, 9)
    for family, path in TOKENIZERS.items():
        tok = AutoTokenizer.from_pretrained(path)
        with open(os.path.join(OUT, "masks_%s.jsonl" % family), "w") as f:
            for msgs in convs:
                ids, mask = hf_mask(family, tok, msgs)
                f.write(json.dumps({"messages": msgs, "ids": ids, "mask": mask}) + "\n")

    cfg = json.load(open(os.path.join(MODEL, "config.json")))
    w = {k: v.astype(np.float64) for k, v in load_file(os.path.join(MODEL, "model.safetensors")).items()}
    tok = AutoTokenizer.from_pretrained(MODEL)
    eos = json.load(open(os.path.join(MODEL, "generation_config.json")))["eos_token_id"][0]
    expected, accuracy = {}, {}
    msg_rows = [hf_mask("qwen3_tiny", tok, m) for m in convs[:6]]
    with open(os.path.join(OUT, "messages.jsonl"), "w") as f:
        for m in convs[:6]:
            f.write(json.dumps({"messages": m}) + "\n")
    expected["messages.jsonl"], accuracy["messages.jsonl"] = masked_stats(w, cfg, msg_rows)
    prompt_rows = []
    with open(os.path.join(OUT, "prompt.jsonl"), "w") as f:
        for i in range(6):
            prompt, completion = sentence(rng, 3) + " =", " " + sentence(rng, 1 + i % 4)
            f.write(json.dumps({"prompt": prompt, "completion": completion}) + "\n")
            p = tok(prompt, add_special_tokens=False)["input_ids"]
            c = tok(completion, add_special_tokens=False)["input_ids"] + [eos]
            prompt_rows.append((p + c, [0] * len(p) + [1] * len(c)))
    expected["prompt.jsonl"], accuracy["prompt.jsonl"] = masked_stats(w, cfg, prompt_rows)
    # a float32 forward's logits are good to ~1e-5; the random model hits some chat-template tokens
    # (prompt.jsonl's completions: none)
    assert all(a["min_margin"] > 1e-3 for a in accuracy.values()) and accuracy["messages.jsonl"]["hits"] > 0, accuracy
    for name, values in (("expected_loss.json", expected), ("expected_accuracy.json", accuracy)):
        with open(os.path.join(OUT, name), "w") as f:
            json.dump(values, f, indent=1)
            f.write("\n")
    print(expected, accuracy)


if __name__ == "__main__":
    main()
