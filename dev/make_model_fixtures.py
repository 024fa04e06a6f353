#!/usr/bin/env python3
"""Reference outputs of HF transformers (FP32, torch autograd) for the CPU model's tests.

For every tiny checkpoint under test/fixtures/models/ (written by dev/make_tiny_models.py) this runs
the HF model on a fixed batch of token sequences and writes test/fixtures/model/<name>.safetensors.
Logits, log-probs, entropy and gradients are computed by HF's code in FP64, so they are the exact
values an FP32 engine approximates (HF's own FP32 run is off by up to ~1e-5 of a tensor's scale in
the gradients, as large as the errors under test); they are stored rounded to F32. Generation runs
the model in FP32, as the CPU engine does.

  ids, offsets          the packed batch (sequence s is ids[offsets[s]:offsets[s+1]])
  logits [T, n]         logits; n = V, or for vocabularies over 4096 the columns logit_cols
  logprobs, entropy     [T] at temperature 1: log p(ids[t] | ids before t) and the entropy of that
                        next-token distribution; 0 at each sequence's first token
  temperature, loss_a, loss_b, logprobs_t, entropy_t
                        the scalar loss L = sum_t loss_a[t] * logprob_t[t] + loss_b[t] * entropy_t[t]
                        at that temperature, and its per-token terms
  grad.<tensor name>    dL/dparameter through torch autograd, for every parameter tensor; tensors
                        over 1024 elements keep 1024 of them, at flat indices (k * numel) // 1024
  gen.prompt.<i>, gen.tokens.<i>
                        HF generate, greedy (do_sample=False), max_new_tokens GEN_TOKENS, stopping on
                        the generation_config eos ids; gen.tokens excludes the prompt

Every value is stored as F32 (integers are exact below 2^24). Seeded; rerunning reproduces the files.

    python dev/make_model_fixtures.py            # all models
    python dev/make_model_fixtures.py qwen3_tiny # only the named ones
"""
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, GenerationConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "test", "fixtures", "models")
OUT = os.path.join(ROOT, "test", "fixtures", "model")
NAMES = ["qwen3_tiny", "qwen2_tiny", "llama_tiny", "qwen3_gqa3_tiny", "qwen3_bigvocab_tiny"]
LENGTHS = [11, 6, 1]  # packed batch: different lengths, one sequence with nothing to score
TEMPERATURE = 0.7
GRAD_SAMPLES = 1024
LOGIT_COLS = 1024
GEN_TOKENS = 12


def sampled(flat):
    n = flat.numel()
    if n <= GRAD_SAMPLES:
        return flat
    idx = torch.tensor([(k * n) // GRAD_SAMPLES for k in range(GRAD_SAMPLES)], dtype=torch.long)
    return flat[idx]


def token_terms(logits, ids, temperature):
    """Per-token logprob and entropy of sequence `ids` (aligned with ids; 0 at position 0)."""
    lsm = torch.log_softmax(logits / temperature, dim=-1)  # [n, V]
    lp = torch.zeros(len(ids), dtype=logits.dtype)
    ent = torch.zeros(len(ids), dtype=logits.dtype)
    if len(ids) > 1:
        rows = lsm[:-1]
        lp = torch.cat([lp[:1], rows.gather(1, ids[1:, None])[:, 0]])
        ent = torch.cat([ent[:1], -(rows.exp() * rows).sum(-1)])
    return lp, ent


def build(name):
    path = os.path.join(MODELS, name)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64, attn_implementation="eager").eval()
    model32 = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    V = model.config.vocab_size
    gen = torch.Generator().manual_seed(1000 + NAMES.index(name))
    seqs = [torch.randint(0, V, (n,), generator=gen) for n in LENGTHS]
    a = torch.randn(sum(LENGTHS), generator=gen).double()
    b = torch.randn(sum(LENGTHS), generator=gen).double()
    cols = None if V <= LOGIT_COLS else torch.cat([torch.arange(0, 64), torch.randint(0, V, (LOGIT_COLS - 128,), generator=gen),
                                                  torch.arange(V - 64, V)])
    out = {}
    logits_all, lp_all, ent_all, lpt_all, entt_all = [], [], [], [], []
    loss = 0.0
    offset = 0
    for s in seqs:
        logits = model(input_ids=s[None]).logits[0]  # [n, V], FP64
        with torch.no_grad():
            lp, ent = token_terms(logits, s, 1.0)
        lpt, entt = token_terms(logits, s, TEMPERATURE)
        n = len(s)
        loss = loss + (a[offset:offset + n] * lpt).sum() + (b[offset:offset + n] * entt).sum()
        logits_all.append((logits if cols is None else logits[:, cols]).detach())
        lp_all.append(lp), ent_all.append(ent), lpt_all.append(lpt.detach()), entt_all.append(entt.detach())
        offset += n
    loss.backward()
    out["ids"] = torch.cat(seqs).float()
    out["offsets"] = torch.tensor([0] + list(torch.cumsum(torch.tensor(LENGTHS), 0)), dtype=torch.float32)
    out["logits"] = torch.cat(logits_all)
    if cols is not None:
        out["logit_cols"] = cols.float()
    out["logprobs"], out["entropy"] = torch.cat(lp_all), torch.cat(ent_all)
    out["temperature"] = torch.tensor([TEMPERATURE], dtype=torch.float32)
    out["loss_a"], out["loss_b"] = a, b
    out["logprobs_t"], out["entropy_t"] = torch.cat(lpt_all), torch.cat(entt_all)
    for pname, p in model.named_parameters():
        out["grad." + pname] = sampled(p.grad.detach().flatten()).float()

    gcfg = GenerationConfig.from_pretrained(path)
    prompts = [seqs[0][:5], seqs[1][:3]]
    for i, prompt in enumerate(prompts):
        with torch.no_grad():
            res = model32.generate(prompt[None], do_sample=False, max_new_tokens=GEN_TOKENS, eos_token_id=gcfg.eos_token_id,
                                 pad_token_id=gcfg.eos_token_id[0] if isinstance(gcfg.eos_token_id, list) else gcfg.eos_token_id,
                                 attention_mask=torch.ones_like(prompt[None]))
        out[f"gen.prompt.{i}"] = prompt.float()
        out[f"gen.tokens.{i}"] = res[0, len(prompt):].float()
        # how close greedy came to a tie (smallest top-1 minus top-2 logit gap along the way)
        with torch.no_grad():
            lg = model32(input_ids=res[:, :-1]).logits[0, len(prompt) - 1:]
            top = lg.topk(2, dim=-1).values
        print(f"  {name} gen {i}: {res[0, len(prompt):].tolist()} (smallest top-2 gap {(top[:, 0] - top[:, 1]).min():.2e})")

    os.makedirs(OUT, exist_ok=True)
    file = os.path.join(OUT, name + ".safetensors")
    save_file({k: v.float().contiguous() for k, v in out.items()}, file)
    print(f"{name}: loss {float(loss):.6f}, {os.path.getsize(file)} bytes -> {file}")


def main():
    torch.set_num_threads(2)
    for name in sys.argv[1:] or NAMES:
        build(name)


if __name__ == "__main__":
    main()
