#!/usr/bin/env python3
"""Tables of the emulation's profile: for each FP8RL_EMU_STATS file (docs/gpu-emulation.md, "The
profile"), one row per range and the total (counts per call beside the totals), then each range's
kernels by launches.

    python3 dev/emu_profile.py runs/emu_profile/train_step.json [more.json ...]
    python3 dev/emu_profile.py --top 5 FILE     # at most 5 kernels per range (default 8; 0: none)
"""
import argparse
import json

FIELDS = [("kernel_launches", "kernels"), ("gemm_calls", "GEMMs"), ("host_syncs", "host syncs"),
          ("h2d_copies", "H2D"), ("d2h_copies", "D2H"), ("memset_bytes", "memset bytes"),
          ("graph_launches", "graphs")]
# the engine's ranges in the order a step runs them (rl/driver/driver.h, cuda/engine/engine_gpu.cuh, rollout.cu)
ORDER = ["rollout", "decode_step", "sampling", "old_logprobs", "forward", "backward", "optimizer_step"]


def per_call(total, calls):
    return f"{total / calls:.1f}" if calls else "-"


def print_table(header, rows):
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                                       for i, (c, w) in enumerate(zip(r, widths))) + " |"
    print(line(header))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(line(r))


def report(path, top):
    with open(path) as f:
        stats = json.load(f)
    ranges = stats["ranges"]
    names = [n for n in ORDER if n in ranges] + sorted(n for n in ranges if n not in ORDER)
    print(f"## {path}\n")
    header = ["range", "calls"] + [h for _, h in FIELDS] + ["kernels/call", "GEMMs/call"]
    rows = []
    for name, s in [(n, ranges[n]) for n in names] + [("total", stats["total"])]:
        rows.append([name, s["calls"]] + [s[k] for k, _ in FIELDS] +
                    [per_call(s["kernel_launches"], s["calls"]), per_call(s["gemm_calls"], s["calls"])])
    print_table(header, rows)
    for name in names if top else []:
        kernels = sorted(ranges[name]["kernels"].items(), key=lambda kv: (-kv[1], kv[0]))
        if not kernels:
            continue
        calls = ranges[name]["calls"]
        print(f"\n{name}: kernels by launches" + (f" (first {top} of {len(kernels)})" if len(kernels) > top else ""))
        print_table(["kernel", "launches", "per call"], [[k, n, per_call(n, calls)] for k, n in kernels[:top]])
    print()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", help="FP8RL_EMU_STATS files")
    ap.add_argument("--top", type=int, default=8, help="kernels listed per range (0: none)")
    args = ap.parse_args()
    for path in args.files:
        report(path, args.top)


if __name__ == "__main__":
    main()
