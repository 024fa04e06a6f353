#!/usr/bin/env python3
"""Tokenizer speed: fp8rl against HF tokenizers (single-threaded), on the same documents, in one run.

    make build/bench_tokenizer && python3 dev/bench_tokenizer.py [test/fixtures/tokenizer]

Runs build/bench_tokenizer (which writes its >= 10 MB corpus), then HF tokenizers on those
documents with one thread (RAYON_NUM_THREADS=1, one encode call per document, as the C++ side), and
prints both, their ratio, and whether the ids agree (FNV-1a hash of all ids).
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
from tokenizers import Tokenizer  # noqa: E402  (after the thread settings)

SHARED = sys.argv[1] if len(sys.argv) > 1 else "test/fixtures/tokenizer"


def fnv1a64(all_ids):
    h = 0xCBF29CE484222325
    for ids in all_ids:
        for i in ids:
            for b in int(i).to_bytes(4, "little"):
                h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def main():
    with tempfile.TemporaryDirectory() as tmp:
        corpus_path = os.path.join(tmp, "corpus.jsonl")
        env = dict(os.environ, FP8RL_TOKENIZERS=SHARED)
        ours = subprocess.run(["./build/bench_tokenizer", "--corpus-out", corpus_path], env=env, check=True,
                              capture_output=True, text=True).stdout
        print(ours, end="")
        with open(corpus_path, encoding="utf-8") as f:
            docs = [json.loads(line) for line in f]
    mb = sum(len(d.encode("utf-8")) for d in docs) / 1e6

    t0 = time.perf_counter()
    tok = Tokenizer.from_file(os.path.join(SHARED, "qwen3/tokenizer.json"))
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    ids = [tok.encode(d, add_special_tokens=False).ids for d in docs]
    encode_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for v in ids:
        tok.decode(v)
    decode_s = time.perf_counter() - t0
    print("HF tokenizers: Qwen3 tokenizer.json load %.3f s" % load_s)
    print("HF tokenizers: encode %.2f MB in %.3f s = %.2f MB/s (1 thread)" % (mb, encode_s, mb / encode_s))
    print("HF tokenizers: decode in %.3f s = %.2f MB/s" % (decode_s, mb / decode_s))

    our_load = float(re.search(r"load ([0-9.]+) s", ours).group(1))
    our_mbs = float(re.search(r"= ([0-9.]+) MB/s \(1 thread\)", ours).group(1))
    our_dec = float(re.search(r"decode .* = ([0-9.]+) MB/s", ours).group(1))
    same = re.search(r"fnv1a64 ([0-9a-f]+)", ours).group(1) == fnv1a64(ids)
    print("ratio fp8rl/HF: encode %.2fx, decode %.2fx, load time %.2fx; ids identical: %s"
          % (our_mbs / (mb / encode_s), our_dec / (mb / decode_s), our_load / load_s, "yes" if same else "NO"))


if __name__ == "__main__":
    main()
