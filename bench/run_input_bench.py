#!/usr/bin/env python3
"""Whether the examples' input path keeps the device busy: an example's
steady-state samples/s against the fixed-data bench's on the same device.

Steady state without the start: each round runs the example for --epochs
epochs (one worker through ddprun, default options otherwise; whole epochs
unless --limit-batches) and takes the median of the samples/s that
metrics.csv gives for the epochs after the first (each epoch's training
alone, its evaluation not included); then ddp_bench_lenet trains the same
model at the same batch (and, for ResNet-18, the same image size) on data
already on the device, --iters timed steps after --warmup ones. The ratio
is the example's rate over the bench's (goal: >= 0.97 on a GPU). Every
round is printed, then min / median / max. --variant NAME=FLAGS (again for
more) runs the example once more each round with FLAGS added, beside the
default run, against the same bench run: what an option costs, side by side.

An earlier form took the difference of a 40-batch and a 140-batch epoch:
on an H100 a LeNet epoch of either is a few tenths of a second, and the
difference was within the host's noise (it once came out negative).

  python3 bench/run_input_bench.py --build build-torch2 --models lenet,resnet18 --rounds 3
"""
import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# model -> (example, per-process batch, bench flags)
MODELS = {
    "lenet": ("lenet_fmnist", 256, []),
    "resnet18": ("resnet18_fmnist", 256, ["--image", "96"]),
}


def example_samples_s(a, example, batch, run_dir, device, extra):
    cmd = [os.path.join(a.build, "launcher", "ddprun"), "--standalone", "--nproc-per-node", "1",
           os.path.join(a.build, "examples", example, example), "--epochs", str(a.epochs),
           "--batch-size", str(batch), "--run-dir", run_dir] + (["--data-dir", a.data_dir] if a.data_dir else [])
    cmd += extra
    if a.limit_batches:
        cmd += ["--limit-batches", str(a.limit_batches)]
    if device == "cpu":
        cmd += ["--backend", "gloo"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        sys.exit(f"{example} failed (exit {p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    with open(os.path.join(run_dir, "metrics.csv")) as f:
        rates = [float(row["samples_per_s"]) for row in csv.DictReader(f)][1:]
    return statistics.median(rates)


def bench_samples_s(a, model, batch, flags, device):
    steps = a.iters
    cmd = [os.path.join(a.build, "launcher", "ddprun"), "--standalone", "--nproc-per-node", "1",
           os.path.join(a.build, "bench", "ddp_bench_lenet"), "--mode", "ddp", "--model", model,
           "--batch", str(batch), "--iters", str(steps), "--warmup", str(a.warmup), "--device", device,
           "--backend", "nccl" if device == "cuda" else "gloo", "--lr", "0.05"] + flags
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    for line in (p.stdout + p.stderr).splitlines():
        if "RESULT " in line:
            fields = dict(kv.split("=", 1) for kv in line[line.find("RESULT "):].split()[1:] if "=" in kv)
            return float(fields["it_s"]) * batch
    sys.exit(f"ddp_bench_lenet {model} failed (exit {p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build-torch2"))
    ap.add_argument("--models", default="lenet,resnet18")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=4, help="the example's epochs; the first is not counted")
    ap.add_argument("--limit-batches", type=int, default=0, help="batches of each epoch (0: the whole epoch)")
    ap.add_argument("--warmup", type=int, default=40, help="the bench's untimed steps")
    ap.add_argument("--iters", type=int, default=400, help="the bench's timed steps")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--data-dir", default="")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=FLAGS",
                    help="the example again with FLAGS added (split at spaces), e.g. "
                         "'nocheck=--preemption-check-every 0'")
    a = ap.parse_args()
    variants = [("default", [])]
    for v in a.variant:
        name, sep, flags = v.partition("=")
        if not sep or not name:
            ap.error(f"--variant {v!r}: NAME=FLAGS")
        variants.append((name, flags.split()))
    rows = []
    with tempfile.TemporaryDirectory(prefix="ddp_input_bench_") as tmp:
        for model in a.models.split(","):
            example, batch, flags = MODELS[model]
            for r in range(a.rounds):
                rates = {name: example_samples_s(a, example, batch, os.path.join(tmp, f"{model}_{name}_{r}"),
                                                 a.device, extra) for name, extra in variants}
                fixed_rate = bench_samples_s(a, model, batch, flags, a.device)
                for name, rate in rates.items():
                    rows.append((model, name, r, rate, fixed_rate))
                    print(f"round {r} {model:8s} {name:10s} example {rate:9.0f} samples/s   fixed data "
                          f"{fixed_rate:9.0f}   ratio {rate / fixed_rate:.3f}", flush=True)
    print("\nsummary (ratio example / fixed data over rounds: min / median / max)")
    for model in a.models.split(","):
        for name, _ in variants:
            v = [e / f for m, n, _, e, f in rows if m == model and n == name]
            print(f"  {model:8s} {name:10s} {min(v):.3f} / {statistics.median(v):.3f} / {max(v):.3f}"
                  f"   ({len(v)} rounds)")


if __name__ == "__main__":
    main()
