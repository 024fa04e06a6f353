"""What the miniature experiments share (dev/paper_experiment.py, dev/kv_replay_experiment.py): the
miniature's run (addition, a fresh tiny model per seed, 32 prompts x 16 samples, 4 minibatches, lr
3e-4, temperature 1.5, 100 eval prompts), their common flags, the pool that runs every (arm, seed),
their logs, and the "mean (min..max) over the seeds" cells of their tables. Standard library only."""
import concurrent.futures
import json
import os

MINIATURE = ["--task", "add", "--task_size", "1", "--max_new_tokens", "3", "--group_size", "16", "--batch_prompts", "32",
             "--minibatches", "4", "--lr", "3e-4", "--temperature", "1.5", "--eval_prompts", "100", "--eval_k", "0"]


def add_common_args(ap, steps, out):
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--jobs", type=int, default=2, help="runs at once (each on OMP_NUM_THREADS threads, default 1)")
    ap.add_argument("--out", default=out)
    ap.add_argument("--bin", default="./train_rl_cpu")


def arm_dir(a, name, seed):
    return os.path.join(a.out, f"seed{seed}", name.replace(" ", "_").replace(",", "").replace("+", ""))


def read_log(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def run_arms(a, arms, run_one):
    """run_one(a, name, flags, seed) -> rows of its log, for every arm (name, flags) and seed, a.jobs at once:
    {name: {seed: rows}}."""
    runs = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs) as pool:
        futures = {pool.submit(run_one, a, name, flags, seed): (name, seed) for seed in a.seeds for name, flags in arms}
        for f in concurrent.futures.as_completed(futures):
            name, seed = futures[f]
            runs.setdefault(name, {})[seed] = f.result()
            print(f"== {name}, seed {seed}: done", flush=True)
    return runs


def spread(values):
    values = [v for v in values if v == v]
    if not values:
        return "n/a"
    mean = sum(values) / len(values)
    fmt = (lambda v: f"{v:.2e}") if max(abs(v) for v in values) < 1e-2 else (lambda v: f"{v:.3f}")
    return f"{fmt(mean)} ({fmt(min(values))}..{fmt(max(values))})"


def write_table(out, lines):
    table = "\n".join(lines) + "\n"
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(table)
    print(table)
