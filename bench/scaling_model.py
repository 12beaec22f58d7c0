#!/usr/bin/python3
"""A model of DDP's step time at scale, fitted to the two-host link benchmark
and projected to 8, 64 and 256 GPUs (docs/scaling.md explains it).

  /usr/bin/python3 bench/scaling_model.py --csv bench/results/links.csv
  /usr/bin/python3 bench/scaling_model.py --csv bench/results/links.csv --update-doc docs/scaling.md
  /usr/bin/python3 bench/scaling_model.py --make-synthetic /tmp/links_synthetic.csv   # for development only
  /usr/bin/python3 bench/scaling_model.py --csv /tmp/links_synthetic.csv --outdir /tmp/scaling

Writes OUTDIR/scaling.txt (every table, then a markdown block ready to paste)
and OUTDIR/scaling.png (gnuplot). Four parts:

1. All-reduce: per link, T(S, p) = 2(p-1) alpha + 2(p-1)/p * S / B, fitted by
   least squares (relative residuals) to the `allreduce` rows (p = 2).
2. Overlap: per model, the buckets DDP builds (reverse registration order,
   1 MiB first bucket, then bucket_cap_mb), each gradient ready at a point of
   backward given by the work of the layers behind it, buckets reduced one
   after another on the link; exposed = how far the last one ends after
   backward. Checked against the ddp/pytorch rows' exposed_ms and ms_per_step.
3. The measured configuration (CPU hosts, Gloo ring) extrapolated to p ranks.
4. Projection to GPUs on published interconnect figures (SCENARIOS) and
   assumed per-GPU compute times (COMPUTE); independent of the CSV.

Missing links, modes or models are skipped with a note. The synthetic CSV is
for trying the script; its numbers are not measurements and are never to be
committed as results.
"""
import argparse
import csv
import math
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

import numpy as np

MiB = 1024 * 1024

# --------------------------------------------------------------------------
# Models: parameter tensors in registration order, with the work of the layer
# each belongs to (multiply-adds per sample, forward; backward is about twice
# that for every layer, so only the proportions matter).


class Param:
    __slots__ = ("name", "numel", "work")

    def __init__(self, name, numel, work):
        self.name, self.numel, self.work = name, numel, work


def resnet_layout(depth, num_classes=1000, image=224):
    """torchvision's ResNet (v1.5: the stride on the 3x3 convolution), its
    parameters in registration order (the order of model.parameters())."""
    kind, blocks = {18: ("basic", [2, 2, 2, 2]), 34: ("basic", [3, 4, 6, 3]),
                    50: ("bottleneck", [3, 4, 6, 3]), 101: ("bottleneck", [3, 4, 23, 3])}[depth]
    ps = []

    def conv(name, cin, cout, k, hw):
        n = cin * cout * k * k
        ps.append(Param(name + ".weight", n, n * hw * hw))

    def bn(name, c, hw):
        # Elementwise, a few operations per activation: small against the
        # convolutions, and memory-bound (rough).
        for t in ("weight", "bias"):
            ps.append(Param(f"{name}.{t}", c, 2 * c * hw * hw))

    hw = image // 2
    conv("conv1", 3, 64, 7, hw)
    bn("bn1", 64, hw)
    hw //= 2  # max pool
    cin = 64
    expansion = 1 if kind == "basic" else 4
    for s, n in enumerate(blocks):
        planes = 64 << s
        for b in range(n):
            stride = 2 if (s > 0 and b == 0) else 1
            hw_in, hw_out = hw, hw // stride
            pre = f"layer{s + 1}.{b}"
            if kind == "basic":
                conv(pre + ".conv1", cin, planes, 3, hw_out)
                bn(pre + ".bn1", planes, hw_out)
                conv(pre + ".conv2", planes, planes, 3, hw_out)
                bn(pre + ".bn2", planes, hw_out)
            else:
                conv(pre + ".conv1", cin, planes, 1, hw_in)
                bn(pre + ".bn1", planes, hw_in)
                conv(pre + ".conv2", planes, planes, 3, hw_out)
                bn(pre + ".bn2", planes, hw_out)
                conv(pre + ".conv3", planes, planes * expansion, 1, hw_out)
                bn(pre + ".bn3", planes * expansion, hw_out)
            if stride != 1 or cin != planes * expansion:
                conv(pre + ".downsample.0", cin, planes * expansion, 1, hw_out)
                bn(pre + ".downsample.1", planes * expansion, hw_out)
            cin = planes * expansion
            hw = hw_out
    ps.append(Param("fc.weight", cin * num_classes, cin * num_classes))
    ps.append(Param("fc.bias", num_classes, num_classes))
    return ps


def mlp_layout(width=2048, layers=6, classes=10):
    """bench/lenet_bench.cpp's mlp100: 6 x Linear(2048, 2048) + Linear(2048, 10)."""
    ps = []
    for i in range(layers):
        ps.append(Param(f"fc{i}.weight", width * width, width * width))
        ps.append(Param(f"fc{i}.bias", width, width))
    ps.append(Param("head.weight", classes * width, classes * width))
    ps.append(Param("head.bias", classes, classes))
    return ps


MODELS = {
    "resnet18": ("ResNet-18", resnet_layout(18), 11_689_512),
    "resnet50": ("ResNet-50", resnet_layout(50), 25_557_032),
    "resnet101": ("ResNet-101", resnet_layout(101), 44_549_160),
    "mlp": ("MLP 6x2048", mlp_layout(), 25_198_602),
}
for _key, (_label, _layout, _expect) in MODELS.items():
    assert sum(p.numel for p in _layout) == _expect, (_key, sum(p.numel for p in _layout))


def model_key(name):
    """The CSV's model name -> a key of MODELS (None if unknown)."""
    n = re.sub(r"[^a-z0-9]", "", (name or "").lower())
    if n.startswith("mlp"):
        return "mlp"
    return n if n in MODELS else None


def grad_bytes(key):
    return 4 * sum(p.numel for p in MODELS[key][1])  # float32 gradients


# --------------------------------------------------------------------------
# Buckets and the overlap model


