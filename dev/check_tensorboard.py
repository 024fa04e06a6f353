#!/usr/bin/env python3
"""Reads a run's TensorBoard event files back with the tensorboard package and compares every
scalar with log.jsonl (the step is training/global_step + 1). TensorBoard holds the float32 of the
double; log.jsonl its 9-digit decimal, whose float32 can be the neighbour: within 1 float32 ulp.

    pip install tensorboard && python3 dev/check_tensorboard.py RUN_DIR

Exits 1 on the first missing or differing scalar, else prints how many it compared.
"""
import json
import math
import os
import sys

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def main():
    run = sys.argv[1]
    acc = EventAccumulator(run, size_guidance={"scalars": 0})
    acc.Reload()
    tb = {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}
    compared = 0
    with open(os.path.join(run, "log.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            step = int(row["training/global_step"]) + 1
            for tag, v in row.items():
                if v is None or (isinstance(v, float) and math.isnan(v)):
                    continue
                got = tb.get(tag, {}).get(step)
                want = np.float32(v)
                near = {float(want), float(np.nextafter(want, np.float32(np.inf))), float(np.nextafter(want, np.float32(-np.inf)))}
                if got is None or got not in near:
                    sys.exit(f"{run}: step {step} {tag}: log.jsonl {v} (float32 {want}), TensorBoard {got}")
                compared += 1
    n_tb = sum(len(v) for v in tb.values())
    if n_tb != compared:
        sys.exit(f"{run}: TensorBoard holds {n_tb} scalars, log.jsonl {compared}")
    print(f"{run}: {compared} scalars over {len(tb)} tags agree between log.jsonl and TensorBoard")


if __name__ == "__main__":
    main()
