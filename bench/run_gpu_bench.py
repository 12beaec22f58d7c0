#!/usr/bin/env python3
"""libddp on one GPU: LeNet and ResNet-18 through ddprun with one worker,
against PyTorch's DDP (through torchrun) and local training, it/s and peak
GPU memory (issue 29's measurement).

  python3 bench/run_gpu_bench.py --build build-torch2 --rounds 3 --out gpu.csv

Each round runs every mode once, as its own process started by its launcher
(the order rotates from round to round); a mode's figure for a round is its
it/s over --iters timed steps after --warmup steps, timed with the GPU
synchronised at both ends. Modes (bench/lenet_bench.cpp and
bench/pytorch_lenet_bench.py, the same models, fixed random data on the GPU,
SGD, cross-entropy, nccl):
  local        libddp's binary without DDP, under ddprun
  ddp          ddp::DistributedDataParallel, default options, under ddprun
  pytorch_ddp  torch.nn.parallel.DistributedDataParallel, under torchrun
  pytorch_local PyTorch without DDP, under torchrun
Prints every run and a summary: min / median / max it/s per mode, the ratios
of medians, peak GPU memory (max_memory_allocated) per mode.
"""
import argparse
import csv
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODES = {"local": "cpp", "ddp": "cpp", "pytorch_ddp": "py", "pytorch_local": "py"}
# model -> (batch, extra flags, timed steps, warm-up steps): the examples' batches
# (LeNet 256, ResNet-18 at 96x96 256 a GPU: the seed's 512 over two).
MODELS = {
    "lenet": (256, [], 400, 50),
    "resnet18": (256, ["--image", "96"], 60, 15),
}


def parse_result(text):
    for line in text.splitlines():
        if line.startswith("RESULT "):
            return dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)
    return None


def run_one(a, model, mode):
    batch, extra, iters, warmup = MODELS[model]
    common = ["--model", model, "--batch", str(batch), "--iters", str(a.iters or iters), "--warmup", str(warmup),
              "--device", "cuda", "--backend", "nccl", "--lr", "0.05"] + extra
    impl_mode = "ddp" if mode in ("ddp", "pytorch_ddp") else "local"
    if MODES[mode] == "cpp":
        cmd = [os.path.join(a.build, "launcher", "ddprun"), "--standalone", "--nproc-per-node", "1",
               os.path.join(a.build, "bench", "ddp_bench_lenet"), "--mode", impl_mode, "--threads", "4"] + common
    else:
        cmd = [a.python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
               os.path.join(HERE, "pytorch_lenet_bench.py"), "--mode", impl_mode, "--threads", "4"] + common
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    r = parse_result(p.stdout)
    if p.returncode != 0 or r is None:
        sys.stderr.write(f"{mode} {model} failed (exit {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}\n")
        return None
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build-torch2"))
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=0, help="timed steps (default: the model's)")
    ap.add_argument("--models", default="lenet,resnet18")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    rows = []
    for model in a.models.split(","):
        modes = list(MODES)
        for r in range(a.rounds):
            for k in range(len(modes)):
                mode = modes[(k + r) % len(modes)]
                res = run_one(a, model, mode)
                if res is None:
                    continue
                row = {"round": r, "model": model, "label": mode, "it_s": float(res["it_s"]),
                       "peak_gpu_mb": float(res.get("peak_gpu_mb", "nan")), "loss": res.get("loss"),
                       "checksum": res.get("checksum"), "device": res.get("device"), "buckets": res.get("buckets")}
                rows.append(row)
                print(f"round {r} {model:8s} {mode:14s} {row['it_s']:9.2f} it/s  peak {row['peak_gpu_mb']:8.1f} MiB"
                      f"  loss {row['loss']}", flush=True)
    if not rows:
        sys.exit("run_gpu_bench: no run succeeded")
    if a.out:
        with open(a.out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    print("\nsummary (it/s over rounds: min / median / max; peak GPU memory, median)")
    for model in a.models.split(","):
        med = {}
        for mode in MODES:
            v = [x["it_s"] for x in rows if x["model"] == model and x["label"] == mode]
            m = [x["peak_gpu_mb"] for x in rows if x["model"] == model and x["label"] == mode]
            if not v:
                print(f"  {model:8s} {mode:14s} no runs")
                continue
            med[mode] = statistics.median(v)
            print(f"  {model:8s} {mode:14s} {min(v):9.2f} / {med[mode]:9.2f} / {max(v):9.2f} it/s"
                  f"   peak {statistics.median(m):8.1f} MiB   ({len(v)} runs)")
        if "ddp" in med and "pytorch_ddp" in med:
            print(f"  {model:8s} libddp ddp / PyTorch DDP: {med['ddp'] / med['pytorch_ddp']:.3f}x")
        if "ddp" in med and "local" in med:
            print(f"  {model:8s} libddp ddp / libddp local: {med['ddp'] / med['local']:.3f}x")
        if "pytorch_ddp" in med and "pytorch_local" in med:
            print(f"  {model:8s} PyTorch DDP / PyTorch local: {med['pytorch_ddp'] / med['pytorch_local']:.3f}x")


if __name__ == "__main__":
    main()
