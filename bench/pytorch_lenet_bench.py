"""PyTorch's side of the libddp benchmark: one rank of PyTorch's own
DistributedDataParallel (or of local training, for reference) on the same
model, data shape, loss and optimizer as bench/lenet_bench.cpp. Run with the
Python that has torch (/usr/bin/python3 here) and torchrun's variables; prints
the same RESULT line as ddp_bench_lenet:

  RESULT impl=pytorch mode=ddp model=lenet rank=0 world=2 iters=200 it_s=123.4 ...

With --mode ddp the line also gives DDP's own timings of the timed steps
(medians, ms), read from model._get_ddp_logging_data() with the runtime
logging sample rate at 1: backward_ms (avg_backward_compute_time's
per-step value: backward's compute), comm_ms (backward_comm_time: first
bucket launched -> all buckets reduced) and overlap_ms
(backward_compute_comm_overlap_time: first bucket launched -> end of
backward's compute), the figures libddp's ReducerStats gives.
"""
import argparse
import os
import resource
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel


class LeNet(torch.nn.Module):
    # The seed's LeNet, as bench/lenet_bench.cpp.
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 20, 3)
        self.conv2 = torch.nn.Conv2d(20, 50, 5)
        self.fc1 = torch.nn.Linear(800, 128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x):
        x = F.avg_pool2d(F.relu(self.conv1(x)), 2)
        x = F.avg_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


class D2lLeNet(torch.nn.Module):
    # The d2l.ai LeNet with sigmoids, as bench/lenet_bench.cpp's d2l_lenet.
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 6, 5, padding=2)
        self.conv2 = torch.nn.Conv2d(6, 16, 5)
        self.fc1 = torch.nn.Linear(400, 120)
        self.fc2 = torch.nn.Linear(120, 84)
        self.fc3 = torch.nn.Linear(84, 10)

    def forward(self, x):
        x = F.avg_pool2d(torch.sigmoid(self.conv1(x)), 2)
        x = F.avg_pool2d(torch.sigmoid(self.conv2(x)), 2)
        x = torch.sigmoid(self.fc1(x.flatten(1)))
        x = torch.sigmoid(self.fc2(x))
        return self.fc3(x)


class Residual(torch.nn.Module):
    # d2l's Residual, registered in the order of bench/lenet_bench.cpp's
    # (conv1, conv2, bn1, bn2, then conv3 on a changing shape).
    def __init__(self, cin, cout, use_1x1conv, stride):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(cin, cout, 3, padding=1, stride=stride)
        self.conv2 = torch.nn.Conv2d(cout, cout, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(cout)
        self.bn2 = torch.nn.BatchNorm2d(cout)
        self.conv3 = torch.nn.Conv2d(cin, cout, 1, stride=stride) if use_1x1conv else None

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        if self.conv3 is not None:
            x = self.conv3(x)
        return F.relu(y + x)


def resnet_block(cin, cout, num_residuals, first_block):
    return torch.nn.Sequential(*[
        Residual(cin, cout, True, 2) if i == 0 and not first_block else Residual(cin if i == 0 else cout, cout, False, 1)
        for i in range(num_residuals)])


class ResNet18(torch.nn.Module):
    # d2l.ai's ResNet-18 (1 input channel, 10 classes), as bench/lenet_bench.cpp's resnet18.
    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(1, 64, 7, stride=2, padding=3), torch.nn.BatchNorm2d(64),
                                        torch.nn.ReLU(), torch.nn.MaxPool2d(3, stride=2, padding=1))
        self.resnet_block1 = resnet_block(64, 64, 2, True)
        self.resnet_block2 = resnet_block(64, 128, 2, False)
        self.resnet_block3 = resnet_block(128, 256, 2, False)
        self.resnet_block4 = resnet_block(256, 512, 2, False)
        self.fc = torch.nn.Linear(512, 10)
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)):
                    m.weight.normal_(0, 0.01)

    def forward(self, x):
        x = self.resnet_block4(self.resnet_block3(self.resnet_block2(self.resnet_block1(self.stem(x)))))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


# What LibTorch's C++ zero_grad() does: keeps zeros in 1.x, sets to None from 2.0.
SET_TO_NONE = not torch.__version__.startswith("1.")

MODELS = {"lenet": LeNet, "d2l_lenet": D2lLeNet, "resnet18": ResNet18}
WIDTH, LAYERS = 2048, 6


class MLP(torch.nn.Module):
    # About 100 MB of float parameters, as bench/lenet_bench.cpp's mlp100.
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS))
        self.head = torch.nn.Linear(WIDTH, 10)

    def forward(self, x):
        for layer in self.layers:
            x = F.relu(layer(x))
        return self.head(x)


def current_rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1048576.0