def buckets_for(key, cap_mb=25.0, first_mb=1.0):
    """DDP's buckets after the rebuild (PyTorch 1.13 and libddp alike,
    src/bucket_assignment.cpp): parameters in ready order (reverse
    registration order for a plain stack of layers), a bucket closes at the
    first parameter that brings it to its cap; the first cap is first_mb.
    Returns a list of lists of indices into the layout."""
    layout = MODELS[key][1]
    limits = [int(first_mb * MiB), int(cap_mb * MiB)]
    out, cur, size, li = [], [], 0, 0
    for i in reversed(range(len(layout))):
        cur.append(i)
        size += 4 * layout[i].numel
        if size >= limits[li]:
            out.append(cur)
            cur, size, li = [], 0, 1
    if cur:
        out.append(cur)
    return out


def ready_fractions(key, profile="flops"):
    """When each gradient is ready, as a fraction of the backward window
    (0 = the first gradient ready, 1 = the last), walking the layers in
    reverse. profile: flops (the layer's work), bytes (its parameters), uniform
    (every parameter tensor the same)."""
    layout = MODELS[key][1]
    order = list(reversed(range(len(layout))))
    w = {"flops": lambda p: p.work, "bytes": lambda p: p.numel, "uniform": lambda p: 1.0}[profile]
    cum, acc = {}, 0.0
    for i in order:
        acc += w(layout[i])
        cum[i] = acc
    first, last = cum[order[0]], cum[order[-1]]
    return {i: (cum[i] - first) / (last - first) for i in order}


def timeline(key, cap_mb, backward_ms, allreduce_ms, profile="flops", overlap=True):
    """Per bucket: (bytes, ready ms, start ms, end ms), times from the first
    gradient ready. allreduce_ms(bytes) -> ms. Buckets go one after another on
    the link (one collective at a time, in launch order). Without overlap every
    bucket is launched when backward ends."""
    layout = MODELS[key][1]
    frac = ready_fractions(key, profile)
    rows, free = [], 0.0
    for b in buckets_for(key, cap_mb):
        size = sum(4 * layout[i].numel for i in b)
        ready = backward_ms * max(frac[i] for i in b) if overlap else backward_ms
        start = max(ready, free)
        free = start + allreduce_ms(size)
        rows.append((size, ready, start, free))
    return rows


def exposed_ms(rows, backward_ms):
    return max(0.0, rows[-1][3] - backward_ms) if rows else 0.0


# --------------------------------------------------------------------------
# The CSV


def num(v):
    try:
        x = float(v)
        return x if math.isfinite(x) else None
    except (TypeError, ValueError):
        return None


