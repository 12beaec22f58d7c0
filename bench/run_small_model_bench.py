#!/usr/bin/python3
"""libddp benchmark driver for the small-model regime: the d2l.ai
LeNet with sigmoids (61,706 parameters, about 18 ms of one core per step),
batch 128 per rank of fixed random data, SGD lr 0.1, cross-entropy, one thread
per rank, 2 ranks over Gloo on loopback, 10 warm-up and 60 timed steps, each
step written the plain way (zero_grad, forward, loss, backward, step).

  /usr/bin/python3 bench/run_small_model_bench.py                  # 10 rounds, ~3 min
  /usr/bin/python3 bench/run_small_model_bench.py --rounds 20 --out bench/results/small_model.csv

Every round runs each mode once as its own pair of processes (the order
rotates from round to round). Every run is printed, with both ranks' it/s;
the summary gives min, median and max over rounds of rank 0's it/s (the
figure first reported for this regime) and checks the goals:
  - libddp's slowest run >= PyTorch's DDP's median,
  - libddp's median >= 0.9 x local training's median.
Modes: local, ddp, ddp_no_retain (DDPOptions::retain_step_memory(false):
the slow regime's cause, glibc returning every step's heap), sync_only (the
ranks meet once per step and exchange no gradients), ddp_loop_idle (DDP_GLOO_LOOP_POLICY=idle: Gloo's event
loop under SCHED_IDLE, see src/comm/backend/comm_threads.h), ddp_timeline (DDP_TIMELINE set:
the timeline's cost, with --model mlp100 for a large model), pytorch_ddp, pytorch_local
(see run_lenet_bench.py), ddp_baseline (ddp from --baseline-bin, another build,
interleaved: what a change costs):
  /usr/bin/python3 bench/run_small_model_bench.py --modes local,ddp,ddp_baseline --baseline-bin OLD/ddp_bench_lenet
"""
import argparse
import csv
import os
import shutil
import statistics
import sys
import tempfile

import run_lenet_bench as lb

