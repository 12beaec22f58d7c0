"""PyTorch's own DDP, SyncBatchNorm, autocast and GradScaler on CUDA, on the
models and data of ddp_gpu_worker's parity scenarios (gpu_worker.cpp):
change both together. Started once per rank with torchrun's variables;
argv: <scenario: syncbn_parity | amp_parity> <backend: gloo | nccl> <out dir>.
Writes what the C++ scenario writes, with torch_ in place of cpp_: the
parameters, floating-point buffers (and for syncbn the last output) as raw
float32, and for amp a line per step, "<step> <scale> <stepped>"."""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def wave(shape, step, phase, amplitude=1.0):
    """gpu_worker.cpp's wave(): sin of an arithmetic sequence in float64, rounded once."""
    n = 1
    for d in shape:
        n *= d
    k = torch.arange(n, dtype=torch.float64)
    return (torch.sin(k * step + phase) * amplitude).to(torch.float32).reshape(shape)


def init_parameters(model, device):
    with torch.no_grad():
        for i, (_, p) in enumerate(model.named_parameters()):
            p.copy_(wave(list(p.shape), 0.7, i, 0.1).to(device))


def write_state(model, path, extra=()):
    tensors = list(model.parameters()) + [b for b in model.buffers() if b.is_floating_point()] + list(extra)
    with open(path, "wb") as f:
        for t in tensors:
            f.write(t.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())


def syncbn_parity(rank, world, device, out):
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    net = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.SyncBatchNorm(6), nn.ReLU(), nn.Flatten(),
                        nn.Linear(6 * 8 * 8, 4)).to(device)
    init_parameters(net, device)
    model = DDP(net, device_ids=[device.index])
    opt = torch.optim.SGD(net.parameters(), lr=0.1, foreach=False)
    per_rank = 4
    for step in range(3):
        x = wave([per_rank * world, 3, 8, 8], 0.37, 1.3 * step, 2.0)[rank * per_rank:(rank + 1) * per_rank].to(device)
        y = wave([per_rank * world, 4], 0.11, step)[rank * per_rank:(rank + 1) * per_rank].to(device)
        opt.zero_grad(set_to_none=False)
        output = model(x)
        F.mse_loss(output, y).backward()
        opt.step()
    write_state(net, os.path.join(out, f"torch_syncbn_rank{rank}.bin"), [output])


def amp_parity(rank, world, device, out):
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).to(device)
    init_parameters(net, device)
    model = DDP(net, device_ids=[device.index])
    opt = torch.optim.SGD(net.parameters(), lr=0.05, foreach=False)
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        scaler = torch.amp.GradScaler("cuda", init_scale=65536.0, growth_interval=3)
    else:
        scaler = torch.cuda.amp.GradScaler(init_scale=65536.0, growth_interval=3)
    per_rank = 8
    with open(os.path.join(out, f"torch_amp_rank{rank}_scales.txt"), "w") as scales:
        for step in range(10):
            amplitude = 1e5 if step in (3, 4) else 2.0
            x = wave([per_rank * world, 16], 0.37, 1.3 * step, amplitude)[rank * per_rank:(rank + 1) * per_rank].to(device)
            y = wave([per_rank * world, 8], 0.11, step)[rank * per_rank:(rank + 1) * per_rank].to(device)
            opt.zero_grad(set_to_none=False)
            with torch.autocast("cuda", dtype=torch.float16):
                loss = F.mse_loss(model(x), y)
            scaler.scale(loss).backward()
            before = scaler.get_scale()
            scaler.step(opt)
            scaler.update()
            after = scaler.get_scale()
            scales.write(f"{step} {after} {0 if after < before else 1}\n")
    write_state(net, os.path.join(out, f"torch_amp_rank{rank}.bin"))


def main():
    scenario, backend, out = sys.argv[1:4]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group(backend)
    try:
        {"syncbn_parity": syncbn_parity, "amp_parity": amp_parity}[scenario](rank, world, device, out)
        torch.cuda.synchronize()
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
