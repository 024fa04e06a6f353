#!/usr/bin/env python3
"""Tiny random HF checkpoints for fp8rl's tests, written by HF transformers' own save_pretrained.

These files are the real-format test of rl/io/safetensors.h, rl/model/config.h and rl/model/weights.h: they are
produced by code nobody on this project wrote. Each model is a few hundred KB (FP32 weights, so
the CPU model can be compared to torch at FP32 precision) with a small byte-level BPE
tokenizer.json trained by HF `tokenizers` on a fixed text, so the fixtures are complete model
directories.

    python dev/make_tiny_models.py            # writes test/fixtures/models/<name>/
    python dev/make_tiny_models.py qwen3_tiny # only the named models

To add a model, append an entry to MODELS: a config class, its keyword arguments, and how to save.
Everything is seeded; rerunning the script reproduces the same tensors.
"""
import json
import os
import shutil
import sys

import torch
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "test", "fixtures", "models")
SHARED_TOK = os.path.join(ROOT, "test", "fixtures", "tokenizer")  # the real Qwen files (NOTICE there)

QWEN_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA_REGEX = QWEN_REGEX.replace(r"\p{N}|", r"\p{N}{1,3}|", 1)

# Text the tiny tokenizers are trained on: the shape of the synthetic RL tasks (arithmetic, chat turns).
def training_text():
    lines = []
    for a in range(0, 60, 7):
        for b in range(0, 60, 11):
            lines.append(f"What is {a} + {b}? Let me think. {a} + {b} = {a + b}. The answer is {a + b}.")
            lines.append(f"Compute {a} * {b}. The answer is \\boxed{{{a * b}}}.")
    lines += ["Hello world! Hello, world.", "user\nassistant\nsystem\n", "The quick brown fox jumps over the lazy dog."]
    return lines


def make_tokenizer(family, vocab_size):
    """A byte-level BPE like the real ones (same pre-tokenizer shape), with a tiny vocabulary."""
    if family == "llama":
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
        regex, normalizer = LLAMA_REGEX, None
    else:
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        regex, normalizer = QWEN_REGEX, normalizers.NFC()
    tok = Tokenizer(models.BPE(ignore_merges=(family == "llama")))
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(specials) - (2 if family == "qwen3" else 0),
                                  special_tokens=[], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(training_text(), trainer=trainer)
    tok.add_special_tokens(specials)
    if family == "qwen3":  # <think> and </think> are added but not special, as in Qwen3's file
        from tokenizers import AddedToken
        tok.add_tokens([AddedToken("<think>", special=False, normalized=False),
                        AddedToken("</think>", special=False, normalized=False)])
    assert tok.get_vocab_size() == vocab_size, tok.get_vocab_size()
    return tok, specials


def save_tokenizer(tok, specials, family, path):
    """tokenizer.json + tokenizer_config.json; the Qwen chat templates come from the real files."""
    if family == "llama":
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=specials[0], eos_token=specials[4])
    else:
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
        real = os.path.join(SHARED_TOK, "qwen3" if family == "qwen3" else "qwen2.5", "tokenizer_config.json")
        with open(real) as f:
            fast.chat_template = json.load(f)["chat_template"]
    fast.save_pretrained(path)


