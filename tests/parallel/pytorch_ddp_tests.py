"""PyTorch's own DDP tests (torch/testing/_internal/distributed/distributed_test.py),
run on CPU over Gloo: the oracle of ported/ (ported/cases.cpp), which ports
each case line by line to libddp. Each case is named after the test it ports
and writes what the test looks at (parameters, gradients, outputs, buffers,
whether an error came) as lines of <dir>/torch_r<rank>.txt; the C++ side writes
the same lines, and pytorch_parity_test.cpp compares them. Tensors are
written bit for bit (float64 bits of each value). Where the original runs on
CUDA devices, the port runs the same module on CPU; inputs and parameters are
made by formulas, not by a random generator, so both sides start equal.
Usage: pytorch_ddp_tests.py DIR [CASE,CASE...] (rank and world from torchrun's variables)."""
import contextlib
import copy
import functools
import itertools
import math
import os
import sys
import warnings
from unittest import mock

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))  # parity_common
import parity_common

NAMES = {torch.float32: "f32", torch.float64: "f64", torch.int64: "i64", torch.int32: "i32"}


class Out:
    def __init__(self, path):
        self.path = path
        self.lines = []
        self.case = ""

    def tensor(self, label, t):
        t = t.detach().contiguous()
        vals = t.double().reshape(-1).view(torch.int64).tolist() if t.is_floating_point() else t.long().reshape(-1).tolist()
        shape = "x".join(str(s) for s in t.shape) or "scalar"
        self.lines.append("%s %s %s %s : %s" % (self.case, label, NAMES[t.dtype], shape, " ".join(map(str, vals))))

    def text(self, label, s):
        self.lines.append("%s %s %s" % (self.case, label, s))

    def grads(self, label, module):
        for name, p in module.named_parameters():
            if p.grad is None:
                self.text(label + " " + name + ".grad", "none")
            else:
                self.tensor(label + " " + name + ".grad", p.grad)

    def params(self, label, module):
        for name, p in module.named_parameters():
            self.tensor(label + " " + name, p)

    def write(self):
        with open(self.path, "w") as f:
            f.write("\n".join(self.lines) + "\n")


def init(module, shift=0.0):
    """Every floating-point parameter i of named_parameters(), element k:
    0.3 sin(0.7 k + i + shift), computed in float64, rounded once."""
    with torch.no_grad():
        for i, (_, p) in enumerate(module.named_parameters()):
            if p.is_floating_point():
                k = torch.arange(p.numel(), dtype=torch.float64)
                p.copy_((torch.sin(0.7 * k + i + shift) * 0.3).reshape(p.shape))
    return module


def data(shape, seed):
    """cos(0.37 k + seed), float64 rounded to float32 once."""
    n = math.prod(shape)
    k = torch.arange(n, dtype=torch.float64)
    return torch.cos(0.37 * k + seed).reshape(shape).float()


def raised(out, label, fn):
    """Runs fn; writes whether it raised (PyTorch raises RuntimeError or ValueError)."""
    try:
        fn()
    except (RuntimeError, ValueError) as e:
        out.text(label, "raised")
        return str(e)
    out.text(label, "returned")
    return None


# ---- the cases, in distributed_test.py's order ------------------------------

