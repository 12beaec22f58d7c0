#!/usr/bin/env python3
"""What a checkpoint costs training, side by side: ddp_bench_checkpoint (a
100.7M-parameter MLP under DDP with Adam, plain or ZeRO) under
`ddprun --standalone --nproc-per-node 2`, saving every 3 steps in each of
four ways (file: save_checkpoint; file_async: CheckpointWriter; sharded:
save_sharded_checkpoint; sharded_async: CheckpointWriter with
CheckpointLayout::sharded), then loading the last checkpoint of the one-file
and the sharded kinds at 2 ranks and at another world size. Every run is
written to --out (CSV: one row per rank and event); the table on stdout.

  bench/run_checkpoint_bench.py --build build-torch2 --repeats 2 --out bench/results/checkpoint.csv
"""
import argparse
import csv
import os
import re
import shutil
import subprocess
import sys
import tempfile

LINE = re.compile(r"rank (\d+): (save at step \d+: ([\d.]+) s|durable ([\d.]+) s after the last save's call; "
                  r"RSS ([\d.]+) MiB before the saves \(peak so far ([\d.]+) MiB\), peak ([\d.]+) MiB|load ([\d.]+) s, written by (\d+) ranks; "
                  r"RSS ([\d.]+) MiB before, peak ([\d.]+) MiB)")


def run(args, world, extra, env):
    cmd = [args.ddprun, "--standalone", "--nproc-per-node", str(world), args.bench] + extra
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.run_timeout)
    if out.returncode != 0:
        sys.exit("failed: %s\n%s%s" % (" ".join(cmd), out.stdout, out.stderr))
    rows = []
    for m in LINE.finditer(out.stdout):
        rank = int(m.group(1))
        if m.group(3):
            rows.append(dict(rank=rank, event="save", seconds=float(m.group(3))))
        elif m.group(4):
            rows.append(dict(rank=rank, event="durable", seconds=float(m.group(4)), rss_before=float(m.group(5)),
                             rss_peak_before=float(m.group(6)), rss_peak=float(m.group(7))))
        else:
            rows.append(dict(rank=rank, event="load", seconds=float(m.group(8)), rss_before=float(m.group(10)),
                             rss_peak=float(m.group(11)), written_by=int(m.group(9))))
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build-torch2")
    p.add_argument("--ddprun")
    p.add_argument("--bench")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--other-world", type=int, default=3)
    p.add_argument("--dir", help="where checkpoints go (default: a new temporary folder)")
    p.add_argument("--run-timeout", type=int, default=1800)
    p.add_argument("--out", default="bench/results/checkpoint.csv")
    args = p.parse_args()
    args.ddprun = args.ddprun or os.path.join(args.build, "launcher", "ddprun")
    args.bench = args.bench or os.path.join(args.build, "bench", "ddp_bench_checkpoint")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    fields = ["repeat", "optimizer", "mode", "world", "rank", "event", "seconds", "rss_before", "rss_peak_before",
              "rss_peak", "written_by"]
    rows = []
    for repeat in range(1, args.repeats + 1):
        for optimizer in ("plain", "zero"):
            for mode in ("file", "file_async", "sharded", "sharded_async"):
                d = args.dir or tempfile.mkdtemp(prefix="ckpt_bench_")
                for r in run(args, 2, ["--dir", d, "--optimizer", optimizer, "--save", mode], env):
                    rows.append(dict(r, repeat=repeat, optimizer=optimizer, mode=mode, world=2))
                    print(rows[-1], flush=True)
                if mode in ("file", "sharded"):
                    path = os.path.join(d, optimizer + ".pt" if mode == "file" else "sharded_" + optimizer)
                    for world in (2, args.other_world):
                        extra = ["--dir", d, "--optimizer", optimizer, "--save", "none", "--steps", "0",
                                 "--load", path]
                        for r in run(args, world, extra, env):
                            rows.append(dict(r, repeat=repeat, optimizer=optimizer, mode="load_" + mode,
                                             world=world))
                            print(rows[-1], flush=True)
                if not args.dir:
                    shutil.rmtree(d, ignore_errors=True)
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in fields})
    print("wrote", args.out)


if __name__ == "__main__":
    main()
