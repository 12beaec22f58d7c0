"""PyTorch's own DDP on the model, data and optimizer of ddp_worker's `parity`
scenario. Started once per rank with torchrun's variables; writes the final
parameters as raw float32 to <out>/torch_rank<r>.bin."""
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main(out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
                              torch.nn.Linear(16, 3))
    with torch.no_grad():
        for layer, (name, p) in enumerate(net.named_parameters()):
            k = torch.arange(p.numel(), dtype=torch.float64)
            v = 0.3 * torch.sin(0.7 * k + layer) if "weight" in name else 0.01 * torch.cos(k + layer)
            p.copy_(v.reshape(p.shape).float())
    model = DistributedDataParallel(net, bucket_cap_mb=0.001)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    per_rank = 16
    for step in range(30):
        n = torch.arange(per_rank * world, dtype=torch.float64).unsqueeze(1)
        x = torch.sin(0.1 * (step * 1000 + n * 7 + torch.arange(6, dtype=torch.float64).unsqueeze(0) * 3)).float()
        y = torch.cos(0.05 * (step * 500 + n * 5 + torch.arange(3, dtype=torch.float64).unsqueeze(0))).float()
        opt.zero_grad()
        lo, hi = rank * per_rank, (rank + 1) * per_rank
        torch.nn.functional.mse_loss(model(x[lo:hi]), y[lo:hi]).backward()
        opt.step()
    with open(os.path.join(out_dir, f"torch_rank{rank}.bin"), "wb") as f:
        for p in net.parameters():
            f.write(p.detach().contiguous().numpy().tobytes())
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