class _FC2(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(10, 50, bias=True)
        self.fc.bias.requires_grad = False

    def forward(self, x):
        return self.fc(x)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(2, 10, bias=False)
        self.fc2 = _FC2()
        self.fc3 = nn.Linear(50, 4, bias=False)
        self.relu = nn.ReLU()
        self.no_grad_param = nn.Parameter(torch.tensor([2, 2]).long(), requires_grad=False)

    def forward(self, x):
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        x = self.fc3(x)
        return F.softmax(x, dim=1)


def step_with_zero_grad(model):
    for param in model.parameters():
        if param.grad is not None:
            with torch.no_grad():
                param += param.grad
            param.grad.requires_grad_(False)
            param.grad.zero_()


def step(model):
    for param in model.parameters():
        if param.grad is not None:
            with torch.no_grad():
                param += param.grad
            param.grad = None


def distributed_data_parallel_cpu(out, rank, world, gradient_as_bucket_view):
    """_test_DistributedDataParallelCPU: Net, 5 iterations of _test_DDP_niter."""
    model = DDP(init(Net()), gradient_as_bucket_view=gradient_as_bucket_view)
    local_bs = 2
    global_bs = world * local_bs
    inp, target = data([global_bs, 2], 1), data([global_bs, 4], 2)
    torch.manual_seed(5)
    for it in range(5):
        off = rank * local_bs
        output = model(inp[off:off + local_bs])
        nn.MSELoss()(output, target[off:off + local_bs]).backward()
        step_with_zero_grad(model.module)
        out.params("iteration %d" % it, model.module)
        inp = inp[torch.randperm(global_bs)]


def test_DistributedDataParallelCPU(out, rank, world):
    distributed_data_parallel_cpu(out, rank, world, False)


def test_DistributedDataParallelCPU_grad_is_view(out, rank, world):
    distributed_data_parallel_cpu(out, rank, world, True)


def test_DistributedDataParallel_requires_grad(out, rank, world):
    raised(out, "DDP(nn.Module())", lambda: DDP(nn.Module()))
    dist.barrier()


def test_ddp_create_graph(out, rank, world):
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = nn.Parameter(torch.tensor(1.0 + rank))

        def forward(self):
            return self.p.pow(2)

    ddp_model = DDP(Model())
    for it in range(6):
        ddp_model().backward(create_graph=True)
        out.tensor("iteration %d p.grad" % it, ddp_model.module.p.grad)
        out.text("iteration %d requires_grad" % it, int(all(p.requires_grad for p in ddp_model.parameters())))


def ddp_ignore_params_arg(out, rank, world, static_graph):
    class TestModel(nn.Module):
        def __init__(self, rank):
            super().__init__()
            self.fc1 = nn.Linear(1, 1, bias=False)
            self.fc2 = nn.Linear(1, 10, bias=False) if rank == 0 else nn.Linear(10, 10, bias=False)

        def forward(self, x):
            return self.fc2(self.fc1(x))

    for find_unused, broadcast_buffers in itertools.product([False, True], [False, True]):
        label = "static_graph=%d find_unused=%d broadcast_buffers=%d" % (static_graph, find_unused, broadcast_buffers)
        model = init(TestModel(rank), shift=rank)
        model.fc2.register_buffer("ignore_buffer", torch.zeros(5 + rank))
        proxy_params = list(model.fc2.parameters())
        names = ["fc2.weight", "fc2.ignore_buffer"]
        DDP._set_params_and_buffers_to_ignore_for_model(model, names)
        ddp = DDP(model, find_unused_parameters=find_unused, broadcast_buffers=broadcast_buffers,
                  static_graph=static_graph)
        ddp.module.fc2 = init(nn.Linear(1, 1, bias=False), shift=3 + rank)
        if hasattr(ddp, "_build_replicated_tensor_module"):
            ddp._build_replicated_tensor_module()
        inp = torch.ones(1) * (rank + 1)
        for it in range(6):
            ddp(inp).sum().backward()
            out.grads("%s iteration %d" % (label, it), ddp.module)
            out.text("%s iteration %d proxy grad" % (label, it), "none" if proxy_params[0].grad is None else "set")


def test_ddp_ignore_params_arg(out, rank, world):
    ddp_ignore_params_arg(out, rank, world, static_graph=False)
    ddp_ignore_params_arg(out, rank, world, static_graph=True)


def test_ddp_unused_params_rebuild_buckets_exception(out, rank, world):
    class ToyModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.net1 = nn.Linear(10, 10, bias=False)
            self.net2 = nn.Linear(10, 10, bias=False)

        def forward(self, x):
            return self.net1(x)

    ddp = DDP(init(ToyModel()))
    for i in range(2):
        inp = data([1, 10], i)
        if i > 0:
            raised(out, "iteration %d" % i, lambda: ddp(inp).sum().backward())
        else:
            ddp(inp).sum().backward()
            out.text("iteration 0", "returned")


def test_ddp_shared_grad_acc_unused_params(out, rank, world):
    class ToyModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.net1 = nn.Linear(10, 5, bias=False)
            self.bias = nn.Parameter(torch.zeros(5))
            self.net1.bias = self.bias
            self.net2 = nn.Linear(10, 5)

        def forward(self, x):
            return self.net2(x).sum()

    model = init(ToyModel())
    for static in [True, False]:
        ddp_model = DDP(copy.deepcopy(model), find_unused_parameters=True, static_graph=static)
        inp = data([20, 10], rank)
        for i in range(6):
            loss = ddp_model(inp)
            loss /= 10
            loss.backward()
            out.grads("static_graph=%d iteration %d" % (static, i), ddp_model.module)


def test_ddp_control_flow_different_across_ranks(out, rank, world):
    batch, dim = 20, 10

    class ToyModel(nn.Module):
        def __init__(self, rank):
            super().__init__()
            self.lin1 = nn.Linear(10, 10, bias=False)
            self.lin2 = nn.Linear(10, 10, bias=False)
            self.rank = rank

        def forward(self, x):
            use_second_layer = torch.equal(x, torch.ones(batch, dim)) and self.rank == 1
            if use_second_layer:
                return self.lin2(F.relu(self.lin1(x)))
            return F.relu(self.lin1(x))

    model = DDP(init(ToyModel(rank)), find_unused_parameters=True)
    random_input = data([batch, dim], rank)
    ones_input = torch.ones(batch, dim)
    for i in range(6):
        out_t = model(random_input if i % 2 == 0 else ones_input)
        out_t.sum().backward()
        out.grads("iteration %d" % i, model.module)
    model = DDP(init(ToyModel(rank)), find_unused_parameters=False)
    for i in range(2):
        if i == 0:
            model(random_input).sum().backward()
        else:
            raised(out, "find_unused_parameters=False iteration 1", lambda: model(random_input).sum().backward())


def test_ddp_inference(out, rank, world):
    """The Net half: PyTorch's DDP refuses SyncBatchNorm on CPU (ours runs it
    there; its parity is syncbn_zero_amp.md's)."""
    model = init(Net())
    local_model = copy.deepcopy(model)
    model = DDP(model)
    inp = data([10, 2], 1)
    if rank == 0:
        model.eval()
        local_model.eval()
        for _ in range(6):
            a, b = model(inp), local_model(inp)
            out.text("equal to the local model", int(torch.equal(a, b)))
        out.tensor("output", a)
    dist.barrier()


class BatchNormNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(2, 40, bias=False)
        self.bn = nn.BatchNorm1d(4)
        self.fc2 = nn.Linear(40, 4, bias=False)

    def forward(self, x):
        x = torch.reshape(self.fc1(x), (-1, 4, 10))
        x = self.bn(x)
        x = torch.reshape(x, (-1, 40))
        x = self.fc2(x)
        return F.softmax(x, dim=1)


def ddp_evaluation_after_training(out, rank, world):
    """test_ddp_inference's question on a model with buffers: train, then
    evaluate under no_grad on every rank through the wrapper. The first
    forward after a training one broadcasts rank 0's running statistics."""
    model = DDP(init(BatchNormNet()))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for it in range(3):
        opt.zero_grad()
        model(data([4, 2], 10 * it + rank)).sum().backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        for it in range(2):
            out.tensor("evaluation %d output" % it, model(data([4, 2], 7)))
    out.tensor("running_mean", model.module.bn.running_mean)
    out.tensor("running_var", model.module.bn.running_var)


def test_ddp_static_graph_nested_types(out, rank, world):
    class NestedOutputModule(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(100, 1, bias=False)

        def forward(self, inp, output_type):
            if output_type == "tuple":
                return (self.lin(inp), (self.lin(inp), self.lin(inp)))
            if output_type == "list":
                return [self.lin(inp), [self.lin(inp), self.lin(inp)]]
            return {"a": self.lin(inp), "b": {"c": self.lin(inp)}}

    def get_loss(model_output):
        loss = 0.0
        if isinstance(model_output, torch.Tensor):
            return model_output.sum()
        values = model_output.values() if isinstance(model_output, dict) else model_output
        for v in values:
            loss += get_loss(v)
        return loss

    module = init(NestedOutputModule())
    model = DDP(copy.deepcopy(module))
    model_static_graph = DDP(copy.deepcopy(module), static_graph=True)
    inp = data([10, 100], 3 + rank)
    for output_type in ["list", "tuple", "dict"]:
        for i in range(6):
            get_loss(model(inp, output_type=output_type)).backward()
            step(model.module)
            get_loss(model_static_graph(inp, output_type=output_type)).backward()
            step(model_static_graph.module)
            out.params("%s iteration %d" % (output_type, i), model.module)
            out.params("%s iteration %d static_graph" % (output_type, i), model_static_graph.module)


def test_ddp_returns_tensor_with_no_grad(out, rank, world):
    class MyModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(10, 10, bias=False)
            self.fc2 = nn.Linear(10, 10, bias=False)

        def forward(self, x):
            x = self.fc2(F.relu(self.fc1(x)))
            y = x.clone()
            x = x.detach()
            return (x, y)

    model = init(MyModel())
    inp = data([1, 10], rank)
    for find_unused, static_graph in itertools.product([True, False], [True, False]):
        ddp = DDP(model, find_unused_parameters=find_unused, static_graph=static_graph)
        for i in range(6):
            o = ddp(inp)
            out.text("find_unused=%d static_graph=%d iteration %d out[0].requires_grad" % (find_unused, static_graph, i),
                     int(o[0].requires_grad))
            (o[0] + o[1]).sum().backward()
        out.grads("find_unused=%d static_graph=%d" % (find_unused, static_graph), ddp.module)


def ddp_new_tensor_in_fwd(out, rank, world, static_graph):
    class MyModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(10, 10, bias=False)
            self.fc2 = nn.Linear(10, 10, bias=False)
            self.made = 0

        def init_opt(self):
            self.made += 1
            return data([1, 10], 100 + self.made)

        def forward(self, x, opt_1, opt_2, opt_nested):
            x = F.relu(self.fc1(x))
            x = self.fc2(x)
            if opt_1 is None:
                opt_1 = self.init_opt()
            if opt_2 is None:
                opt_2 = self.init_opt()
            if opt_nested is None or not torch.is_tensor(opt_nested):
                opt_nested = self.init_opt()
            return x, opt_1, opt_2, {"tensor": opt_nested}

    model = init(MyModel())
    for find_unused in [True, False]:
        ddp = DDP(model, broadcast_buffers=False, find_unused_parameters=find_unused, static_graph=static_graph)
        opt = [None for _ in range(3)]
        for i in range(2):
            ddp.zero_grad()
            x = data([1, 10], 10 * i + rank)
            result, opt[0], opt[1], opt[2] = ddp(x, opt_1=opt[0], opt_2=opt[1], opt_nested=opt[2])
            for j in range(3):
                t = opt[j] if torch.is_tensor(opt[j]) else opt[j]["tensor"]
                out.tensor("find_unused=%d iteration %d opt %d" % (find_unused, i, j), t)
            result.mean().backward()
            out.grads("find_unused=%d iteration %d" % (find_unused, i), ddp.module)


def test_ddp_new_tensor_in_fwd(out, rank, world):
    ddp_new_tensor_in_fwd(out, rank, world, static_graph=False)


def test_ddp_new_tensor_in_fwd_static_graph(out, rank, world):
    ddp_new_tensor_in_fwd(out, rank, world, static_graph=True)


def test_ddp_broadcast_buffer(out, rank, world):
    class NetWithBuffers(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(10, 10, bias=False)
            self.b = nn.Linear(10, 1, bias=False)
            self.register_buffer("buffer", data([1, 2], rank))

        def forward(self, x):
            return self.b(self.a(x))

    model_ddp = DDP(init(NetWithBuffers(), shift=rank))
    inp = data([2, 10], 5 + rank)
    for i in range(2):
        if rank == 0:
            model_ddp.module.buffer = model_ddp.module.buffer + 1
        model_ddp(inp).sum().backward()
        out.tensor("iteration %d buffer" % i, model_ddp.module.buffer)


def outcome(out, label, forward, backward):
    """One iteration, and where it raised: "forward raised", "backward
    raised" or "returned"."""
    try:
        result = forward()
    except (RuntimeError, ValueError):
        out.text(label, "forward raised")
        return
    try:
        backward(result)
    except (RuntimeError, ValueError):
        out.text(label, "backward raised")
        return
    out.text(label, "returned")


def accumulate_gradients_no_sync(out, rank, world, num_iters=2, hook=None, gradient_as_bucket_view=False):
    """_test_accumulate_gradients_no_sync (2.11's) on the CPU module of
    _prepare_cpu_module: Net, buckets of 0.001 MiB."""
    global_batch_size, local_batch_size = world, 1
    ddp_model = DDP(init(Net()), bucket_cap_mb=0.001, gradient_as_bucket_view=gradient_as_bucket_view)
    inp, target = data([global_batch_size, 2], 3), data([global_batch_size, 4], 4)
    if hook is not None:
        ddp_model.register_comm_hook(dist.group.WORLD, hook)

    def step_model(model, x, y):
        model.train()
        F.mse_loss(model(x), y).backward()

    with torch.no_grad():
        with ddp_model.no_sync():
            ddp_model.train()
            ddp_model(inp)
    for iteration in range(num_iters):
        x = inp[rank * local_batch_size:(rank + 1) * local_batch_size]
        y = target[rank * local_batch_size:(rank + 1) * local_batch_size]
        if iteration % 2 == 0:
            with ddp_model.no_sync():
                step_model(ddp_model, x, y)
        else:
            step_model(ddp_model, x, y)
        out.grads("iteration %d" % iteration, ddp_model.module)
        torch.manual_seed(1337 + iteration)
        inp = inp[torch.randperm(global_batch_size)]


def test_accumulate_gradients_no_sync(out, rank, world):
    accumulate_gradients_no_sync(out, rank, world)


def test_accumulate_gradients_no_sync_grad_is_view(out, rank, world):
    accumulate_gradients_no_sync(out, rank, world, gradient_as_bucket_view=True)


def test_accumulate_gradients_no_sync_allreduce_hook(out, rank, world):
    def allreduce_hook(group_id, bucket):
        tensors = [bucket.buffer() / world]
        return group_id.allreduce(tensors).get_future().then(lambda fut: fut.value()[0])

    accumulate_gradients_no_sync(out, rank, world, num_iters=4, hook=allreduce_hook)


def test_accumulate_gradients_no_sync_allreduce_with_then_hook(out, rank, world):
    def allreduce_with_then_hook(group_id, bucket):
        fut = group_id.allreduce([bucket.buffer()]).get_future()

        def mult(fut):
            return 2 * fut.wait()[0]

        def div(fut):
            return fut.wait() / (2 * world)

        return fut.then(mult).then(div)

    accumulate_gradients_no_sync(out, rank, world, num_iters=4, hook=allreduce_with_then_hook)


def test_ddp_zero_output_features(out, rank, world):
    class ToyModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.net1 = nn.Linear(10, 10)
            self.relu = nn.ReLU()
            self.net2 = nn.Linear(10, 0)

    raised(out, "DDP(model)", lambda: DDP(init(ToyModel())))


def test_grads_same_across_ranks_with_no_sync(out, rank, world):
    class SimpleConditionalModel(nn.Module):
        def __init__(self, rank):
            super().__init__()
            self.rank = rank
            self.nn1, self.nn2, self.nn3, self.nn4 = (nn.Linear(1, 1) for _ in range(4))
            self.state = 0

        def forward(self, x):
            first = self.state == 0
            self.state = 1 if first else 0
            if self.rank == 0:
                return self.nn1(x) if first else self.nn2(x)
            return self.nn3(x) if first else self.nn4(x)

    model = DDP(init(SimpleConditionalModel(rank)), find_unused_parameters=True)
    grad_accumulation = 2
    for microbatch_idx in range(grad_accumulation):
        x, y = data([1], 20 + 2 * microbatch_idx + rank), data([1], 21 + 2 * microbatch_idx + rank)
        if microbatch_idx < grad_accumulation - 1:
            with model.no_sync():
                nn.MSELoss()(model.forward(x), y).backward()
        else:
            nn.MSELoss()(model.forward(x), y).backward()
    out.grads("after the accumulation", model.module)


def ddp_invalid_static_graph(out, rank, world, first, second, label):
    class ControlFlowToyModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin1 = nn.Linear(10, 10, bias=False)
            self.lin2 = nn.Linear(10, 10, bias=False)

        def forward(self, x):
            if torch.equal(x, torch.ones(20, 10)):
                return self.lin2(F.relu(self.lin1(x)))
            return F.relu(self.lin1(x))

    model = DDP(init(ControlFlowToyModel()), static_graph=True)
    for i, x in enumerate([first, second, first]):
        outcome(out, "%s iteration %d" % (label, i), lambda: model(x), lambda o: o.sum().backward())


def test_invalid_static_graph(out, rank, world):
    """Both halves of the test, each on a fresh model (the test goes on with
    the model its first half left failed)."""
    random_input, ones_input = data([20, 10], rank), torch.ones(20, 10)
    ddp_invalid_static_graph(out, rank, world, random_input, ones_input, "unused then used")
    ddp_invalid_static_graph(out, rank, world, ones_input, random_input, "used then unused")


class UnusedParamTwoLinLayerNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(10, 10, bias=False)
        self.b = nn.Linear(10, 10, bias=False)
        self.c = nn.Linear(5, 5, bias=False)

    def forward(self, x):
        return (self.a(x), self.b(x))


class DictOutputModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.module = UnusedParamTwoLinLayerNet()

    def forward(self, x):
        predictions = self.module(x)
        loss = (predictions[0] + predictions[1]).sum()
        return {"predictions": predictions, "loss": loss}


def output_unused_in_loss(out, rank, world, module_cls, gradient_as_bucket_view):
    """_test_output_unused_in_loss; as the test, gradient_as_bucket_view is
    not passed to DDP (PyTorch's default)."""
    net = DDP(init(module_cls()), find_unused_parameters=True)
    inp = data([10, 10], rank)

    def predictions():
        o = net(inp)
        return o["predictions"] if module_cls == DictOutputModule else o

    a_dist, b_dist = predictions()
    b_dist.sum().backward()
    out.grads("view=%d first" % gradient_as_bucket_view, net.module)
    net.zero_grad()
    for i in range(6):
        a_dist, b_dist = predictions()
        loss_dist = (a_dist @ b_dist).sum() if i < 2 else b_dist.sum()
        loss_dist.backward()
        out.grads("view=%d iteration %d" % (gradient_as_bucket_view, i), net.module)
    dist.barrier()


def test_output_unused_in_loss_tuple_module(out, rank, world):
    for view in [True, False]:
        output_unused_in_loss(out, rank, world, UnusedParamTwoLinLayerNet, view)


def test_output_unused_in_loss_dict_module(out, rank, world):
    for view in [True, False]:
        output_unused_in_loss(out, rank, world, DictOutputModule, view)


def test_ddp_sync_module_states(out, rank, world):
    from torch.distributed.utils import _sync_module_states
    model = init(nn.Linear(2, 2, bias=False), shift=rank)
    net = DDP(model, bucket_cap_mb=1)
    net.module = copy.deepcopy(init(nn.Linear(2, 2, bias=False), shift=10 + rank))
    _sync_module_states(module=net.module, process_group=net.process_group,
                        broadcast_bucket_size=net.broadcast_bucket_size, src=1,
                        params_and_buffers_to_ignore=net.parameters_to_ignore)
    out.params("after the broadcast from rank 1", net.module)


def test_ddp_grad_div_uneven_inputs(out, rank, world):
    dim, batch, grad_scale = 5, 1, 50
    inp = torch.ones(batch, dim) * grad_scale
    net = DDP(init(nn.Linear(dim, dim, bias=False)), bucket_cap_mb=1)
    n_iters = 3 + (2 if rank > 0 else 0)
    for divide in [False, True]:
        with net.join(divide_by_initial_world_size=divide):
            for i in range(n_iters):
                net(inp).sum().backward()
                out.tensor("divide_by_initial_world_size=%d iteration %d grad" % (divide, i), net.module.weight.grad)
                net.zero_grad()


def test_ddp_join_model_equivalence(out, rank, world):
    batch, dim, learning_rate = 3, 10, 0.03
    model = init(nn.Linear(dim, dim, bias=False))
    inp = data([batch, dim], rank)
    num_iters = 2 * (rank + 1)
    net = DDP(model)
    ddp_optim = torch.optim.SGD(model.parameters(), lr=learning_rate * world)
    with net.join():
        for _ in range(num_iters):
            ddp_optim.zero_grad()
            net(inp).sum().backward()
            ddp_optim.step()
    out.params("after Join", net.module)


def test_ddp_uneven_input_join_disable(out, rank, world):
    net = DDP(init(nn.Linear(1, 1), shift=rank))
    inp = torch.ones(1) * rank
    with net.join(enable=False):
        for i in range(5):
            grad = net.module.weight.grad
            if grad is not None:
                grad.requires_grad_(False)
                grad.zero_()
            net(inp).sum().backward()
            out.tensor("iteration %d weight.grad" % i, net.module.weight.grad)
    out.text("join enabled", int(net._join_config.enable))


def test_ddp_uneven_input_exception(out, rank, world):
    class ExceptionModule(nn.Module):
        def __init__(self):
            super().__init__()
            self.param = nn.Parameter(torch.ones(1, requires_grad=True))

        def forward(self, _):
            raise ValueError("Intentional error")

    net = DDP(ExceptionModule())
    inp = torch.ones(1)

    def run():
        with net.join():
            net(inp).sum().backward()

    raised(out, "the forward's own error through Join", run)


class EmbeddingNetDifferentParams(nn.Module):
    def __init__(self, rank, diff_num_params=False):
        super().__init__()
        embedding_dim = 500 if diff_num_params or rank == 0 else 50
        self.embedding = nn.Embedding(num_embeddings=10, embedding_dim=embedding_dim)
        self.lin = nn.Linear(embedding_dim, 1)
        if diff_num_params:
            self.lin2 = nn.Linear(1, 1, bias=False)

    def forward(self, x):
        return self.lin(self.embedding(x))


def ddp_model_with_diff_params(out, net):
    """_run_test_ddp_model_with_diff_params: at least one rank raises."""
    from datetime import timedelta
    group_gloo = dist.new_group(timeout=timedelta(seconds=60), backend="gloo")
    group_to_use = dist.new_group(backend=dist.get_backend(), timeout=timedelta(seconds=10))
    caught = 0
    try:
        DDP(net, process_group=group_to_use)
    except Exception:
        caught = 1
    t = torch.Tensor([caught])
    dist.all_reduce(t, group=group_gloo)
    out.text("some rank raised", int(t.item() > 0))


def test_ddp_model_diff_shape_across_ranks(out, rank, world):
    ddp_model_with_diff_params(out, EmbeddingNetDifferentParams(rank))


def test_ddp_model_diff_num_params_across_ranks(out, rank, world):
    ddp_model_with_diff_params(out, EmbeddingNetDifferentParams(rank, diff_num_params=(rank == 1)))


class TwoLinLayerNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(10, 10, bias=False)
        self.b = nn.Linear(10, 1, bias=False)

    def forward(self, x):
        return (self.a(x), self.b(x))


def ddp_multiple_nested_unused_params_error(out, rank, world, ignore_sparse):
    class SubModule(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding_net = EmbeddingNetDifferentParams(0)
            self.lin = TwoLinLayerNet()
            self.bn = BatchNormNet()
            self.lin_layer = nn.Linear(4, 10, bias=False)

        def forward(self, x):
            x = self.bn(x)
            x = self.lin_layer(x)
            return self.lin.a(x)

    class MyModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.sub_module = SubModule()

        def forward(self, x):
            return self.sub_module(x)

    model = init(MyModel())
    if ignore_sparse:
        DDP._set_params_and_buffers_to_ignore_for_model(model, ["sub_module.embedding_net.embedding.weight"])
    net = DDP(model)
    inp = torch.ones(10, 2)
    net(inp).sum().backward()
    raised(out, "iteration 1", lambda: net(inp).sum().backward())


def test_ddp_multiple_nested_unused_params_error(out, rank, world):
    ddp_multiple_nested_unused_params_error(out, rank, world, ignore_sparse=False)


def test_ddp_multiple_nested_unused_params_err_ignore_params(out, rank, world):
    ddp_multiple_nested_unused_params_error(out, rank, world, ignore_sparse=True)


def test_ddp_control_flow_same_across_ranks(out, rank, world):
    class ControlFlowToyModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin1 = nn.Linear(10, 10, bias=False)
            self.lin2 = nn.Linear(10, 10, bias=False)

        def forward(self, x):
            if torch.equal(x, torch.ones(20, 10)):
                return self.lin2(F.relu(self.lin1(x)))
            return F.relu(self.lin1(x))

    model = DDP(init(ControlFlowToyModel()), find_unused_parameters=True)
    random_input, ones_input = data([20, 10], rank), torch.ones(20, 10)
    for i in range(6):
        model(random_input if i % 2 == 0 else ones_input).sum().backward()
        out.grads("iteration %d" % i, model.module)
    model = DDP(init(ControlFlowToyModel()), find_unused_parameters=False)
    model(random_input).sum().backward()
    raised(out, "find_unused_parameters=False iteration 1", lambda: model(random_input).sum().backward())


def ddp_hook_parity(out, rank, world, state, hook, label=""):
    """_test_ddp_hook_parity: Linear(1, 5) with and without the hook, 100
    iterations; the weight's gradients are cleared by hand, the bias's
    accumulate."""
    process_group = getattr(state, "process_group", state)
    m = init(nn.Linear(1, 5))
    net_with_hook = DDP(copy.deepcopy(m), process_group=process_group)
    net_with_hook.register_comm_hook(state=state, hook=hook)
    net_without_hook = DDP(copy.deepcopy(m), process_group=process_group)
    for i in range(100):
        for g in [net_without_hook.module.weight.grad, net_with_hook.module.weight.grad]:
            if g is not None:
                g.requires_grad_(False)
                g.zero_()
        batch = torch.tensor([rank]).float()
        net_without_hook(batch).sum().backward()
        net_with_hook(batch).sum().backward()
        if i < 3 or i % 25 == 24:
            out.grads("%siteration %d without the hook" % (label, i), net_without_hook.module)
            out.grads("%siteration %d with the hook" % (label, i), net_with_hook.module)


def test_ddp_hook_parity_allreduce(out, rank, world):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as default
    ddp_hook_parity(out, rank, world, None, default.allreduce_hook)


def test_ddp_hook_parity_allreduce_process_group(out, rank, world):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as default
    process_group = dist.new_group(list(range(world)))
    ddp_hook_parity(out, rank, world, process_group, default.allreduce_hook)


def test_ddp_hook_parity_powerSGD(out, rank, world):
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
    for warm_start in [True, False]:
        state = powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2,
                                       warm_start=warm_start)
        ddp_hook_parity(out, rank, world, state, powerSGD.powerSGD_hook, "warm_start=%d " % warm_start)


def test_undefined_grad_parity_unused_parameters(out, rank, world):
    x = torch.ones(1, 2)
    net = DDP(init(Net()), find_unused_parameters=True)
    out_t = net(x).sum()
    torch._C._functions.UndefinedGrad()(out_t).backward()
    out.grads("after the backward", net.module)


def test_static_graph_multi_forward(out, rank, world):
    class TwoForwardNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(10, 10)
            self.relu = nn.ReLU()

        def forward(self, x):
            return self.relu(self.lin(x))

    model = DDP(init(TwoForwardNet(), shift=rank), static_graph=True)
    inp = torch.ones(2, 10)
    for i in range(3):
        model.zero_grad()
        a = model(inp)
        b = model(inp)
        (a.sum() + b.sum()).backward()
        out.grads("iteration %d" % i, model.module)


def test_ddp_uneven_inputs_stop_iteration_sync_bn(out, rank, world):
    """The model that communicates in its forward; the SyncBatchNorm half is
    GPU-only in PyTorch (ours runs on the CPU: syncbn_zero_amp.md)."""
    class ModelWithComm(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 40, bias=False)

        def forward(self, x):
            x = self.lin(x)
            dist.all_reduce(x)
            return x

    model = DDP(init(ModelWithComm()))
    model_input = data([10, 2], rank)
    min_num_iters = 5
    num_iters = min_num_iters * 2 if rank == 0 else min_num_iters
    n = [0]

    def run():
        with model.join(throw_on_early_termination=True):
            for _ in range(num_iters):
                model(model_input).sum().backward()
                step(model.module)
                n[0] += 1

    raised(out, "throw_on_early_termination", run)
    out.text("iterations", n[0])
    out.params("after", model.module)


def checksums(out, label, module):
    """A parameter's or buffer's values as two float64 sums (plain and weighted
    by position): bitwise the same for the same values, a few lines for any size."""
    for name, t in list(module.named_parameters()) + list(module.named_buffers()):
        flat = t.detach().double().reshape(-1)
        out.tensor("%s %s" % (label, name), torch.stack([flat.sum(), (flat * torch.arange(flat.numel())).sum()]))


def grad_checksums(out, label, module):
    """checksums() of every gradient; "none" for a missing one."""
    for name, p in module.named_parameters():
        if p.grad is None:
            out.text("%s %s.grad" % (label, name), "none")
        else:
            flat = p.grad.double().reshape(-1)
            out.tensor("%s %s.grad" % (label, name),
                       torch.stack([flat.sum(), (flat * torch.arange(flat.numel())).sum()]))


UNEVEN_DIM = 24  # 1000 in the original: a CPU runs it in seconds


def test_ddp_uneven_inputs(out, rank, world):
    """Every model and rank-to-iterations mapping of the original, on CPU: the
    dimension 1000 shrunk to UNEVEN_DIM and the bucket cap with it (1 to 0.25
    MiB: the conv model still spans several buckets); ResNet-50 left out
    (torchvision). Each run writes its iterations, its error (on early
    termination) and the model's and buffers' checksums after Join."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as default
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
    dim, batch = UNEVEN_DIM, 1
    large_model = init(nn.Sequential(nn.Conv2d(1, 20, 5), nn.ReLU(), nn.Conv2d(20, 32, 5), nn.ReLU(),
                                     nn.Conv2d(32, 256, 5), nn.ReLU()))
    small_model = init(nn.Linear(dim, dim, bias=False))
    bn_net = init(BatchNormNet())

    class UnusedParamModule(nn.Module):
        def __init__(self, unused_params_rank):
            super().__init__()
            self.t0, self.t1 = Task(), Task()
            self.unused_params_rank = unused_params_rank

        def forward(self, x, rank):
            return self.t1(self.t0(x)) if rank != self.unused_params_rank else self.t1(x)

    unjoined = init(UnusedParamModule(1))
    joined = init(UnusedParamModule(0))
    power_sgd_state = powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=1,
                                             warm_start=False, use_error_feedback=False)
    # (name, model, input, hook, state)
    models = [("batch_norm_net", bn_net, torch.ones(batch, 2), None, None),
              ("large_conv_model", large_model, torch.ones(batch, batch, dim, dim), None, None),
              ("small_model", small_model, torch.ones(batch, dim), None, None),
              ("unjoined_rank_with_unused_params_model", unjoined, (torch.ones(batch, 2), rank), None, None),
              ("joined_rank_with_unused_params_model", joined, (torch.ones(batch, 2), rank), None, None),
              ("small_model_allreduce_hook", small_model, torch.ones(batch, dim), default.allreduce_hook, None),
              ("small_model_power_sgd_hook", small_model, torch.ones(batch, dim), powerSGD.powerSGD_hook,
               power_sgd_state)]
    # (case, sync_interval, throw_on_early_termination): the hooks only in the first set, as the original
    cases = [(m, 1, False) for m in models]
    cases += [((m[0], m[1], m[2], None, None), i + 2, False) for i, m in enumerate(models)]
    cases += [((m[0], m[1], m[2], None, None), 1, True) for m in models]
    mappings = []
    # One early rank at 2 ranks, two at 3 (join.cpp says why the original's 1 at 3 is left out).
    for num_early_join_ranks in [2 if world > 2 else 1]:
        for baseline_iter in [0, 5]:
            for offset in [2, 3, 10]:
                mapping = dict.fromkeys(range(num_early_join_ranks), baseline_iter)
                if num_early_join_ranks > 1:
                    for r in mapping:
                        if r > 0:
                            mapping[r] += offset // 2
                mapping.update(dict.fromkeys(range(num_early_join_ranks, world), baseline_iter + offset))
                mappings.append(mapping)
    for ((name, model, inp, hook, state), sync_interval, throw), mapping in itertools.product(cases, mappings):
        label = "%s sync %d%s %s" % (name, sync_interval, " throw" if throw else "",
                                     ",".join(str(mapping[r]) for r in range(world)))
        dist.barrier()
        net = DDP(model, bucket_cap_mb=0.25, find_unused_parameters="unused_params_model" in name)
        if hook is not None:
            net.register_comm_hook(state, hook)
        num_iters = mapping[rank]
        total_iters = [0]

        def run():
            with net.join(throw_on_early_termination=throw):
                for i in range(num_iters):
                    with (net.no_sync() if i % sync_interval != 0 else contextlib.nullcontext()):
                        loss = (net(*inp) if isinstance(inp, tuple) else net(inp)).sum()
                        loss.backward()
                        step(net)
                    total_iters[0] += 1

        if throw:
            raised(out, label, run)
        else:
            run()
        out.text(label + " iterations", total_iters[0])
        if not throw:
            out.text(label + " join_uneven_inputs", net._get_ddp_logging_data().get("join_uneven_inputs"))
        checksums(out, label, model)

class LargeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(1000, 2000, bias=False)
        self.fc2 = nn.Linear(2000, 500, bias=False)

    def forward(self, x):
        return self.fc2(self.fc1(x))


def test_ddp_bucket_cap_mb_list(out, rank, world):
    """With bucket_cap_mb_list [1, 2] and without (bucket_cap_mb 25): two
    iterations each; the caps in bytes, the first buckets' sizes, the model."""
    for label, kwargs in [("with the list", dict(bucket_cap_mb_list=[1, 2])),
                          ("without", dict(bucket_cap_mb=25))]:
        model = DDP(init(LargeNet()), **kwargs)
        for it in range(2):
            model(data([10, 1000], rank + it)).sum().backward()
        out.text(label + " bucket_bytes_cap_list", repr(model.bucket_bytes_cap_list).replace(" ", ""))
        d = model._get_ddp_logging_data()
        out.text(label + " bucket_cap_bytes", d.get("bucket_cap_bytes"))
        if kwargs.get("bucket_cap_mb_list"):
            out.text(label + " bucket_sizes", d.get("bucket_sizes"))
        grad_checksums(out, label, model.module)


def test_skip_all_reduce_unused_parameters(out, rank, world):
    """_test_skip_all_reduce_unused_parameters with and without the option:
    fc2 never used, buckets of 1.5 MiB, ten iterations."""
    class SkipLargeNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(100, 5000, bias=False)
            self.fc2 = nn.Linear(100, 100, bias=False)

        def forward(self, x):
            return self.fc1(x)

    for skip in [False, True]:
        ddp_model = DDP(init(SkipLargeNet()), find_unused_parameters=True, static_graph=False, bucket_cap_mb=1.5,
                        skip_all_reduce_unused_params=skip)
        random_input = data([20, 100], rank)
        for _ in range(10):
            ddp_model(random_input).sum().backward()
        label = "skip_all_reduce_unused_params=%d" % skip
        out.text(label + " num_buckets_reduced", ddp_model._get_ddp_logging_data().get("num_buckets_reduced"))
        grad_checksums(out, label, ddp_model.module)
        checksums(out, label, ddp_model.module)

def test_ddp_logging_data_cpu(out, rank, world):
    """_test_ddp_logging_data on CPU, then the logging data's keys (see the port)."""
    model = DDP(init(Net()))
    local_bs, global_bs = 2, world * 2
    inp, target = data([global_bs, 2], 1), data([global_bs, 4], 2)
    model._set_ddp_runtime_logging_sample_rate(2)
    for idx in range(20):
        offset = rank * local_bs
        nn.MSELoss()(model(inp[offset:offset + local_bs]), target[offset:offset + local_bs]).backward()
        step_with_zero_grad(model.module)
        d = model._get_ddp_logging_data()
        if idx > 0 and (idx < 10 or idx % 2 == 0):
            ok = (d.get("forward_compute_time") >= 1 and d.get("backward_compute_time") >= 1
                  and d.get("backward_comm_time") >= 1
                  and d.get("backward_compute_time") >= d.get("backward_compute_comm_overlap_time")
                  and d.get("backward_comm_time") >= d.get("backward_compute_comm_overlap_time"))
            out.text("iteration %d runtime figures in order" % idx, int(ok))
    d = model._get_ddp_logging_data()

    def env(name):
        return os.environ.get(name, "N/A")

    for k in ["world_size", "rank", "output_device", "broadcast_buffers", "bucket_cap_bytes",
              "find_unused_parameters", "total_parameter_size_bytes",
              "num_parameter_tensors", "has_rebuilt_buckets", "gloo_num_threads"]:
        out.text(k, int(d.get(k, -12345)))
    out.text("unused_parameter_size", d.get("unused_parameter_size", 0))
    for k in ["device_ids", "backend_name", "dtypes", "bucket_sizes", "rebuilt_bucket_sizes",
              "prev_iteration_grad_ready_order_indices", "rebuilt_per_bucket_param_indices",
              "nccl_socket_ifname", "nccl_blocking_wait", "nccl_async_error_handling", "nccl_debug",
              "nccl_nthreads", "nccl_ib_timeout"]:
        out.text(k, "'%s'" % d.get(k))
    out.text("module_name is the module's class", int(d.get("module_name") == type(model.module).__name__))
    out.text("iteration at least 18", int(d.get("iteration") >= 18))
    out.text("gradient_as_bucket_view is the option in effect",
             int(d.get("gradient_as_bucket_view") == int(model.gradient_as_bucket_view)))
    out.text("environment", int(d.get("master_port") == env("MASTER_PORT") and d.get("master_addr") == env("MASTER_ADDR")
                                and d.get("torch_distributed_debug") == env("TORCH_DISTRIBUTED_DEBUG")
                                and d.get("cuda_visible_devices") == env("CUDA_VISIBLE_DEVICES")
                                and d.get("gloo_socket_ifname") == env("GLOO_SOCKET_IFNAME")
                                and d.get("gloo_device_transport") == env("GLOO_DEVICE_TRANSPORT")))
    out.text("average figures in order", int(
        d.get("avg_forward_compute_time") >= 1 and d.get("avg_backward_compute_time") >= 1
        and d.get("avg_backward_comm_time") >= 1
        and d.get("avg_backward_compute_time") >= d.get("avg_backward_compute_comm_overlap_time")
        and d.get("avg_backward_comm_time") >= d.get("avg_backward_compute_comm_overlap_time")))
    out.text("host-side times in order", int(
        d.get("backward_comm_time_end") >= d.get("backward_comm_time_start")
        and d.get("backward_comm_time_start") >= d.get("backward_compute_time_start")
        and d.get("backward_compute_time_end") >= d.get("backward_compute_time_start")
        and d.get("backward_compute_time_start") >= d.get("forward_compute_time_start")))


# ---- test/distributed/test_c10d_gloo.py's and test_c10d_common.py's ----------
# (not installed with torch: C10D_SINCE says which are newer than 1.13; named
# "test_c10d_gloo.<test>", "test_c10d_common.<test>")

class Task(nn.Module):
    def __init__(self):
        super().__init__()
        self.p = nn.Parameter(torch.ones(2, 2))

    def forward(self, x):
        return self.p + x


def global_local_unused_params_grad(out, rank, world, gradient_as_bucket_view=False, static_graph=False):
    """_test_global_local_unused_params_grad, its CPU half: the grad of a
    parameter no rank used stays None; a parameter some rank used gets it."""
    class GlobalLocalUnusedParamModule(nn.Module):
        def __init__(self):
            super().__init__()
            self.t0, self.t1, self.task_unused = Task(), Task(), Task()

        def forward(self, x, rank):
            return self.t0(x) if rank == 0 else self.t1(x)

    model = DDP(GlobalLocalUnusedParamModule(), find_unused_parameters=True,
                gradient_as_bucket_view=gradient_as_bucket_view, static_graph=static_graph)
    output = model(8, rank)
    out.grads("before the backward", model.module)
    output.mean().backward()
    out.grads("after the backward", model.module)


def c10d_test_global_local_unused_params_grad(out, rank, world):
    global_local_unused_params_grad(out, rank, world)


def c10d_test_global_local_unused_params_grad_with_grad_is_view(out, rank, world):
    global_local_unused_params_grad(out, rank, world, gradient_as_bucket_view=True)


def c10d_test_global_local_unused_params_grad_with_static_graph(out, rank, world):
    global_local_unused_params_grad(out, rank, world, static_graph=True)


def c10d_test_find_unused_parameters_when_unused_parameters_empty(out, rank, world):
    class FindUnusedParamModule(nn.Module):
        def __init__(self):
            super().__init__()
            self.t0, self.t1 = Task(), Task()

        def forward(self, x, rank):
            return self.t1(self.t0(x)) if rank == 0 else self.t1(x)

    model = DDP(FindUnusedParamModule(), find_unused_parameters=True)
    output = model(8, rank)
    output.mean().backward()
    out.grads("after the backward", model.module)


def ignored_output(out, rank, world, unused):
    """test_ignored_output(_with_unused_parameters): four forwards whose output
    is dropped, then four trained with CrossEntropyLoss."""
    class IgnoredOutput(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(2, 10, bias=False)
            self.fc2 = nn.Linear(10, 4, bias=False)
            if unused:
                self.fc3 = nn.Linear(4, 4, bias=False)
            self.relu = nn.ReLU()

        def forward(self, x):
            x = self.relu(self.fc1(x))
            x = self.relu(self.fc2(x))
            return F.softmax(x, dim=1)

    model = DDP(init(IgnoredOutput()), find_unused_parameters=unused)
    criterion = nn.CrossEntropyLoss()
    inp = data([4, 2], rank)
    target = torch.LongTensor([(rank + i) % 4 for i in range(4)])
    for _ in range(4):
        output = model(inp)
        del output
    for i in range(4):
        criterion(model(inp), target).backward()
        out.grads("iteration %d" % i, model.module)


def c10d_test_ignored_output(out, rank, world):
    ignored_output(out, rank, world, unused=False)


def c10d_test_ignored_output_with_unused_parameters(out, rank, world):
    ignored_output(out, rank, world, unused=True)


def c10d_test_ddp_comm_hook_future_passing_cpu(out, rank, world):
    """_simple_hook: a future set to ones, then one added: every gradient is 2."""
    class ModuleForDdpCommHook(nn.Module):
        def __init__(self):
            super().__init__()
            self.t0 = Task()

        def forward(self, x, rank):
            return self.t0(x + rank)

    def simple_hook(state, bucket):
        fut = torch.futures.Future()
        fut.set_result(torch.ones_like(bucket.buffer()))
        return fut.then(lambda fut: fut.value() + torch.ones_like(fut.value()))

    cpu_model = DDP(ModuleForDdpCommHook())
    cpu_model.register_comm_hook(None, simple_hook)
    cpu_model(8, rank).mean().backward()
    out.grads("after the backward", cpu_model.module)



def c10d_test_ddp_comm_hook_register_just_once(out, rank, world):
    class ModuleForDdpCommHook(nn.Module):
        def __init__(self):
            super().__init__()
            self.t0 = Task()

        def forward(self, x, rank):
            return self.t0(x + rank)

    model = DDP(ModuleForDdpCommHook())

    def dummy_hook(state, bucket):
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    model.register_comm_hook(None, dummy_hook)
    raised(out, "the second register_comm_hook", lambda: model.register_comm_hook(None, dummy_hook))


class C10dNet(nn.Module):
    """test_c10d_common.py's Net."""
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(2, 10, bias=False)
        self.fc2 = nn.Linear(10, 50, bias=False)
        self.fc3 = nn.Linear(50, 4, bias=False)
        self.relu = nn.ReLU()

    def forward(self, x):
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        return F.softmax(self.fc3(x), dim=1)


def gloo_backend_cpu_module(out, rank, world, gradient_as_bucket_view):
    """_test_gloo_backend -> _test_ddp_with_process_group on one CPU device."""
    model = init(C10dNet())
    ddp_model = DDP(copy.deepcopy(model), bucket_cap_mb=0.001, gradient_as_bucket_view=gradient_as_bucket_view)
    inp, target = data([world, 2], 1), data([world, 4], 2)

    def step_model(model, inp, target):
        model.train()
        F.mse_loss(model(inp), target).backward()

    def update_parameters(model):
        for param in model.parameters():
            with torch.no_grad():
                param -= param.grad
            param.grad = None

    for iteration in range(2):
        step_model(model, inp, target)
        step_model(ddp_model, inp[rank:rank + 1], target[rank:rank + 1])
        update_parameters(model)
        update_parameters(ddp_model)
        out.params("iteration %d single process" % iteration, model)
        out.params("iteration %d DDP" % iteration, ddp_model.module)
        torch.manual_seed(1337 + iteration)
        inp = inp[torch.randperm(world)]


def c10d_test_gloo_backend_cpu_module(out, rank, world):
    gloo_backend_cpu_module(out, rank, world, False)


def c10d_test_gloo_backend_cpu_module_grad_is_view(out, rank, world):
    gloo_backend_cpu_module(out, rank, world, True)


def c10d_test_save_load_checkpoint(out, rank, world):
    """Parameters from init(), not zeros; a rank's own batch; the checkpoint
    in the test's folder."""
    class TestModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(2, 10, bias=False)
            self.fc2 = nn.Linear(10, 4, bias=False)
            self.relu = nn.ReLU()

        def forward(self, x):
            x = self.relu(self.fc1(x))
            x = self.relu(self.fc2(x))
            return F.softmax(x, dim=1)

    def train_loop(model, optimizer, iterations):
        for _ in range(iterations):
            optimizer.zero_grad()
            criterion(model(inp), target).backward()
            optimizer.step()

    model_withload, model_withoutload = init(TestModel()), init(TestModel())
    ddp_withload, ddp_withoutload = DDP(model_withload), DDP(model_withoutload)
    criterion = nn.CrossEntropyLoss()
    optimizer_withload = torch.optim.SGD(ddp_withload.parameters(), lr=0.001)
    optimizer_non_ddp_withload = torch.optim.SGD(model_withload.parameters(), lr=0.001)
    optimizer_withoutload = torch.optim.SGD(ddp_withoutload.parameters(), lr=0.001)
    inp = data([4, 2], rank)
    target = torch.LongTensor([1, 3, 0, 2])
    train_loop(ddp_withload, optimizer_withload, 3)
    path = os.path.join(os.environ["DDP_TEST_DIR"], "model.checkpoint")
    if rank == 0:
        torch.save(ddp_withload.state_dict(), path)
    dist.barrier()
    ddp_state_dict = torch.load(path)
    for p in ddp_withload.parameters():
        with torch.no_grad():
            p.zero_()
    ddp_withload.load_state_dict(ddp_state_dict)
    torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(ddp_state_dict, "module.")
    model_withload.load_state_dict(ddp_state_dict)
    out.params("loaded", model_withload)
    train_loop(ddp_withload, optimizer_withload, 3)
    train_loop(model_withload, optimizer_non_ddp_withload, 3)
    train_loop(ddp_withoutload, optimizer_withoutload, 6)
    out.params("with the checkpoint", model_withload)
    out.params("without", model_withoutload)


def c10d_test_broadcast_coalesced_gloo_cpu(out, rank, world):
    """CommTest._test_broadcast_coalesced on CPU: float16 becomes float32."""
    half = torch.float32
    target = torch.arange(60, dtype=half).chunk(5)
    target += torch.arange(60, dtype=torch.float32).chunk(5)
    target += torch.arange(60, dtype=half).chunk(5)
    target += torch.arange(60, dtype=torch.float64).chunk(5)
    target += torch.arange(60, dtype=half).chunk(5)
    target += torch.arange(60, dtype=torch.float32).chunk(5)
    process_group = dist.distributed_c10d._get_default_group()
    for root_rank in range(world):
        tensors = [t.clone() if rank == root_rank else torch.zeros_like(t) for t in target]
        dist._broadcast_coalesced(process_group, tensors, 256, root_rank)
        out.text("root %d: the root's tensors" % root_rank, int(all(torch.equal(a, b) for a, b in zip(tensors, target))))


def c10d_test_invalid_powerSGD_state(out, rank, world):
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
    for start_powerSGD_iter, use_error_feedback, warm_start in itertools.product([0, 1], [True, False], [True, False]):
        if not use_error_feedback and not warm_start:
            continue
        raised(out, "start_powerSGD_iter=%d use_error_feedback=%d warm_start=%d" % (
            start_powerSGD_iter, use_error_feedback, warm_start),
            lambda: powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                           start_powerSGD_iter=start_powerSGD_iter,
                                           use_error_feedback=use_error_feedback, warm_start=warm_start))


def bucket_assignment(out, tensors, limits):
    """ComputeBucketAssignmentTest: the buckets of dist._compute_bucket_assignment_by_size."""
    result = dist._compute_bucket_assignment_by_size(tensors, limits)
    indices = result[0] if isinstance(result, tuple) else result
    out.text("buckets", repr([list(b) for b in indices]).replace(" ", ""))


def c10d_test_single_limit_single_dtype(out, rank, world):
    bucket_assignment(out, [torch.empty([100]), torch.empty([200]), torch.empty([100]), torch.empty([50])], [400])


def c10d_test_single_limit_multi_dtype(out, rank, world):
    bucket_assignment(out, [torch.empty([50], dtype=torch.float), torch.empty([25], dtype=torch.double)] * 3, [400])


def c10d_test_multi_limit_single_dtype(out, rank, world):
    bucket_assignment(out, [torch.empty([10], dtype=torch.float) for _ in range(4)], [40, 80])


def c10d_test_multi_limit_multi_dtype(out, rank, world):
    bucket_assignment(out, [torch.empty([50], dtype=torch.float), torch.empty([25], dtype=torch.double)] * 3, [200, 400])


def dataclass_output(out, rank, world, skip_o1):
    """_test_dataclass_output; the parameters from init()."""
    import dataclasses
    import typing

    @dataclasses.dataclass
    class CustomOutput:
        o1: typing.Optional[torch.Tensor]
        o2: typing.Dict[str, torch.Tensor]

    class DataclassOutputModule(nn.Module):
        def __init__(self, skip_o1):
            super().__init__()
            self.seq1 = nn.Sequential(*[nn.Linear(10, 10) for _ in range(3)])
            self.relu = nn.ReLU()
            self.seq2 = nn.Sequential(*[nn.Linear(10, 10) for _ in range(3)])
            self.skip_o1 = skip_o1

        def forward(self, x):
            o1 = None if self.skip_o1 else self.relu(self.seq1(x))
            o2 = {"a": self.seq2(x), "b": self.relu(self.seq2(x))}
            return CustomOutput(o1=o1, o2=o2)

    net_x = torch.cat([torch.ones(4, 10) * i for i in range(world)])
    ddp_x = torch.ones(4, 10) * rank
    net = init(DataclassOutputModule(skip_o1=skip_o1))
    ddp = DDP(copy.deepcopy(net), find_unused_parameters=True, static_graph=False)

    def loss(o):
        return F.mse_loss(o.o1 + o.o2["a"] + o.o2["b"] if not skip_o1 else o.o2["a"] + o.o2["b"],
                          torch.ones_like(o.o2["a"]))

    loss(net(net_x)).backward()
    loss(ddp(ddp_x)).backward()
    out.grads("single process", net)
    out.grads("DDP", ddp.module)
    close = all(p1.grad.allclose(p2.grad) if torch.is_tensor(p1.grad) else p1.grad is p2.grad
                for p1, p2 in zip(net.parameters(), ddp.parameters()))
    out.text("the same gradients", int(close))


def c10d_test_dataclass_output(out, rank, world):
    dataclass_output(out, rank, world, False)


def c10d_test_dataclass_output_unused_param(out, rank, world):
    dataclass_output(out, rank, world, True)


def c10d_test_ddp_buffer_sync_multi_forward_with_batchnorm(out, rank, world):
    model = init(nn.Sequential(nn.Linear(10, 10), nn.BatchNorm1d(10)))
    ddp = DDP(model, broadcast_buffers=True)
    inp = data([4, 10], rank)

    def two_forwards_one_backward():
        out1 = ddp(inp)
        out2 = ddp(inp)
        (out1.mean() + out2.mean()).backward()

    raised(out, "two forwards, one backward", two_forwards_one_backward)
    out.grads("after the backward", model)
    for name, b in model.named_buffers():
        out.tensor(name, b)


# ---- post-local SGD: its hook, model averagers, PostLocalSGDOptimizer ----------

@contextlib.contextmanager
def subgroups_of_this_node():
    """dist.new_subgroups() sizes its default subgroups by the GPUs of the
    node (torch.cuda.device_count()) and refuses without CUDA (1.13's, even
    given a size); the original test has one GPU per rank. Here it sees
    LOCAL_WORLD_SIZE GPUs, libddp's default (the ranks on this node)."""
    original = dist.new_subgroups

    def new_subgroups(*args, **kwargs):
        with mock.patch.object(torch.cuda, "is_available", return_value=True), \
                mock.patch.object(torch.cuda, "device_count", return_value=int(os.environ["LOCAL_WORLD_SIZE"])):
            return original(*args, **kwargs)

    dist.new_subgroups = new_subgroups
    try:
        yield
    finally:
        dist.new_subgroups = original


def test_ddp_hook_parity_post_localSGD(out, rank, world):
    from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as post_localSGD
    state = post_localSGD.PostLocalSGDState(process_group=None, subgroup=dist.group.WORLD, start_localSGD_iter=10)
    ddp_hook_parity(out, rank, world, state, post_localSGD.post_localSGD_hook, "subgroup=WORLD ")
    state = post_localSGD.PostLocalSGDState(process_group=None, subgroup=dist.group.WORLD, start_localSGD_iter=10,
                                            post_local_gradient_allreduce=False)
    ddp_hook_parity(out, rank, world, state, post_localSGD.post_localSGD_hook, "post_local_gradient_allreduce=0 ")
    state = post_localSGD.PostLocalSGDState(process_group=None, subgroup=None, start_localSGD_iter=10)
    with subgroups_of_this_node():
        ddp_hook_parity(out, rank, world, state, post_localSGD.post_localSGD_hook, "subgroup=None ")


def periodic_model_averager():
    from torch.distributed.algorithms.model_averaging import averagers
    return averagers.PeriodicModelAverager(period=4, warmup_steps=10)


def hierarchical_model_averager():
    from collections import OrderedDict
    from torch.distributed.algorithms.model_averaging import hierarchical_model_averager as hierarchicalSGD
    with subgroups_of_this_node():  # PyTorch 1.13's refuses any subgroup without CUDA (from 4 ranks on)
        return hierarchicalSGD.HierarchicalModelAverager(
            period_group_size_dict=OrderedDict([(2, 2), (4, dist.get_world_size())]), warmup_steps=4)


def post_localSGD_optimizer(net, learning_rate, averager):
    from torch.distributed.optim import post_localSGD_optimizer as post_localSGD_opt
    return post_localSGD_opt.PostLocalSGDOptimizer(optim=torch.optim.SGD(net.parameters(), lr=learning_rate),
                                                   averager=averager)


def perform_a_train_step(optimizer, net, loss_fn, input, target):
    optimizer.zero_grad()
    loss_fn(net(input), target).backward()
    optimizer.step()


def post_localSGD_optimizer_parity(out, rank, world, create_averager, grad_is_view):
    """_test_post_localSGD_optimizer_parity: SGD then averager.average_parameters
    by hand, against PostLocalSGDOptimizer, from the same model; each
    iteration's parameters, and whether the two models are bitwise equal."""
    learning_rate = 0.03
    ddp_net = init(Net())
    net = DDP(copy.deepcopy(ddp_net), gradient_as_bucket_view=grad_is_view)
    averager = create_averager()
    opt = torch.optim.SGD(net.parameters(), lr=learning_rate)
    net_using_post_localSGD_opt = DDP(copy.deepcopy(ddp_net), gradient_as_bucket_view=grad_is_view)
    averager2 = create_averager()
    post_localSGD_opt = post_localSGD_optimizer(net_using_post_localSGD_opt, learning_rate, averager2)
    input, target = data([world * 2, 2], 1), data([world * 2, 4], 2)
    loss_fn = nn.MSELoss()
    for i in range(20):
        perform_a_train_step(opt, net, loss_fn, input, target)
        averager.average_parameters(net.parameters())
        perform_a_train_step(post_localSGD_opt, net_using_post_localSGD_opt, loss_fn, input, target)
        out.params("iteration %d" % i, net_using_post_localSGD_opt.module)
        same = all(torch.equal(p1, p2) for p1, p2 in zip(net.parameters(), net_using_post_localSGD_opt.parameters()))
        out.text("iteration %d same as SGD and the averager" % i, int(same))
    out.text("averager.step", averager.step)
    out.text("averager2.step", averager2.step)


def test_post_localSGD_optimizer_parity(out, rank, world):
    post_localSGD_optimizer_parity(out, rank, world, periodic_model_averager, False)


def test_post_localSGD_optimizer_parity_grad_is_view(out, rank, world):
    post_localSGD_optimizer_parity(out, rank, world, periodic_model_averager, True)


def test_post_localSGD_optimizer_parity_with_hierarchical_sgd(out, rank, world):
    if world % 2 == 1:  # skip_if_odd_worldsize
        return out.text("skipped", "odd world size")
    post_localSGD_optimizer_parity(out, rank, world, hierarchical_model_averager, False)


def test_post_localSGD_optimizer_parity_with_hierarchical_sgd_grad_is_view(out, rank, world):
    if world % 2 == 1:
        return out.text("skipped", "odd world size")
    post_localSGD_optimizer_parity(out, rank, world, hierarchical_model_averager, True)


def test_post_localSGD_optimizer_step_reload(out, rank, world):
    """_test_post_localSGD_optimizer_step_reload: rank 0 saves the optimizer
    after 20 steps to a file every rank loads into a second optimizer; then
    the checkpoint without "step" warns and resets the step to 0."""
    learning_rate = 0.03
    net_using_post_localSGD_opt = DDP(init(Net()))
    averager = periodic_model_averager()
    post_localSGD_opt = post_localSGD_optimizer(net_using_post_localSGD_opt, learning_rate, averager)
    averager2 = periodic_model_averager()
    dummy_post_localSGD_opt = post_localSGD_optimizer(net_using_post_localSGD_opt, learning_rate, averager2)
    input, target = data([world * 2, 2], 1), data([world * 2, 4], 2)
    loss_fn = nn.MSELoss()
    for _ in range(20):
        perform_a_train_step(post_localSGD_opt, net_using_post_localSGD_opt, loss_fn, input, target)
    chkpt_file = os.path.join(os.environ["DDP_TEST_DIR"], "post_localSGD_py.pt")
    if rank == 0:
        torch.save({"optimizer_state_dict": post_localSGD_opt.state_dict()}, chkpt_file)
    dist.barrier()
    checkpoint = torch.load(chkpt_file)
    dummy_post_localSGD_opt.load_state_dict(checkpoint["optimizer_state_dict"])
    out.text("averager.step", averager.step)
    out.text("averager2.step after the load", averager2.step)
    del checkpoint["optimizer_state_dict"]["step"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dummy_post_localSGD_opt.load_state_dict(checkpoint["optimizer_state_dict"])
    if any("Loaded state dict does not contain a step counter for an averager. Setting step counter to 0."
           in str(w.message) for w in caught):
        out.text("the load without a step", "warned")
    out.text("averager2.step after the load without a step", averager2.step)
    out.params("parameters", net_using_post_localSGD_opt.module)


CASES = [(case.__name__, case) for case in [test_DistributedDataParallelCPU, test_DistributedDataParallelCPU_grad_is_view,
         test_DistributedDataParallel_requires_grad, test_ddp_create_graph, test_ddp_ignore_params_arg,
         test_ddp_unused_params_rebuild_buckets_exception, test_ddp_shared_grad_acc_unused_params,
         test_ddp_control_flow_different_across_ranks, test_ddp_inference, ddp_evaluation_after_training,
         test_ddp_static_graph_nested_types, test_ddp_returns_tensor_with_no_grad, test_ddp_new_tensor_in_fwd,
         test_ddp_new_tensor_in_fwd_static_graph, test_ddp_broadcast_buffer, test_accumulate_gradients_no_sync,
         test_accumulate_gradients_no_sync_grad_is_view, test_accumulate_gradients_no_sync_allreduce_hook,
         test_accumulate_gradients_no_sync_allreduce_with_then_hook, test_ddp_zero_output_features,
         test_grads_same_across_ranks_with_no_sync, test_invalid_static_graph, test_output_unused_in_loss_tuple_module,
         test_output_unused_in_loss_dict_module, test_ddp_sync_module_states, test_ddp_grad_div_uneven_inputs,
         test_ddp_join_model_equivalence, test_ddp_uneven_input_join_disable, test_ddp_uneven_input_exception,
         test_ddp_model_diff_shape_across_ranks, test_ddp_model_diff_num_params_across_ranks,
         test_ddp_multiple_nested_unused_params_error, test_ddp_multiple_nested_unused_params_err_ignore_params,
         test_ddp_control_flow_same_across_ranks, test_ddp_hook_parity_allreduce,
         test_ddp_hook_parity_allreduce_process_group, test_ddp_hook_parity_powerSGD,
         test_undefined_grad_parity_unused_parameters, test_static_graph_multi_forward,
         test_ddp_uneven_inputs_stop_iteration_sync_bn, test_ddp_uneven_inputs, test_ddp_logging_data_cpu,
         test_ddp_bucket_cap_mb_list, test_skip_all_reduce_unused_parameters, test_ddp_hook_parity_post_localSGD,
         test_post_localSGD_optimizer_parity, test_post_localSGD_optimizer_parity_grad_is_view,
         test_post_localSGD_optimizer_parity_with_hierarchical_sgd,
         test_post_localSGD_optimizer_parity_with_hierarchical_sgd_grad_is_view,
         test_post_localSGD_optimizer_step_reload]] + [
    ("test_c10d_gloo." + case.__name__[len("c10d_"):], case) for case in [
        c10d_test_global_local_unused_params_grad, c10d_test_global_local_unused_params_grad_with_grad_is_view,
        c10d_test_global_local_unused_params_grad_with_static_graph,
        c10d_test_find_unused_parameters_when_unused_parameters_empty, c10d_test_ignored_output,
        c10d_test_ignored_output_with_unused_parameters, c10d_test_ddp_comm_hook_future_passing_cpu,
        c10d_test_ddp_comm_hook_register_just_once, c10d_test_gloo_backend_cpu_module,
        c10d_test_gloo_backend_cpu_module_grad_is_view, c10d_test_save_load_checkpoint,
        c10d_test_broadcast_coalesced_gloo_cpu]] + [
    ("test_c10d_common." + case.__name__[len("c10d_"):], case) for case in [
        c10d_test_invalid_powerSGD_state, c10d_test_single_limit_single_dtype, c10d_test_single_limit_multi_dtype,
        c10d_test_multi_limit_single_dtype, c10d_test_multi_limit_multi_dtype, c10d_test_dataclass_output,
        c10d_test_dataclass_output_unused_param, c10d_test_ddp_buffer_sync_multi_forward_with_batchnorm]]


# Tests of test_c10d_*.py (not installed with PyTorch) newer than some
# PyTorch: the first version whose suite has them.
C10D_SINCE = {
    "test_c10d_common.test_dataclass_output": (2, 0),
    "test_c10d_common.test_dataclass_output_unused_param": (2, 0),
    "test_c10d_common.test_ddp_buffer_sync_multi_forward_with_batchnorm": (2, 12),
}


def in_this_pytorch(name):
    """Whether this PyTorch's suite has the test: distributed_test.py's read
    as text (importing it costs seconds), test_c10d_*.py's by C10D_SINCE. A
    port of a test this version lacks writes one line saying so, and the
    comparison skips the case (pytorch_parity_test.cpp)."""
    if "." in name:
        return tuple(int(v) for v in torch.__version__.split(".")[:2]) >= C10D_SINCE.get(name, (0, 0))
    return ("def %s(" % name) in distributed_test_source()


@functools.lru_cache(maxsize=None)
def distributed_test_source():
    import torch.testing._internal.distributed as package
    with open(os.path.join(os.path.dirname(package.__file__), "distributed_test.py")) as f:
        return f.read()


def main():
    directory = sys.argv[1]
    wanted = set(sys.argv[2].split(",")) if len(sys.argv) > 2 and sys.argv[2] else None
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out = Out(os.path.join(directory, "torch_r%d.txt" % rank))
    for name, case in CASES:
        if wanted is not None and name not in wanted:
            continue
        out.case = name
        if name.startswith("test_") and not in_this_pytorch(name):
            out.text("absent", "from PyTorch %s" % torch.__version__)
            continue
        case(out, rank, world)
        dist.barrier()
    out.write()
    parity_common.finish()


if __name__ == "__main__":
    main()
