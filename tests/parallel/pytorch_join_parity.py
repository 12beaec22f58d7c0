"""PyTorch 1.13's DDP under Join on uneven inputs, on the models, data and
optimizer of ddp_worker's `join_parity` scenario, case by case. Started once
per rank with torchrun's variables; argv: <out> <cases> <batches per rank,
comma-separated>. Writes each case's final parameters and float buffers as raw
float32 to <out>/torch_<case>_rank<r>.bin. The C++ side is
join_scenarios.cpp: change both together."""
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))  # parity_common
from parity_common import finish, init, make_model, state_bytes, write_bytes

ROWS = 8
SMALL = dict(first=512, cap=1024)  # bytes: several buckets for these models

# case: (model variant, gradient_as_bucket_view, bucket sizes or None, hook or None)
CASES = {
    "default": ("plain", False, None, None),
    "buckets": ("reversed", True, SMALL, None),
    "no_divide": ("plain", False, SMALL, None),
    "find_unused": ("extra", False, SMALL, None),
    "no_sync": ("plain", True, SMALL, None),
    "batchnorm": ("batchnorm", False, SMALL, None),
    "hook_allreduce": ("plain", False, SMALL, default_hooks.allreduce_hook),
    "hook_fp16": ("plain", True, SMALL, default_hooks.fp16_compress_hook),
    "early_join": ("reversed", False, SMALL, None),
    "disabled": ("plain", False, SMALL, None),
    # static_graph=True. Not with find_unused_parameters: PyTorch 1.13's joined
    # rank then all-reduces a used map the others no longer send, and Gloo aborts.
    "static": ("reversed", True, SMALL, None),
}


class Net(nn.Module):
    def __init__(self, variant):
        super().__init__()
        if variant == "reversed":
            self.l3 = nn.Linear(16, 3)
            self.l2 = nn.Linear(16, 16)
            self.l1 = nn.Linear(6, 16)
        else:
            self.l1 = nn.Linear(6, 16)
            if variant == "batchnorm":
                self.bn = nn.BatchNorm1d(16)
            self.l2 = nn.Linear(16, 16)
            self.l3 = nn.Linear(16, 3)
            if variant == "extra":
                self.extra = nn.Linear(6, 3)
        self.variant = variant

    def forward(self, x, use_extra=False):
        h = self.l1(x)
        if self.variant == "batchnorm":
            h = self.bn(h)
        h = torch.tanh(self.l2(torch.tanh(h)))
        y = self.l3(h)
        if use_extra:
            y = y + self.extra(x)
        return y


def batch(step, rank):
    n = torch.arange(ROWS, dtype=torch.float64).unsqueeze(1)
    x = torch.sin(0.1 * (step * 1000 + rank * 100 + n * 7 + torch.arange(6, dtype=torch.float64).unsqueeze(0) * 3)).float()
    y = torch.cos(0.05 * (step * 500 + rank * 50 + n * 5 + torch.arange(3, dtype=torch.float64).unsqueeze(0))).float()
    return x, y


def num_batches(case, batches, rank):
    if case == "disabled":
        return batches[0]  # even inputs: Join is off
    if case == "early_join":
        return 1 if rank == 0 else 3 if rank == 1 else 0
    return batches[rank]


def run_case(case, rank, batches):
    variant, as_view, sizes, hook = CASES[case]
    net = Net(variant)
    init(net)
    model = make_model(net, sizes, gradient_as_bucket_view=as_view, find_unused_parameters=case == "find_unused",
                       static_graph=case == "static")
    if hook:
        model.register_comm_hook(None, hook)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    mse = nn.functional.mse_loss
    with model.join(divide_by_initial_world_size=case != "no_divide", enable=case != "disabled"):
        for step in range(num_batches(case, batches, rank)):
            x, y = batch(step, rank)
            use_extra = case == "find_unused" and (step % 3 == 0 or (rank == 0 and step % 2 == 0))
            if case == "no_sync" and step % 2 == 0:
                with model.no_sync():
                    mse(model(x, use_extra), y).backward()
                continue
            mse(model(x, use_extra), y).backward()
            opt.step()
            opt.zero_grad()
    if case == "no_divide":
        # Even steps after the Join divide by the world size again.
        for step in range(100, 102):
            x, y = batch(step, rank)
            mse(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    return state_bytes(net)


def run_sampler_case(rank, world):
    """33 samples, batches of 4, the unpadded split (ddp::DistributedSampler's
    pad(false)): a seeded permutation, rank r takes positions r, r + W, ..."""
    samples, batch_size = 33, 4
    n = torch.arange(samples, dtype=torch.float64).unsqueeze(1)
    xs = torch.sin(0.3 * n + 0.2 * torch.arange(6, dtype=torch.float64).unsqueeze(0)).float()
    ys = torch.cos(0.2 * n + 0.5 * torch.arange(3, dtype=torch.float64).unsqueeze(0)).float()
    net = Net("plain")
    init(net)
    model = DistributedDataParallel(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    with Join([model]):
        for epoch in range(2):
            g = torch.Generator()
            g.manual_seed(7 + epoch)
            indices = torch.randperm(samples, generator=g).tolist()[rank::world]
            for lo in range(0, len(indices), batch_size):
                idx = torch.tensor(indices[lo:lo + batch_size])
                opt.zero_grad()
                nn.functional.mse_loss(model(xs[idx]), ys[idx]).backward()
                opt.step()
    return state_bytes(net)


def main(out_dir, cases, batches):
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for case in cases:
        data = run_sampler_case(rank, world) if case == "sampler" else run_case(case, rank, batches)
        write_bytes(os.path.join(out_dir, f"torch_{case}_rank{rank}.bin"), data)
    finish()  # barrier, leave the group, exit without teardown


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2].split(","), [int(b) for b in sys.argv[3].split(",")])
