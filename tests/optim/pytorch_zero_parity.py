"""PyTorch 1.13's ZeroRedundancyOptimizer under DDP, on the models, data and
optimizers of ddp_worker's `zero_parity` scenario, case by case. Started once
per rank with torchrun's variables; argv: <out> <cases>. Writes each case's
final parameters as raw float32 to <out>/torch_<case>_rank<r>.bin, and the
rank owning each parameter (one float32 each) to
<out>/torch_<case>_owner_rank<r>.bin. The C++ side is zero_scenarios.cpp:
change both together."""
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))  # parity_common
from parity_common import finish, init, state_bytes, write_bytes

ROWS, IN, OUT, STEPS = 8, 10, 3, 30

# PyTorch 2.x's Adam updates its first moment with lerp_; LibTorch's C++
# Adam, which our ZeRO wraps, and 1.13's Python with mul_ and add_. With
# ZERO_ADAM_FIRST_MOMENT=mul_add the oracle's Adam takes LibTorch's
# arithmetic (lerp_ is used by nothing else here), so that ZeRO itself
# (partition, step, broadcasts) is compared bit for bit on 2.x too.
if os.environ.get("ZERO_ADAM_FIRST_MOMENT") == "mul_add":
    def _lerp_as_mul_add(self, end, weight):
        return self.mul_(1 - weight).add_(end, alpha=weight)

    torch.Tensor.lerp_ = _lerp_as_mul_add
WIDE = 11000  # l2's weight is over 1 MiB


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(IN, 24)
        self.l2 = nn.Linear(24, WIDE)
        self.l3 = nn.Linear(WIDE, 6)
        self.l4 = nn.Linear(6, OUT)

    def forward(self, x):
        return self.l4(torch.tanh(self.l3(torch.tanh(self.l2(torch.tanh(self.l1(x)))))))


def batch(step, rank):
    n = torch.arange(ROWS, dtype=torch.float64).unsqueeze(1)
    x = torch.sin(0.1 * (step * 1000 + rank * 100 + n * 7 + torch.arange(IN, dtype=torch.float64).unsqueeze(0) * 3)).float()
    y = torch.cos(0.05 * (step * 500 + rank * 50 + n * 5 + torch.arange(OUT, dtype=torch.float64).unsqueeze(0))).float()
    return x, y


def make_zero(case, net):
    if case == "adam":
        return ZeroRedundancyOptimizer(net.parameters(), optimizer_class=torch.optim.Adam, lr=1e-2, weight_decay=1e-3)
    if case == "adamw":
        return ZeroRedundancyOptimizer(net.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-2, weight_decay=1e-2)
    sgd = dict(optimizer_class=torch.optim.SGD, lr=0.05, momentum=0.9, weight_decay=1e-3)
    if case == "sgd":
        return ZeroRedundancyOptimizer(net.parameters(), **sgd)
    assert case == "sgd_groups"
    groups = [{"params": list(net.l1.parameters()) + list(net.l2.parameters())},
              # LibTorch's group options replace the defaults whole: weight_decay 0 here.
              {"params": list(net.l3.parameters()) + list(net.l4.parameters()), "lr": 0.02, "momentum": 0.5,
               "weight_decay": 0.0}]
    return ZeroRedundancyOptimizer(groups, **sgd)


def run_case(case, rank):
    net = Net()
    init(net)
    # libddp's default (PyTorch's is False): at 3 ranks the two differ in the
    # last bit, as PyTorch divides a gradient that aliases its bucket (div_)
    # but multiplies one it copies in by 1/W (mul_out).
    model = DistributedDataParallel(net, gradient_as_bucket_view=True)
    opt = make_zero(case, net)
    for step in range(STEPS):
        x, y = batch(step, rank)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    owners = torch.tensor([float(opt._param_to_rank[p]) for p in net.parameters()], dtype=torch.float32)
    return state_bytes(net), owners.numpy().tobytes()


def main(out_dir, cases):
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for case in cases:
        params, owners = run_case(case, rank)
        write_bytes(os.path.join(out_dir, f"torch_{case}_rank{rank}.bin"), params)
        write_bytes(os.path.join(out_dir, f"torch_{case}_owner_rank{rank}.bin"), owners)
    finish()  # barrier, leave the group, exit without teardown


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2].split(","))