def load_csv(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k in ("ms_per_step", "backward_ms", "comm_ms", "exposed_ms", "overlap_ms", "allreduce_mb",
                  "bucket_cap_mb", "chosen_bucket_cap_mb", "veth_mb_per_step", "batch"):
            r[k] = num(r.get(k))
        r["link"] = (r.get("link") or "").strip().lower()
        r["mode"] = (r.get("mode") or "").strip()
        r["impl"] = (r.get("impl") or "").strip() or "libddp"
        r["round"] = (r.get("round") or "").strip()
        r["key"] = model_key(r.get("model"))
    return rows


LINK_ORDER = ["100mbit", "1gbit", "10gbit", "none"]
LINK_RATE_BPS = {"100mbit": 100e6, "1gbit": 1e9, "10gbit": 10e9}  # tc: mbit/gbit are powers of 1000


def links_in(rows):
    seen = {r["link"] for r in rows if r["link"]}
    return [l for l in LINK_ORDER if l in seen] + sorted(seen - set(LINK_ORDER))


def per_run(rows, field, how):
    """Collapse a run's ranks (rows sharing round) with min or max, then the
    median over runs. None when no row has the field."""
    runs = {}
    for r in rows:
        if r[field] is not None:
            runs.setdefault(r["round"], []).append(r[field])
    if not runs:
        return None
    return statistics.median(how(v) for v in runs.values())


def cap_of(r):
    if r["mode"] == "ddp_auto" and r["chosen_bucket_cap_mb"]:
        return r["chosen_bucket_cap_mb"]
    if r["bucket_cap_mb"]:
        return r["bucket_cap_mb"]
    m = re.search(r"_b(\d+(?:\.\d+)?)$", r["mode"])
    return float(m.group(1)) if m else 25.0


# --------------------------------------------------------------------------
# 1. Fit


class Fit:
    """T(S, p) = 2(p-1) alpha + 2(p-1)/p * S / B, from p = 2 measurements."""

    def __init__(self, link, impl, points):
        self.link, self.impl, self.points = link, impl, points  # [(bytes, ms median, n)]
        S = np.array([p[0] for p in points], float)
        t = np.array([p[1] for p in points], float)
        # Least squares on relative residuals, so that the 0.25 MB point (the
        # latency) weighs as much as the 100 MB one (the bandwidth).
        A = np.stack([np.ones_like(S), S], axis=1) / t[:, None]
        (a, b), *_ = np.linalg.lstsq(A, np.ones_like(t), rcond=None)
        self.intercept_ms, self.ms_per_byte = float(a), float(b)
        # Standard errors from the scatter around the line (none with 2 sizes).
        self.se_intercept = self.se_slope = None
        if len(points) > 2:
            r = A @ np.array([a, b]) - 1
            cov = float(r @ r) / (len(points) - 2) * np.linalg.inv(A.T @ A)
            self.se_intercept, self.se_slope = math.sqrt(cov[0, 0]), math.sqrt(cov[1, 1])
        self.alpha_us = 1e3 * self.intercept_ms / 2  # p = 2: 2(p-1) alpha = 2 alpha
        self.B = 1e3 / self.ms_per_byte if self.ms_per_byte > 0 else float("inf")  # bytes/s
        self.resid = [(s, ms, (self.predict(s) - ms) / ms) for s, ms, _ in points]

    def predict(self, S, p=2, per_hop=True):
        """per_hop=False charges the fitted intercept once per call instead of
        per ring step (the two readings a p = 2 fit cannot tell apart)."""
        lat = 2 * (p - 1) * self.alpha_us / 1e3 if per_hop else self.intercept_ms
        return max(lat, 0.0) + 2 * (p - 1) / p * S * self.ms_per_byte

    def rate_ratio(self):
        r = LINK_RATE_BPS.get(self.link)
        return self.B * 8 / r if r else None


def fit_links(rows, unit, notes):
    fits = {}
    ar = [r for r in rows if r["mode"] == "allreduce" and r["allreduce_mb"] and r["ms_per_step"]]
    for link in links_in(rows):
        sizes = 0
        for impl in ("libddp", "pytorch"):
            sel = [r for r in ar if r["link"] == link and r["impl"] == impl]
            by_size = {}
            for r in sel:
                by_size.setdefault(r["allreduce_mb"], []).append(r)
            # Each rank times the same collective; the rank that entered last
            # sees the collective alone: min over ranks, median over rounds.
            pts = [(mb * unit, per_run(rs, "ms_per_step", min), len(rs)) for mb, rs in sorted(by_size.items())]
            if len(pts) >= 2:
                fit = Fit(link, impl, pts)
                if fit.ms_per_byte > 0:
                    fits[(link, impl)] = fit
                else:
                    notes.append(f"link {link} {impl}: the all-reduce time does not grow with size; not fitted")
            sizes = max(sizes, len(pts))
        if not fit_for(fits, link):
            notes.append(f"link {link}: all-reduce rows at {sizes} size(s), 2 or more needed: not fitted, "
                         "its ddp rows not checked")
    return fits


def fit_for(fits, link):
    return fits.get((link, "libddp")) or fits.get((link, "pytorch"))


# --------------------------------------------------------------------------
# 2. Overlap model against the measurements

DDP_MODES = ["ddp", "ddp_timeline", "ddp_auto", "ddp_b1", "ddp_b5", "ddp_b100",
             "pytorch_ddp", "pytorch_b1", "pytorch_b5", "pytorch_b100"]


class Local:
    def __init__(self, step, backward, backward_assumed):
        self.step, self.backward, self.backward_assumed = step, backward, backward_assumed


def local_baseline(rows, key, link, impl, notes):
    """Local training's step (slower rank, median over rounds) and backward
    window: the same link's rows if there are any (the link does not matter
    without communication, the day's machine speed does), else all links."""
    for imp in (impl, "libddp"):
        for same_link in (True, False):
            sel = [r for r in rows if r["mode"] == "local" and r["key"] == key and r["impl"] == imp
                   and (r["link"] == link or not same_link)]
            step = per_run(sel, "ms_per_step", max)
            if step is None:
                continue
            bwd = per_run(sel, "backward_ms", max)
            if bwd is None:
                # The usual split: backward twice forward's cost.
                return Local(step, step * 2 / 3, True)
            return Local(step, bwd, False)
    return None


class Check:
    pass


def validate(rows, fits, profile, notes):
    out = []
    for link in links_in(rows):
        fit = fit_for(fits, link)
        for key in [k for k in MODELS if any(r["key"] == k and r["link"] == link for r in rows)]:
            for mode in DDP_MODES:
                sel = [r for r in rows if r["link"] == link and r["key"] == key and r["mode"] == mode]
                if not sel:
                    continue
                if fit is None:
                    continue  # noted once for the link in main()
                impl = sel[0]["impl"]
                loc = local_baseline(rows, key, link, impl, notes)
                if loc is None:
                    notes.append(f"model {key}: no local rows; its ddp rows are not checked")
                    continue
                c = Check()
                c.link, c.key, c.mode, c.impl, c.local = link, key, mode, impl, loc
                c.cap = statistics.median(cap_of(r) for r in sel)
                c.step = per_run(sel, "ms_per_step", max)
                c.exposed = per_run(sel, "exposed_ms", min)
                c.comm = per_run(sel, "comm_ms", min)
                c.backward = per_run(sel, "backward_ms", max)
                c.veth = per_run(sel, "veth_mb_per_step", max)
                if c.veth and abs(c.veth * 1e6 / grad_bytes(key) - 1) > 0.03:
                    # With 2 ranks each end sends about the gradient's bytes (plus headers).
                    notes.append(f"model {key}: {c.veth:.1f} MB on the veth per step against {mb(grad_bytes(key)):.1f} "
                                 "MB of gradients in this layout: the benchmark's model may differ from it")
                c.rows = timeline(key, c.cap, loc.backward, lambda S: fit.predict(S), profile)
                c.p_exposed = exposed_ms(c.rows, loc.backward)
                c.p_step = loc.step + c.p_exposed
                c.p_comm = c.rows[-1][3] - c.rows[0][2]
                out.append(c)
    return out


# --------------------------------------------------------------------------
# 3 and 4. Projection

PS = [8, 64, 256]
PS_CURVE = [1, 2, 4, 8, 16, 32, 64, 128, 256]


class Scenario:
    def __init__(self, key, label, short, gpu, per_node, nvl_GBps, nvl_alpha_us, nic_Gbps, nics, eff, net_alpha_us,
                 source):
        self.key, self.label, self.short, self.gpu, self.g = key, label, short, gpu, per_node
        self.nvl = nvl_GBps * 1e9  # intra-node all-reduce bus bandwidth, bytes/s
        self.nvl_alpha = nvl_alpha_us / 1e3  # ms per ring step
        self.node_bw = nics * nic_Gbps * 1e9 / 8 * eff  # the node's achievable network bandwidth, bytes/s
        self.net_alpha = net_alpha_us / 1e3
        self.nic_Gbps, self.nics, self.eff, self.source = nic_Gbps, nics, eff, source
        self.nvl_GBps, self.nvl_alpha_us, self.net_alpha_us = nvl_GBps, nvl_alpha_us, net_alpha_us

    def allreduce_ms(self, S, p):
        """Hierarchical ring: reduce-scatter inside the node (NVLink), an
        all-reduce across the n nodes of each GPU's 1/g share (all of the
        node's NICs at once), all-gather inside the node. The three phases are
        added (NCCL pipelines them, so this is the slower reading)."""
        if p <= 1:
            return 0.0
        g = min(self.g, p)
        n = p // g
        t = 2 * (g - 1) * self.nvl_alpha + 2 * (g - 1) / g * S / self.nvl * 1e3
        if n > 1:
            t += 2 * (n - 1) * self.net_alpha + 2 * (n - 1) / n * S / self.node_bw * 1e3
        return t


# Sources: NVIDIA DGX A100 datasheet (8x A100, NVLink 3 at 600 GB/s per GPU
# both directions together, 6 NVSwitches; 8x single-port ConnectX-6 HDR
# 200 Gb/s for the compute fabric); NVIDIA DGX H100 datasheet (8x H100, NVLink
# 4 at 900 GB/s per GPU, 4 NVSwitches; 8x single-port ConnectX-7 400 Gb/s).
# The achievable NVLink bus bandwidths, the efficiencies and every latency
# are assumptions (docs/scaling.md, "Assumptions").
SCENARIOS = [
    Scenario("a100_hdr", "A100 NVLink 3 + 8x HDR IB", "A100+8xHDR", "a100", 8, 230, 2, 200, 8, 0.9, 5,
             "DGX A100 datasheet; busbw 230 GB/s assumed"),
    Scenario("h100_ndr", "H100 NVLink 4 + 8x NDR IB", "H100+8xNDR", "h100", 8, 360, 2, 400, 8, 0.9, 5,
             "DGX H100 datasheet; busbw 360 GB/s assumed"),
    Scenario("a100_eth", "A100 NVLink 3 + 1x 100GbE", "A100+1x100GbE", "a100", 8, 230, 2, 100, 1, 0.8, 15,
             "one 100 Gb/s NIC per node assumed"),
]
# A configuration like Horovod's 2018 benchmark (4 Pascal GPUs per server,
# 25 GbE, TCP), for the cross-check against its published 88 % at 128 GPUs.
HOROVOD = Scenario("p100_25gbe", "P100 PCIe + 1x 25GbE (Horovod-like)", "P100+25GbE", "p100", 4, 10, 5, 25, 1, 0.8, 30,
                   "Sergeev & Del Balso 2018 setup; PCIe busbw, efficiency, latency assumed")

# Per-GPU compute per step (forward + backward + optimizer, ms) at a fixed
# per-GPU batch: weak scaling. Assumptions, not measurements (docs/scaling.md).
A100_RN50_MS = 256 / 2600 * 1e3  # ~2,600 images/s with AMP at batch 256 (order of NVIDIA's published figures)
FLOPS_RN18_RN50 = 1.82 / 4.11  # forward GFLOPs per 224x224 image
MLP_FLOP = 6 * 25_198_602 * 1024  # 2 (multiply-add) x 3 (forward, two backward products) x params x batch
COMPUTE = {
    ("a100", "resnet50"): (A100_RN50_MS, 256, "~2,600 img/s, AMP (NVIDIA's published order)"),
    ("a100", "resnet18"): (A100_RN50_MS * FLOPS_RN18_RN50, 256, "ResNet-50's x 1.82/4.11 GFLOPs"),
    ("a100", "mlp"): (MLP_FLOP / 150e12 * 1e3, 1024, "6 N batch FLOPs at 150 TFLOP/s (half of FP16 peak)"),
    ("h100", "resnet50"): (A100_RN50_MS / 1.7, 256, "A100's / 1.7"),
    ("h100", "resnet18"): (A100_RN50_MS * FLOPS_RN18_RN50 / 1.7, 256, "A100's / 1.7"),
    ("h100", "mlp"): (MLP_FLOP / 495e12 * 1e3, 1024, "at 495 TFLOP/s (half of FP16 dense peak)"),
    ("p100", "resnet101"): (64 / 130 * 1e3, 64, "~130 img/s FP32 at batch 64 (recollection)"),
}
PROJ_MODELS = ["resnet18", "resnet50", "mlp"]
BWD_FRAC = 2 / 3  # backward window / step on a GPU: backward costs about twice forward
COMPUTE_SWEEP = [10, 25, 50, 100, 200, 400]


def project(key, sc, p, compute_ms, cap_mb=25.0, profile="flops", overlap=True):
    bwd = BWD_FRAC * compute_ms
    rows = timeline(key, cap_mb, bwd, lambda S: sc.allreduce_ms(S, p), profile, overlap)
    exp = exposed_ms(rows, bwd)
    return compute_ms + exp, exp, compute_ms / (compute_ms + exp), rows


# --------------------------------------------------------------------------
# Output helpers


def f(x, d=1):
    return "–" if x is None else f"{x:.{d}f}"


def mb(b):
    return b / 1e6


def md_table(header, rows, align=None):
    align = align or ["---"] + ["---:"] * (len(header) - 1)
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def fmt_buckets(key, cap):
    layout = MODELS[key][1]
    return " + ".join(f"{mb(sum(4 * layout[i].numel for i in b)):.1f}" for b in buckets_for(key, cap))


def measured_block(rows, fits, checks, profile, unit_name):
    """The tables that depend on the CSV."""
    if rows is None:
        return "_No measurements given (run with --csv bench/results/links.csv)._"
    parts = []
    # Fit
    t = []
    for link in links_in(rows):
        for impl in ("libddp", "pytorch"):
            fit = fits.get((link, impl))
            if not fit:
                continue
            rr = fit.rate_ratio()
            rate = LINK_RATE_BPS.get(link)
            host = fits.get(("none", impl))
            share = (host.ms_per_byte / fit.ms_per_byte) if (host and link != "none" and fit.ms_per_byte > 0) else None
            worst = max(fit.resid, key=lambda x: abs(x[2]))
            t.append([link, impl, f"{rate / 1e9:g} Gbit/s" if rate else "unshaped",
                      " ".join(f"{mb(s):g}" for s, _, _ in fit.points),
                      f(fit.alpha_us, 0) + (f" ± {1e3 * fit.se_intercept / 2:.0f}" if fit.se_intercept else ""),
                      f(fit.B * 8 / 1e9, 3) + (f" ± {100 * fit.se_slope / fit.ms_per_byte:.1f} %"
                                                if fit.se_slope and fit.ms_per_byte > 0 else ""),
                      f(fit.B / 1e9, 3), f(rr, 3) if rr else "–",
                      f"{100 * worst[2]:+.1f} % at {mb(worst[0]):g} MB", f(share, 2) if share is not None else "–"])
    if t:
        parts.append("**All-reduce fit, 2 ranks** (T = 2α + S/B; sizes in " + unit_name +
                     "; residual = (model − measured) / measured; host share = the unshaped link's "
                     "time per byte over this link's; ± one standard error)\n\n" +
                     md_table(["link", "impl", "tbf rate", "sizes MB", "α µs", "B Gbit/s", "B GB/s",
                               "B / tbf rate", "worst residual", "host share"], t,
                              ["---", "---", "---", "---", "---:", "---:", "---:", "---:", "---:", "---:"]))
    # Residuals per size
    t = []
    for (link, impl), fit in fits.items():
        t.append([f"{link} {impl}"] + [f"{mb(s):g} MB: {ms:.2f} ms ({100 * e:+.1f} %)" for s, ms, e in fit.resid])
    if t:
        parts.append("Measured all-reduce medians and residuals:\n\n" + "\n".join(
            "- " + r[0] + ": " + "; ".join(r[1:]) for r in t))
    # Models
    t = []
    for key in MODELS:
        if not any(r["key"] == key for r in rows):
            continue
        loc = local_baseline(rows, key, "", "libddp", [])
        t.append([MODELS[key][0], f"{sum(p.numel for p in MODELS[key][1]) / 1e6:.2f} M",
                  f"{mb(grad_bytes(key)):.1f}", fmt_buckets(key, 25),
                  f(loc.step if loc else None, 0),
                  (f(loc.backward, 0) + (" (assumed 2/3)" if loc.backward_assumed else "")) if loc else "–"])
    if t:
        parts.append("**Models and their buckets** (25 MiB cap, 1 MiB first bucket; local step and backward: "
                     "median over rounds of the slower rank, all links)\n\n" +
                     md_table(["model", "parameters", "gradient MB", "buckets MB, launch order",
                               "local ms/step", "backward ms"], t,
                              ["---", "---:", "---:", "---", "---:", "---:"]))
    # Validation
    t = []
    for c in checks:
        t.append([c.link, MODELS[c.key][0], c.mode, f"{c.cap:g}", f(c.step, 0), f(c.p_step, 0),
                  f(c.exposed, 0), f(c.p_exposed, 0), f(c.comm, 0), f(c.p_comm, 0),
                  f(c.backward, 0), f(c.local.backward, 0)])
    if t:
        parts.append(f"**Overlap model against the measurements** (gradients ready by the `{profile}` profile; "
                     "step: slower rank; exposed and comm: the rank that waited least; medians over rounds)\n\n" +
                     md_table(["link", "model", "mode", "cap MiB", "step ms", "model", "exposed ms", "model",
                               "comm ms", "model", "backward ms", "local's"], t,
                              ["---", "---", "---"] + ["---:"] * 9))
    # Summary of the check, per link
    t = []
    for link in links_in(rows):
        cs = [c for c in checks if c.link == link and c.step and c.exposed is not None]
        if not cs:
            continue
        ratio = [c.p_step / c.step for c in cs]
        diff = [c.p_exposed - c.exposed for c in cs]
        t.append([link, len(cs), f"{statistics.median(ratio):.3f}", f"{min(ratio):.3f} – {max(ratio):.3f}",
                  f"{statistics.median(diff):+.0f}", f"{min(diff):+.0f} – {max(diff):+.0f}"])
    if t:
        parts.append("Summary per link (model step / measured step; model exposed − measured exposed, ms):\n\n" +
                     md_table(["link", "configurations", "step ratio, median", "range", "exposed diff, median",
                               "range"], t))
    # One timeline
    pick = next((c for c in checks if c.mode == "ddp" and c.link == "1gbit" and c.key == "resnet18"),
                next((c for c in checks if c.mode == "ddp"), None))
    if pick:
        t = [[k, f"{mb(s):.1f}", f"{r:.0f}", f"{a:.0f}", f"{e:.0f}"] for k, (s, r, a, e) in enumerate(pick.rows)]
        parts.append(f"**Bucket timeline, {MODELS[pick.key][0]} on {pick.link}** (ms from the first gradient; "
                     f"backward ends at {pick.local.backward:.0f}; exposed {pick.p_exposed:.0f} ms)\n\n" +
                     md_table(["bucket", "MB", "ready", "start", "end"], t))
    # The measured configuration at p ranks
    t = []
    for link in links_in(rows):
        fit = fit_for(fits, link)
        if not fit:
            continue
        for key in MODELS:
            loc = local_baseline(rows, key, link, "libddp", [])
            if not loc:
                continue
            cells = []
            for p in PS:
                e = []
                for per_hop in (True, False):
                    r = timeline(key, 25, loc.backward, lambda S: fit.predict(S, p, per_hop), profile)
                    e.append(loc.step / (loc.step + exposed_ms(r, loc.backward)))
                cells.append(f"{e[0]:.2f} / {e[1]:.2f}")
            t.append([link, MODELS[key][0], f(loc.step, 0)] + cells)
    if t:
        parts.append("**These CPU hosts and links at p ranks** (Gloo ring, fitted α and B, the measured local "
                     "step, 25 MiB buckets; efficiency with the intercept charged per ring step / once per call)\n\n" +
                     md_table(["link", "model", "local ms/step"] + [f"p = {p}" for p in PS], t,
                              ["---", "---", "---:"] + ["---:"] * len(PS)))
    return "\n\n".join(parts)


def constants_block():
    """The projection's constants, as the code has them (docs/scaling.md gives their sources)."""
    parts = []
    t = [[s.label, s.g, f"{s.nvl_GBps:g}", f"{s.nvl_alpha_us:g}",
          f"{s.nics} x {s.nic_Gbps:g} Gb/s", f"{s.eff:g}", f"{s.node_bw / 1e9:.1f}",
          f"{s.net_alpha_us:g}", s.source] for s in SCENARIOS + [HOROVOD]]
    parts.append("**Interconnects** (busbw: all-reduce bus bandwidth inside a node; node network: NICs x rate x "
                 "efficiency, in GB/s)\n\n" +
                 md_table(["interconnect", "GPUs/node", "NVLink busbw GB/s", "α intra µs", "NICs per node",
                           "efficiency", "node network GB/s", "α network µs", "source"], t,
                          ["---", "---:", "---:", "---:", "---", "---:", "---:", "---:", "---"]))
    t = [[gpu.upper(), MODELS[k][0], b, f"{ms:.1f}", src] for (gpu, k), (ms, b, src) in COMPUTE.items()]
    parts.append("**Compute per GPU and step** (assumptions; forward + backward + optimizer, fixed per-GPU batch)\n\n" +
                 md_table(["GPU", "model", "batch/GPU", "ms/step", "basis"], t,
                          ["---", "---", "---:", "---:", "---"]))
    return "\n\n".join(parts)


def projection_block(profile):
    parts = []
    t = []
    for key in PROJ_MODELS:
        for sc in SCENARIOS:
            ms, _, _ = COMPUTE[(sc.gpu, key)]
            for p in PS:
                s1, e1, eff1, _ = project(key, sc, p, ms, profile=profile)
                s0, e0, eff0, _ = project(key, sc, p, ms, profile=profile, overlap=False)
                t.append([MODELS[key][0], sc.label, p, f"{ms:.1f}", f"{s1:.1f}", f"{e1:.2f}", f"{eff1:.3f}",
                          f"{s0:.1f}", f"{e0:.2f}", f"{eff0:.3f}"])
    parts.append("**Projection** (weak scaling: efficiency = step on 1 GPU / step on p; 25 MiB buckets; "
                 f"backward = {BWD_FRAC:.2f} of the step; gradients ready by the `{profile}` profile)\n\n" +
                 md_table(["model", "interconnect", "GPUs", "compute ms", "step ms, overlap", "exposed ms",
                           "efficiency", "step ms, no overlap", "exposed ms", "efficiency"], t,
                          ["---", "---"] + ["---:"] * 8))
    for p in (256,):
        t = []
        for key in PROJ_MODELS:
            for c in COMPUTE_SWEEP:
                cells = []
                for sc in SCENARIOS:
                    _, _, e1, _ = project(key, sc, p, c, profile=profile)
                    _, _, e0, _ = project(key, sc, p, c, profile=profile, overlap=False)
                    cells.append(f"{e1:.3f} ({e0:.3f})")
                t.append([MODELS[key][0], c] + cells)
        parts.append(f"**Efficiency at {p} GPUs against compute time per step** (with overlap; without in "
                     "brackets)\n\n" + md_table(["model", "compute ms"] + [s.label for s in SCENARIOS], t))
    sc, key = SCENARIOS[0], "resnet50"
    ms = COMPUTE[(sc.gpu, key)][0]
    _, exp, _, rows = project(key, sc, 256, ms, profile=profile)
    t = [[k, f"{mb(s):.1f}", f"{r:.2f}", f"{a:.2f}", f"{e:.2f}", f"{sc.allreduce_ms(s, 256):.2f}"]
         for k, (s, r, a, e) in enumerate(rows)]
    parts.append(f"**Bucket timeline, {MODELS[key][0]} on 256 GPUs, {sc.label}** (ms from the first gradient; "
                 f"backward ends at {BWD_FRAC * ms:.1f}; exposed {exp:.2f} ms)\n\n" +
                 md_table(["bucket", "MB", "ready", "start", "end", "all-reduce ms"], t))
    ms = COMPUTE[("p100", "resnet101")][0]
    t = []
    for p in (8, 32, 128):
        _, e1, eff1, _ = project("resnet101", HOROVOD, p, ms, cap_mb=64, profile=profile)
        _, e0, eff0, _ = project("resnet101", HOROVOD, p, ms, cap_mb=64, profile=profile, overlap=False)
        t.append([p, f"{ms:.0f}", f"{e1:.1f}", f"{eff1:.3f}", f"{e0:.1f}", f"{eff0:.3f}"])
    parts.append("**Cross-check: a Horovod-like configuration** (ResNet-101, 178 MB of gradients, 64 MiB fusion "
                 "buffers, 4 GPUs per server, one 25 GbE link per server; Horovod reports 0.88 at 128 GPUs)\n\n" +
                 md_table(["GPUs", "compute ms", "exposed ms, overlap", "efficiency", "exposed ms, no overlap",
                           "efficiency"], t))
    return "\n\n".join(parts)


def text_report(rows, fits, checks, profile, notes):
    """Everything the markdown has, plus per-link, per-model timelines."""
    out = []
    if rows is not None:
        for (link, impl), fit in fits.items():
            se = (f" (standard errors: intercept {fit.se_intercept:.3f} ms, slope {100 * fit.se_slope / fit.ms_per_byte:.1f} %)"
                  if fit.se_intercept and fit.ms_per_byte > 0 else "")
            out.append(f"fit {link} {impl}: intercept {fit.intercept_ms:.3f} ms (alpha {fit.alpha_us:.0f} us), "
                       f"B {fit.B / 1e9:.4f} GB/s = {fit.B * 8 / 1e9:.4f} Gbit/s"
                       + (f", {fit.rate_ratio():.3f} x the tbf rate" if fit.rate_ratio() else "") + se)
            for s, ms, e in fit.resid:
                out.append(f"    {mb(s):9.3f} MB  measured {ms:10.3f} ms  model {fit.predict(s):10.3f} ms  "
                           f"residual {100 * e:+6.1f} %")
            if fit.intercept_ms < 0:
                out.append("    negative intercept (a tbf burst lets small transfers through faster than the rate, "
                           "or noise): latency taken as 0 when extrapolating")
        for c in checks:
            out.append(f"\ntimeline {c.link} {c.key} {c.mode} {c.impl} cap {c.cap:g} MiB: local step {c.local.step:.1f} "
                       f"ms, backward {c.local.backward:.1f} ms"
                       + (" (assumed 2/3 of the step)" if c.local.backward_assumed else "")
                       + (f"; measured ddp backward {c.backward:.1f}" if c.backward is not None else ""))
            for k, (s, r, a, e) in enumerate(c.rows):
                out.append(f"    bucket {k}: {mb(s):8.2f} MB  ready {r:9.1f}  start {a:9.1f}  end {e:9.1f}")
            out.append(f"    exposed: measured {f(c.exposed)} model {c.p_exposed:.1f}; step: measured {f(c.step)} "
                       f"model {c.p_step:.1f}; comm: measured {f(c.comm)} model {c.p_comm:.1f}"
                       + (f"; veth {c.veth:.2f} MB/step (gradient {mb(grad_bytes(c.key)):.2f} MB)" if c.veth else ""))
    out.append("")
    out.append(constants_block())
    out.append("")
    for sc in SCENARIOS:
        for key in PROJ_MODELS:
            ms = COMPUTE[(sc.gpu, key)][0]
            for p in PS:
                _, exp, eff, rows_ = project(key, sc, p, ms, profile=profile)
                out.append(f"projection {sc.key} {key} p={p}: compute {ms:.1f} ms, exposed {exp:.2f} ms, "
                           f"efficiency {eff:.3f}; buckets (MB ready start end): " +
                           "; ".join(f"{mb(s):.1f} {r:.1f} {a:.1f} {e:.1f}" for s, r, a, e in rows_))
    if notes:
        out.append("\nnotes:")
        out += ["  - " + n for n in dict.fromkeys(notes)]
    return "\n".join(out)


# --------------------------------------------------------------------------
# Chart


def plot(path, fits, profile):
    gp = shutil.which("gnuplot")
    if not gp:
        print("gnuplot not found: no chart", file=sys.stderr)
        return
    with tempfile.TemporaryDirectory() as d:
        cmds = [f"set terminal pngcairo size 800,500 noenhanced font ',9'", f"set output '{path}'"]
        have_fit = bool(fits)
        if have_fit:
            cmds += ["set multiplot layout 1,2"]
            plots = []
            for k, ((link, impl), fit) in enumerate(sorted(fits.items(), key=lambda x: (
                    LINK_ORDER.index(x[0][0]) if x[0][0] in LINK_ORDER else 9, x[0][1]))):
                if impl != "libddp" and (link, "libddp") in fits:
                    continue
                pf = os.path.join(d, f"pts{k}.dat")
                with open(pf, "w") as fh:
                    for s, ms, _ in fit.points:
                        fh.write(f"{mb(s)} {ms}\n")
                lf = os.path.join(d, f"fit{k}.dat")
                with open(lf, "w") as fh:
                    for x in np.logspace(math.log10(0.1), math.log10(300), 60):
                        fh.write(f"{x} {max(fit.predict(x * 1e6), 1e-3)}\n")
                plots.append(f"'{pf}' using 1:2 with points pt 7 lc {k + 1} title '{link}'")
                plots.append(f"'{lf}' using 1:2 with lines lc {k + 1} notitle")
            cmds += ["set title 'All-reduce, 2 ranks: measured (points), fitted (lines)'",
                     "set logscale xy", "set xlabel 'MB'", "set ylabel 'ms'", "set key top left",
                     "set grid", "plot " + ", ".join(plots), "unset logscale", "unset title"]
        curves = []
        # ResNet-50 only: the MLP's assumed GPU step (1 ms) would squash the
        # scale; its figures are in the tables.
        series = [(SCENARIOS[0], True), (SCENARIOS[0], False), (SCENARIOS[1], True),
                  (SCENARIOS[2], True), (SCENARIOS[2], False)]
        for k, (sc, ov) in enumerate(series):
            fn = os.path.join(d, f"eff{k}.dat")
            ms = COMPUTE[(sc.gpu, "resnet50")][0]
            with open(fn, "w") as fh:
                for p in PS_CURVE:
                    fh.write(f"{p} {project('resnet50', sc, p, ms, profile=profile, overlap=ov)[2]}\n")
            colour = {"a100_hdr": 1, "h100_ndr": 2, "a100_eth": 4}[sc.key]
            curves.append(f"'{fn}' using 1:2 with linespoints dt {1 if ov else 2} lc {colour} pt 7 ps 0.6 "
                          f"title 'RN50 {sc.short}{'' if ov else ', no overlap'}'")
        fn = os.path.join(d, "hvd.dat")
        ms = COMPUTE[("p100", "resnet101")][0]
        with open(fn, "w") as fh:
            for p in [1, 4, 8, 16, 32, 64, 128]:
                fh.write(f"{p} {project('resnet101', HOROVOD, p, ms, cap_mb=64, profile=profile)[2]}\n")
        curves.append(f"'{fn}' using 1:2 with linespoints dt 3 lc rgb 'gray40' pt 6 ps 0.6 "
                      "title 'RN101 P100+25GbE (model)'")
        pf = os.path.join(d, "hvdpub.dat")
        with open(pf, "w") as fh:
            fh.write("128 0.88\n")
        curves.append(f"'{pf}' using 1:2 with points pt 9 ps 1.6 lc rgb 'black' "
                      "title 'Horovod 2018: 0.88'")
        cmds += ["set title 'Projected weak-scaling efficiency'",
                 "set logscale x 2", "set xrange [1:300]", "set yrange [0.6:1.02]", "set xlabel 'GPUs'",
                 "set ylabel 'efficiency'", "set key bottom left", "set grid", "plot " + ", ".join(curves)]
        if have_fit:
            cmds.append("unset multiplot")
        r = subprocess.run([gp], input="\n".join(cmds) + "\n", text=True, capture_output=True)
        if r.returncode != 0:
            print("gnuplot failed: " + r.stderr.strip(), file=sys.stderr)


# --------------------------------------------------------------------------
# Synthetic data, for developing and trying this script only


def make_synthetic(path, seed=1):
    """Plausible rows in the shape of bench/run_link_bench.py's CSV. The
    ground truth differs from the model on purpose (gradients ready uniformly
    over backward, a CPU slowdown while communicating, rank skew, noise), so
    that the validation has something to disagree with."""
    rnd = random.Random(seed)
    cols = ("date,link,model,batch,mode,impl,bucket_cap_mb,round,rank,ms_per_step,backward_ms,comm_ms,"
            "exposed_ms,overlap_ms,allreduce_mb,chosen_bucket_cap_mb,hidden_timeline,veth_mb_per_step").split(",")
    rate = {"100mbit": 100e6 / 8 * 0.95, "1gbit": 1e9 / 8 * 0.94, "10gbit": 10e9 / 8 * 0.6, "none": 2.2e9}
    local = {"resnet18": (300.0, 190.0, 32), "mlp100": (250.0, 160.0, 16)}
    keymap = {"resnet18": "resnet18", "mlp100": "mlp"}
    out = []

    def noise(x, s=0.03):
        return x * math.exp(rnd.gauss(0, s))

    def row(**kw):
        r = {c: "" for c in cols}
        r.update(date="synthetic", **{k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in kw.items()})
        out.append(r)

    for link in ["100mbit", "1gbit", "10gbit", "none"]:
        B = rate[link]
        ar = lambda S: 0.2 + S / B * 1e3  # noqa: E731
        for rd in range(3):
            for sz in [0.25, 1, 5, 25, 100] + [mb(grad_bytes(keymap[m])) for m in local]:
                t = noise(ar(sz * 1e6))
                for rank in (0, 1):
                    row(link=link, model="" if sz in (0.25, 1, 5, 25, 100) else "-", batch="", mode="allreduce",
                        impl="libddp", round=rd, rank=rank, ms_per_step=t + rank * abs(rnd.gauss(0, 0.2)),
                        allreduce_mb=float(sz))
            for m, (step, bwd, batch) in local.items():
                key = keymap[m]
                for rank in (0, 1):
                    row(link=link, model=m, batch=batch, mode="local", impl="libddp", round=rd, rank=rank,
                        ms_per_step=noise(step), backward_ms=noise(bwd))
                modes = [("ddp", 25), ("pytorch_ddp", 25), ("ddp_auto", 25)]
                if link != "100mbit":  # as if the slow link's sweep had been left out
                    modes += [("ddp_b1", 1), ("ddp_b5", 5), ("ddp_b100", 100), ("pytorch_b5", 5)]
                for mode, cap in modes:
                    slow = 1.05 if link != "100mbit" else 1.02  # Gloo's threads take CPU from backward
                    b = noise(bwd * slow)
                    rows = timeline(key, cap, b, lambda S: noise(ar(S)), "uniform")
                    exp = exposed_ms(rows, b)
                    st = noise(step) * slow + exp
                    skew = abs(rnd.gauss(0, 5))
                    for rank in (0, 1):
                        row(link=link, model=m, batch=batch, mode=mode,
                            impl="pytorch" if mode.startswith("pytorch") else "libddp",
                            bucket_cap_mb=float(cap), round=rd, rank=rank, ms_per_step=st + skew,
                            backward_ms=b, comm_ms=rows[-1][3] - rows[0][2] + rank * skew,
                            exposed_ms=exp + rank * skew, overlap_ms=max(0.0, b - rows[0][2]),
                            chosen_bucket_cap_mb=float(cap) if mode == "ddp_auto" else "",
                            veth_mb_per_step=mb(grad_bytes(key)) * 1.0025)
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        w.writerows(out)
    print(f"wrote {len(out)} synthetic rows to {path} (not measurements: never commit them as results)")


# --------------------------------------------------------------------------

BEGIN_M, END_M = "<!-- scaling_model: measured begin -->", "<!-- scaling_model: measured end -->"
BEGIN_P, END_P = "<!-- scaling_model: projection begin -->", "<!-- scaling_model: projection end -->"


def update_doc(path, measured, projection):
    with open(path) as fh:
        doc = fh.read()
    for b, e, body in ((BEGIN_M, END_M, measured), (BEGIN_P, END_P, projection)):
        if body is None:
            continue
        i, j = doc.find(b), doc.find(e)
        if i < 0 or j < i:
            sys.exit(f"{path}: markers {b} ... {e} not found")
        doc = doc[:i + len(b)] + "\n" + body + "\n" + doc[j:]
    with open(path, "w") as fh:
        fh.write(doc)
    print(f"updated {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--csv", help="bench/run_link_bench.py's CSV (bench/results/links.csv); "
                                  "without it, only the projection")
    ap.add_argument("--outdir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    ap.add_argument("--ready", choices=["flops", "bytes", "uniform"], default="flops",
                    help="when gradients become ready during backward (default: by the layers' work)")
    ap.add_argument("--allreduce-unit", choices=["MB", "MiB"], default="MB",
                    help="unit of the CSV's allreduce_mb column (default MB = 10^6 bytes)")
    ap.add_argument("--update-doc", metavar="MD", help="replace the generated blocks of this markdown file")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--make-synthetic", metavar="CSV", help="write a synthetic CSV for development and exit")
    a = ap.parse_args()
    if a.make_synthetic:
        make_synthetic(a.make_synthetic)
        return
    notes, rows, fits, checks = [], None, {}, []
    if a.csv:
        if not os.path.exists(a.csv):
            sys.exit(f"{a.csv}: no such file (run bench/run_link_bench.py first, or leave --csv out "
                     "for the projection alone)")
        rows = load_csv(a.csv)
        unknown = sorted({r.get("model") for r in rows if r["mode"] != "allreduce" and r["key"] is None})
        if unknown:
            notes.append(f"models not modelled, skipped: {', '.join(str(u) for u in unknown)}")
        unit = MiB if a.allreduce_unit == "MiB" else 1e6
        fits = fit_links(rows, unit, notes)
        checks = validate(rows, fits, a.ready, notes)
        if any(r.get("hidden_timeline") for r in rows):
            notes.append("hidden_timeline is not read by this model (ddp_timeline rows are checked as ddp)")
    measured = measured_block(rows, fits, checks, a.ready, a.allreduce_unit)
    projection = projection_block(a.ready)
    text = text_report(rows, fits, checks, a.ready, notes)
    block = "\n".join(["", "=" * 72, "markdown (paste into docs/scaling.md, or use --update-doc):", "=" * 72,
                       BEGIN_M, measured, END_M, "", BEGIN_P, projection, END_P])
    os.makedirs(a.outdir, exist_ok=True)
    txt = os.path.join(a.outdir, "scaling.txt")
    with open(txt, "w") as fh:
        fh.write(f"bench/scaling_model.py --csv {a.csv} --ready {a.ready} --allreduce-unit {a.allreduce_unit}\n\n")
        fh.write(text + "\n" + block + "\n")
    print(text)
    print(block)
    if not a.no_plot:
        plot(os.path.join(a.outdir, "scaling.png"), fits, a.ready)
    print(f"\nwrote {txt}" + ("" if a.no_plot else f" and {os.path.join(a.outdir, 'scaling.png')}"))
    if a.update_doc:
        update_doc(a.update_doc, measured if rows is not None else None, projection)


if __name__ == "__main__":
    main()
