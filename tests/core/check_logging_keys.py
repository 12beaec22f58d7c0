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


def pytorch_logging_data():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
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