class Trainer:
    """One way of training (its own model, optimizer, DDP or not) and what its timed steps cost."""

    def __init__(self, name, mode, a):
        self.name, self.mode, self.a = name, mode, a
        torch.manual_seed(0)
        self.net = MODELS.get(a.model, MLP)().to(a.torch_device)
        self.model = self.net
        if mode == "ddp":
            ids = [a.torch_device.index] if a.torch_device.type == "cuda" else None
            self.model = DistributedDataParallel(self.net, device_ids=ids, bucket_cap_mb=a.bucket_cap_mb,
                                                 gradient_as_bucket_view=bool(a.bucket_view))
            if a.device == "cpu":  # on CUDA, sampling synchronises the step: PyTorch's default rate there
                self.model._set_ddp_runtime_logging_sample_rate(1)
        self.opt = torch.optim.SGD(self.net.parameters(), lr=a.lr)
        # --amp: PyTorch's recipe, autocast around forward and loss, a GradScaler for float16 only.
        self.amp_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(a.amp)
        self.scaler = None
        if a.amp == "fp16":
            self.scaler = (torch.amp.GradScaler(a.torch_device.type) if hasattr(torch.amp, "GradScaler")
                           else torch.cuda.amp.GradScaler())
        self.fwd, self.bwd, self.step_ms, self.chunk_it_s = [], [], [], []
        self.ddp_backward, self.ddp_comm, self.ddp_overlap = [], [], []
        self.elapsed = self.proc_cpu = self.main_cpu = 0.0
        self.minor_faults = 0
        self.timed = 0
        self.last_loss = None

    def one_step(self, x, y, record):
        t0 = time.perf_counter()
        self.opt.zero_grad(set_to_none=SET_TO_NONE)
        with torch.autocast(self.a.torch_device.type, dtype=self.amp_dtype or torch.float32,
                            enabled=self.amp_dtype is not None):
            loss = F.cross_entropy(self.model(x), y)
        t1 = time.perf_counter()
        (self.scaler.scale(loss) if self.scaler else loss).backward()
        t2 = time.perf_counter()
        if self.scaler:
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            self.opt.step()
        t3 = time.perf_counter()
        self.last_loss = loss.detach()
        if record:
            self.fwd.append((t1 - t0) * 1e3)
            self.bwd.append((t2 - t1) * 1e3)
            self.step_ms.append((t3 - t2) * 1e3)

    def record_ddp_stats(self):
        """DDP's timings of the step its last forward logged (each forward
        logs the step before it)."""
        d = self.model._get_ddp_logging_data()
        self.ddp_backward.append(d.get("backward_compute_time", float("nan")) / 1e6)
        self.ddp_comm.append(d.get("backward_comm_time", float("nan")) / 1e6)
        self.ddp_overlap.append(d.get("backward_compute_comm_overlap_time", float("nan")) / 1e6)

    def sync(self):
        if self.a.torch_device.type == "cuda":
            torch.cuda.synchronize(self.a.torch_device)

    def timed_steps(self, x, y, n):
        dist.barrier()  # every rank starts together
        self.sync()
        proc0, thread0 = time.process_time(), time.thread_time()
        faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        for i in range(n):
            self.one_step(x, y, True)
            if self.mode == "ddp" and i > 0 and self.a.device == "cpu":  # the step before this one (a few µs)
                self.record_ddp_stats()
        self.sync()  # the GPU's work of these steps is in the time
        elapsed = time.perf_counter() - start
        if self.mode == "ddp" and self.a.device == "cpu":  # the last timed step, as the next forward would
            self.model.logger.set_runtime_stats_and_log()
            self.record_ddp_stats()
        self.elapsed += elapsed
        self.proc_cpu += time.process_time() - proc0
        self.main_cpu += time.thread_time() - thread0
        self.minor_faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0
        self.timed += n
        self.chunk_it_s.append(n / elapsed)

    def buckets(self):
        if self.mode != "ddp":
            return 0, 0
        try:  # private API, but the bucket layout is useful context
            info = self.model._get_ddp_logging_data()
            sizes = str(info.get("rebuilt_bucket_sizes") or info.get("bucket_sizes", ""))
            return len([s for s in sizes.split(",") if s.strip()]), int(info.get("total_parameter_size_bytes", 0))
        except Exception:
            return -1, 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["local", "ddp", "interleaved"], default="ddp",
                    help="interleaved: local and ddp in the same processes, alternating every --chunk steps")
    ap.add_argument("--model", choices=["lenet", "d2l_lenet", "mlp100", "resnet18"], default="lenet")
    ap.add_argument("--image", type=int, default=28, help="resnet18: N x N inputs")
    ap.add_argument("--amp", choices=["none", "fp16", "bf16"], default="none",
                    help="autocast forward and loss (fp16 with a GradScaler)")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=0.2)
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0)
    ap.add_argument("--bucket-view", type=int, default=0, help="gradient_as_bucket_view (PyTorch's default: 0)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=10, help="interleaved: alternations")
    ap.add_argument("--chunk", type=int, default=10, help="interleaved: steps per mode per alternation")
    ap.add_argument("--tag", default="")
    ap.add_argument("--flush-denormal", type=int, default=1, help="as lenet_bench.cpp: fixed data is memorised, "
                    "and denormal gradients would make timings depend on training progress")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cuda: model and data on the GPU of this rank's LOCAL_RANK")
    ap.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    a = ap.parse_args()
    a.torch_device = torch.device("cpu")
    if a.device == "cuda":
        a.torch_device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(a.torch_device)

    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    torch.set_flush_denormal(bool(a.flush_denormal))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # Every mode joins the group (local only for the barriers), as the C++ side.
    dist.init_process_group(a.backend, timeout=__import__("datetime").timedelta(seconds=300))
    base_rss = current_rss_mb()

    if a.mode == "interleaved":
        trainers = [Trainer("pytorch_local", "local", a), Trainer("pytorch_ddp", "ddp", a)]
    else:
        trainers = [Trainer(a.tag or f"pytorch_{a.mode}", a.mode, a)]
    param_mb = sum(p.numel() * p.element_size() for p in trainers[0].net.parameters()) / 1048576.0
    torch.manual_seed(1234 + rank)
    if a.model == "mlp100":
        x = torch.randn(a.batch, WIDTH)
    elif a.model == "resnet18":
        x = torch.randn(a.batch, 1, a.image, a.image)
    else:
        x = torch.randn(a.batch, 1, 28, 28)
    params = sum(p.numel() for p in trainers[0].net.parameters())
    y = torch.randint(0, 10, (a.batch,))
    x, y = x.to(a.torch_device), y.to(a.torch_device)

    for t in trainers:
        for _ in range(a.warmup):
            t.one_step(x, y, False)
    if a.mode == "interleaved":
        for r in range(a.rounds):
            for k in range(len(trainers)):
                trainers[(k + r) % len(trainers)].timed_steps(x, y, a.chunk)
    else:
        trainers[0].timed_steps(x, y, a.iters)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    peak_gpu_mb = torch.cuda.max_memory_allocated(a.torch_device) / 1048576.0 if a.device == "cuda" else 0.0
    dist.barrier()

    med = statistics.median

    def med_or_nan(v):
        v = [x for x in v if x == x]
        return statistics.median(v) if v else float("nan")
    for t in trainers:
        with torch.no_grad():
            checksum = sum(p.double().sum().item() for p in t.net.parameters())
        num_buckets, bytes_reduced = t.buckets()
        n = t.timed
        fields = [
            ("impl", "pytorch"), ("mode", t.mode), ("model", a.model), ("rank", rank), ("world", world),
            ("batch", a.batch), ("iters", n), ("it_s", f"{n / t.elapsed:.4f}"),
            ("chunk_it_s", f"{med(t.chunk_it_s):.4f}"), ("ms_per_iter", f"{t.elapsed * 1e3 / n:.4f}"),
            ("cpu_ms_per_iter", f"{t.proc_cpu * 1e3 / n:.4f}"), ("main_cpu_ms_per_iter", f"{t.main_cpu * 1e3 / n:.4f}"),
            ("faults_per_iter", f"{t.minor_faults / n:.1f}"),
            ("fwd_ms", f"{med(t.fwd):.4f}"), ("bwd_ms", f"{med(t.bwd):.4f}"), ("sync_ms", "0.0000"),
            ("step_ms", f"{med(t.step_ms):.4f}"), ("exposed_comm_ms", "0.0000"),
            ("backward_ms", f"{med_or_nan(t.ddp_backward):.4f}" if t.mode == "ddp" else "0.0000"),
            ("comm_ms", f"{med_or_nan(t.ddp_comm):.4f}" if t.mode == "ddp" else "nan"),
            ("overlap_ms", f"{med_or_nan(t.ddp_overlap):.4f}" if t.mode == "ddp" else "nan"),
            ("params", params), ("image", a.image if a.model == "resnet18" else 0), ("amp", a.amp),
            ("buckets", num_buckets), ("bytes_reduced", bytes_reduced),
            ("bucket_view", a.bucket_view if t.mode == "ddp" else -1), ("bucket_cap_mb", f"{a.bucket_cap_mb:.4f}"),
            ("first_bucket_mb", "1.0000"), ("param_mb", f"{param_mb:.4f}"), ("peak_rss_mb", f"{peak_mb:.4f}"),
            ("base_rss_mb", f"{base_rss:.4f}"), ("checksum", f"{checksum:.4f}"),
            ("loss", f"{t.last_loss.item():.4f}"), ("flush_denormal", a.flush_denormal),
            ("device", str(a.torch_device)), ("peak_gpu_mb", f"{peak_gpu_mb:.4f}"), ("tag", t.name),
        ]
        print("RESULT " + " ".join(f"{k}={v}" for k, v in fields), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
