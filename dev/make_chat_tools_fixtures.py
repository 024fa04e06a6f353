#!/usr/bin/env python3
"""Fixtures of Qwen's chat templates with function schemas (`tools`), from transformers'
apply_chat_template over the repository's tokenizer configs (test/fixtures/tokenizer/qwen3,
qwen2.5). Run from the repository root (dev only: pip install transformers jinja2):

    python3 dev/make_chat_tools_fixtures.py [test/fixtures/tokenizer]

Writes chat_tools_qwen3.jsonl and chat_tools_qwen2.5.jsonl there, one line per rendering:
  {"messages", "tools", "add_generation_prompt", "enable_thinking", "text", "ids"}
which test/test_tokenizer.cpp compares with rl/text/chat.h's rendering (and SFT's, test_environment.cpp).
"""
import json
import os
import sys

from transformers import AutoTokenizer

DIR = sys.argv[1] if len(sys.argv) > 1 else "test/fixtures/tokenizer"

# Two function schemas: nested objects, an enum, integers, floats that Python writes in both of its
# notations (0.5, 100.0, 1e-05, 2.5e+16), true/false/null, and text with quotes, a backslash, a
# newline, a tab, a control character and non-ASCII letters.
TOOLS = [
    {"type": "function",
     "function": {"name": "calculator", "description": "Evaluate an arithmetic expression, e.g. \"3*(4+5)\".",
                  "parameters": {"type": "object",
                                 "properties": {"expression": {"type": "string", "description": "the expression"},
                                                "precision": {"type": "integer", "default": 6, "minimum": 0}},
                                 "required": ["expression"]}}},
    {"type": "function",
     "function": {"name": "search_docs", "description": "Suche in Dokumenten \\ 文档\nline two\tand\x01 more",
                  "parameters": {"type": "object",
                                 "properties": {"query": {"type": "string"},
                                                "mode": {"type": "string", "enum": ["fast", "exact"]},
                                                "threshold": {"type": "number", "default": 0.5, "maximum": 100.0,
                                                              "epsilon": 1e-05, "big": 2.5e16},
                                                "strict": {"type": "boolean", "default": False},
                                                "filter": {"type": ["string", "null"], "default": None}},
                                 "required": ["query", "mode"]}}},
]


def cases(family):
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "3*(4+5)"}}\n</tool_call>'
    out = [
        ([{"role": "user", "content": "What is 3*(4+5)?"}], TOOLS, True),
        ([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 3*(4+5)?"}], TOOLS[:1], True),
        ([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 3*(4+5)?"},
          {"role": "assistant", "content": call}, {"role": "tool", "content": "27"},
          {"role": "assistant", "content": "It is 27."}], TOOLS, False),
        ([{"role": "user", "content": "Find the docs."}, {"role": "assistant", "content": call},
          {"role": "tool", "content": "27"}, {"role": "tool", "content": "none"}], TOOLS[1:], True),
    ]
    if family == "qwen3":
        out.append(([{"role": "user", "content": "Q"}, {"role": "assistant", "content": "<think>\nr\n</think>\n\n" + call},
                     {"role": "tool", "content": "27"}, {"role": "assistant", "content": "27"}], TOOLS, False))
    return out


def main():
    for family in ["qwen3", "qwen2.5"]:
        hf = AutoTokenizer.from_pretrained(os.path.join(DIR, family))
        rows = []
        for messages, tools, gen in cases(family):
            for thinking in ([None, True, False] if family == "qwen3" else [None]):
                kwargs = {} if thinking is None else {"enable_thinking": thinking}
                text = hf.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=gen, **kwargs)
                rows.append({"messages": messages, "tools": tools, "add_generation_prompt": gen, "enable_thinking": thinking,
                             "text": text, "ids": hf(text, add_special_tokens=False)["input_ids"]})
        with open(os.path.join(DIR, "chat_tools_%s.jsonl" % family), "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
