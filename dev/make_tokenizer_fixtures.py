#!/usr/bin/env python3
"""Fixtures for the tokenizer tests, from HF `tokenizers` (ids, decodes, NFC) and `transformers`
(apply_chat_template). Run from the repository root:

    python3 dev/make_tokenizer_fixtures.py [test/fixtures/tokenizer]

Writes test/fixtures/tokenizer/:
  corpus.jsonl            the assembled corpus, one {"text": ...} per line (inputs only)
  <name>.jsonl            per tokenizer (qwen3, qwen2.5, llama3_style, gpt2_style), lines of kinds
                            {"text", "ids", "ids_special"}   encode without / with special tokens
                            {"long": {...}, "n_ids", "fnv1a64"}  a long document (rule below)
                            {"hex", "text", "ids"}          invalid UTF-8 bytes, Python's
                                                            bytes.decode("utf-8", "replace") of
                                                            them, and HF's ids of that text
                            {"decode": [ids], "text", "text_skip"}  HF decode without / with
                                                            skip_special_tokens
  nfc.jsonl               {"text", "nfc"}: HF's NFC normalizer output
  chat_<name>.jsonl       {"messages", "add_generation_prompt", "enable_thinking", "text", "ids"}
  llama3_style/           a Llama-3-style tokenizer.json built here with `tokenizers` (Llama-3
                          Split regex, ignore_merges, byte-level, Llama-3 special tokens,
                          TemplateProcessing adding <|begin_of_text|>), its tokenizer_config.json
                          with the Llama-3.2 chat template, and config.json (model_type llama)
  gpt2_style/tokenizer.json  a small ByteLevelBPETokenizer (GPT-2 regex, add_prefix_space true)

Long documents are not stored: {"long": {"entries": [i...], "sep": s, "repeat": r}} means the text
  for _ in range(r): for i in entries: text += corpus[i] + s
and the test rebuilds it the same way from corpus.jsonl; the expected ids are stored as their count
and the FNV-1a 64-bit hash of the ids as little-endian uint32 bytes.
"""
import json
import os
import random
import sys

import unicodedata2
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from tokenizers import ByteLevelBPETokenizer
from transformers import AutoTokenizer

SHARED = sys.argv[1] if len(sys.argv) > 1 else "test/fixtures/tokenizer"
OUT = "test/fixtures/tokenizer"

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>"]
LLAMA_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                  "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
                  "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]

# The Llama-3.2-Instruct chat template, its path without tools (tools, custom_tools and tool roles
# are not rendered by fp8rl), transcribed from the public template: spec-model.md section 8.3.
LLAMA3_TEMPLATE = (
    "{{- bos_token }}\n"
    "{%- if not date_string is defined %}\n"
    "    {%- if strftime_now is defined %}\n"
    "        {%- set date_string = strftime_now(\"%d %b %Y\") %}\n"
    "    {%- else %}\n"
    "        {%- set date_string = \"26 Jul 2024\" %}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {%- set system_message = messages[0]['content']|trim %}\n"
    "    {%- set messages = messages[1:] %}\n"
    "{%- else %}\n"
    "    {%- set system_message = \"\" %}\n"
    "{%- endif %}\n"
    "{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n"
    "{{- \"Cutting Knowledge Date: December 2023\\n\" }}\n"
    "{{- \"Today Date: \" + date_string + \"\\n\\n\" }}\n"
    "{{- system_message }}\n"
    "{{- \"<|eot_id|>\" }}\n"
    "{%- for message in messages %}\n"
    "    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    "{%- endif %}\n"
)


