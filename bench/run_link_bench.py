#!/usr/bin/python3
"""DDP measured across two hosts on limited links: two network
namespaces joined by a veth pair, shaped with tc tbf at each --links rate (or
unshaped: none), one rank per namespace (one core, OMP_NUM_THREADS=1), Gloo
bound to the veth addresses. Needs root. Reuses Link and run_pair of
bench/run_netns_bench.py, and ddp_bench_lenet (build-bench/ or build/) and
bench/pytorch_lenet_bench.py as the two ranks' programs.

  /usr/bin/python3 bench/run_link_bench.py                          # the full run, about 40 min on the 2-core VM
  /usr/bin/python3 bench/run_link_bench.py --links 1gbit --models resnet18,mlp100 --rounds 1 \
      --iters 2 --warmup 1 --out /tmp/linkbench                     # a smoke test, about 4 min
  /usr/bin/python3 bench/run_link_bench.py --report-only bench/results/links.csv   # tables and charts again

Per link, first the all-reduce of one flat tensor alone at each of
--allreduce-sizes (MiB, once; for a latency + bandwidth fit), then --rounds
rounds; each round runs, for each model, every mode once as its own pair of
processes, the order rotating from round to round:

  local          libddp's binary, no communication (the compute-only step)
  ddp            ddp::DistributedDataParallel, the library's defaults (25 MB buckets)
  pytorch_ddp    torch.nn.parallel.DistributedDataParallel (python3-torch), its defaults (25 MB)
  allreduce      the whole gradient's all-reduce alone, no compute (ddp_bench_lenet --mode allreduce)
  ddp_timeline   ddp with DDP_TIMELINE set: the hidden fraction from the trace (rank 0, timed steps)
  ddp_auto       ddp with --bucket-cap-mb auto; it warms up until the tuning chose (at most --auto-warmup steps)
  ddp_bC, pytorch_bC   the bucket-size sweep at C MB (--sweep; 25 MB is ddp / pytorch_ddp itself)
  pytorch_local  (not by default) PyTorch without DDP

ddp_auto and the sweep run in the first --sweep-rounds rounds only (default
1): at 100 Mbit/s they are most of the time. The defaults: resnet18 (d2l's,
11.2 M parameters, 28x28 inputs) at batch 192 per rank and mlp100 (25.2 M) at
48, where local backward (about 320 and 840 ms here) matches the whole
gradient's all-reduce at 1 Gbit/s (about 375 and 845 ms): at 100 Mbit/s
backward is a tenth of it, at 10 Gbit/s and unshaped 5 to 10 times it. Steps
per run, timed:warm-up: 100 Mbit/s 2:1 (a step takes 4 to 10 s there),
1 Gbit/s 3:2, 10 Gbit/s and unshaped 4:2 (--iters-per-link; --iters and
--warmup set every link).

Every run is printed as it finishes and appended to OUT/links.csv, one row per
run and rank: ms_per_step is the mean over the timed steps (for allreduce rows
the all-reduce's time; allreduce_mb its size in MiB, model '-' for the size
series); backward_ms is the local run's backward call, libddp's
ReducerStats::backward_ms (first gradient ready -> end of backward) or
PyTorch's backward compute time; comm_ms and overlap_ms are what the reducer
reports (ReducerStats; PyTorch's DDP logging data), medians over the timed
steps; hidden_timeline and the tl_* columns come from rank 0's trace;
veth_mb_per_step is what rank 1's end sent (warm-up and the construction
broadcast included), in 10^6 bytes. Bucket caps are MiB, as both libraries
mean them. At the end OUT/links.txt gets the console log and a markdown
summary (it/s of every round and the median, libddp / PyTorch, the hidden
fraction as 1 - (step - local step) / all-reduce alone and from the timeline,
what the reducers report, the timeline's breakdown, the sweep, auto against
the best fixed cap, the all-reduce fit; the goals: libddp >= PyTorch, >= 75 %
hidden where the all-reduce takes no longer than local backward), and gnuplot
draws OUT/links_its.png, OUT/links_hidden.png and OUT/links_sweep.png. The
namespaces are removed at the end, also on failure or Ctrl-C; a run past
--timeout is killed and recorded as failed, and the others go on. Timings are
only valid on an otherwise idle machine.
"""
import argparse
import csv
import datetime
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import run_lenet_bench as lb
import run_netns_bench as nb

DEFAULT_LINKS = "100mbit,1gbit,10gbit,none"
DEFAULT_MODELS = "resnet18,mlp100"
# Batch per rank: at 1 Gbit/s, local backward about the whole gradient's all-reduce.
DEFAULT_BATCH = {"resnet18": 192, "mlp100": 48}
# link -> (timed steps, warm-up steps) per run.
DEFAULT_STEPS = {"100mbit": (2, 1), "1gbit": (3, 2), "10gbit": (4, 2), "none": (4, 2)}
DEFAULT_SWEEP = "1,5,100"
DEFAULT_ALLREDUCE_SIZES = "0.25,1,5,25,100"
BASE_MODES = ["local", "ddp", "pytorch_ddp", "allreduce", "ddp_timeline", "ddp_auto"]
LINK_WORDS = {"none": "unshaped"}