MODES = {
    "local": ("cpp", ["--mode", "local"]),
    "ddp": ("cpp", ["--mode", "ddp"]),
    # libddp before the fix: glibc returns the step's heap every step
    # (DDPOptions::retain_step_memory(false), ddp/runtime/malloc_tuning.h)
    "ddp_no_retain": ("cpp", ["--mode", "ddp", "--retain-step-memory", "0"]),
    # libddp with Gloo's event loop under SCHED_IDLE (DDP_GLOO_LOOP_POLICY=idle)
    "ddp_loop_idle": ("cpp", ["--mode", "ddp"]),
    # libddp recording its timeline (DDP_TIMELINE=<temporary file>): what the
    # timeline costs a step; the trace is written after the timed loop
    "ddp_timeline": ("cpp", ["--mode", "ddp"]),
    # the ranks meet once per step (a one-float all-reduce) and exchange no
    # gradients: the ceiling of any transport for a synchronous step
    "sync_only": ("cpp", ["--mode", "sync_only"]),
    # the same as ddp, from the binary given with --baseline-bin (an older
    # build: a change's cost, measured interleaved with it)
    "ddp_baseline": ("cpp", ["--mode", "ddp"]),
    "pytorch_ddp": ("py", ["--mode", "ddp"]),
    "pytorch_local": ("py", ["--mode", "local"]),
}
FIELDS = ["round", "label", "impl", "mode", "model", "rank", "world", "batch", "iters", "it_s", "ms_per_iter",
          "cpu_ms_per_iter", "main_cpu_ms_per_iter", "faults_per_iter", "fwd_ms", "bwd_ms", "step_ms", "exposed_comm_ms",
          "backward_ms", "buckets", "checksum", "loss", "foreign_cores", "attempt", "tag"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", help="ddp_bench_lenet (default: build-bench/ or build/ under the repo)")
    ap.add_argument("--baseline-bin", help="ddp_bench_lenet of another build, for the ddp_baseline mode")
    ap.add_argument("--python", default="/usr/bin/python3", help="a Python with torch")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--model", default="d2l_lenet", help="d2l_lenet (default), lenet, mlp100, ...")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--flush-denormal", type=int, default=0,
                    help="0 (default) as the plain program does; sigmoids keep this model's gradients normal")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per run")
    ap.add_argument("--wait-idle", type=float, default=30)
    ap.add_argument("--max-foreign", type=float, default=0.25)
    ap.add_argument("--retries", type=int, default=1)
    ap.add_argument("--pin", action="store_true", help="pin rank r to CPU r")
    ap.add_argument("--extra", default="", help="extra flags for the libddp binary (e.g. '--first-bucket-mb 0.1')")
    ap.add_argument("--out", default=os.path.join(lb.HERE, "results", "small_model.csv"))
    args = ap.parse_args()
    args.bin = lb.find_binary(args.bin)
    if args.modes == ",".join(MODES):
        args.modes = ",".join(m for m in MODES if m != "ddp_baseline" or args.baseline_bin)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if "ddp_baseline" in modes and not args.baseline_bin:
        sys.exit("the ddp_baseline mode needs --baseline-bin")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        sys.exit(f"unknown mode(s) {unknown}; known: {list(MODES)}")

    common = ["--model", args.model, "--iters", str(args.iters), "--warmup", str(args.warmup),
              "--batch", str(args.batch), "--lr", "0.1", "--flush-denormal", str(args.flush_denormal)]
    print(f"binary {args.bin}\npython {args.python}\ncpus {os.cpu_count()}, load average "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}\n", flush=True)
    runs = {m: [] for m in modes}  # per mode, per round: {rank: result}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        writer.writeheader()
        for r in range(args.rounds):
            order = modes[r % len(modes):] + modes[:r % len(modes)]
            for m in order:
                impl, flags = MODES[m]
                if impl == "cpp" and args.extra:
                    flags = flags + args.extra.split()
                if m == "ddp_loop_idle":
                    os.environ["DDP_GLOO_LOOP_POLICY"] = "idle"
                trace_dir = tempfile.mkdtemp(prefix="ddp_bench_timeline_") if m == "ddp_timeline" else None
                if trace_dir:
                    os.environ["DDP_TIMELINE"] = os.path.join(trace_dir, "trace.json")
                own_bin = args.bin
                if m == "ddp_baseline":
                    args.bin = args.baseline_bin
                try:
                    res = lb.run_mode(args, impl, flags, common, args.world, m)
                finally:
                    args.bin = own_bin
                    os.environ.pop("DDP_GLOO_LOOP_POLICY", None)
                    os.environ.pop("DDP_TIMELINE", None)
                    if trace_dir:
                        shutil.rmtree(trace_dir, ignore_errors=True)
                by_rank = {x["rank"]: x for x in res}
                runs[m].append(by_rank)
                for x in res:
                    writer.writerow(dict(round=r, label=m, **x))
                r0 = by_rank[0]
                print(f"  round {r + 1:2d}/{args.rounds} {m:14s} rank 0 {r0['it_s']:6.2f} it/s  (ranks: "
                      f"{', '.join('%.2f' % by_rank[k]['it_s'] for k in sorted(by_rank))}; fwd "
                      f"{', '.join('%.1f' % by_rank[k]['fwd_ms'] for k in sorted(by_rank))} ms, bwd "
                      f"{', '.join('%.1f' % by_rank[k]['bwd_ms'] for k in sorted(by_rank))} ms, exposed "
                      f"{', '.join('%.1f' % by_rank[k]['exposed_comm_ms'] for k in sorted(by_rank))} ms, "
                      f"CPU/step {', '.join('%.1f' % by_rank[k]['cpu_ms_per_iter'] for k in sorted(by_rank))} ms, "
                      f"page faults/step {', '.join('%.0f' % by_rank[k].get('faults_per_iter', -1) for k in sorted(by_rank))}; "
                      f"foreign load {r0['foreign_cores']:.2f})", flush=True)

    print(f"\nd2l LeNet, batch {args.batch}/rank, {args.world} ranks, Gloo over loopback, 1 thread/rank; "
          f"{args.rounds} rounds x {args.iters} timed steps (+{args.warmup} warm-up); rank 0's it/s\n")
    print("| mode | every run (it/s, in round order) | min | median | max |")
    print("|---|---|---:|---:|---:|")
    stats = {}
    for m in modes:
        v = [run[0]["it_s"] for run in runs[m]]
        stats[m] = (min(v), statistics.median(v), max(v))
        print(f"| {m} | {' '.join('%.1f' % x for x in v)} | {stats[m][0]:.1f} | {stats[m][1]:.1f} | {stats[m][2]:.1f} |")
    if "ddp" in stats and "local" in stats:
        rr = [a[0]["it_s"] / b[0]["it_s"] for a, b in zip(runs["ddp"], runs["local"])]
        print(f"\nddp / local per round: {' '.join('%.2f' % x for x in rr)} (median {statistics.median(rr):.3f})")
    goals = []
    if "ddp" in stats and "pytorch_ddp" in stats:
        ok = stats["ddp"][0] >= stats["pytorch_ddp"][1]
        goals.append(f"libddp's slowest run {stats['ddp'][0]:.1f} >= PyTorch DDP's median "
                     f"{stats['pytorch_ddp'][1]:.1f}: {'met' if ok else 'MISSED'}")
    if "ddp" in stats and "ddp_baseline" in stats:
        rr = [a[0]["it_s"] / b[0]["it_s"] for a, b in zip(runs["ddp"], runs["ddp_baseline"])]
        goals.append(f"libddp / the baseline build ({args.baseline_bin}), per round: "
                     f"{' '.join('%.3f' % x for x in rr)} (min {min(rr):.3f}, median {statistics.median(rr):.3f}, "
                     f"max {max(rr):.3f})")
    if "ddp" in stats and "ddp_loop_idle" in stats:
        goals.append(f"libddp's median with the idle loop / with Gloo's default loop = "
                     f"{stats['ddp_loop_idle'][1] / stats['ddp'][1]:.3f}")
    if "ddp" in stats and "ddp_timeline" in stats:
        rr = [a[0]["it_s"] / b[0]["it_s"] for a, b in zip(runs["ddp_timeline"], runs["ddp"])]
        goals.append(f"libddp with the timeline / without, per round: {' '.join('%.3f' % x for x in rr)} "
                     f"(median {statistics.median(rr):.3f})")
    if "ddp" in stats and "local" in stats:
        ratio = stats["ddp"][1] / stats["local"][1]
        goals.append(f"libddp's median / local's median = {ratio:.3f} (goal >= 0.9): "
                     f"{'met' if ratio >= 0.9 else 'MISSED'}")
    if goals:
        print("\n" + "\n".join(goals))
    print(f"\nload average at the end {', '.join(f'{x:.2f}' for x in os.getloadavg())}; raw results: {args.out}")


if __name__ == "__main__":
    main()
