#!/usr/bin/env python3
"""parquet_to_jsonl.py: verl / slime RL parquet -> fp8rl JSONL rows (docs/sft.md, "Formats").

verl's data preprocessing (examples/data_preprocess/*.py) writes one row per problem:
    data_source: str, prompt: [{"role", "content"}, ...], ability: str,
    reward_model: {"style": "rule", "ground_truth": str}, extra_info: {...}
Each becomes one line
    {"messages": prompt, "answer": reward_model.ground_truth, "data_source": ..., "ability": ..., **extra_info}
which fp8rl reads as an RL row (--data, rl/tasks/data.h) or, with a "completion", an SFT row; the
extra_info fields stay on the line for an external verifier (fp8rl ignores fields it does not know).
A row whose prompt is a plain string keeps it as "prompt". A row without a ground truth, or whose
extra_info would overwrite one of the row's own keys, is an error naming the row.

    python3 dev/parquet_to_jsonl.py train.parquet train.jsonl      # needs pyarrow (or pandas)

Dev-only: the product and `make test` never need Python.
"""
import json
import os
import sys


def read_rows(path):
    """The parquet file's rows as Python dicts, by pyarrow, else pandas."""
    try:
        import pyarrow.parquet as pq
        return pq.read_table(path).to_pylist()
    except ImportError:
        import pandas as pd
        return [{k: to_python(v) for k, v in r.items()} for r in pd.read_parquet(path).to_dict(orient="records")]


def to_python(v):
    """numpy arrays and scalars (what pandas gives for nested columns) as lists and plain values."""
    if hasattr(v, "tolist"):
        v = v.tolist()
    if isinstance(v, dict):
        return {k: to_python(x) for k, x in v.items()}
    if isinstance(v, list):
        return [to_python(x) for x in v]
    return v


def convert(row, where):
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        out = {"prompt": prompt}
    elif isinstance(prompt, list) and prompt:
        out = {"messages": [{"role": m["role"], "content": m["content"]} for m in prompt]}
    else:
        raise ValueError(f"{where}: \"prompt\" must be a string or a non-empty message list")
    truth = (row.get("reward_model") or {}).get("ground_truth")
    if truth is None:
        raise ValueError(f"{where}: no reward_model.ground_truth to use as the answer")
    out["answer"] = truth if isinstance(truth, (str, int)) else json.dumps(truth)
    for key in ("data_source", "ability"):
        if row.get(key) is not None:
            out[key] = row[key]
    for key, value in (row.get("extra_info") or {}).items():
        if key in out:
            raise ValueError(f"{where}: extra_info.{key} would overwrite the row's own \"{key}\"")
        out[key] = value
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: parquet_to_jsonl.py IN.parquet OUT.jsonl")
    src, dst = sys.argv[1], sys.argv[2]
    rows = read_rows(src)
    with open(dst + ".tmp", "w", encoding="utf-8") as f:
        for i, row in enumerate(rows):
            try:
                f.write(json.dumps(convert(row, f"{src} row {i}"), ensure_ascii=False) + "\n")
            except ValueError as e:
                sys.exit(f"error: {e}")
    os.replace(dst + ".tmp", dst)
    print(f"{dst}: {len(rows)} rows")


if __name__ == "__main__":
    main()
