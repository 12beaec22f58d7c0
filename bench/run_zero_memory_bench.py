#!/usr/bin/python3
"""ZeRO-1's memory: optimizer state per rank with Adam on a ~100 MB model
(ddp_bench_zero_memory), unsharded torch::optim::Adam at W = 1 against
ddp::ZeroRedundancyOptimizer at W = 1, 2, 3, 4, each run under ddprun
--standalone on one machine over Gloo.

  /usr/bin/python3 bench/run_zero_memory_bench.py [--build build] [--worlds 1,2,3,4] [--reps 2]

Prints a table and writes bench/results/zero_memory.txt and .csv (every rank
of every run). Per rank: state_bytes, the bytes of Adam's state tensors (what
ZeRO shards; expect 2 x 4 bytes x owned parameters, about 1/W of the
unsharded 199 MB); rss_delta, the resident memory grown from before the first
step to after the third (the state, plus what the allocator keeps of the
step's temporaries); peak_rss_delta, the peak grown over the same steps.
"""
import argparse
import csv
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run(build, optimizer, world):
    cmd = [os.path.join(build, "launcher", "ddprun"), "--standalone", "--nproc-per-node", str(world),
           os.path.join(build, "bench", "ddp_bench_zero_memory"), "--optimizer", optimizer, "--steps", "3"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    rows = []
    for line in (out.stdout + out.stderr).splitlines():
        if "ZERO_MEMORY" in line:
            fields = dict(kv.split("=", 1) for kv in line[line.index("ZERO_MEMORY"):].split()[1:])
            rows.append({k: (v if k == "optimizer" else int(v)) for k, v in fields.items()})
    if len(rows) != world:
        sys.exit(f"expected {world} ZERO_MEMORY lines:\n{out.stdout}\n{out.stderr}")
    return sorted(rows, key=lambda r: r["rank"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--worlds", default="1,2,3,4")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "zero_memory"))
    a = ap.parse_args()
    rows = []
    for rep in range(a.reps):
        rows += [dict(r, rep=rep) for r in run(a.build, "plain", 1)]
        for w in [int(x) for x in a.worlds.split(",")]:
            rows += [dict(r, rep=rep) for r in run(a.build, "zero", w)]
    unsharded = max(r["state_bytes"] for r in rows if r["optimizer"] == "plain")
    lines = ["ZeRO-1 memory, Adam on a %.1f MB model (%d float parameters), per rank; 3 steps, Gloo, one machine"
             % (rows[0]["params"] * 4 / 1e6, rows[0]["params"]),
             "optimizer  W  rank rep  owned_params  state_MB  state/unsharded  x_W  rss_delta_MB  peak_rss_delta_MB"]
    for r in rows:
        share = r["state_bytes"] / unsharded
        lines.append("%-9s %2d %5d %3d %13d %9.1f %16.3f %5.2f %13.1f %18.1f" % (
            r["optimizer"], r["world"], r["rank"], r["rep"], r["owned_params"], r["state_bytes"] / 1e6, share,
            share * r["world"], r["rss_delta_kb"] / 1024, r["peak_rss_delta_kb"] / 1024))
    text = "\n".join(lines) + "\n"
    print(text, end="")
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out + ".txt", "w") as f:
        f.write(text)
    with open(a.out + ".csv", "w", newline="") as f:
        keys = ["optimizer", "world", "rank", "rep", "params", "owned_params", "state_bytes", "rss_delta_kb",
                "peak_rss_delta_kb", "rss_after_kb"]
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: r[k] for k in keys})


if __name__ == "__main__":
    main()