CSV_COLUMNS = ["date", "link", "model", "batch", "mode", "impl", "bucket_cap_mb", "round", "rank", "ms_per_step",
               "backward_ms", "comm_ms", "exposed_ms", "overlap_ms", "allreduce_mb", "chosen_bucket_cap_mb",
               "hidden_timeline", "veth_mb_per_step", "iters", "warmup", "fwd_ms", "bwd_call_ms", "params",
               "auto_trials", "tl_backward_ms", "tl_comm_ms", "tl_comm_in_backward_ms", "tl_first_launch_ms",
               "tl_comm_after_backward_ms", "tl_buckets"]
TIMELINE_KEYS = ["backward_ms", "comm_ms", "comm_in_backward_ms", "first_launch_ms", "comm_after_backward_ms", "buckets"]


class Log:
    """The console, kept for links.txt (and written there as it goes, so that
    an interrupted run leaves its log: --report-only adds the summary)."""

    def __init__(self, path):
        self.lines = []
        self.file = open(path, "w")

    def __call__(self, text=""):
        print(text, flush=True)
        self.lines.append(text)
        self.file.write(text + "\n")
        self.file.flush()


def mode_spec(name):
    """mode -> (impl, flags, bucket cap for the CSV, timeline?)."""
    fixed = {
        "local": ("cpp", ["--mode", "local"], "", False),
        "ddp": ("cpp", ["--mode", "ddp"], "25", False),
        "ddp_timeline": ("cpp", ["--mode", "ddp"], "25", True),
        "ddp_auto": ("cpp", ["--mode", "ddp", "--bucket-cap-mb", "auto"], "auto", False),
        "pytorch_ddp": ("py", ["--mode", "ddp"], "25", False),
        "pytorch_local": ("py", ["--mode", "local"], "", False),
        "allreduce": ("cpp", ["--mode", "allreduce"], "", False),
    }
    if name in fixed:
        return fixed[name]
    m = re.fullmatch(r"(ddp|pytorch)_b([0-9]*\.?[0-9]+)", name)
    if not m:
        raise ValueError(f"unknown mode {name}")
    cap = m.group(2)
    return ("cpp" if m.group(1) == "ddp" else "py", ["--mode", "ddp", "--bucket-cap-mb", cap], cap, False)


def is_sweep(mode):
    """ddp_auto and the sweep's modes (--sweep-rounds)."""
    return mode == "ddp_auto" or re.fullmatch(r"(ddp|pytorch)_b([0-9]*\.?[0-9]+)", mode) is not None


def cap_of_mode(mode):
    """The fixed bucket cap (MB) a ddp / PyTorch mode runs at, else None."""
    if mode in ("ddp", "pytorch_ddp"):
        return 25.0
    m = re.fullmatch(r"(ddp|pytorch)_b([0-9]*\.?[0-9]+)", mode)
    return float(m.group(2)) if m else None


def parse_map(text, what, convert):
    out = {}
    for item in filter(None, text.split(",")):
        if "=" not in item:
            sys.exit(f"{what}: expected NAME=VALUE, got '{item}'")
        k, v = item.split("=", 1)
        out[k.strip()] = convert(v.strip())
    return out


