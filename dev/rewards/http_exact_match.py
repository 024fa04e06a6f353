#!/usr/bin/env python3
"""http_exact_match.py: a reward server in OpenRLHF's remote reward format, for --reward_url.

    python3 dev/rewards/http_exact_match.py --port 5000 &
    ./train_rl_cpu --init tiny --task sort --task_size 1 --reward_url http://127.0.0.1:5000/get_reward

POST {"query": [prompt + response, ...], "prompts": [prompt, ...], "labels": [answer or null, ...]}
-> {"rewards": [...]}. The reward is the synthetic tasks' verifier (rl/tasks/tasks.h,
synthetic_verdict): the response's first line, stripped, equals the label: 1, else 0. Standard
library only; it serves 127.0.0.1 unless told otherwise. Replace `reward` with your own verifier.
"""
import argparse
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def reward(response, label):
    return 1.0 if label is not None and response.split("\n", 1)[0].strip() == label else 0.0


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        rewards = [reward(q[len(p):], label) for q, p, label in zip(body["query"], body["prompts"], body["labels"])]
        out = json.dumps({"rewards": rewards}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=5000)
    a = ap.parse_args()
    ThreadingHTTPServer((a.host, a.port), Handler).serve_forever()
