#!/usr/bin/python3
"""Mixed precision (--amp) against float32, on the examples themselves:
accuracy and training throughput, run by ddprun with 2 processes on one
machine, configurations interleaved so that the machine's drift hits all.

  /usr/bin/python3 bench/run_amp_bench.py                    # LeNet 10 epochs and ResNet-18 1 epoch, 2 reps each
  /usr/bin/python3 bench/run_amp_bench.py --reps 1 --lenet-epochs 2 --resnet-batches 20   # a quick look

Each run's per-epoch figures come from its run folder's metrics.csv (train
samples/s over both ranks, test accuracy). Writes bench/results/amp.txt and
amp.csv (every epoch of every run). On CPU --amp is bfloat16 autocast (no
loss scaler); on a GPU it is float16 with ddp::GradScaler.
"""
import argparse
import csv
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run(build, example, args, run_dir):
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [os.path.join(build, "launcher", "ddprun"), "--standalone", "--nproc-per-node", "2",
           os.path.join(build, "examples", example, example), "--run-dir", run_dir] + args
    env = dict(os.environ, OMP_NUM_THREADS="1")
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    with open(os.path.join(run_dir, "metrics.csv")) as f:
        return list(csv.DictReader(f))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--lenet-epochs", type=int, default=10)
    ap.add_argument("--resnet-batches", type=int, default=-1, help="ResNet-18 batches per epoch (-1: all)")
    ap.add_argument("--resnet-image-size", type=int, default=32)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "amp"))
    a = ap.parse_args()
    configs = [
        ("lenet_fmnist", "float32", ["--epochs", str(a.lenet_epochs)]),
        ("lenet_fmnist", "amp", ["--epochs", str(a.lenet_epochs), "--amp"]),
        ("resnet18_fmnist", "float32", ["--epochs", "1", "--global-batch-size", "256", "--lr", "0.1",
                                        "--image-size", str(a.resnet_image_size), "--limit-batches", str(a.resnet_batches)]),
        ("resnet18_fmnist", "amp", ["--epochs", "1", "--global-batch-size", "256", "--lr", "0.1",
                                    "--image-size", str(a.resnet_image_size), "--limit-batches", str(a.resnet_batches),
                                    "--amp"]),
    ]
    rows = []
    tmp = tempfile.mkdtemp(prefix="amp_bench_")
    for rep in range(a.reps):
        order = configs if rep % 2 == 0 else list(reversed(configs))
        for example, mode, args in order:
            for r in run(a.build, example, args, os.path.join(tmp, f"{example}_{mode}")):
                rows.append(dict(example=example, mode=mode, rep=rep + 1, **r))
    shutil.rmtree(tmp, ignore_errors=True)
    with open(a.out + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    lines = ["--amp against float32: 2 processes (ddprun, Gloo, OMP_NUM_THREADS=1), every run listed",
             "example          mode     rep  epochs  samples/s per epoch (min-max)  final acc  best acc"]
    summary = {}
    for example, mode, _ in configs:
        for rep in range(1, a.reps + 1):
            rs = [r for r in rows if r["example"] == example and r["mode"] == mode and r["rep"] == rep]
            sps = [float(r["samples_per_s"]) for r in rs]
            acc = [float(r["test_acc"]) for r in rs]
            summary.setdefault((example, mode), []).append(statistics.median(sps))
            lines.append(f"{example:16} {mode:8} {rep:3}  {len(rs):6}  {statistics.median(sps):9.0f} "
                         f"({min(sps):.0f}-{max(sps):.0f})          {acc[-1]:.4f}     {max(acc):.4f}")
    for example in ("lenet_fmnist", "resnet18_fmnist"):
        f32, amp = summary[(example, "float32")], summary[(example, "amp")]
        lines.append(f"{example}: --amp / float32 throughput, rep by rep: " +
                     ", ".join(f"{x / y:.2f}" for x, y in zip(amp, f32)))
    text = "\n".join(lines) + "\n"
    with open(a.out + ".txt", "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