def timeline_steps(path, warmup):
    """Rank 0's timed steps (step >= warmup) in a DDP_TIMELINE trace, each a
    dict: hidden (the communication-span time that overlaps the step's
    backward span, over all its communication-span time), backward_ms,
    comm_ms (the communication spans' total), comm_in_backward_ms,
    first_launch_ms (backward's start to the first bucket's launch),
    comm_after_backward_ms (backward's end to the last bucket done) and
    buckets. A bucket belongs to the step whose backward began last before
    the bucket's launch (events also carry their step)."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    backward = sorted((e["ts"], e["ts"] + e["dur"], e["args"]["step"]) for e in events
                      if e.get("pid") == 0 and e.get("ph") == "X" and e.get("name") == "backward")
    comms = [(e["ts"], e["ts"] + e["dur"], e["args"].get("launch_us", e["ts"])) for e in events
             if e.get("pid") == 0 and e.get("ph") == "X" and e.get("cat") == "communication"]
    steps = []
    for i, (b0, b1, step) in enumerate(backward):
        if step < warmup:
            continue
        until = backward[i + 1][0] if i + 1 < len(backward) else math.inf
        mine = [(c0, c1, launch) for c0, c1, launch in comms if b0 <= launch < until]
        total = sum(c1 - c0 for c0, c1, _ in mine)
        if total <= 0:
            continue
        hidden = sum(max(0, min(c1, b1) - max(c0, b0)) for c0, c1, _ in mine)
        steps.append({"hidden": hidden / total, "backward_ms": (b1 - b0) / 1e3, "comm_ms": total / 1e3,
                      "comm_in_backward_ms": hidden / 1e3,
                      "first_launch_ms": (min(launch for _, _, launch in mine) - b0) / 1e3,
                      "comm_after_backward_ms": max(0, max(c1 for _, c1, _ in mine) - b1) / 1e3,
                      "buckets": len(mine)})
    return steps


def num(x):
    """A RESULT value as a float, None where absent or not a number."""
    if x is None or x == "":
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def cell(v, digits=3):
    return "" if v is None else f"{v:.{digits}f}"


def steps_for(a, link, mode):
    """(timed, warm-up) steps of a run of `mode` on `link`."""
    iters, warmup = a.steps.get(link, DEFAULT_STEPS.get(link, (4, 2)))
    if a.iters is not None:
        iters = a.iters
    if a.warmup is not None:
        warmup = a.warmup
    if mode == "ddp_auto":  # at most; the bench stops warming up once the tuning chose
        warmup = max(warmup, a.auto_warmup)
    return iters, warmup


class Bench:
    def __init__(self, args, binary, log, csv_file):
        self.args, self.binary, self.log = args, binary, log
        self.csv = csv.DictWriter(csv_file, fieldnames=CSV_COLUMNS)
        self.csv_file = csv_file
        self.csv.writeheader()
        self.date = datetime.datetime.now().isoformat(timespec="seconds")
        self.tmp = tempfile.mkdtemp(prefix="ddp_linkbench_")
        self.failures = []
        self.auto_unsupported = False

    def run(self, link, link_name, model, mode, rnd, allreduce_mb=None):
        a = self.args
        impl, flags, cap, timeline = mode_spec(mode)
        if mode == "ddp_auto" and self.auto_unsupported:
            return
        iters, warmup = steps_for(a, link_name, mode)
        batch = a.batch.get(model, 32)
        common = ["--model", model, "--batch", str(batch), "--iters", str(iters), "--warmup", str(warmup), "--lr",
                  "0.01", "--threads", str(a.threads)]
        if model == "resnet18":
            common += ["--image", str(a.image)]
        if allreduce_mb is not None:
            flags = flags + ["--allreduce-mb", str(allreduce_mb)]
        if mode == "ddp_auto":
            common[common.index("--warmup") + 1] = str(steps_for(a, link_name, "")[1])
            common += ["--auto-max-warmup", str(warmup)]
        env = {}
        trace = None
        if timeline:
            trace = os.path.join(self.tmp, f"{link_name}_{model}_{rnd}.json")
            env["DDP_TIMELINE"] = trace
        label = f"{link_name:8s} round {rnd} {model:8s} {mode if allreduce_mb is None else f'allreduce {allreduce_mb} MB':16s}"
        t0 = time.time()
        try:
            res = nb.run_pair(link, impl, flags, a, self.binary, common=common, extra_env=env, steps=iters + warmup,
                              timeout=a.timeout)
        except RuntimeError as e:
            msg = str(e)
            if mode == "ddp_auto" and "bucket_cap_mb(\"auto\")" in msg:
                self.auto_unsupported = True
                self.log(f"  {label} skipped from now on: this libddp has no bucket_cap_mb(\"auto\")")
            else:
                self.log(f"  {label} FAILED after {time.time() - t0:.0f} s: {msg.splitlines()[-1] if msg else msg}")
            self.failures.append(f"{label}: {msg}")
            return
        hidden, tl = None, {}
        if trace:
            try:
                tl_steps = timeline_steps(trace, warmup)
                if tl_steps:
                    hidden = statistics.median(x["hidden"] for x in tl_steps)
                    tl = {k: statistics.median(x[k] for x in tl_steps) for k in TIMELINE_KEYS}
                steps_txt = " ".join(f"{x['hidden']:.2f}" for x in tl_steps)
            except (OSError, ValueError, KeyError) as e:
                steps_txt = f"unreadable ({e})"
            for f in os.listdir(self.tmp):
                os.remove(os.path.join(self.tmp, f))
        rows = []
        if mode == "ddp_auto" and res[0].get("warmup_steps"):  # the warm-up steps it took
            ran = iters + int(res[0]["warmup_steps"])
            for x in res:
                x["veth_bytes_per_step"] *= (iters + warmup) / ran
            warmup = int(res[0]["warmup_steps"])
        for x in sorted(res, key=lambda x: x["rank"]):
            is_ddp = x["mode"] == "ddp"
            row = {
                "date": self.date, "link": link_name, "model": "-" if allreduce_mb is not None else model,
                "batch": "" if mode == "allreduce" else batch,
                "mode": mode,
                "impl": "libddp" if impl == "cpp" else "pytorch", "bucket_cap_mb": cap, "round": rnd,
                "rank": int(x["rank"]), "ms_per_step": cell(num(x["ms_per_iter"]), 3),
                "backward_ms": cell(num(x.get("backward_ms")) if is_ddp else
                                    (num(x.get("bwd_ms")) if x["mode"] == "local" else None)),
                "comm_ms": cell(num(x.get("comm_ms"))),
                "exposed_ms": cell(num(x.get("exposed_comm_ms")) if is_ddp and impl == "cpp" else None),
                "overlap_ms": cell(num(x.get("overlap_ms"))),
                "allreduce_mb": cell(num(x.get("allreduce_mb")), 4) if x["mode"] == "allreduce" else "",
                "chosen_bucket_cap_mb": cell(num(x.get("chosen_bucket_cap_mb")), 3) if is_ddp else "",
                "hidden_timeline": cell(hidden, 4) if trace and x["rank"] == 0 else "",
                "veth_mb_per_step": cell(x["veth_bytes_per_step"] / 1e6, 3),
                "iters": iters, "warmup": warmup, "fwd_ms": cell(num(x.get("fwd_ms"))),
                "bwd_call_ms": cell(num(x.get("bwd_ms"))), "params": x.get("params", ""),
                "auto_trials": x.get("bucket_cap_trials", "") if mode == "ddp_auto" else "",
            }
            for k in TIMELINE_KEYS:
                row["tl_" + k] = cell(tl.get(k), 3) if trace and x["rank"] == 0 and k in tl else ""
            rows.append(row)
            self.csv.writerow(row)
        self.csv_file.flush()
        cells = "; ".join(f"rank {r['rank']}: {float(r['ms_per_step']):.0f} ms/step "
                          f"({1000 / float(r['ms_per_step']):.2f} it/s)" for r in rows)
        r0 = rows[0]
        extra = []
        for key, name in (("backward_ms", "backward"), ("comm_ms", "comm"), ("overlap_ms", "overlap"),
                          ("exposed_ms", "exposed")):
            if r0[key]:
                extra.append(f"{name} {float(r0[key]):.0f}")
        if r0["chosen_bucket_cap_mb"] and mode == "ddp_auto":
            still = res[0].get("tuning") == 1
            extra.append(f"auto {'still tuning at' if still else 'chose'} {float(r0['chosen_bucket_cap_mb']):g} MB "
                         f"after {warmup} warm-up steps (trials cap:ms {r0['auto_trials']})")
        if trace:
            extra.append(f"hidden (timeline) {r0['hidden_timeline'] or '?'} [per step: {steps_txt}]")
        extra.append(f"veth {float(r0['veth_mb_per_step']):.1f} MB/step")
        self.log(f"  {label} {cells}; {', '.join(extra)} ms [{time.time() - t0:.0f} s]")

    def cleanup(self):
        shutil.rmtree(self.tmp, ignore_errors=True)


# ---------------------------------------------------------------- the report

def read_csv(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k in CSV_COLUMNS[9:]:
            if k in r and k != "auto_trials":  # the rest are numbers
                r[k] = num(r[k])
        r["round"] = int(r["round"])
        r["rank"] = int(r["rank"])
    return rows


def ordered(values):
    seen = []
    for v in values:
        if v not in seen:
            seen.append(v)
    return seen


class Summary:
    """The CSV's figures per link and model: a run's step time is its slower rank's."""

    def __init__(self, rows):
        self.rows = rows
        self.links = ordered(r["link"] for r in rows)
        self.models = ordered(r["model"] for r in rows if r["model"] != "-")
        self.date = rows[0]["date"] if rows else ""

    def select(self, link, model, mode):
        return [r for r in self.rows if r["link"] == link and r["model"] == model and r["mode"] == mode]

    def ms_rounds(self, link, model, mode):
        """Step time (ms) of every round, the slower rank's."""
        by_round = {}
        for r in self.select(link, model, mode):
            if r["ms_per_step"] is not None:
                by_round[r["round"]] = max(by_round.get(r["round"], 0), r["ms_per_step"])
        return [by_round[k] for k in sorted(by_round)]

    def ms(self, link, model, mode):
        v = self.ms_rounds(link, model, mode)
        return statistics.median(v) if v else None

    def its(self, link, model, mode):
        v = self.ms(link, model, mode)
        return 1000 / v if v else None

    def field(self, link, model, mode, key, rank=0):
        v = [r[key] for r in self.select(link, model, mode) if r["rank"] == rank and r[key] is not None]
        return statistics.median(v) if v else None

    def batch(self, link, model):
        b = [r["batch"] for r in self.rows if r["link"] == link and r["model"] == model and r["batch"]]
        return b[0] if b else ""

    def hidden_formula(self, link, model, mode):
        step, local, ar = self.ms(link, model, mode), self.ms(link, model, "local"), self.ms(link, model, "allreduce")
        if step is None or local is None or not ar:
            return None
        return 1 - (step - local) / ar

    def hidden_logged(self, link, model, mode):
        comm, overlap = self.field(link, model, mode, "comm_ms"), self.field(link, model, mode, "overlap_ms")
        if comm is None or overlap is None or comm <= 0:
            return None
        return min(overlap, comm) / comm

    def caps(self, link, model):
        """Fixed caps of the sweep (MB), with ddp / pytorch_ddp as 25."""
        modes = ordered(r["mode"] for r in self.rows if r["link"] == link and r["model"] == model)
        return sorted({cap_of_mode(m) for m in modes if cap_of_mode(m) is not None})

    def sweep_mode(self, impl, cap):
        if cap == 25.0:
            return "ddp" if impl == "libddp" else "pytorch_ddp"
        return f"{'ddp' if impl == 'libddp' else 'pytorch'}_b{cap:g}"

    def sweep_its(self, link, model, impl, cap):
        return self.its(link, model, self.sweep_mode(impl, cap))

    def series(self, link):
        """The all-reduce size series: [(MiB, ms)]."""
        pts = {}
        for r in self.rows:
            if r["link"] == link and r["mode"] == "allreduce" and r["model"] == "-" and r["ms_per_step"] is not None:
                mb = r["allreduce_mb"]
                pts.setdefault(mb, {}).setdefault(r["round"], 0)
                pts[mb][r["round"]] = max(pts[mb][r["round"]], r["ms_per_step"])
        return sorted((mb, statistics.median(v.values())) for mb, v in pts.items())


