"""What the PyTorch-parity scripts (pytorch_ddp_parity.py, pytorch_join_parity.py,
pytorch_powersgd_parity.py) share: the deterministic parameters, DDP with
small buckets, and the bytes a case writes. The C++ side is worker_common.h's
init_parity_parameters, parity_state_bytes and write_bytes: change both
together, since the tests compare the two bitwise."""
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def init(net, weight_scale=lambda p: 0.3):
    """Parameter i of named_parameters(), element k: weights
    weight_scale(p) * sin(0.7 k + i), biases 0.01 cos(k + i), computed in
    float64 and rounded to float32 once."""
    with torch.no_grad():
        for layer, (name, p) in enumerate(net.named_parameters()):
            k = torch.arange(p.numel(), dtype=torch.float64)
            if "weight" in name:
                v = torch.sin(0.7 * k + layer) * weight_scale(p)
            else:
                v = 0.01 * torch.cos(k + layer)
            p.copy_(v.reshape(p.shape).float())


def make_model(net, sizes=None, **kwargs):
    """DistributedDataParallel(net, **kwargs); `sizes` (bytes: first, cap)
    sets the first bucket's size too, which only the module-level default
    dist._DEFAULT_FIRST_BUCKET_BYTES reaches, so it is restored after."""
    saved_first = dist._DEFAULT_FIRST_BUCKET_BYTES
    if sizes:
        dist._DEFAULT_FIRST_BUCKET_BYTES = sizes["first"]
        kwargs["bucket_cap_mb"] = sizes["cap"] / float(1 << 20)
    try:
        return DistributedDataParallel(net, **kwargs)
    finally:
        dist._DEFAULT_FIRST_BUCKET_BYTES = saved_first


def state_bytes(net):
    """The parameters, then the floating-point buffers, as raw float32."""
    tensors = [p for p in net.parameters()] + [b for b in net.buffers() if b.is_floating_point()]
    return b"".join(t.detach().float().contiguous().numpy().tobytes() for t in tensors)


def write_bytes(path, data):
    with open(path, "wb") as f:
        f.write(data)


def finish():
    """Ends an oracle rank once its results are written. Every rank waits for
    the others, leaves the group, and exits without the interpreter's
    teardown: a PyTorch 2.11 rank aborted there now and then, after its work
    was done and its group destroyed ("terminate called without an active
    exception", exit 134, no Python frame), which failed a parity test that
    had nothing wrong with it."""
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
