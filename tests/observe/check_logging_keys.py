#!/usr/bin/python3
"""Checks a DDP logging-data JSON written by libddp (the logging_data scenario
of ddp_worker: find_unused_parameters, one unused layer, 3 steps) against
the oracle PyTorch's (1.13, or 2.x in a 2.x build) for the same configuration: every key PyTorch reports is
there, with a value of the same kind (number or text).

  check_logging_keys.py ours.json
"""
import json
import os
import socket
import sys

import torch
import torch.distributed as dist


_held = []  # the holders of reserved_port(), open until the process exits


def reserved_port():
    """A port for this process's store, reserved until the process exits (as
    tests/support/reserved_port.h does): bound on every address without
    SO_REUSEADDR, so the kernel hands out a port no socket holds, then given
    SO_REUSEADDR and kept open, bound and not listening. No bind() to port 0
    and no outgoing connection of any process draws it meanwhile, and the
    store's own bind (TCPStore sets SO_REUSEADDR) succeeds."""
    holder = socket.socket()
    holder.bind(("", 0))
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    _held.append(holder)
    return holder.getsockname()[1]


def pytorch_logging_data():
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(reserved_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    net = torch.nn.ModuleDict({"l1": torch.nn.Linear(8, 32), "l2": torch.nn.Linear(32, 4),
                               "extra": torch.nn.Linear(8, 4)}).double()

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = net

        def forward(self, x):
            return self.m["l2"](torch.relu(self.m["l1"](x)))

    model = torch.nn.parallel.DistributedDataParallel(Net(), find_unused_parameters=True)
    model._set_ddp_runtime_logging_sample_rate(1)
    for _ in range(3):
        model(torch.randn(6, 8, dtype=torch.double)).sum().backward()
    # As ours, read after the third step: PyTorch records a step's figures at
    # the next forward, so run one more forward.
    model(torch.randn(6, 8, dtype=torch.double))
    data = model._get_ddp_logging_data()
    dist.destroy_process_group()
    return data


def main():
    with open(sys.argv[1]) as f:
        ours = json.load(f)
    theirs = pytorch_logging_data()
    problems = []
    for key, value in sorted(theirs.items()):
        if key not in ours:
            problems.append(f"missing: {key} (PyTorch: {value!r})")
        elif isinstance(value, int) != isinstance(ours[key], int):
            problems.append(f"{key}: PyTorch's is {type(value).__name__} {value!r}, ours {ours[key]!r}")
    extra = sorted(set(ours) - set(theirs))
    print(f"PyTorch {torch.__version__} reports {len(theirs)} keys, libddp {len(ours)}; ours only: {', '.join(extra)}")
    if problems:
        print("\n".join(problems))
        sys.exit(1)


if __name__ == "__main__":
    main()
