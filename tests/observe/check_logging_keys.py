#!/usr/bin/python3
"""PyTorch's DDP logging data against libddp's (the logging_data scenario of
ddp_worker: find_unused_parameters, one unused layer, 3 steps), in two steps:

  check_logging_keys.py write theirs.json   as rank 0 of a job of one
      (run_ranks, so through the oracle cache): the logging data of the
      oracle PyTorch (1.13, or 2.x in a 2.x build) for the same configuration
  check_logging_keys.py compare theirs.json ours.json   without torch:
      every key PyTorch reports is in ours, with a value of the same kind
      (number or text)
"""
import json
import os
import sys


def pytorch_logging_data():
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")  # the job's MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE
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
    return {"torch": torch.__version__, "data": data}


def compare(theirs_path, ours_path):
    with open(theirs_path) as f:
        theirs = json.load(f)
    with open(ours_path) as f:
        ours = json.load(f)
    version, theirs = theirs["torch"], theirs["data"]
    problems = []
    for key, value in sorted(theirs.items()):
        if key not in ours:
            problems.append(f"missing: {key} (PyTorch: {value!r})")
        elif isinstance(value, int) != isinstance(ours[key], int):
            problems.append(f"{key}: PyTorch's is {type(value).__name__} {value!r}, ours {ours[key]!r}")
    extra = sorted(set(ours) - set(theirs))
    print(f"PyTorch {version} reports {len(theirs)} keys, libddp {len(ours)}; ours only: {', '.join(extra)}")
    if problems:
        print("\n".join(problems))
        return 1
    return 0


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "write":
        data = pytorch_logging_data()
        with open(sys.argv[2] + ".partial", "w") as f:
            json.dump(data, f)
        os.replace(sys.argv[2] + ".partial", sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
