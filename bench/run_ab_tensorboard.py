#!/usr/bin/python3
"""What the training kit's TensorBoard files cost: lenet_fmnist under ddprun
(2 ranks, Gloo over loopback) with the writer on (the default) against
--no-tensorboard, as pairs whose order alternates, so that the machine's drift
falls on both alike. Each run starts afresh in a run folder of its own; its
training throughput is metrics.csv's samples_per_s (the epoch's steps, the
per-step records among them), its wall time the whole program's (start-up,
the environment text, evaluation, the epoch's records and the hparams), its
CPU time that of ddprun and both ranks (getrusage of the children: on a
machine others use too, the figure their load disturbs least).
Prints every pair, the on/off ratios, and their median.

  /usr/bin/python3 bench/run_ab_tensorboard.py --build build --pairs 8 --limit-batches 80
"""
import argparse
import csv
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def run_once(args, tensorboard, folder):
    shutil.rmtree(folder, ignore_errors=True)
    cmd = [os.path.join(args.build, "launcher", "ddprun"), "--nproc-per-node", "2",
           os.path.join(args.build, "examples", "lenet_fmnist", "lenet_fmnist"),
           "--epochs", "1", "--limit-batches", str(args.limit_batches), "--run-dir", folder,
           "--preemption-check-every", "0"]
    if not tensorboard:
        cmd.append("--no-tensorboard")
    start = time.monotonic()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if out.returncode != 0:
        sys.exit(f"run failed ({out.returncode}): {' '.join(cmd)}\n{out.stdout[-3000:]}")
    events = [f for f in os.listdir(folder) if f.startswith("events.out.tfevents.")]
    if bool(events) != tensorboard:
        sys.exit(f"{folder}: {len(events)} event files with tensorboard {'on' if tensorboard else 'off'}")
    with open(os.path.join(folder, "metrics.csv")) as f:
        row = list(csv.DictReader(f))[-1]
    return float(row["samples_per_s"]), wall, cpu


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--limit-batches", type=int, default=80)
    args = ap.parse_args()
    top = tempfile.mkdtemp(prefix="ddp_tb_bench_")
    print(f"lenet_fmnist, 2 ranks (ddprun), --epochs 1 --limit-batches {args.limit_batches}; {args.pairs} pairs, "
          f"order alternating; on: the default (--tensorboard), off: --no-tensorboard", flush=True)
    speed, wall, cpu = [], [], []
    for k in range(args.pairs):
        order = [True, False] if k % 2 == 0 else [False, True]
        got = {}
        for on in order:
            got[on] = run_once(args, on, os.path.join(top, "on" if on else "off"))
        speed.append(got[True][0] / got[False][0])
        wall.append(got[True][1] / got[False][1])
        cpu.append(got[True][2] / got[False][2])
        print(f"  pair {k + 1}/{args.pairs} ({'on first' if order[0] else 'off first'}): "
              f"on {got[True][0]:.0f} samples/s, {got[True][1]:.2f} s, {got[True][2]:.2f} s CPU; "
              f"off {got[False][0]:.0f} samples/s, {got[False][1]:.2f} s, {got[False][2]:.2f} s CPU; "
              f"on/off throughput {speed[-1]:.3f}, wall time {wall[-1]:.3f}, CPU time {cpu[-1]:.3f}", flush=True)
    print(f"on/off throughput: median {statistics.median(speed):.3f}, min {min(speed):.3f}, max {max(speed):.3f}")
    print(f"on/off wall time: median {statistics.median(wall):.3f}, min {min(wall):.3f}, max {max(wall):.3f}")
    print(f"on/off CPU time: median {statistics.median(cpu):.3f}, min {min(cpu):.3f}, max {max(cpu):.3f}")
    shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    main()
