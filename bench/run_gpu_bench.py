#!/usr/bin/env python3
"""libddp on one GPU: LeNet and ResNet-18 through ddprun with one worker,
against PyTorch's DDP (through torchrun) and local training, it/s and peak
GPU memory (bench/results/gpu_h200.md).

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
--amp none,fp16 runs each mode in float32 and under AMP (autocast and a
loss scaler, both implementations PyTorch's recipe); --image N sets
ResNet-18's input size. Prints every run and a summary: min / median / max it/s per mode, the ratios
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
MODES = {"local": "cpp", "ddp": "cpp", "pytorch_ddp": "py", "pytorch_local": "py", "interleaved": "cpp",
         "pytorch_interleaved": "py"}
LABELS = ["local", "ddp", "pytorch_ddp", "pytorch_local", "i_local", "i_ddp", "i_pytorch_local", "i_pytorch_ddp"]
# model -> (batch, extra flags, timed steps, warm-up steps): the examples' batches
# (LeNet 256, ResNet-18 at 96x96 256 a GPU: the seed's 512 over two).
MODELS = {
    "lenet": (256, [], 2000, 100),
    "resnet18": (256, ["--image", "96"], 100, 15),
}


def parse_results(text):
    """Every RESULT line (ddprun prefixes a worker's lines with "[rank0]: ")."""
    out = []
    for line in text.splitlines():
        at = line.find("RESULT ")
        if at >= 0:
            out.append(dict(kv.split("=", 1) for kv in line[at:].split()[1:] if "=" in kv))
    return out


def run_one(a, model, mode, amp="none"):
    batch, extra, iters, warmup = MODELS[model]
    if model == "resnet18" and a.image:
        extra = ["--image", str(a.image)]
    common = ["--model", model, "--batch", str(batch), "--iters", str(a.iters or iters), "--warmup", str(warmup),
              "--device", "cuda", "--backend", "nccl", "--lr", "0.05", "--amp", amp] + extra
    impl_mode = {"ddp": "ddp", "pytorch_ddp": "ddp", "interleaved": "interleaved",
                 "pytorch_interleaved": "interleaved"}.get(mode, "local")
    if impl_mode == "interleaved":
        # every mode in one process, alternating every --chunk steps: the ratios without drift
        common += ["--rounds", str(a.chunk_rounds), "--chunk", str(max(1, (a.iters or iters) // 8))]
    if MODES[mode] == "cpp":
        cmd = [os.path.join(a.build, "launcher", "ddprun"), "--standalone", "--nproc-per-node", "1",
               os.path.join(a.build, "bench", "ddp_bench_lenet"), "--mode", impl_mode, "--threads", "4"] + common
    else:
        cmd = [a.python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
               os.path.join(HERE, "pytorch_lenet_bench.py"), "--mode", impl_mode, "--threads", "4"] + common
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    r = parse_results(p.stdout + "\n" + p.stderr)
    if p.returncode != 0 or not r:
        sys.stderr.write(f"{mode} {model} failed (exit {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}\n")
        return []
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build-torch2"))
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=0, help="timed steps (default: the model's)")
    ap.add_argument("--models", default="lenet,resnet18")
    ap.add_argument("--out", default="")
    ap.add_argument("--chunk-rounds", type=int, default=6, help="interleaved: alternations per process")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--amp", default="none",
                    help="precisions, comma-separated: none (float32), fp16 (autocast + GradScaler), bf16 (autocast); "
                         "each mode runs in each, both implementations the PyTorch recipe")
    ap.add_argument("--image", type=int, default=0, help="resnet18: N x N inputs (default: the example's 96)")
    a = ap.parse_args()
    rows = []
    for model in a.models.split(","):
        runs = [(m, p) for p in a.amp.split(",") for m in a.modes.split(",")]
        for r in range(a.rounds):
            for k in range(len(runs)):
                mode, amp = runs[(k + r) % len(runs)]
                for res in run_one(a, model, mode, amp):
                    label = mode
                    if mode in ("interleaved", "pytorch_interleaved"):
                        label = "i_" + res.get("tag", "?")
                    if amp != "none":
                        label += "+" + amp
                    row = {"round": r, "model": model, "label": label, "it_s": float(res["it_s"]),
                           "peak_gpu_mb": float(res.get("peak_gpu_mb", "nan")), "loss": res.get("loss"),
                           "checksum": res.get("checksum"), "device": res.get("device"),
                           "buckets": res.get("buckets")}
                    rows.append(row)
                    print(f"round {r} {model:8s} {label:22s} {row['it_s']:9.2f} it/s"
                          f"  peak {row['peak_gpu_mb']:8.1f} MiB  loss {row['loss']}", flush=True)
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
        for mode in [m + ("" if p == "none" else "+" + p) for p in a.amp.split(",") for m in LABELS]:
            v = [x["it_s"] for x in rows if x["model"] == model and x["label"] == mode]
            m = [x["peak_gpu_mb"] for x in rows if x["model"] == model and x["label"] == mode]
            if not v:
                continue
            med[mode] = statistics.median(v)
            print(f"  {model:8s} {mode:16s} {min(v):9.2f} / {med[mode]:9.2f} / {max(v):9.2f} it/s"
                  f"   peak {statistics.median(m):8.1f} MiB   ({len(v)} runs)")
        if "ddp" in med and "pytorch_ddp" in med:
            print(f"  {model:8s} libddp ddp / PyTorch DDP: {med['ddp'] / med['pytorch_ddp']:.3f}x")
        if "ddp" in med and "local" in med:
            print(f"  {model:8s} libddp ddp / libddp local: {med['ddp'] / med['local']:.3f}x")
        if "i_ddp" in med and "i_local" in med:
            print(f"  {model:8s} interleaved in one process: libddp ddp / local {med['i_ddp'] / med['i_local']:.3f}x")
        if "i_pytorch_ddp" in med and "i_pytorch_local" in med:
            print(f"  {model:8s} interleaved in one process: PyTorch DDP / local "
                  f"{med['i_pytorch_ddp'] / med['i_pytorch_local']:.3f}x")
        if "pytorch_ddp" in med and "pytorch_local" in med:
            print(f"  {model:8s} PyTorch DDP / PyTorch local: {med['pytorch_ddp'] / med['pytorch_local']:.3f}x")
        for p in a.amp.split(","):
            for impl, name in (("ddp", "libddp"), ("pytorch_ddp", "PyTorch"), ("local", "libddp local"),
                               ("pytorch_local", "PyTorch local")):
                if p != "none" and impl in med and impl + "+" + p in med:
                    print(f"  {model:8s} {name} {p} / float32: {med[impl + '+' + p] / med[impl]:.3f}x")


if __name__ == "__main__":
    main()