def corpus():
    prose = ("The quick brown fox jumps over the lazy dog. It wasn't the first time; the dog'd seen it "
             "before, and he'll see it again. \"Really?\" she asked -- twice. (Yes.) Mr. O'Neil's car "
             "cost $12,345.67 on 2024-01-15, roughly 3.5x what I'd paid.")
    code = ("def fib(n: int) -> int:\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n"
            "    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n\nif __name__ == '__main__':\n"
            "\tprint(fib(30))  # 832040\r\n")
    cpp = ("template <typename T>\nstatic inline T clamp(T x, T lo, T hi) {\n  return x < lo ? lo : (x > hi ? hi : x);\n}\n"
           "int main(){std::vector<int> v{1,2,3};for(auto&x:v)x*=2;return v[0]!=2;}// done\n")
    latex = (r"\begin{align} \int_0^\infty e^{-x^2}\,dx &= \frac{\sqrt{\pi}}{2}, \\ \sum_{k=1}^{n} k^2 "
             r"&= \frac{n(n+1)(2n+1)}{6} \end{align} where $\alpha_i \in \mathbb{R}^{d}$ and \boxed{42}.")
    texts = [
        prose, code, cpp, latex,
        "Hello world", " Hello world", "Hello, world!", "12345", "  leading spaces\n\nnew\r\nlines\t\ttabs",
        "I'm don't you'LL WE'RE They'Ve SHE'S it'D I'M y'all 'tis 'S ' s '", "'ſ 'K 'Ll 'rE 've",
        "😀 café naïve", "x=[1,2];  y",
        "3141592653589793238462643383279502884197169399375105820974944592307816406286208998628034825342117067982148086513282306647",
        "Order #00042: 1,000,000 items at 0.001 each = 1e3; v1.2.3-rc4; 0x1F; ²³ ½ Ⅻ ٣٤٥ ४२ ๕๖",
        "中文测试：我们今天去公园散步，天气非常好！日本語のテキストも混ぜます。한국어 문장도 있습니다.",
        "العربية: مرحبا بالعالم، كيف حالك؟ ١٢٣ وَالسَّلَامُ عَلَيْكُمْ",
        "हिन्दी: नमस्ते दुनिया, आप कैसे हैं? क़ ख़ ग़ ज़ ड़ ढ़ फ़ य़ ॐ",
        "ภาษาไทย: สวัสดีชาวโลก ขอบคุณมากครับ ๑๒๓",
        "Emoji: 👨‍👩‍👧‍👦 👩🏽‍💻 🏳️‍🌈 ❤️‍🔥 🇫🇷🇯🇵🇺🇸 🏴󠁧󠁢󠁳󠁣󠁴󠁿 1️⃣ #️⃣ 🫨 🛝",
        "Combining: e\u0301 a\u0308 A\u030a \u212b \u2126 n\u0303 o\u0302\u0323 o\u0323\u0302 Tie\u0302\u0301ng Vie\u0323\u0302t "
        "\u1100\u1161\u11a8 \u0387 \uf900 \u0958 \u0344 e\u0301\u0301 \u0301leading mark q\u0307\u0323",
        "Whitespace:   three\t\ttwo tabs\n\n\nthree newlines\r\n\r\nCRLF  \u00a0nbsp\u3000ideo\u2028ls\u2029ps\x85nel"
        "\x0bvt\x0cff  \n  \t \n end   ",
        "          \n\n\n          ",
        "trailing spaces   ", "\n", " ", "\t\t\t", "\r\n", "a\rb\r\rc", "",
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
        "text<|endoftext|>more<|im_end|><|im_start|>  <think>x</think><tool_call>{}</tool_call>",
        "partial <|im_star and <|im_start| and <|im_end||> and <<|im_end|>> and <thinking>",
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
        "Control\x00chars\x01\x1f\x7f and \ufffd replacement and \u200b zero\u200dwidth \ufeffbom",
        "Unicode 16: \U00010d40\U00010d41 Garay digits \U0001ccf0\U0001ccf1 outlined \u1c89\u1c8a letters "
        "\U000105c0\U000105c1 Todhri",
        "Unassigned \u0378 private \ue000 supplementary \U00020000\U0002a700 \U00031350 tag \U000e0041",
        "MiXeD CaSe WoRdS and snake_case_identifiers and camelCaseIdentifiers and ALLCAPS123abc",
        "http://example.com/path?query=1&b=2#frag user@example.org C:\\Users\\x\\file.txt ~/.bashrc",
        "--- *** ___ === +++ ... !!! ??? ;;; ::: ((( ))) [[[ ]]] {{{ }}} <<< >>> ||| &&& %%% $$$ ### @@@",
        "a" * 300, "ab" * 200, "😀" * 50, "\u0301" * 20, " " * 100 + "x", "9" * 100,
    ]
    return texts


def class_probe_text():
    """Every boundary of the Unicode 16.0 general-category ranges (and a stride through the rest),
    each between two letters, so each probed character's class shows in the pre-tokens."""
    cps = set()
    prev = None
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        cat = unicodedata2.category(chr(cp))[0]
        if cat != prev:
            cps.update([cp - 1, cp])
        prev = cat
    cps.update(range(0, 0x110000, 997))
    cps = sorted(c for c in cps if c >= 0 and not 0xD800 <= c <= 0xDFFF)
    chunks, cur = [], []
    for c in cps:
        cur.append("x" + chr(c) + "y ")
        if len(cur) == 400:
            chunks.append("".join(cur))
            cur = []
    chunks.append("".join(cur))
    return chunks


