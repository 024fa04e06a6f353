#!/usr/bin/env python3
"""Draws one step's rollouts from --dump_rollouts (OUT/rollouts/step_K.jsonl) as an HTML page: one
row per sample, its tokens coloured by entropy (white = 0 to red = the step's largest), a blue
underline where the clipped branch of the surrogate won below the ratio bounds and a green one
above, and a tooltip with every per-token value. Samples are sorted by advantage, the negative
first, so the Calibrated Clipping paper's "garbled high-entropy negative-advantage responses" come
on top. Standard library only.

  python3 dev/plot_rollouts.py OUT/rollouts/step_0.jsonl [-o page.html] [--tokenizer OUT/init_model/tokenizer.json]

Without --tokenizer the tokens are shown as their ids; with it, as the vocabulary's strings.
"""
import argparse
import html
import json
import sys


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def vocabulary(path):
    if not path:
        return None
    with open(path) as f:
        vocab = json.load(f)["model"]["vocab"]
    return {i: s for s, i in vocab.items()}


def token_span(tok_text, t, s, max_entropy):
    e = s["entropy"][t] if s["entropy"][t] is not None else 0.0
    shade = int(255 * (1.0 - min(e / max_entropy, 1.0))) if max_entropy > 0 else 255
    clip = s["clipped"][t]
    underline = {-1: "border-bottom:3px solid #2060ff;", 1: "border-bottom:3px solid #20a040;"}.get(clip, "")
    tip = " ".join("%s=%s" % (k, s[k][t]) for k in ("ids", "rollout_lp", "old_lp", "entropy", "is_weight", "ratio", "clipped"))
    return '<span title="%s" style="background:rgb(255,%d,%d);%s">%s</span>' % (
        html.escape(tip), shade, shade, underline, html.escape(tok_text))


def page(samples, vocab):
    max_entropy = max((e for s in samples for e in s["entropy"] if e is not None), default=0.0)
    rows = []
    for s in sorted(samples, key=lambda s: s["advantage"]):
        toks = [vocab.get(i, str(i)) if vocab else "[%d]" % i for i in s["ids"]]
        spans = "".join(token_span(x, t, s, max_entropy) for t, x in enumerate(toks))
        rows.append("<tr><td>%.3f</td><td>%.3f</td><td><code>%s</code></td><td><code>%s</code></td></tr>" % (
            s["advantage"], s["reward"], html.escape(s["prompt"]), spans))
    step = samples[0]["step"] if samples else "?"
    return ("<!doctype html><meta charset=utf-8><title>fp8rl rollouts, step %s</title>"
            "<h3>step %s: %d samples; red = entropy (max %.3g), underline blue/green = clipped below/above</h3>"
            "<table border=1 cellspacing=0 cellpadding=3><tr><th>advantage</th><th>reward</th><th>prompt</th>"
            "<th>response tokens</th></tr>%s</table>" % (step, step, len(samples), max_entropy, "".join(rows)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dump")
    ap.add_argument("-o", "--out", default=None, help="output HTML (default: the dump's name with .html)")
    ap.add_argument("--tokenizer", default=None, help="a tokenizer.json to show tokens as text")
    a = ap.parse_args()
    samples = load(a.dump)
    out = a.out or a.dump.rsplit(".", 1)[0] + ".html"
    with open(out, "w") as f:
        f.write(page(samples, vocabulary(a.tokenizer)))
    print("%s: %d samples" % (out, len(samples)), file=sys.stderr)


if __name__ == "__main__":
    main()
