"""PyTorch's own DDP on the models, data and optimizer of ddp_worker's `parity`
scenario, case by case. Started once per rank with torchrun's variables;
writes each case's final parameters and float buffers as raw float32 to
<out>/torch_<case>_rank<r>.bin. The C++ side is
parity_scenario.cpp: change both together."""
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))  # parity_common
from parity_common import finish, init, make_model, state_bytes, write_bytes

STEPS = 30
PER_RANK = 16
SMALL = dict(first=512, cap=1024)  # bytes: several buckets for these models

# case: (model variant, gradient_as_bucket_view, bucket sizes or None for the defaults)
CASES = {
    "defaults": ("plain", False, None),
    "bucket_view": ("plain", True, None),
    "buckets": ("plain", False, SMALL),
    "buckets_view": ("plain", True, SMALL),
    "find_unused": ("extra", False, SMALL),
    "no_sync": ("plain", True, SMALL),
    "batchnorm": ("batchnorm", False, SMALL),
    "tied": ("tied", True, SMALL),
    "set_to_none": ("plain", True, SMALL),
    # Communication hooks; run only when named (pytorch_parity_test.cpp's kHookCases).
    "hook_allreduce": ("plain", False, SMALL),
    "hook_allreduce_view": ("plain", True, SMALL),
    "hook_fp16": ("plain", False, SMALL),
    "hook_fp16_view": ("plain", True, SMALL),
    "hook_fp16_wrapper": ("plain", True, None),
    "hook_fp16_no_sync": ("plain", True, SMALL),
    # static_graph=True; run only when named (pytorch_parity_test.cpp's kStaticCases).
    "static": ("plain", False, SMALL),
    "static_view": ("plain", True, SMALL),
    "static_rank_unused": ("extra", True, SMALL),  # extra: used by rank 0 only, every step
    "static_never_used": ("extra", False, SMALL),  # extra: never used; find_unused_parameters too
    "static_tied": ("tied", True, SMALL),
    "static_checkpoint": ("checkpoint", False, SMALL),  # l2 in two reentrant backwards
    "static_checkpoint_view": ("checkpoint", True, SMALL),
    "static_hook_allreduce": ("plain", False, SMALL),
}

HOOKS = {
    "hook_allreduce": default_hooks.allreduce_hook,
    "hook_allreduce_view": default_hooks.allreduce_hook,
    "hook_fp16": default_hooks.fp16_compress_hook,
    "hook_fp16_view": default_hooks.fp16_compress_hook,
    "hook_fp16_wrapper": default_hooks.fp16_compress_wrapper(default_hooks.allreduce_hook),
    "hook_fp16_no_sync": default_hooks.fp16_compress_hook,
    "static_hook_allreduce": default_hooks.allreduce_hook,
}


class Net(nn.Module):
    def __init__(self, variant):
        super().__init__()
        self.l1 = nn.Linear(6, 16)
        if variant == "batchnorm":
            self.bn = nn.BatchNorm1d(16)
        self.l2 = nn.Linear(16, 16)
        if variant == "tied":
            self.l2b = self.l2  # the same layer registered twice: one parameter for DDP
        self.l3 = nn.Linear(16, 3)
        if variant == "extra":
            self.extra = nn.Linear(6, 3)
        self.variant = variant

    def forward(self, x, use_extra=False):
        h = self.l1(x)
        if self.variant == "batchnorm":
            h = self.bn(h)
        if self.variant == "checkpoint":
            # The same layer in two reentrant backward passes: its gradient
            # arrives twice per backward.
            h = torch.tanh(checkpoint(self.l2, torch.tanh(h)))
            h = torch.tanh(checkpoint(self.l2, h))
        else:
            h = torch.tanh(self.l2(torch.tanh(h)))
        if self.variant == "tied":
            h = torch.tanh(self.l2b(h))
        y = self.l3(h)
        if use_extra:
            y = y + self.extra(x)
        return y


def batch(step, world):
    n = torch.arange(PER_RANK * world, dtype=torch.float64).unsqueeze(1)
    x = torch.sin(0.1 * (step * 1000 + n * 7 + torch.arange(6, dtype=torch.float64).unsqueeze(0) * 3)).float()
    y = torch.cos(0.05 * (step * 500 + n * 5 + torch.arange(3, dtype=torch.float64).unsqueeze(0))).float()
    return x, y


def run_case(case, rank, world):
    variant, as_view, sizes = CASES[case]
    net = Net(variant)
    init(net)
    model = make_model(net, sizes, gradient_as_bucket_view=as_view,
                       find_unused_parameters=case in ("find_unused", "static_never_used"),
                       static_graph=case.startswith("static"))
    if case in HOOKS:
        model.register_comm_hook(None, HOOKS[case])
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    lo, hi = rank * PER_RANK, (rank + 1) * PER_RANK
    mse = nn.functional.mse_loss
    for step in range(STEPS):
        opt.zero_grad(set_to_none=case == "set_to_none")
        if case in ("no_sync", "hook_fp16_no_sync"):
            for micro in range(3):
                x, y = batch(step * 3 + micro, world)
                if micro < 2:
                    with model.no_sync():
                        mse(model(x[lo:hi]), y[lo:hi]).backward()
                else:
                    mse(model(x[lo:hi]), y[lo:hi]).backward()
        else:
            x, y = batch(step, world)
            use_extra = case == "find_unused" and (step % 3 == 0 or (rank == 0 and step % 2 == 0))
            use_extra = use_extra or (case == "static_rank_unused" and rank == 0)
            mse(model(x[lo:hi], use_extra), y[lo:hi]).backward()
        opt.step()
    return state_bytes(net)


def main(out_dir, cases):
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for case in cases:
        write_bytes(os.path.join(out_dir, f"torch_{case}_rank{rank}.bin"), run_case(case, rank, world))
    finish()  # barrier, leave the group, exit without teardown


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2].split(",") if len(sys.argv) > 2 else [c for c in CASES if not c.startswith(("hook_", "static"))])