def nfc_cases():
    rng = random.Random(7)
    marks = [c for c in range(0x300, 0x110000) if not 0xD800 <= c <= 0xDFFF and unicodedata2.combining(chr(c))]
    cases = []
    decomposable = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF
                    and unicodedata2.normalize("NFD", chr(c)) != chr(c)]
    for k in range(0, len(decomposable), 64):  # decomposed forms, 64 characters per case
        group = decomposable[k:k + 64]
        cases.append(" ".join(unicodedata2.normalize("NFD", chr(c)) for c in group))
        cases.append(" ".join(chr(c) for c in group))
    for _ in range(300):  # random mark sequences after a base letter or a Hangul jamo
        base = rng.choice(["a", "e", "o", "u", "\u1100", "\u1161", "\uac00", "\u0915", "\u0627", " "])
        cases.append(base + "".join(chr(rng.choice(marks)) for _ in range(rng.randint(1, 5))))
    return cases


def fnv1a64(ids):
    h = 0xCBF29CE484222325
    for i in ids:
        for b in int(i).to_bytes(4, "little"):
            h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def long_docs(n):
    return [
        {"entries": list(range(n)), "sep": "\n", "repeat": 12},       # the whole corpus, ~140 KB
        {"entries": [0, 2, 15, 18], "sep": " ", "repeat": 60},        # prose, C++, CJK, Thai
        {"entries": [40], "sep": "", "repeat": 400},                   # one 120 KB pre-token (a run of 'a')
        {"entries": [44], "sep": "", "repeat": 1200},                 # (100 spaces, x) x 1200
    ]


def build_long(texts, spec):
    out = []
    for _ in range(spec["repeat"]):
        for i in spec["entries"]:
            out.append(texts[i] + spec["sep"])
    return "".join(out)


INVALID_UTF8 = ["ff", "c0af", "e282", "e282" + "41", "f09f98", "f09f9880", "eda080", "f4908080", "80bfbf",
                "48656c6c6fff776f726c64", "e0808041", "f880808041", "c3", "6162e2", "efbbbf41", "fe41fd"]


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def encode_rows(tok, texts, rng, with_probes):
    rows = []
    inputs = texts + (class_probe_text() if with_probes else [])
    for t in inputs:
        rows.append({"text": t, "ids": tok.encode(t, add_special_tokens=False).ids,
                     "ids_special": tok.encode(t, add_special_tokens=True).ids})
    for spec in long_docs(len(texts)):
        ids = tok.encode(build_long(texts, spec), add_special_tokens=False).ids
        rows.append({"long": spec, "n_ids": len(ids), "fnv1a64": fnv1a64(ids)})
    for h in INVALID_UTF8:
        text = bytes.fromhex(h).decode("utf-8", "replace")
        rows.append({"hex": h, "text": text, "ids": tok.encode(text, add_special_tokens=False).ids})
    vocab = tok.get_vocab_size(with_added_tokens=True)
    specials = [i for i in range(vocab) if tok.id_to_token(i) is not None and tok.decode([i], skip_special_tokens=True) == ""
                and tok.decode([i]) != ""]
    for _ in range(200):
        n = rng.randint(1, 12)
        ids = [rng.choice([rng.randrange(0, 300), rng.randrange(0, vocab), rng.choice(specials or [0]), vocab + 5])
               for _ in range(n)]
        rows.append({"decode": ids, "text": tok.decode(ids, skip_special_tokens=False),
                     "text_skip": tok.decode(ids, skip_special_tokens=True)})
    return rows


