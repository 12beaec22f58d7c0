#!/usr/bin/python3
"""libddp benchmark driver: LeNet throughput and ~100 MB-model peak memory,
2 ranks on one machine over Gloo (loopback), every mode interleaved.

  /usr/bin/python3 bench/run_lenet_bench.py                 # ~8 min: 5 rounds, 3 interleaved reps, memory
  /usr/bin/python3 bench/run_lenet_bench.py --quick         # ~1 min smoke run
  /usr/bin/python3 bench/run_lenet_bench.py --rounds 9 --out bench/results/lenet.csv

Every round runs each mode once (the order rotates from round to round) as 2
processes started together with torchrun's variables and OMP_NUM_THREADS=1 (one
core per rank). Each process prints one RESULT line; a mode's figure for a
round is the slower rank's it/s. The table gives medians over rounds and the
ratios; the CSV holds every rank of every run. See docs/performance.md.

Then the same comparison in-process ("interleaved"): one pair of libddp
processes alternates local / ddp / allreduce_each / ddp_overlap every --chunk
steps, one pair of PyTorch processes alternates local / ddp; this cancels the
machine's speed drift out of the ratios to local training.

Modes (LeNet, batch 128 per rank, SGD lr 0.2, cross-entropy, fixed synthetic data):
  local           libddp's binary, no communication while training
  ddp             ddp::DistributedDataParallel, default options (25 MB buckets, 1 MB first bucket)
  allreduce_each  allreduce(grad).wait() per parameter after backward (pytorch/examples cpp/distributed)
  pytorch_ddp     torch.nn.parallel.DistributedDataParallel, default options
  pytorch_local   PyTorch without DDP (how much of pytorch_ddp's gap is Python, not communication)
  ddp_overlap     libddp DDP with 0.25 MB buckets: the fc layers' bucket overlaps the conv layers' backward
"""
import argparse
import csv
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# mode -> (implementation, extra flags)
LENET_MODES = {
    "local": ("cpp", ["--mode", "local"]),
    "ddp": ("cpp", ["--mode", "ddp"]),
    "allreduce_each": ("cpp", ["--mode", "allreduce_each"]),
    "pytorch_ddp": ("py", ["--mode", "ddp"]),
    "pytorch_local": ("py", ["--mode", "local"]),
    "ddp_overlap": ("cpp", ["--mode", "ddp", "--first-bucket-mb", "0.25", "--bucket-cap-mb", "0.25"]),
}
DEFAULT_MODES = ["local", "ddp", "allreduce_each", "pytorch_ddp", "pytorch_local", "ddp_overlap"]
QUICK_MODES = ["local", "ddp", "allreduce_each", "pytorch_ddp"]

MEMORY_MODES = {
    "local": ("cpp", ["--mode", "local"]),
    "ddp": ("cpp", ["--mode", "ddp", "--bucket-view", "1"]),
    "ddp_no_bucket_view": ("cpp", ["--mode", "ddp", "--bucket-view", "0"]),
    # DDPOptions::malloc_mmap_threshold_mb: the default (0) leaves glibc's dynamic
    # thresholds on; -1 (opt-in) fixes them at the largest gradient (16 MiB here).
    "ddp_malloc_tuning": ("cpp", ["--mode", "ddp", "--bucket-view", "1", "--malloc-mmap-mb", "-1"]),
    "local_same_malloc_tuning": ("cpp", ["--mode", "local", "--malloc-mmap-mb", "16"]),
    "pytorch_local": ("py", ["--mode", "local"]),
    "pytorch_ddp": ("py", ["--mode", "ddp", "--bucket-view", "0"]),
    "pytorch_ddp_bucket_view": ("py", ["--mode", "ddp", "--bucket-view", "1"]),
}