VOCAB = 320
MODELS = {
    # Qwen3: head_dim 32 != hidden/heads = 16, GQA 4:2, q/k norms, tied.
    "qwen3_tiny": dict(family="qwen3", cls="Qwen3ForCausalLM", config="Qwen3Config", seed=1, shard=None, config_kwargs=dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
        max_position_embeddings=512)),
    # Qwen2: q/k/v biases, GQA 4:2, head_dim = hidden/heads, tied; sharded to exercise the index file.
    "qwen2_tiny": dict(family="qwen2", cls="Qwen2ForCausalLM", config="Qwen2Config", seed=2, shard="120KB", config_kwargs=dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
        max_position_embeddings=512)),
    # Llama-3: llama3 RoPE frequency scaling, untied lm_head, eps 1e-5, GQA 4:1.
    "llama_tiny": dict(family="llama", cls="LlamaForCausalLM", config="LlamaConfig", seed=3, shard=None, config_kwargs=dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False,
        max_position_embeddings=1024,
        rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=64))),
    # Qwen3 with GQA 3:1 (6 query heads on 2 kv heads), head_dim 16 != hidden/heads, untied lm_head.
    "qwen3_gqa3_tiny": dict(family="qwen3", cls="Qwen3ForCausalLM", config="Qwen3Config", seed=4, shard=None, config_kwargs=dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False,
        max_position_embeddings=512)),
    # A vocabulary over 100k (not a multiple of 128 or of any chunk size) on a hidden size of 4, tied,
    # stored in BF16 so the file stays under 1 MB. The tokenizer covers only the first VOCAB ids, as
    # Qwen's embedding has rows beyond its tokenizer.
    "qwen3_bigvocab_tiny": dict(family="qwen3", cls="Qwen3ForCausalLM", config="Qwen3Config", seed=5, shard=None,
        dtype=torch.bfloat16, config_kwargs=dict(
        vocab_size=100003, hidden_size=4, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
        max_position_embeddings=512)),
}


def special_ids(family, tok):
    """config.json and generation_config.json ids, in the shape of the real files (spec-model §5.3, §9)."""
    t = tok.token_to_id
    if family == "llama":
        return dict(bos_token_id=t("<|begin_of_text|>"), eos_token_id=t("<|end_of_text|>")), \
               dict(bos_token_id=t("<|begin_of_text|>"), eos_token_id=[t("<|end_of_text|>"), t("<|eot_id|>")])
    return dict(bos_token_id=t("<|endoftext|>"), eos_token_id=t("<|im_end|>")), \
           dict(bos_token_id=t("<|endoftext|>"), eos_token_id=[t("<|im_end|>"), t("<|endoftext|>")],
                pad_token_id=t("<|endoftext|>"))


def write_expected(name, model):
    """What torch holds for each parameter (shape, float64 sum, first values): the loader test's reference."""
    tensors = {}
    for pname, p in model.state_dict().items():
        flat = p.detach().to(torch.float64).flatten()
        tensors[pname] = dict(shape=list(p.shape), sum=flat.sum().item(), abs_sum=flat.abs().sum().item(),
                              first=[float(x) for x in p.detach().flatten()[:4]], last=float(p.detach().flatten()[-1]))
    expected = dict(num_parameters=sum(p.numel() for p in model.parameters()),
                    tied=model.config.tie_word_embeddings, tensors=tensors)
    with open(os.path.join(OUT, f"expected_{name}.json"), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")


def build(name, spec):
    path = os.path.join(OUT, name)
    if os.path.isdir(path):
        shutil.rmtree(path)
    tok, specials = make_tokenizer(spec["family"], VOCAB)
    config_ids, generation_ids = special_ids(spec["family"], tok)
    torch.manual_seed(spec["seed"])
    config = getattr(transformers, spec["config"])(**spec["config_kwargs"], **config_ids)
    model = getattr(transformers, spec["cls"])(config).to(torch.float32).eval()
    # HF initialises norms to ones and biases to zero; randomise them so a loader that mixes them up fails.
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif pname.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
    if "dtype" in spec:
        model = model.to(spec["dtype"])
    kwargs = {"safe_serialization": True}
    if spec["shard"]:
        kwargs["max_shard_size"] = spec["shard"]
    model.save_pretrained(path, **kwargs)
    GenerationConfig(**generation_ids).save_pretrained(path)
    save_tokenizer(tok, specials, spec["family"], path)
    write_expected(name, model)
    total = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    print(f"{name}: {sum(p.numel() for p in model.parameters())} parameters, {total} bytes in {path}")


def main():
    names = sys.argv[1:] or list(MODELS)
    for name in names:
        build(name, MODELS[name])


if __name__ == "__main__":
    main()