def chat_cases(family):
    q = [{"role": "user", "content": "What is 2+2?"}]
    cases = [
        (q, True), ([{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}], True),
        ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}], False),
        ([{"role": "user", "content": "  padded question \n"}], True),
        ([{"role": "system", "content": " You are terse. "}, {"role": "user", "content": "Name a prime."},
          {"role": "assistant", "content": "7"}, {"role": "user", "content": "Another?"}], True),
        ([{"role": "user", "content": "数学: 1+1=? <|im_end|> inline"}], True),
    ]
    if family == "qwen3":
        cases += [
            ([{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "<think>\nr1\n</think>\n\nA1"},
              {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "<think>\nr2\n</think>\n\nA2"}], False),
            ([{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1", "reasoning_content": "because"},
              {"role": "user", "content": "Q2"}], True),
            ([{"role": "user", "content": "Q"}, {"role": "assistant", "content": "\n\n<think>x</think>\n\nA"},
              {"role": "system", "content": "late system"}, {"role": "assistant", "content": "B"}], False),
            ([{"role": "user", "content": "call"}, {"role": "assistant", "content": "ok"},
              {"role": "tool", "content": "result 1"}, {"role": "tool", "content": "result 2"},
              {"role": "assistant", "content": "<think>\n\nthought\n\n</think>final"}], True),
            ([{"role": "user", "content": "<tool_response>x</tool_response>"}, {"role": "assistant", "content": "a"}], True),
        ]
    return cases


def chat_rows(hf, family):
    rows = []
    for messages, gen in chat_cases(family):
        for thinking in ([None, True, False] if family == "qwen3" else [None]):
            kwargs = {}
            if thinking is not None:
                kwargs["enable_thinking"] = thinking
            if family == "llama3_style":
                kwargs["date_string"] = "26 Jul 2024"
            text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen, **kwargs)
            rows.append({"messages": messages, "add_generation_prompt": gen, "enable_thinking": thinking, "text": text,
                         "ids": hf(text, add_special_tokens=False)["input_ids"]})
    return rows


def build_llama3_style(texts, folder):
    """A Llama-3-style tokenizer: Llama-3's Split regex, byte-level, ignore_merges, trained here."""
    llama_regex = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
                   "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(pattern=__import__("tokenizers").Regex(llama_regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    trainer_tok = Tokenizer(models.BPE())
    trainer_tok.pre_tokenizer = pre
    trainer = trainers.BpeTrainer(vocab_size=1200, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    trainer_tok.train_from_iterator(texts * 3, trainer)
    trained = json.loads(trainer_tok.to_str())
    vocab = dict(trained["model"]["vocab"])
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in trained["model"]["merges"]]
    # whole words added to the vocab without merges leading to them: only ignore_merges emits them
    for word in ["Ġhello", "Ġworld", "quick", "Ġfox", "Ġ12", "ĠĠĠ"]:
        vocab.setdefault(word, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(LLAMA_SPECIALS)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "clean_up_tokenization_spaces": False,
                   "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 131072,
                   "chat_template": LLAMA3_TEMPLATE}, f, indent=2)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}, f, indent=2)
    return tok


def build_gpt2_style(texts, folder):
    tok = ByteLevelBPETokenizer(add_prefix_space=True)
    tok.train_from_iterator(texts * 3, vocab_size=700, special_tokens=["<|endoftext|>"], show_progress=False)
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    return Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))


def main():
    os.makedirs(OUT, exist_ok=True)
    texts = corpus()
    write_jsonl(os.path.join(OUT, "corpus.jsonl"), [{"text": t} for t in texts])
    tokenizers = {
        "qwen3": Tokenizer.from_file(os.path.join(SHARED, "qwen3/tokenizer.json")),
        "qwen2.5": Tokenizer.from_file(os.path.join(SHARED, "qwen2.5/tokenizer.json")),
        "llama3_style": build_llama3_style(texts, os.path.join(OUT, "llama3_style")),
        "gpt2_style": build_gpt2_style(texts, os.path.join(OUT, "gpt2_style")),
    }
    for name, tok in tokenizers.items():
        write_jsonl(os.path.join(OUT, name + ".jsonl"), encode_rows(tok, texts, random.Random(name), name == "qwen3"))
    norm = tokenizers["qwen3"].normalizer
    write_jsonl(os.path.join(OUT, "nfc.jsonl"), [{"text": t, "nfc": norm.normalize_str(t)} for t in nfc_cases() + texts])
    for name, folder in [("qwen3", os.path.join(SHARED, "qwen3")), ("qwen2.5", os.path.join(SHARED, "qwen2.5")),
                         ("llama3_style", os.path.join(OUT, "llama3_style"))]:
        hf = AutoTokenizer.from_pretrained(folder)
        write_jsonl(os.path.join(OUT, "chat_%s.jsonl" % name), chat_rows(hf, name))


if __name__ == "__main__":
    main()
