#!/usr/bin/python3
"""A model of DDP's step time at scale, fitted to the two-host link benchmark
and projected to 8, 64 and 256 GPUs (docs/scaling.md explains it).

  /usr/bin/python3 bench/scaling_model.py --csv bench/results/links.csv
  /usr/bin/python3 bench/scaling_model.py --no-plot --update-doc docs/scaling.md
  /usr/bin/python3 bench/scaling_model.py --csv bench/results/links.csv --update-doc bench/results/scaling_runs.md
  /usr/bin/python3 bench/scaling_model.py --make-synthetic /tmp/links_synthetic.csv   # for development only
  /usr/bin/python3 bench/scaling_model.py --csv /tmp/links_synthetic.csv --outdir /tmp/scaling

Writes OUTDIR/scaling.txt (the models' layouts and buckets, every table,
then a markdown block ready to paste) and OUTDIR/scaling.png (gnuplot). Pure
Python (no numpy). Four parts:

1. All-reduce: per link, T(S, p) = 2(p-1) alpha + 2(p-1)/p * S / B, fitted by
   least squares (relative residuals) to the `allreduce` rows (p = 2): the
   size series (model '-') and each model's whole gradient. Their
   allreduce_mb is MiB (--allreduce-unit, MiB by default).
2. Overlap: per model, the buckets DDP builds after its rebuild (gradients in
   ready order, 1 MiB first bucket, then bucket_cap_mb MiB), each gradient
   ready at a point of backward given by the work of the layers behind it,
   buckets reduced one after another on the link; exposed = how far the last
   one ends after backward. Checked against the ddp/pytorch rows' exposed_ms,
   comm_ms and ms_per_step. The models are the benchmark's, parameter for
   parameter: resnet18 = d2l.ai's ResNet-18 at 28x28 (bench/lenet_bench.cpp,
   11,178,378 parameters), mlp100 = 6 x Linear(2048, 2048) + Linear(2048, 10)
   (25,198,602); the CSV's params column is checked against them.
3. The measured configuration (CPU hosts, Gloo ring) extrapolated to p ranks.
4. Projection to GPUs on published interconnect figures (SCENARIOS) and
   assumed per-GPU compute times (COMPUTE), with torchvision's ResNet-18, -50
   and -101 (ImageNet, 224x224) and the MLP; independent of the CSV.

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
import textwrap
import tempfile

MiB = 1024 * 1024

# --------------------------------------------------------------------------
# Models: parameter tensors in registration order (the order of
# model.parameters()), each with the work of the layer it belongs to
# (multiply-adds per sample, forward; backward is about twice that for every
# layer, so only the proportions matter) and the layer's place in forward.


class Param:
    __slots__ = ("name", "numel", "work", "layer", "pos")

    def __init__(self, name, numel, work, layer, pos):
        # layer: the module the tensor belongs to; pos: that module's place
        # in forward (its backward runs in the reverse order).
        self.name, self.numel, self.work, self.layer, self.pos = name, numel, work, layer, pos


class Layout(list):
    """Params in registration order, plus the order their gradients become
    ready in backward (`ready`, indices into the list)."""

    def finish(self):
        # Layers in reverse forward order; inside a layer, reverse registration
        # order (bias before weight: the two come out of the same backward op).
        self.ready = sorted(range(len(self)), key=lambda i: (-self[i].pos, -i))
        return self


def conv_out(hw, k, stride, pad):
    return (hw + 2 * pad - k) // stride + 1


def bn_params(ps, name, c, hw, pos):
    # Elementwise, a few operations per activation: small against the
    # convolutions, and memory-bound (rough).
    for t in ("weight", "bias"):
        ps.append(Param(f"{name}.{t}", c, 2 * c * hw * hw, name, pos))


def resnet_layout(depth, num_classes=1000, image=224):
    """torchvision's ResNet (v1.5: the stride on the 3x3 convolution; 3 input
    channels, convolutions without bias), for the GPU projection only: the
    benchmark's ResNet-18 is d2l_resnet18_layout. Registration order is forward
    order (the downsample branch runs after bn2), so the ready order is the
    reverse registration order."""
    kind, blocks = {18: ("basic", [2, 2, 2, 2]), 34: ("basic", [3, 4, 6, 3]),
                    50: ("bottleneck", [3, 4, 6, 3]), 101: ("bottleneck", [3, 4, 23, 3])}[depth]
    ps = Layout()

    def conv(name, cin, cout, k, hw):
        n = cin * cout * k * k
        ps.append(Param(name + ".weight", n, n * hw * hw, name, len(ps)))

    def bn(name, c, hw):
        bn_params(ps, name, c, hw, len(ps))

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
    pos = len(ps)
    ps.append(Param("fc.weight", cin * num_classes, cin * num_classes, "fc", pos))
    ps.append(Param("fc.bias", num_classes, num_classes, "fc", pos))
    return ps.finish()


def d2l_resnet18_layout(image=28, num_classes=10):
    """The benchmark's ResNet-18: d2l.ai's, as bench/lenet_bench.cpp's
    `resnet18`, examples/resnet18_fmnist/main.cpp and
    bench/pytorch_lenet_bench.py's ResNet18 build it. 1 input channel, 10
    classes, N x N inputs (--image, 28 by default); every Conv2d has a bias.
    stem = Sequential(Conv2d(1, 64, 7, stride 2, pad 3), BatchNorm2d(64),
    ReLU, MaxPool2d(3, stride 2, pad 1)); resnet_block1..4 = Sequentials of
    two Residuals, 64, 128, 256, 512 channels, the first Residual of blocks
    2..4 with stride 2 and a 1x1 conv3 on the shortcut; fc = Linear(512, 10).
    At 28 x 28: stem 28 -> 14, max pool -> 7, the blocks at 7, 4, 2, 1.

    A Residual registers conv1, conv2, bn1, bn2, then conv3 (its constructor
    body), but runs conv1, bn1, conv2, bn2, then conv3 on the shortcut; so in
    backward (autograd runs the node created last first) the gradients come
    conv3, bn2, conv2, bn1, conv1: the ready order differs from the reverse
    registration order inside each Residual (bn1 and conv2 swap)."""
    ps = Layout()

    def conv(name, cin, cout, k, stride, pad, hw_in, at):
        hw = conv_out(hw_in, k, stride, pad)
        n = cin * cout * k * k
        ps.append(Param(name + ".weight", n, n * hw * hw, name, at))
        ps.append(Param(name + ".bias", cout, cout * hw * hw, name, at))
        return hw

    hw = conv("stem.0", 1, 64, 7, 2, 3, image, 0)
    bn_params(ps, "stem.1", 64, hw, 1)
    hw = conv_out(hw, 3, 2, 1)  # max pool
    at = 2
    cin = 64
    for s, cout in enumerate([64, 128, 256, 512]):
        for r in range(2):
            first = r == 0 and s > 0  # stride 2 and the 1x1 shortcut conv
            stride = 2 if first else 1
            pre = f"resnet_block{s + 1}.{r}"
            hw_in = hw
            # Registration: conv1, conv2, bn1, bn2, conv3; forward positions
            # at + 0 conv1, 1 bn1, 2 conv2, 3 bn2, 4 conv3.
            hw = conv(pre + ".conv1", cin, cout, 3, stride, 1, hw_in, at + 0)
            conv(pre + ".conv2", cout, cout, 3, 1, 1, hw, at + 2)
            bn_params(ps, pre + ".bn1", cout, hw, at + 1)
            bn_params(ps, pre + ".bn2", cout, hw, at + 3)
            if first:
                conv(pre + ".conv3", cin, cout, 1, stride, 0, hw_in, at + 4)
            at += 5
            cin = cout
    ps.append(Param("fc.weight", cin * num_classes, cin * num_classes, "fc", at))
    ps.append(Param("fc.bias", num_classes, num_classes, "fc", at))
    return ps.finish()


def mlp_layout(width=2048, layers=6, classes=10):
    """bench/lenet_bench.cpp's mlp100: fc0..fc5 = Linear(2048, 2048), head =
    Linear(2048, 10) (and bench/pytorch_lenet_bench.py's MLP, whose names are
    layers.0..5 and head: the same tensors in the same order)."""
    ps = Layout()
    for i in range(layers):
        ps.append(Param(f"fc{i}.weight", width * width, width * width, f"fc{i}", i))
        ps.append(Param(f"fc{i}.bias", width, width, f"fc{i}", i))
    ps.append(Param("head.weight", classes * width, classes * width, "head", layers))
    ps.append(Param("head.bias", classes, classes, "head", layers))
    return ps.finish()


# key -> (label, layout, parameter count the real model reports). resnet18 and
# mlp are the benchmark's (bench/lenet_bench.cpp and pytorch_lenet_bench.py
# print params=11178378 and params=25198602); the torchvision ResNets are for
# the GPU projection and the Horovod cross-check only.
MODELS = {
    "resnet18": ("ResNet-18 (d2l, 28x28)", d2l_resnet18_layout(), 11_178_378),
    "mlp": ("MLP 6x2048", mlp_layout(), 25_198_602),
    "resnet18_tv": ("ResNet-18 (torchvision)", resnet_layout(18), 11_689_512),
    "resnet50": ("ResNet-50", resnet_layout(50), 25_557_032),
    "resnet101": ("ResNet-101", resnet_layout(101), 44_549_160),
}
MEASURED_MODELS = ["resnet18", "mlp"]
for _key, (_label, _layout, _expect) in MODELS.items():
    assert sum(p.numel for p in _layout) == _expect, (_key, sum(p.numel for p in _layout))
    assert sorted(_layout.ready) == list(range(len(_layout))), _key


def model_key(name):
    """The CSV's model name -> a key of MEASURED_MODELS (None if unknown, or
    '-', the all-reduce size series)."""
    n = re.sub(r"[^a-z0-9]", "", (name or "").lower())
    if n.startswith("mlp"):
        return "mlp"
    return n if n in MEASURED_MODELS else None


def n_params(key):
    return sum(p.numel for p in MODELS[key][1])


def grad_bytes(key):
    return 4 * n_params(key)  # float32 gradients


# --------------------------------------------------------------------------
# Buckets and the overlap model


def param_order(key, order="ready"):
    """Indices into the layout in the order DDP assigns buckets: `ready`, the
    order the gradients become ready in backward (what PyTorch 1.13 and libddp
    record in the first iteration and rebuild the buckets in), or `reverse`,
    the reverse registration order (the rule of thumb)."""
    layout = MODELS[key][1]
    return list(layout.ready) if order == "ready" else list(reversed(range(len(layout))))


def buckets_for(key, cap_mb=25.0, first_mb=1.0, order="ready"):
    """DDP's buckets after the rebuild (PyTorch 1.13 and libddp alike,
    src/parallel/reducer/bucket_assignment.cpp): parameters in ready order, a bucket closes at
    the first parameter that brings it to its cap; the first cap is first_mb.
    Caps in MiB, as both libraries mean them. Returns a list of lists of
    indices into the layout, in launch order."""
    layout = MODELS[key][1]
    limits = [int(first_mb * MiB), int(cap_mb * MiB)]
    out, cur, size, li = [], [], 0, 0
    for i in param_order(key, order):
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
    backward order; a layer's gradients are ready once its whole backward is
    done. profile: flops (the layer's work), bytes (its parameters), uniform
    (every parameter tensor the same)."""
    layout = MODELS[key][1]
    order = param_order(key)
    if profile == "uniform":
        cum = {i: float(k + 1) for k, i in enumerate(order)}
    else:
        w = {"flops": lambda p: p.work, "bytes": lambda p: p.numel}[profile]
        per_layer = {}
        for p in layout:
            per_layer[p.layer] = per_layer.get(p.layer, 0.0) + w(p)
        cum, acc, prev = {}, 0.0, None
        for i in order:
            if layout[i].layer != prev:
                prev = layout[i].layer
                acc += per_layer[prev]
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
    """bench/run_link_bench.py's CSV (its CSV_COLUMNS; columns this model does
    not use are kept as text). allreduce_mb and the bucket caps are MiB,
    veth_mb_per_step 10^6 bytes; model is resnet18 or mlp100, '-' for the
    all-reduce size series; bucket_cap_mb is 'auto' for ddp_auto."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k in ("ms_per_step", "backward_ms", "comm_ms", "exposed_ms", "overlap_ms", "allreduce_mb",
                  "bucket_cap_mb", "chosen_bucket_cap_mb", "veth_mb_per_step", "batch", "params"):
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
        # Least squares on relative residuals, so that the 0.25 MiB point (the
        # latency) weighs as much as the 100 MiB one (the bandwidth): minimise
        # sum(((a + b S) / t - 1)^2), a 2 x 2 linear system (no numpy needed).
        x = [1.0 / p[1] for p in points]
        y = [p[0] / p[1] for p in points]
        sxx, sxy, syy = sum(v * v for v in x), sum(u * v for u, v in zip(x, y)), sum(v * v for v in y)
        det = sxx * syy - sxy * sxy
        a = (syy * sum(x) - sxy * sum(y)) / det
        b = (sxx * sum(y) - sxy * sum(x)) / det
        self.intercept_ms, self.ms_per_byte = a, b
        # Standard errors from the scatter around the line (none with 2 sizes).
        self.se_intercept = self.se_slope = None
        if len(points) > 2:
            s2 = sum((a * u + b * v - 1) ** 2 for u, v in zip(x, y)) / (len(points) - 2)
            self.se_intercept, self.se_slope = math.sqrt(s2 * syy / det), math.sqrt(s2 * sxx / det)
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
    for mode, imp in ((("pytorch_local", "pytorch"),) if impl == "pytorch" else ()) + (("local", "libddp"),):
        for same_link in (True, False):
            sel = [r for r in rows if r["mode"] == mode and r["key"] == key and r["impl"] == imp
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


def ddp_modes(rows):
    """The ddp and pytorch modes in the CSV, DDP_MODES' order first, then any
    other bucket sizes of the sweep (ddp_bC, pytorch_bC)."""
    seen = {r["mode"] for r in rows}
    extra = sorted((m for m in seen - set(DDP_MODES) if re.fullmatch(r"(ddp|pytorch)_b[0-9]*\.?[0-9]+", m)),
                   key=lambda m: (m.split("_")[0], float(m.split("_b")[1])))
    return [m for m in DDP_MODES if m in seen] + extra


def check_params(rows, notes):
    """The CSV's params column (what the benchmark's model reports) against
    the layouts here."""
    for key in MEASURED_MODELS:
        got = sorted({int(r["params"]) for r in rows if r["key"] == key and r["params"]})
        if got and got != [n_params(key)]:
            notes.append(f"model {key}: the benchmark reports {', '.join(map(str, got))} parameters, the layout here "
                         f"has {n_params(key)}: the bucket and timeline figures are for a different model")


class Check:
    pass


def validate(rows, fits, profile, notes):
    out = []
    for link in links_in(rows):
        fit = fit_for(fits, link)
        for key in [k for k in MEASURED_MODELS if any(r["key"] == k and r["link"] == link for r in rows)]:
            for mode in ddp_modes(rows):
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
    ("a100", "resnet18_tv"): (A100_RN50_MS * FLOPS_RN18_RN50, 256, "ResNet-50's x 1.82/4.11 GFLOPs"),
    ("a100", "mlp"): (MLP_FLOP / 150e12 * 1e3, 1024, "6 N batch FLOPs at 150 TFLOP/s (half of FP16 peak)"),
    ("h100", "resnet50"): (A100_RN50_MS / 1.7, 256, "A100's / 1.7"),
    ("h100", "resnet18_tv"): (A100_RN50_MS * FLOPS_RN18_RN50 / 1.7, 256, "A100's / 1.7"),
    ("h100", "mlp"): (MLP_FLOP / 495e12 * 1e3, 1024, "at 495 TFLOP/s (half of FP16 dense peak)"),
    ("p100", "resnet101"): (64 / 130 * 1e3, 64, "~130 img/s FP32 at batch 64 (recollection)"),
}
# The projection's ResNets are torchvision's (ImageNet, 224 x 224), whose
# published GPU throughputs the compute times come from; the MLP is the
# benchmark's.
PROJ_MODELS = ["resnet18_tv", "resnet50", "mlp"]
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


def fmt_buckets(key, cap, unit=1e6, order="ready"):
    layout = MODELS[key][1]
    return " + ".join(f"{sum(4 * layout[i].numel for i in b) / unit:.1f}" for b in buckets_for(key, cap, order=order))


def measured_block(rows, fits, checks, profile, unit, unit_name):
    """The tables that depend on the CSV; sizes in the CSV's unit (unit bytes,
    named unit_name: MiB for bench/run_link_bench.py)."""
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
                      " ".join(f"{s / unit:g}" for s, _, _ in fit.points),
                      f(fit.alpha_us, 0) + (f" ± {1e3 * fit.se_intercept / 2:.0f}" if fit.se_intercept else ""),
                      f(fit.B * 8 / 1e9, 3) + (f" ± {100 * fit.se_slope / fit.ms_per_byte:.1f} %"
                                                if fit.se_slope and fit.ms_per_byte > 0 else ""),
                      f(fit.B / 1e9, 3), f(rr, 3) if rr else "–",
                      f"{100 * worst[2]:+.1f} % at {worst[0] / unit:g} {unit_name}",
                      f(share, 2) if share is not None else "–"])
    if t:
        parts.append("**All-reduce fit, 2 ranks** (T = 2α + S/B; sizes in " + unit_name +
                     "; residual = (model − measured) / measured; host share = the unshaped link's "
                     "time per byte over this link's; ± one standard error)\n\n" +
                     md_table(["link", "impl", "tbf rate", f"sizes {unit_name}", "α µs", "B Gbit/s", "B GB/s",
                               "B / tbf rate", "worst residual", "host share"], t,
                              ["---", "---", "---", "---", "---:", "---:", "---:", "---:", "---:", "---:"]))
    # Residuals per size
    t = []
    for (link, impl), fit in fits.items():
        t.append([f"{link} {impl}"] + [f"{s / unit:g} {unit_name}: {ms:.2f} ms ({100 * e:+.1f} %)"
                                       for s, ms, e in fit.resid])
    if t:
        parts.append("Measured all-reduce medians and residuals:\n\n" + "\n".join(
            "- " + r[0] + ": " + "; ".join(r[1:]) for r in t))
    # Models
    t = []
    for key in MEASURED_MODELS:
        if not any(r["key"] == key for r in rows):
            continue
        loc = local_baseline(rows, key, "", "libddp", [])
        reported = sorted({int(r["params"]) for r in rows if r["key"] == key and r["params"]})
        batch = sorted({int(r["batch"]) for r in rows if r["key"] == key and r["batch"]})
        t.append([MODELS[key][0], f"{n_params(key):,}",
                  ", ".join(f"{n:,}" for n in reported) or "–", ", ".join(map(str, batch)) or "–",
                  f"{grad_bytes(key) / MiB:.2f}", fmt_buckets(key, 25, MiB),
                  f(loc.step if loc else None, 0),
                  (f(loc.backward, 0) + (" (assumed 2/3)" if loc.backward_assumed else "")) if loc else "–"])
    if t:
        parts.append("**Models and their buckets** (parameters: this layout's and the benchmark's `params`; "
                     "25 MiB cap, 1 MiB first bucket, gradients in ready order; local step and backward: "
                     "median over rounds of the slower rank, all links)\n\n" +
                     md_table(["model", "parameters", "benchmark's", "batch/rank", "gradient MiB",
                               "buckets MiB, launch order", "local ms/step", "backward ms"], t,
                              ["---", "---:", "---:", "---:", "---:", "---", "---:", "---:"]))
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
        t = [[k, f"{s / MiB:.2f}", f"{r:.0f}", f"{a:.0f}", f"{e:.0f}"] for k, (s, r, a, e) in enumerate(pick.rows)]
        parts.append(f"**Bucket timeline, {MODELS[pick.key][0]} on {pick.link}** (ms from the first gradient; "
                     f"backward ends at {pick.local.backward:.0f}; exposed {pick.p_exposed:.0f} ms)\n\n" +
                     md_table(["bucket", "MiB", "ready", "start", "end"], t))
    # The measured configuration at p ranks
    t = []
    for link in links_in(rows):
        fit = fit_for(fits, link)
        if not fit:
            continue
        for key in MEASURED_MODELS:
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


def layout_report():
    """The benchmark's models as laid out here: parameter counts and the
    buckets at the caps the benchmark runs, in ready order and in reverse
    registration order."""
    out = []
    for key in MEASURED_MODELS:
        label, layout, _ = MODELS[key]
        work = sum(p.work for p in layout if p.name.endswith("weight") or p.name.endswith("bias"))
        out.append(f"layout {key} ({label}): {len(layout)} tensors, {n_params(key):,} parameters, "
                   f"{grad_bytes(key) / MiB:.2f} MiB of float32 gradients, about {work / 1e6:.1f} M multiply-adds "
                   "per sample forward (parameter layers)")
        for cap in (1, 5, 25, 100):
            for order in ("ready", "reverse"):
                bs = buckets_for(key, cap, order=order)
                desc = "; ".join(f"{sum(4 * layout[i].numel for i in b) / MiB:.2f} MiB "
                                 f"{layout[b[0]].name} .. {layout[b[-1]].name}" for b in bs)
                out.append(f"    cap {cap:g} MiB, {order:7s} order: {len(bs)} buckets: {desc}")
    return "\n".join(out)


def text_report(rows, fits, checks, profile, notes, unit=MiB, unit_name="MiB"):
    """Everything the markdown has, plus the layouts and per-link, per-model
    timelines."""
    out = [layout_report(), ""]
    if rows is not None:
        for (link, impl), fit in fits.items():
            se = (f" (standard errors: intercept {fit.se_intercept:.3f} ms, slope {100 * fit.se_slope / fit.ms_per_byte:.1f} %)"
                  if fit.se_intercept and fit.ms_per_byte > 0 else "")
            out.append(f"fit {link} {impl}: intercept {fit.intercept_ms:.3f} ms (alpha {fit.alpha_us:.0f} us), "
                       f"B {fit.B / 1e9:.4f} GB/s = {fit.B * 8 / 1e9:.4f} Gbit/s"
                       + (f", {fit.rate_ratio():.3f} x the tbf rate" if fit.rate_ratio() else "") + se)
            for s, ms, e in fit.resid:
                out.append(f"    {s / unit:9.3f} {unit_name:3s}  measured {ms:10.3f} ms  model {fit.predict(s):10.3f} ms  "
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
                out.append(f"    bucket {k}: {s / MiB:8.2f} MiB  ready {r:9.1f}  start {a:9.1f}  end {e:9.1f}")
            out.append(f"    exposed: measured {f(c.exposed)} model {c.p_exposed:.1f}; step: measured {f(c.step)} "
                       f"model {c.p_step:.1f}; comm: measured {f(c.comm)} model {c.p_comm:.1f}"
                       + (f"; veth {c.veth:.2f} MB/step (gradient {mb(grad_bytes(c.key)):.2f} MB = 10^6 bytes)"
                          if c.veth else ""))
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


def plot(path, fits, profile, unit=MiB, unit_name="MiB"):
    gp = shutil.which("gnuplot")
    if not gp:
        print("gnuplot not found: no chart", file=sys.stderr)
        return
    with tempfile.TemporaryDirectory() as d:
        cmds = ["set terminal pngcairo size 800,500 noenhanced font ',9'", f"set output '{path}'"]
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
                        fh.write(f"{s / unit} {ms}\n")
                lf = os.path.join(d, f"fit{k}.dat")
                with open(lf, "w") as fh:
                    for k2 in range(60):
                        x = 0.1 * 3000 ** (k2 / 59)  # 0.1 to 300, log-spaced
                        fh.write(f"{x} {max(fit.predict(x * unit), 1e-3)}\n")
                plots.append(f"'{pf}' using 1:2 with points pt 7 lc {k + 1} title '{link}'")
                plots.append(f"'{lf}' using 1:2 with lines lc {k + 1} notitle")
            cmds += ["set title 'All-reduce, 2 ranks: measured (points), fitted (lines)'",
                     "set logscale xy", f"set xlabel '{unit_name}'", "set ylabel 'ms'", "set key top left",
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
            "exposed_ms,overlap_ms,allreduce_mb,chosen_bucket_cap_mb,hidden_timeline,veth_mb_per_step,iters,warmup,"
            "fwd_ms,bwd_call_ms,params,auto_trials,tl_backward_ms,tl_comm_ms,tl_comm_in_backward_ms,"
            "tl_first_launch_ms,tl_comm_after_backward_ms,tl_buckets").split(",")  # run_link_bench.py's CSV_COLUMNS
    rate = {"100mbit": 100e6 / 8 * 0.95, "1gbit": 1e9 / 8 * 0.94, "10gbit": 10e9 / 8 * 0.6, "none": 2.2e9}
    # model -> (local step ms, local backward ms, batch per rank: run_link_bench.py's defaults)
    local = {"resnet18": (480.0, 320.0, 192), "mlp100": (1250.0, 840.0, 48)}
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
        # The size series, once per link (round 1, model '-', sizes in MiB).
        for sz in [0.25, 1, 5, 25, 100]:
            t = noise(ar(sz * MiB))
            for rank in (0, 1):
                row(link=link, model="-", mode="allreduce", impl="libddp", round=1, rank=rank,
                    ms_per_step=t + rank * abs(rnd.gauss(0, 0.2)), allreduce_mb=float(sz), params=129068)
        for rd in range(1, 4):
            for m, (step, bwd, batch) in local.items():
                key = keymap[m]
                # Each model's whole gradient, every round (batch empty, as the benchmark writes it).
                t = noise(ar(grad_bytes(key)))
                for rank in (0, 1):
                    row(link=link, model=m, mode="allreduce", impl="libddp", round=rd, rank=rank,
                        ms_per_step=t + rank * abs(rnd.gauss(0, 0.2)), allreduce_mb=grad_bytes(key) / MiB,
                        params=n_params(key))
                for rank in (0, 1):
                    row(link=link, model=m, batch=batch, mode="local", impl="libddp", round=rd, rank=rank,
                        ms_per_step=noise(step), backward_ms=noise(bwd), params=n_params(key))
                modes = [("ddp", "25"), ("pytorch_ddp", "25"), ("ddp_timeline", "25")]
                if rd == 1:  # the sweep and auto in the first round only (--sweep-rounds 1)
                    modes += [("ddp_auto", "auto"), ("ddp_b1", "1"), ("ddp_b5", "5"), ("ddp_b100", "100"),
                              ("pytorch_b1", "1"), ("pytorch_b5", "5"), ("pytorch_b100", "100")]
                for mode, cap_s in modes:
                    cap = 5.0 if cap_s == "auto" else float(cap_s)
                    slow = 1.05 if link != "100mbit" else 1.02  # Gloo's threads take CPU from backward
                    b = noise(bwd * slow)
                    rows = timeline(key, cap, b, lambda S: noise(ar(S)), "uniform")
                    exp = exposed_ms(rows, b)
                    st = noise(step) * slow + exp
                    skew = abs(rnd.gauss(0, 5))
                    py = mode.startswith("pytorch")
                    for rank in (0, 1):
                        row(link=link, model=m, batch=batch, mode=mode, impl="pytorch" if py else "libddp",
                            bucket_cap_mb=cap_s, round=rd, rank=rank, ms_per_step=st + skew,
                            backward_ms=b, comm_ms=rows[-1][3] - rows[0][2] + rank * skew,
                            exposed_ms="" if py else exp + rank * skew, overlap_ms=max(0.0, b - rows[0][2]),
                            chosen_bucket_cap_mb="" if py else cap,
                            veth_mb_per_step=mb(grad_bytes(key)) * 1.0025, params=n_params(key))
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        w.writerows(out)
    print(f"wrote {len(out)} synthetic rows to {path} (not measurements: never commit them as results)")


# --------------------------------------------------------------------------

BEGIN_M, END_M = "<!-- scaling_model: measured begin -->", "<!-- scaling_model: measured end -->"
BEGIN_P, END_P = "<!-- scaling_model: projection begin -->", "<!-- scaling_model: projection end -->"


def wrap_prose(body, width=120, longest=160):
    """The docs keep prose lines to 160 characters: a longer line that is
    neither a table row nor indented code is wrapped (a list item's
    continuation indented under its text)."""
    out = []
    for line in body.split("\n"):
        if len(line) <= longest or line.startswith("|") or line.startswith("    "):
            out.append(line)
            continue
        indent = "  " if line.startswith("- ") else ""
        out.append(textwrap.fill(line, width, subsequent_indent=indent, break_long_words=False,
                                 break_on_hyphens=False))
    return "\n".join(out)


def update_doc(path, measured, projection):
    with open(path) as fh:
        doc = fh.read()
    for b, e, body in ((BEGIN_M, END_M, measured), (BEGIN_P, END_P, projection)):
        if body is None:
            continue
        body = wrap_prose(body)
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
    ap.add_argument("--allreduce-unit", choices=["MiB", "MB"], default="MiB",
                    help="unit of the CSV's allreduce_mb column (default MiB = 2^20 bytes, what "
                         "bench/run_link_bench.py writes; MB = 10^6 bytes)")
    ap.add_argument("--update-doc", metavar="MD", help="replace the generated blocks of this markdown file")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--make-synthetic", metavar="CSV", help="write a synthetic CSV for development and exit")
    a = ap.parse_args()
    if a.make_synthetic:
        make_synthetic(a.make_synthetic)
        return
    notes, rows, fits, checks = [], None, {}, []
    unit = MiB if a.allreduce_unit == "MiB" else 1e6
    if a.csv:
        if not os.path.exists(a.csv):
            sys.exit(f"{a.csv}: no such file (run bench/run_link_bench.py first, or leave --csv out "
                     "for the projection alone)")
        rows = load_csv(a.csv)
        unknown = sorted({r.get("model") for r in rows if r["mode"] != "allreduce" and r["key"] is None})
        if unknown:
            notes.append(f"models not modelled, skipped: {', '.join(str(u) for u in unknown)}")
        check_params(rows, notes)
        fits = fit_links(rows, unit, notes)
        checks = validate(rows, fits, a.ready, notes)
        if any(r.get("hidden_timeline") for r in rows):
            notes.append("hidden_timeline is not read by this model (ddp_timeline rows are checked as ddp)")
    measured = measured_block(rows, fits, checks, a.ready, unit, a.allreduce_unit)
    projection = projection_block(a.ready)
    text = text_report(rows, fits, checks, a.ready, notes, unit, a.allreduce_unit)
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
        plot(os.path.join(a.outdir, "scaling.png"), fits, a.ready, unit, a.allreduce_unit)
    print(f"\nwrote {txt}" + ("" if a.no_plot else f" and {os.path.join(a.outdir, 'scaling.png')}"))
    if a.update_doc:
        update_doc(a.update_doc, measured if rows is not None else None, projection)


if __name__ == "__main__":
    main()
