"""PyTorch's own DDP with its powerSGD_hook on the model, data and optimizer of
ddp_worker's `powersgd_parity` scenario, case by case. Started once per rank
with torchrun's variables; writes each case's final parameters as raw float32
to <out>/torch_<case>_rank<r>.bin and the state's iteration count and
compression statistics to <out>/torch_<case>_rank<r>.stats. The C++ side is
powersgd_scenarios.cpp: change both together.

PyTorch 1.13's powerSGD_hook deadlocks over Gloo with two or more buckets in
flight: its continuations run on Gloo's two worker threads and block there in
wait() on the next all-reduce, which needs a free worker thread. Here its
all-reduces finish before they return (WaitingDist), so every continuation
runs at once on the thread that called the hook. That changes when the
arithmetic runs, not the arithmetic: with one bucket, where the hook as
shipped does not deadlock, both give the same bits (WAITING=0 runs it as
shipped)."""
import math
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))  # parity_common
from parity_common import finish, init, make_model, state_bytes, write_bytes


class WaitingDist:
    """torch.distributed as powerSGD_hook sees it, with all_reduce finished
    before it returns."""

    def __getattr__(self, name):
        return getattr(dist, name)

    @staticmethod
    def all_reduce(tensor, group=None, async_op=False):
        work = dist.all_reduce(tensor, group=group, async_op=async_op)
        if async_op:
            work.wait()
        return work


if os.environ.get("WAITING", "1") == "1":
    powerSGD.dist = WaitingDist()

STEPS = 30
PER_RANK = 16
SMALL = dict(first=512, cap=8192)  # bytes: five buckets for this model, two [32, 32] weights in one

# case: (gradient_as_bucket_view, small buckets, PowerSGDState arguments)
CASES = {
    "rank1": (False, True, dict(matrix_approximation_rank=1, start_powerSGD_iter=2)),
    "rank1_view": (True, True, dict(matrix_approximation_rank=1, start_powerSGD_iter=2)),
    "rank2": (True, True, dict(matrix_approximation_rank=2, start_powerSGD_iter=3)),
    "rank4_qr": (False, True, dict(matrix_approximation_rank=4, start_powerSGD_iter=2, min_compression_rate=1)),
    "rank3_qr_cold": (True, True, dict(matrix_approximation_rank=3, start_powerSGD_iter=2, min_compression_rate=1,
                                       warm_start=False)),
    "rank1_cold": (False, True, dict(matrix_approximation_rank=1, start_powerSGD_iter=2, warm_start=False)),
    "rank2_no_error_feedback": (True, True, dict(matrix_approximation_rank=2, start_powerSGD_iter=2,
                                                 use_error_feedback=False)),
    "start0": (False, True, dict(matrix_approximation_rank=1, start_powerSGD_iter=0, use_error_feedback=False,
                                 warm_start=False)),
    "rate10": (True, True, dict(matrix_approximation_rank=2, start_powerSGD_iter=2, min_compression_rate=10)),
    "batched": (True, True, dict(matrix_approximation_rank=2, start_powerSGD_iter=2,
                                 batch_tensors_with_same_shape=True)),
    "batched_one_bucket": (False, False, dict(matrix_approximation_rank=1, start_powerSGD_iter=2,
                                              batch_tensors_with_same_shape=True)),
    "epsilon_seed": (True, True, dict(matrix_approximation_rank=2, start_powerSGD_iter=2,
                                      orthogonalization_epsilon=1e-8, random_seed=2024)),
    "one_bucket": (False, False, dict(matrix_approximation_rank=1, start_powerSGD_iter=2)),
}


class Net(nn.Module):
    """2-D weights large enough to compress, two of the same shape, and a
    convolution whose 4-D weight PowerSGD sees as [8, 18]."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 8, 3, padding=1)
        self.fc1 = nn.Linear(128, 64)
        self.fc2 = nn.Linear(64, 32)
        self.fc3 = nn.Linear(32, 32)
        self.fc4 = nn.Linear(32, 32)
        self.out = nn.Linear(32, 3)

    def forward(self, x):
        h = torch.tanh(self.conv(x)).flatten(1)
        h = torch.tanh(self.fc1(h))
        h = torch.tanh(self.fc2(h))
        h = torch.tanh(self.fc3(h))
        h = torch.tanh(self.fc4(h))
        return self.out(h)


def fan_in_scale(weight):
    """Weights scaled by their fan-in, so that 30 steps through five tanh
    layers neither saturate nor vanish."""
    return 0.9 / math.sqrt(weight.numel() // weight.shape[0])


def batch(step, world):
    n = torch.arange(PER_RANK * world, dtype=torch.float64).unsqueeze(1)
    x = torch.sin(0.1 * (step * 1000 + n * 7 + torch.arange(32, dtype=torch.float64).unsqueeze(0) * 3)).float()
    y = torch.cos(0.05 * (step * 500 + n * 5 + torch.arange(3, dtype=torch.float64).unsqueeze(0))).float()
    return x.reshape(-1, 2, 4, 4), y


def run_case(case, rank, world):
    as_view, small, arguments = CASES[case]
    net = Net()
    init(net, fan_in_scale)
    model = make_model(net, SMALL if small else None, gradient_as_bucket_view=as_view)
    state = powerSGD.PowerSGDState(process_group=None, **arguments)
    model.register_comm_hook(state, powerSGD.powerSGD_hook)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    lo, hi = rank * PER_RANK, (rank + 1) * PER_RANK
    for step in range(STEPS):
        opt.zero_grad()
        x, y = batch(step, world)
        nn.functional.mse_loss(model(x[lo:hi]), y[lo:hi]).backward()
        opt.step()
    params = state_bytes(net)  # the parameters: Net has no buffers
    _, before, after = state.compression_stats()
    return params, f"{state.iter} {before} {after}\n"


def main(out_dir, cases):
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for case in cases:
        params, stats = run_case(case, rank, world)
        prefix = os.path.join(out_dir, f"torch_{case}_rank{rank}")
        write_bytes(prefix + ".bin", params)
        with open(prefix + ".stats", "w") as f:
            f.write(stats)
    finish()  # barrier, leave the group, exit without teardown


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2].split(",") if len(sys.argv) > 2 else list(CASES))
