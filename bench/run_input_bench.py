#!/usr/bin/env python3
"""Whether the examples' input path keeps the device busy: an example's
steady-state samples/s against the fixed-data bench's on the same device.

Steady state without the start: each round runs the example for one epoch of
--short and of --long batches (one worker through ddprun, default options
otherwise) and takes (long - short) batches over the difference of the two
epochs' times (metrics.csv's epoch_s); then ddp_bench_lenet trains the same
model at the same batch (and, for ResNet-18, the same image size) on data
already on the device, --long - --short timed steps after --short warm-up
ones. The ratio is the example's rate over the bench's (goal: >= 0.97 on a
GPU). Every round is printed, then min / median / max.

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


def epoch_seconds(a, example, batch, batches, run_dir, device):
    cmd = [os.path.join(a.build, "launcher", "ddprun"), "--standalone", "--nproc-per-node", "1",
           os.path.join(a.build, "examples", example, example), "--epochs", "1", "--limit-batches", str(batches),
           "--batch-size", str(batch), "--run-dir", run_dir] + (["--data-dir", a.data_dir] if a.data_dir else [])
    if device == "cpu":
        cmd += ["--backend", "gloo"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        sys.exit(f"{example} failed (exit {p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    with open(os.path.join(run_dir, "metrics.csv")) as f:
        return float(list(csv.DictReader(f))[-1]["epoch_s"])


def bench_samples_s(a, model, batch, flags, device):
    steps = a.long - a.short
    cmd = [os.path.join(a.build, "launcher", "ddprun"), "--standalone", "--nproc-per-node", "1",
           os.path.join(a.build, "bench", "ddp_bench_lenet"), "--mode", "ddp", "--model", model,
           "--batch", str(batch), "--iters", str(steps), "--warmup", str(a.short), "--device", device,
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
    ap.add_argument("--short", type=int, default=40, help="batches of the short epoch (and the bench's warm-up)")
    ap.add_argument("--long", type=int, default=140, help="batches of the long epoch")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--data-dir", default="")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="ddp_input_bench_") as tmp:
        for model in a.models.split(","):
            example, batch, flags = MODELS[model]
            for r in range(a.rounds):
                short = epoch_seconds(a, example, batch, a.short, os.path.join(tmp, f"{model}_{r}_s"), a.device)
                long = epoch_seconds(a, example, batch, a.long, os.path.join(tmp, f"{model}_{r}_l"), a.device)
                example_rate = (a.long - a.short) * batch / (long - short)
                fixed_rate = bench_samples_s(a, model, batch, flags, a.device)
                rows.append((model, r, example_rate, fixed_rate))
                print(f"round {r} {model:8s} example {example_rate:9.0f} samples/s   fixed data {fixed_rate:9.0f}"
                      f"   ratio {example_rate / fixed_rate:.3f}", flush=True)
    print("\nsummary (ratio example / fixed data over rounds: min / median / max)")
    for model in a.models.split(","):
        v = [e / f for m, _, e, f in rows if m == model]
        print(f"  {model:8s} {min(v):.3f} / {statistics.median(v):.3f} / {max(v):.3f}   ({len(v)} rounds)")


if __name__ == "__main__":
    main()
