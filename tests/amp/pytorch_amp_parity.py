"""PyTorch 1.13's DDP with torch.autocast (bfloat16 on CPU) and its
GradScaler, on the models, data and inf/NaN patterns of ddp_worker's
`amp_parity` scenario (amp_scenarios.cpp), case by case: change both
together. Started once per rank with torchrun's variables, under `python3 -O`
(see below); argv: <out> <cases>. Writes each case's final parameters and
float buffers as raw float32 to <out>/torch_<case>_rank<r>.bin, and with a
scaler a line per step, "<step> <scale> <growth tracker> <stepped>", to
<out>/torch_<case>_rank<r>_scales.txt.

PyTorch 1.13's GradScaler is torch.cuda.amp.GradScaler: its state machine is
Python, but two of its kernels exist for CUDA only. So that the real class
runs on CPU: (1) `-O` drops its asserts that tensors are CUDA tensors; (2) its
CUDA check is answered yes; (3) the two kernels get CPU implementations
below, written from their CUDA sources (aten/src/ATen/native/cuda/AmpKernels.cu
in 1.13): the unscale multiplies in the gradient's
arithmetic and flags any inf/NaN; the update multiplies in float64 and stores
float32, backs off on a flag, grows after growth_interval clean steps unless
that overflows."""
import math
import os
import sys

import torch
import torch.cuda.amp.grad_scaler as grad_scaler
import torch.distributed as dist
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))  # parity_common
from parity_common import finish, init, make_model, state_bytes, write_bytes

assert not __debug__ or os.environ.get("AMP_PARITY_ALLOW_ASSERTS"), "run with python3 -O (see the docstring)"

SMALL = dict(first=512, cap=1024)  # bytes: several buckets for this model

# case: (batchnorm, autocast, scaler, steps with an inf loss on the last rank,
#        steps with an inf (NaN at odd steps) in one gradient after backward)
CASES = {
    "plain": (False, False, False, set(), set()),
    "autocast": (False, True, False, set(), set()),
    "autocast_batchnorm": (True, True, False, set(), set()),
    "scaler_loss": (False, False, True, {2, 7, 8, 15, 16, 17}, set()),
    "scaler_grad": (False, True, True, set(), {4, 5, 12, 20}),
}

# PyTorch 2.3 and later have the scaler for CPU (torch.amp.GradScaler("cpu"))
# with CPU kernels of their own: the oracle is then PyTorch as it ships.
_VERSION = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
NATIVE_CPU_SCALER = _VERSION >= (2, 3)


def _unscale_cpu(grads, found_inf, inv_scale):
    for g in grads:
        if not bool(torch.isfinite(g).all()):
            found_inf.fill_(1.0)
        if float(inv_scale) != 1.0:
            g.mul_(inv_scale.reshape(()))


def _update_scale_cpu(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval):
    if float(found_inf) != 0.0:
        scale.fill_(float(scale) * backoff_factor)
        growth_tracker.fill_(0)
    else:
        successful = int(growth_tracker) + 1
        if successful == growth_interval:
            grown = torch.tensor(float(scale) * growth_factor, dtype=torch.float32)
            if math.isfinite(float(grown)):
                scale.copy_(grown)
            growth_tracker.fill_(0)
        else:
            growth_tracker.fill_(successful)
    return scale


if not NATIVE_CPU_SCALER:
    _lib = torch.library.Library("aten", "IMPL")
    _lib.impl("_amp_foreach_non_finite_check_and_unscale_", _unscale_cpu, "CPU")
    _lib.impl("_amp_update_scale_", _update_scale_cpu, "CPU")
    grad_scaler.amp_definitely_not_available = lambda: False


def make_scaler(enabled):
    if NATIVE_CPU_SCALER:
        return torch.amp.GradScaler("cpu", growth_interval=3, enabled=enabled)
    return grad_scaler.GradScaler(growth_interval=3, enabled=enabled)


class Net(nn.Module):
    def __init__(self, batchnorm):
        super().__init__()
        self.l1 = nn.Linear(6, 16)
        self.bn = nn.BatchNorm1d(16) if batchnorm else None
        self.l2 = nn.Linear(16, 16)
        self.l3 = nn.Linear(16, 3)

    def forward(self, x):
        h = self.l1(x)
        if self.bn is not None:
            h = self.bn(h)
        return self.l3(torch.tanh(self.l2(torch.tanh(h))))


def batch(step, rows):
    n = torch.arange(rows, dtype=torch.float64).unsqueeze(1)
    x = torch.sin(0.1 * (step * 1000 + n * 7 + torch.arange(6, dtype=torch.float64).unsqueeze(0) * 3)).float()
    y = torch.cos(0.05 * (step * 500 + n * 5 + torch.arange(3, dtype=torch.float64).unsqueeze(0))).float()
    return x, y


def run_case(name, rank, world):
    batchnorm, autocast, scaled, inf_loss, bad_grad = CASES[name]
    net = Net(batchnorm)
    init(net)
    model = make_model(net, SMALL)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    scaler = make_scaler(scaled)
    per_rank, lo = 16, rank * 16
    lines = []
    for step in range(30):
        opt.zero_grad()
        x, y = batch(step, per_rank * world)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = nn.functional.mse_loss(model(x[lo:lo + per_rank]), y[lo:lo + per_rank])
        if step in inf_loss and rank == world - 1:
            loss = loss * float("inf")
        scaler.scale(loss).backward()
        if step in bad_grad:
            # Every rank: what libddp's scaler makes of one rank's bad gradient.
            with torch.no_grad():
                net.l2.weight.grad[0][0] = float("nan") if step % 2 else float("inf")
        scaler.step(opt)
        if scaled:
            stepped = not sum(v.item() for v in scaler._found_inf_per_device(opt).values())
        scaler.update()
        if scaled:
            lines.append("%d %.17g %d %d\n" % (step, scaler.get_scale(), scaler._get_growth_tracker(), stepped))
    return state_bytes(net), "".join(lines)


def main():
    out, cases = sys.argv[1], sys.argv[2].split(",")
    torch.set_num_threads(1)  # as ddp_worker: the same reduction order in every kernel
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for name in cases:
        params, scales = run_case(name, rank, world)
        write_bytes(os.path.join(out, "torch_%s_rank%d.bin" % (name, rank)), params)
        if scales:
            write_bytes(os.path.join(out, "torch_%s_rank%d_scales.txt" % (name, rank)), scales.encode())
    finish()  # barrier, leave the group, exit without teardown


if __name__ == "__main__":
    main()