RATIOS = [  # (numerator, denominator)
    ("ddp", "pytorch_ddp"),
    ("ddp", "local"),
    ("allreduce_each", "local"),
    ("pytorch_ddp", "local"),
    ("ddp", "allreduce_each"),
    ("pytorch_ddp", "pytorch_local"),
    ("pytorch_local", "local"),
    ("ddp_overlap", "local"),
]


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_binary(explicit):
    candidates = [explicit] if explicit else []
    candidates += [os.environ.get("DDP_BENCH_BIN", "")]
    for build in ("build-bench", "build", "build-release"):
        candidates.append(os.path.join(ROOT, build, "bench", "ddp_bench_lenet"))
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    sys.exit("ddp_bench_lenet not found; build it (cmake --build BUILD --target ddp_bench_lenet) and pass --bin")


def parse_result(line):
    fields = dict(kv.split("=", 1) for kv in line.split()[1:])
    for k, v in list(fields.items()):
        try:
            fields[k] = int(v)
        except ValueError:
            try:
                fields[k] = float(v)
            except ValueError:
                pass
    return fields


def cpu_busy_seconds():
    """CPU seconds spent by everything on this machine so far (all cores)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (v + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds():
    import resource
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def wait_for_quiet(args):
    """The machine is shared: before a run, wait (up to --wait-idle s) until
    other processes use less than --max-foreign cores."""
    deadline = time.time() + args.wait_idle
    while True:
        b0, t0 = cpu_busy_seconds(), time.time()
        time.sleep(0.5)
        busy = (cpu_busy_seconds() - b0) / (time.time() - t0)
        if busy <= args.max_foreign or time.time() >= deadline:
            return busy
        time.sleep(1.0)


def run_mode(args, impl, flags, common, world, label):
    """Starts `world` ranks of one mode, returns their parsed RESULT lines,
    each with `foreign_cores`: the CPU that other processes used during the run,
    in cores (0 on an otherwise idle machine). Re-runs a disturbed run up to
    --retries times and keeps the least disturbed one."""
    best = None
    for attempt in range(args.retries + 1):
        if args.wait_idle > 0:
            wait_for_quiet(args)
        busy0, ours0, t0 = cpu_busy_seconds(), children_cpu_seconds(), time.time()
        res = run_mode_once(args, impl, flags, common, world, label)
        wall = time.time() - t0
        foreign = max(0.0, ((cpu_busy_seconds() - busy0) - (children_cpu_seconds() - ours0)) / wall)
        for x in res:
            x["foreign_cores"] = round(foreign, 3)
            x["attempt"] = attempt
        if best is None or foreign < best[0]:
            best = (foreign, res)
        if foreign <= args.max_foreign:
            break
        print(f"    ({label}: other processes used {foreign:.2f} cores during the run; "
              f"{'again' if attempt < args.retries else 'keeping the least disturbed'})", flush=True)
    return best[1]


def run_mode_once(args, impl, flags, common, world, label):
    port = free_port()
    if impl == "cpp":
        cmd = [args.bin] + common + flags
    else:
        cmd = [args.python, os.path.join(HERE, "pytorch_lenet_bench.py")] + common + flags
    cmd += ["--tag", label]
    procs = []
    for rank in range(world):
        env = dict(os.environ)
        env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        pin = None
        if args.pin:
            cpus = sorted(os.sched_getaffinity(0))
            pin = (lambda cpu: (lambda: os.sched_setaffinity(0, {cpu})))(cpus[rank % len(cpus)])
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      preexec_fn=pin))
    results, failed = [], []
    for rank, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    q.kill()
            out, err = p.communicate()
            failed.append(f"rank {rank}: timed out after {args.timeout} s")
            continue
        lines = [l for l in out.splitlines() if l.startswith("RESULT ")]
        if p.returncode != 0 or not lines:
            failed.append(f"rank {rank}: exit {p.returncode}\n{err[-2000:]}")
        else:
            results.extend(parse_result(l) for l in lines)
    if failed:
        raise RuntimeError(f"{label}: " + "\n".join(failed) + f"\n  command: {' '.join(cmd)}")
    return results


def med(values):
    return statistics.median(values) if values else float("nan")


def fmt(v, nd=2):
    return "-" if v != v else f"{v:.{nd}f}"


def throughput(args, writer):
    modes = [m for m in args.modes if m in LENET_MODES]
    common = ["--model", "lenet", "--iters", str(args.iters), "--warmup", str(args.warmup),
              "--batch", str(args.batch), "--lr", "0.2"]
    per_mode = {m: [] for m in modes}   # one summary dict per round
    per_round = []                       # {mode: it_s}
    t0 = time.time()
    for r in range(args.rounds):
        order = modes[r % len(modes):] + modes[:r % len(modes)]  # rotate: no mode always goes first
        this_round = {}
        for m in order:
            impl, flags = LENET_MODES[m]
            res = run_mode(args, impl, flags, common, args.world, m)
            for x in res:
                writer.writerow(dict(section="lenet", round=r, label=m, **x))
            slow = min(res, key=lambda x: x["it_s"])
            per_mode[m].append(slow)
            this_round[m] = slow["it_s"]
            sums = {x["checksum"] for x in res}
            if m != "local" and m != "pytorch_local" and len(sums) != 1:
                print(f"warning: {m}: ranks ended with different parameters: {sums}", file=sys.stderr)
            print(f"  round {r + 1}/{args.rounds} {m:15s} {slow['it_s']:8.2f} it/s, foreign load "
                  f"{slow['foreign_cores']:.2f} "
                  f"(ranks: {', '.join('%.2f' % x['it_s'] for x in sorted(res, key=lambda x: x['rank']))})",
                  flush=True)
        per_round.append(this_round)
    elapsed = time.time() - t0

    print(f"\nLeNet, batch {args.batch}/rank, {args.world} ranks, Gloo over loopback, 1 thread/rank; "
          f"{args.rounds} rounds x {args.iters} timed iterations (+{args.warmup} warm-up); medians; {elapsed:.0f} s\n")
    print("| mode | it/s | ms/iter | CPU ms/iter (all threads) | forward ms | backward ms | after-backward sync ms "
          "| exposed comm ms | buckets | foreign load (cores) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    medians = {}
    for m in modes:
        rows = per_mode[m]
        medians[m] = med([x["it_s"] for x in rows])
        print(f"| {m} | {fmt(medians[m])} | {fmt(med([x['ms_per_iter'] for x in rows]))} "
              f"| {fmt(med([x['cpu_ms_per_iter'] for x in rows]))} "
              f"| {fmt(med([x['fwd_ms'] for x in rows]))} | {fmt(med([x['bwd_ms'] for x in rows]))} "
              f"| {fmt(med([x['sync_ms'] for x in rows]))} | {fmt(med([x['exposed_comm_ms'] for x in rows]))} "
              f"| {rows[-1]['buckets']} | {fmt(med([x['foreign_cores'] for x in rows]))} |")
    print("\n| ratio (it/s) | ratio of medians | median of per-round ratios | min..max per round |")
    print("|---|---:|---:|---:|")
    for a, b in RATIOS:
        if a in medians and b in medians:
            rr = [pr[a] / pr[b] for pr in per_round if a in pr and b in pr]
            print(f"| {a} / {b} | {medians[a] / medians[b]:.3f} | {med(rr):.3f} | {min(rr):.3f}..{max(rr):.3f} |")
    return medians


def interleaved(args, writer):
    """Modes alternating every --chunk steps inside one pair of processes:
    libddp's (local, ddp, allreduce_each, ddp_overlap), then PyTorch's (local,
    ddp); --il-reps times. The speed of this (virtual) machine drifts by up to
    2x within minutes, invisibly to /proc/stat, and this cancels it out of the
    ratios to local training."""
    common = ["--mode", "interleaved", "--model", "lenet", "--rounds", str(args.il_rounds), "--chunk",
              str(args.chunk), "--warmup", str(args.warmup), "--batch", str(args.batch), "--lr", "0.2"]
    reps = []  # per rep: {label: it/s (slower rank)}
    rows_by_label = {}
    for r in range(args.il_reps):
        this = {}
        for impl in ("cpp", "py"):
            res = run_mode(args, impl, [], common, args.world, "interleaved")
            for x in res:
                writer.writerow(dict(section="interleaved", round=r, label=x["tag"], **x))
            for label in sorted({x["tag"] for x in res}):
                mine = [x for x in res if x["tag"] == label]
                slow = min(mine, key=lambda x: x["it_s"])
                this[label] = slow["it_s"]
                rows_by_label.setdefault(label, []).append(slow)
            print(f"  rep {r + 1}/{args.il_reps} {impl}: " + ", ".join(
                f"{k} {this[k]:.2f}" for k in this if (k.startswith("pytorch") == (impl == "py"))) +
                f" it/s, foreign load {res[0]['foreign_cores']:.2f}", flush=True)
        reps.append(this)
    print(f"\nInterleaved in-process: {args.il_reps} reps x {args.il_rounds} alternations x {args.chunk} steps per "
          f"mode; medians over reps of the slower rank\n")
    print("| mode | it/s | ms/iter | CPU ms/iter (all threads) | forward ms | backward ms | after-backward sync ms "
          "| exposed comm ms | buckets |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, rows in rows_by_label.items():
        print(f"| {label} | {fmt(med([x['it_s'] for x in rows]))} | {fmt(med([x['ms_per_iter'] for x in rows]))} "
              f"| {fmt(med([x['cpu_ms_per_iter'] for x in rows]))} | {fmt(med([x['fwd_ms'] for x in rows]))} "
              f"| {fmt(med([x['bwd_ms'] for x in rows]))} | {fmt(med([x['sync_ms'] for x in rows]))} "
              f"| {fmt(med([x['exposed_comm_ms'] for x in rows]))} | {rows[-1]['buckets']} |")
    print("\n| ratio (it/s) | median over reps | min..max | measured |")
    print("|---|---:|---:|---|")
    for a, b in [("ddp", "local"), ("allreduce_each", "local"), ("ddp_overlap", "local"), ("ddp", "allreduce_each"),
                 ("pytorch_ddp", "pytorch_local"), ("ddp", "pytorch_ddp"), ("local", "pytorch_local")]:
        rr = [rep[a] / rep[b] for rep in reps if a in rep and b in rep]
        if rr:
            same = a.startswith("pytorch") == b.startswith("pytorch")
            print(f"| {a} / {b} | {med(rr):.3f} | {min(rr):.3f}..{max(rr):.3f} | "
                  f"{'same processes' if same else 'adjacent processes'} |")
    return reps


def memory(args, writer):
    common = ["--model", "mlp100", "--iters", str(args.mem_iters), "--warmup", "1", "--batch", str(args.mem_batch),
              "--lr", "0.01"]
    peaks = {}
    for m, (impl, flags) in MEMORY_MODES.items():
        res = run_mode(args, impl, flags, common, args.world, "mem_" + m)
        for x in res:
            writer.writerow(dict(section="memory", round=0, label="mem_" + m, **x))
        peaks[m] = (max(x["peak_rss_mb"] for x in res), max(x["base_rss_mb"] for x in res), res[0]["param_mb"],
                    max(x["ms_per_iter"] for x in res))
        print(f"  memory {m:24s} peak RSS {peaks[m][0]:8.1f} MB", flush=True)
    print(f"\nPeak RSS (max over ranks), MLP 6 x Linear(2048, 2048) + head = {peaks['local'][2]:.1f} MB of parameters, "
          f"batch {args.mem_batch}, {args.mem_iters + 1} SGD steps\n")
    print("| mode | peak RSS MB | RSS before the model MB | peak - before MB | peak / local peak | ms/step |")
    print("|---|---:|---:|---:|---:|---:|")
    for m, (peak, base, _, ms) in peaks.items():
        ref = peaks["pytorch_local" if m.startswith("pytorch") else "local"][0]
        print(f"| {m} | {peak:.1f} | {base:.1f} | {peak - base:.1f} | {peak / ref:.3f} | {ms:.0f} |")
    ratio = peaks["ddp"][0] / peaks["local"][0]
    print(f"\nlibddp DDP (gradient_as_bucket_view) / local peak RSS: {ratio:.3f} (target <= 1.1: "
          f"{'met' if ratio <= 1.1 else 'MISSED'})")
    return peaks


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", help="ddp_bench_lenet (default: build-bench/, build/ under the repo, or $DDP_BENCH_BIN)")
    ap.add_argument("--python", default="/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable,
                    help="a Python with torch, for PyTorch's DDP")
    ap.add_argument("--rounds", type=int, default=5, help="process-per-mode rounds (0: skip them)")
    ap.add_argument("--iters", type=int, default=40, help="timed iterations per run")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--batch", type=int, default=128, help="per rank")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"comma-separated, of {', '.join(LENET_MODES)}")
    ap.add_argument("--il-reps", type=int, default=3,
                    help="repetitions of the in-process interleaved comparison (0: skip it)")
    ap.add_argument("--il-rounds", type=int, default=6, help="interleaved: alternations per process")
    ap.add_argument("--chunk", type=int, default=10, help="interleaved: steps per mode per alternation")
    ap.add_argument("--no-memory", dest="memory", action="store_false", help="skip the peak-RSS comparison")
    ap.add_argument("--memory-only", action="store_true")
    ap.add_argument("--mem-iters", type=int, default=8)
    ap.add_argument("--mem-batch", type=int, default=16)
    ap.add_argument("--quick", action="store_true", help="2 rounds x 15 iterations, 4 modes, small memory run")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per run")
    ap.add_argument("--wait-idle", type=float, default=60,
                    help="before each run, wait up to this many seconds for other processes to go quiet (0: never)")
    ap.add_argument("--max-foreign", type=float, default=0.25,
                    help="cores other processes may use during a run before it counts as disturbed")
    ap.add_argument("--retries", type=int, default=2, help="re-runs of a disturbed run")
    ap.add_argument("--pin", action="store_true", help="pin rank r (all its threads) to CPU r")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "lenet.csv"))
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.iters, args.warmup, args.mem_iters = 2, 15, 3, 1
        args.il_reps, args.il_rounds, args.chunk = 1, 2, 5
        args.retries, args.wait_idle = 0, min(args.wait_idle, 5)
        if args.modes == ",".join(DEFAULT_MODES):
            args.modes = ",".join(QUICK_MODES)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in args.modes if m not in LENET_MODES]
    if unknown:
        sys.exit(f"unknown mode(s) {unknown}; known: {list(LENET_MODES)}")
    args.bin = find_binary(args.bin)
    if not shutil.which(args.python) and not os.path.exists(args.python):
        sys.exit(f"no python at {args.python}")

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    print(f"binary {args.bin}\npython {args.python}\ncpus {os.cpu_count()}, load average "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}\n", flush=True)
    fields = ["section", "round", "label", "impl", "mode", "model", "rank", "world", "batch", "iters", "it_s",
              "chunk_it_s", "ms_per_iter", "cpu_ms_per_iter", "main_cpu_ms_per_iter", "fwd_ms", "bwd_ms", "sync_ms", "step_ms", "exposed_comm_ms", "backward_ms", "buckets",
              "bytes_reduced", "bucket_view", "bucket_cap_mb", "first_bucket_mb", "param_mb", "peak_rss_mb",
              "base_rss_mb", "checksum", "loss", "flush_denormal", "foreign_cores", "attempt", "tag"]
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        if not args.memory_only:
            if args.rounds > 0:
                throughput(args, writer)
            if args.il_reps > 0:
                print()
                interleaved(args, writer)
        if args.memory or args.memory_only:
            print()
            memory(args, writer)
    print(f"\nload average at the end {', '.join(f'{x:.2f}' for x in os.getloadavg())}; raw results: {args.out}")


if __name__ == "__main__":
    main()