def fmt_rounds(ms_list, digits=2):
    if not ms_list:
        return "-"
    its = [1000 / v for v in ms_list]
    return f"{' '.join(f'{v:.{digits}f}' for v in its)} (median {1000 / statistics.median(ms_list):.{digits}f})"


def pct(v):
    return "-" if v is None else f"{100 * v:.0f} %"


def fit_latency_bandwidth(points):
    """Least squares t = alpha + beta * MB over the series: (alpha ms, MB/s)."""
    if len(points) < 2:
        return None
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    beta = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    alpha = my - beta * mx
    return alpha, (1000 / beta if beta > 0 else None)


def report(rows):
    s = Summary(rows)
    out = [f"Run of {s.date}; a run's figure is its slower rank's; it/s of every round, then the median. "
           f"Hidden (formula) = 1 - (step - local step) / all-reduce alone; hidden (timeline) = communication "
           f"overlapping backward / all communication, rank 0's timed steps, median (PyTorch's formula uses the "
           f"same local step: libddp's binary, the same kernels); hidden (reducer) = "
           f"overlap_ms / comm_ms as the reducer reports them (libddp's ReducerStats, PyTorch's DDP logging data).",
           "", "### Throughput and overlap", "",
           "| link | model | batch | local it/s | libddp it/s | PyTorch it/s | libddp / PyTorch | all-reduce alone ms | "
           "backward ms (local) | hidden libddp (formula) | hidden libddp (timeline) | hidden PyTorch (formula) | "
           "libddp >= PyTorch | >= 75 % hidden where all-reduce <= backward |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for link in s.links:
        for model in s.models:
            if not any(r["link"] == link and r["model"] == model for r in rows):
                continue
            lib, pt = s.its(link, model, "ddp"), s.its(link, model, "pytorch_ddp")
            ratio = lib / pt if lib and pt else None
            ar = s.ms(link, model, "allreduce")
            bwd = s.field(link, model, "local", "backward_ms")
            hf, ht = s.hidden_formula(link, model, "ddp"), s.field(link, model, "ddp_timeline", "hidden_timeline")
            hp = s.hidden_formula(link, model, "pytorch_ddp")
            goal1 = "-" if ratio is None else ("met" if ratio >= 1 else "missed")
            if ar is None or bwd is None:
                goal2 = "-"
            elif ar > bwd:
                goal2 = "n/a (all-reduce > backward)"
            else:
                verdicts = [f"{name} {'met' if v >= 0.75 else 'missed'}" for name, v in (("formula", hf),
                                                                                          ("timeline", ht)) if v is not None]
                goal2 = ", ".join(verdicts) or "-"
            out.append(f"| {LINK_WORDS.get(link, link)} | {model} | {s.batch(link, model)} | "
                       f"{fmt_rounds(s.ms_rounds(link, model, 'local'))} | {fmt_rounds(s.ms_rounds(link, model, 'ddp'))} | "
                       f"{fmt_rounds(s.ms_rounds(link, model, 'pytorch_ddp'))} | {cell(ratio, 2) or '-'} | "
                       f"{cell(ar, 0) or '-'} | {cell(bwd, 0) or '-'} | {pct(hf)} | {pct(ht)} | {pct(hp)} | {goal1} | {goal2} |")

    out += ["", "### What the reducers report (rank 0, medians over rounds of each run's median step, ms)", "",
            "| link | model | impl | step | backward | comm (first launch -> last done) | overlap (first launch -> "
            "end of backward) | exposed | hidden (reducer) |", "|---|---|---|---|---|---|---|---|---|"]
    for link in s.links:
        for model in s.models:
            for impl, mode in (("libddp", "ddp"), ("PyTorch", "pytorch_ddp")):
                if not s.select(link, model, mode):
                    continue
                out.append(f"| {LINK_WORDS.get(link, link)} | {model} | {impl} | {cell(s.ms(link, model, mode), 0)} | "
                           f"{cell(s.field(link, model, mode, 'backward_ms'), 0) or '-'} | "
                           f"{cell(s.field(link, model, mode, 'comm_ms'), 0) or '-'} | "
                           f"{cell(s.field(link, model, mode, 'overlap_ms'), 0) or '-'} | "
                           f"{cell(s.field(link, model, mode, 'exposed_ms'), 0) or '-'} | "
                           f"{pct(s.hidden_logged(link, model, mode))} |")

    out += ["", "### Timeline of libddp's steps (ddp_timeline, rank 0, medians over timed steps and rounds, ms)", "",
            "Communication is the time the communication row's bucket spans cover (a bucket's span starts when the "
            "link could start on it: its launch, or the end of the bucket before it); where less than 75 % of it "
            "falls within backward, the first launch and the tail after backward tell why.", "",
            "| link | model | backward span | communication | of it within backward | first bucket launched after "
            "backward began | communication after backward ended | buckets | hidden (timeline) |",
            "|---|---|---|---|---|---|---|---|---|"]
    for link in s.links:
        for model in s.models:
            if not s.select(link, model, "ddp_timeline"):
                continue
            f = lambda k: cell(s.field(link, model, "ddp_timeline", "tl_" + k), 0) or "-"
            out.append(f"| {LINK_WORDS.get(link, link)} | {model} | {f('backward_ms')} | {f('comm_ms')} | "
                       f"{f('comm_in_backward_ms')} | {f('first_launch_ms')} | {f('comm_after_backward_ms')} | "
                       f"{f('buckets')} | {pct(s.field(link, model, 'ddp_timeline', 'hidden_timeline'))} |")

    out += ["", "### Bucket-size sweep (it/s, every round and the median)", "",
            "| link | model | bucket cap MB | libddp | PyTorch | libddp / PyTorch |", "|---|---|---|---|---|---|"]
    for link in s.links:
        for model in s.models:
            for cap in s.caps(link, model):
                ml, mp = s.sweep_mode("libddp", cap), s.sweep_mode("pytorch", cap)
                lib, pt = s.its(link, model, ml), s.its(link, model, mp)
                out.append(f"| {LINK_WORDS.get(link, link)} | {model} | {cap:g} | {fmt_rounds(s.ms_rounds(link, model, ml))} | "
                           f"{fmt_rounds(s.ms_rounds(link, model, mp))} | "
                           f"{cell(lib / pt if lib and pt else None, 2) or '-'} |")

    out += ["", "### Automatic bucket size against the best fixed cap of the sweep (libddp)", "",
            "| link | model | auto: chosen cap MB (every round) | auto it/s | best fixed cap MB | its it/s | auto / best | "
            "auto's trials, cap:ms (every round) |",
            "|---|---|---|---|---|---|---|---|"]
    for link in s.links:
        for model in s.models:
            if not s.select(link, model, "ddp_auto"):
                continue
            mine = [r for r in s.select(link, model, "ddp_auto") if r["rank"] == 0]
            chosen = [r["chosen_bucket_cap_mb"] for r in mine]
            trials = "; ".join((r.get("auto_trials") or "-").replace("/", " ") for r in mine)
            auto = s.its(link, model, "ddp_auto")
            fixed = [(s.sweep_its(link, model, "libddp", c), c) for c in s.caps(link, model)]
            fixed = [f for f in fixed if f[0]]
            best = max(fixed) if fixed else (None, None)
            out.append(f"| {LINK_WORDS.get(link, link)} | {model} | "
                       f"{' '.join('?' if c is None else f'{c:g}' for c in chosen)} | "
                       f"{fmt_rounds(s.ms_rounds(link, model, 'ddp_auto'))} | "
                       f"{'-' if best[1] is None else f'{best[1]:g}'} | {cell(best[0], 2) or '-'} | "
                       f"{cell(auto / best[0] if auto and best[0] else None, 2) or '-'} | {trials} |")

    series_links = [link for link in s.links if s.series(link)]
    if series_links:
        sizes = sorted({mb for link in series_links for mb, _ in s.series(link)})
        out += ["", "### All-reduce alone, by size (ms; 2 ranks, Gloo) and a fit t = latency + size / bandwidth", "",
                "| link | " + " | ".join(f"{mb:g} MiB" for mb in sizes) + " | latency ms | MiB/s | Gbit/s |",
                "|---|" + "---|" * (len(sizes) + 3)]
        for link in series_links:
            pts = dict(s.series(link))
            fit = fit_latency_bandwidth(sorted(pts.items()))
            lat, bw = fit if fit else (None, None)
            out.append(f"| {LINK_WORDS.get(link, link)} | " + " | ".join(cell(pts.get(mb), 1) or "-" for mb in sizes) +
                       f" | {cell(lat, 2) or '-'} | {cell(bw, 0) or '-'} | "
                       f"{cell(bw * 1048576 * 8 / 1e9 if bw else None, 2) or '-'} |")
    return out, s


# ---------------------------------------------------------------- the charts

def gp_str(text):
    return "'" + text.replace("'", "''") + "'"


def gp_data_str(text):
    return '"' + text.replace('"', "'") + '"'


def datablock(name, lines):
    return f"${name} << EOD\n" + "\n".join(lines) + "\nEOD\n"


def nan(v):
    return "NaN" if v is None else f"{v:.6g}"


def draw_charts(s, outdir):
    """links_its.png, links_hidden.png, links_sweep.png in outdir; returns the paths drawn."""
    if not shutil.which("gnuplot"):
        print("notice: gnuplot not found, no charts drawn (apt-get install gnuplot-nox)")
        return []
    links, models = s.links, s.models
    if not models:
        return []
    labels = [LINK_WORDS.get(link, link) for link in links]
    gp = ["set datafile missing 'NaN'", "set grid", "set key top right"]
    drawn = []

    # 1. it/s per link: local, libddp, PyTorch, a panel per model.
    path = os.path.join(outdir, "links_its.png")
    gp += [f"set terminal pngcairo size {600 * len(models)},500 noenhanced", f"set output {gp_str(path)}",
           f"set multiplot layout 1,{len(models)} title 'it/s per link (2 ranks, median of rounds)'",
           "set style data histograms", "set style histogram clustered gap 1", "set style fill solid 0.8 border -1",
           "set ylabel 'it/s'", "set yrange [0:*]", "set xtics nomirror", "set key below horizontal"]
    for k, model in enumerate(models):
        block = [f"{gp_data_str(lab)} {nan(s.its(link, model, 'local'))} {nan(s.its(link, model, 'ddp'))} "
                 f"{nan(s.its(link, model, 'pytorch_ddp'))}" for link, lab in zip(links, labels)]
        gp.append(datablock(f"its{k}", block))
        gp += [f"set title {gp_str(model + ' (batch ' + str(s.batch(links[0], model)) + '/rank)')}",
               f"plot $its{k} using 2:xtic(1) title 'local (no communication)', "
               f"$its{k} using 3 title 'libddp', $its{k} using 4 title 'PyTorch DDP'"]
    gp += ["unset multiplot", "unset style", "set style data linespoints"]
    drawn.append(path)

    # 2. hidden fraction per link.
    path = os.path.join(outdir, "links_hidden.png")
    vals = []
    block = []
    for i, (link, lab) in enumerate(zip(links, labels)):
        row = [str(i), gp_data_str(lab)]
        for model in models:
            v = [s.hidden_formula(link, model, "ddp"), s.field(link, model, "ddp_timeline", "hidden_timeline"),
                 s.hidden_formula(link, model, "pytorch_ddp")]
            vals += [x for x in v if x is not None]
            row += [nan(x) for x in v]
        block.append(" ".join(row))
    lo, hi = min(vals + [0.0]) - 0.05, max(vals + [1.0]) + 0.05
    gp += [datablock("hidden", block), "set terminal pngcairo size 800,600 noenhanced", f"set output {gp_str(path)}",
           "set title 'communication hidden by overlap'", "set ylabel 'fraction of the all-reduce hidden'",
           "set xlabel 'link'", f"set xrange [-0.3:{len(links) - 0.7}]", f"set yrange [{lo:.2f}:{hi:.2f}]",
           "set key below maxrows 3 font ',9'"]
    plots = []
    for k, model in enumerate(models):
        c = 3 + 3 * k
        plots += [f"$hidden using 1:{c}:xtic(2) with linespoints lw 2 pt 7 dt 1 lc {k + 1} title "
                  f"{gp_str(model + ' libddp, 1 - (step - local)/all-reduce')}",
                  f"$hidden using 1:{c + 1} with linespoints lw 2 pt 5 dt 2 lc {k + 1} title "
                  f"{gp_str(model + ' libddp, timeline')}",
                  f"$hidden using 1:{c + 2} with linespoints lw 1 pt 4 dt 3 lc {k + 1} title "
                  f"{gp_str(model + ' PyTorch, 1 - (step - local)/all-reduce')}"]
    plots.append("0.75 with lines lc rgb 'gray' dt 4 title 'goal: 75 %'")
    gp += ["plot " + ", ".join(plots), "set xrange [*:*]", "set yrange [*:*]", "unset xlabel", "set xtics auto"]
    drawn.append(path)

    # 3. it/s against the bucket cap, a panel per model and link.
    path = os.path.join(outdir, "links_sweep.png")
    gp += [f"set terminal pngcairo size {max(700, 340 * len(links))},{40 + 340 * len(models)} noenhanced",
           f"set output {gp_str(path)}",
           f"set multiplot layout {len(models)},{len(links)} title 'it/s against the bucket cap, MB (diamond: libddp auto, "
           f"at the cap it chose)'", "set logscale x", "unset xlabel", "set ylabel 'it/s'",
           "set key below horizontal font ',8'", "set yrange [0:*]", "set xrange [0.7:150]", "set xtics (1, 5, 25, 100)"]
    n = 0
    for model in models:
        for link, lab in zip(links, labels):
            caps = s.caps(link, model)
            block = [f"{c:g} {nan(s.sweep_its(link, model, 'libddp', c))} {nan(s.sweep_its(link, model, 'pytorch', c))}"
                     for c in caps] or ["25 NaN NaN"]
            chosen = s.field(link, model, "ddp_auto", "chosen_bucket_cap_mb")
            auto = s.its(link, model, "ddp_auto")
            gp.append(datablock(f"sw{n}", block))
            gp.append(datablock(f"au{n}", [f"{nan(chosen) if chosen else 'NaN'} {nan(auto)}"]))
            gp.append(f"set title {gp_str(model + ', ' + lab)}")
            gp.append(f"plot $sw{n} using 1:2 with linespoints lw 2 pt 7 title 'libddp', "
                      f"$sw{n} using 1:3 with linespoints lw 2 pt 5 title 'PyTorch', "
                      f"$au{n} using 1:2 with points pt 13 ps 2 lc rgb 'dark-green' title 'libddp auto'")
            n += 1
    gp += ["unset multiplot"]
    drawn.append(path)
    r = subprocess.run(["gnuplot"], input="\n".join(gp) + "\n", text=True, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE)
    if r.returncode != 0:
        print(f"notice: gnuplot failed: {r.stderr.strip()[-2000:]}")
        return []
    return drawn


SUMMARY_MARK = "## Summary"


def write_report(rows, outdir, log_lines=None, txt_path=None):
    lines, s = report(rows)
    for line in lines:
        print(line)
    txt_path = txt_path or os.path.join(outdir, "links.txt")
    if log_lines is None and os.path.isfile(txt_path):
        # --report-only: keep the console log, replace the summary after it.
        with open(txt_path) as f:
            old = f.read()
        log_lines = old.split("\n" + SUMMARY_MARK, 1)[0].rstrip("\n").split("\n")
    with open(txt_path, "w") as f:
        f.write("\n".join((log_lines or []) + ["", SUMMARY_MARK, ""] + lines) + "\n")
    drawn = draw_charts(s, outdir)
    print(f"\nwrote {txt_path}" + "".join(f", {p}" for p in drawn))


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", help="ddp_bench_lenet (default: build-bench/ or build/ under the repo)")
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--links", default=DEFAULT_LINKS, help="tbf rates (tc syntax); none: unshaped")
    ap.add_argument("--models", default=DEFAULT_MODELS)
    ap.add_argument("--batch", default=",".join(f"{k}={v}" for k, v in DEFAULT_BATCH.items()),
                    help="per-rank batch per model, MODEL=B,...")
    ap.add_argument("--image", type=int, default=28, help="resnet18's input size")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--sweep-rounds", type=int, default=1,
                    help="ddp_auto and the sweep's modes run in the first N rounds only (they cost the most)")
    ap.add_argument("--modes", default=None, help="default: " + ",".join(BASE_MODES) + " and the sweep's")
    ap.add_argument("--sweep", default=DEFAULT_SWEEP, help="bucket caps (MB) of the sweep besides 25; '' for none")
    ap.add_argument("--allreduce-sizes", default=DEFAULT_ALLREDUCE_SIZES,
                    help="MiB; the all-reduce alone at each, once per link; '' for none")
    ap.add_argument("--iters-per-link", default=",".join(f"{k}={i}:{w}" for k, (i, w) in DEFAULT_STEPS.items()),
                    help="timed:warm-up steps per run, per link, LINK=I:W,...")
    ap.add_argument("--iters", type=int, help="timed steps per run on every link (overrides --iters-per-link)")
    ap.add_argument("--warmup", type=int, help="warm-up steps per run on every link (overrides --iters-per-link)")
    ap.add_argument("--auto-warmup", type=int, default=48,
                    help="ddp_auto's warm-up steps, at most: the bench warms up until the tuning chose (the library "
                         "tries up to 7 caps for 4 steps each, after the first step)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--timeout", type=int, default=900, help="seconds per run (both ranks), then killed")
    ap.add_argument("--out", default=os.path.join(lb.HERE, "results"), help="folder for links.csv, links.txt, PNGs")
    ap.add_argument("--report-only", metavar="CSV", help="no runs: the summary and charts from this CSV")
    args = ap.parse_args()

    if args.report_only:
        rows = read_csv(args.report_only)
        outdir = args.out if "--out" in sys.argv else os.path.dirname(os.path.abspath(args.report_only))
        os.makedirs(outdir, exist_ok=True)
        txt = os.path.join(outdir, "links.txt")
        write_report(rows, outdir, txt_path=txt)
        return

    # Ctrl-C, kill (SIGTERM) and a SIGINT that a background start ignored all
    # unwind through the finally blocks: the ranks killed, the namespaces removed.
    def stop(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    if os.geteuid() != 0:
        sys.exit("run_link_bench.py: needs root (it creates network namespaces and shapes them with tc); "
                 "run it with sudo, or use --report-only CSV")
    for tool in ("ip", "tc"):
        if not shutil.which(tool):
            sys.exit(f"run_link_bench.py: '{tool}' is missing (iproute2)")
    binary = lb.find_binary(args.bin)
    links = [x for x in args.links.split(",") if x]
    models = [x for x in args.models.split(",") if x]
    args.batch = parse_map(args.batch, "--batch", int)
    args.steps = parse_map(args.iters_per_link, "--iters-per-link",
                           lambda v: tuple(int(p) for p in v.split(":")) if ":" in v else (int(v), 2))
    sweep = [c for c in args.sweep.split(",") if c]
    modes = args.modes.split(",") if args.modes else \
        BASE_MODES + [f"ddp_b{c}" for c in sweep] + [f"pytorch_b{c}" for c in sweep]
    for m in modes:
        try:
            mode_spec(m)
        except ValueError as e:
            sys.exit(str(e))
    for model in models:
        if model not in ("resnet18", "mlp100", "lenet", "d2l_lenet"):
            sys.exit(f"unknown model {model}")
        args.batch.setdefault(model, DEFAULT_BATCH.get(model, 32))
    sizes = [float(x) for x in args.allreduce_sizes.split(",") if x]

    os.makedirs(args.out, exist_ok=True)
    log = Log(os.path.join(args.out, "links.txt"))
    start = time.time()
    log(f"run_link_bench.py, {datetime.datetime.now().isoformat(timespec='seconds')}, host {os.uname().nodename}, "
        f"{os.cpu_count()} cores")
    log("command: " + " ".join(["/usr/bin/python3"] + sys.argv))
    log(f"binary {binary}; links {links}; models {models}, batch/rank {args.batch}, resnet18 inputs "
        f"{args.image}x{args.image}; {args.rounds} round(s) of {modes} (ddp_auto and the sweep in the first "
        f"{args.sweep_rounds}); all-reduce sizes {sizes} MiB; "
        f"{args.threads} thread(s)/rank; steps per run (timed:warm-up) "
        + ", ".join(f"{link} " + "%d:%d" % steps_for(args, link, "") for link in links)
        + f", ddp_auto up to {args.auto_warmup} warm-up")
    csv_path = os.path.join(args.out, "links.csv")
    with open(csv_path, "w", newline="") as csv_file:
        bench = Bench(args, binary, log, csv_file)
        try:
            for link_name in links:
                t_link = time.time()
                with nb.Link(link_name) as link:
                    log(f"\n== link {LINK_WORDS.get(link_name, 'tbf ' + link_name)}: namespaces {link.ns}, "
                        f"veth {link.veth}, {link.addr}")
                    for mb in sizes:
                        bench.run(link, link_name, "lenet", "allreduce", 1, allreduce_mb=mb)
                    for rnd in range(1, args.rounds + 1):
                        these = [m for m in modes if rnd <= args.sweep_rounds or not is_sweep(m)]
                        for model in models:
                            k = (rnd - 1) % len(these)
                            for mode in these[k:] + these[:k]:
                                bench.run(link, link_name, model, mode, rnd)
                log(f"== link {link_name} done in {time.time() - t_link:.0f} s")
        finally:
            bench.cleanup()
    log(f"\nall runs done in {(time.time() - start) / 60:.1f} min; {len(bench.failures)} failed")
    for f in bench.failures:
        log("  failed: " + f.replace("\n", " | ")[:1500])
    log.file.close()
    write_report(read_csv(csv_path), args.out, log_lines=log.lines)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt as e:
        sys.exit(f"run_link_bench.py: stopped ({e}); the namespaces are removed; the runs so far are in the CSV "
                 f"(--report-only CSV summarises them)")
