"""torch.distributed's own collectives, the oracle of ddp::dist
(dist_test.cpp): every case of dist_worker.cpp run by PyTorch, each rank
writing <dir>/torch_r<rank>.txt in the same line format: collectives,
subgroups (one of them a gloo group made with new_group's backend),
point-to-point (a ring, a batch, a pipeline, tags, a receive from any
source) and the object collectives (objects shown by show()). Where the backend
lacks an op (PyTorch 1.13's Gloo: all_gather_into_tensor, reduce_scatter,
all_to_all, uneven lists), the line says "unsupported", and an "expect"
line gives the result computed here from every rank's inputs, for the
backends that have it (our MPI). Usage: pytorch_dist_parity.py DIR [BACKEND]
(gloo, or nccl with CUDA tensors; rank and world from torchrun's variables)."""
import os
import struct
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))  # parity_common
import parity_common

DEVICE = torch.device("cpu")

DTYPES = {"f32": torch.float32, "f64": torch.float64, "f16": torch.float16, "i64": torch.int64,
          "i32": torch.int32, "u8": torch.uint8}
NAMES = {v: k for k, v in DTYPES.items()}


def val(shape, dtype, seed, rank, bits=False):
    """Deterministic inputs whose sums and products are exact in every
    order: quarters in [-1.25, 1.25] for floats, small integers otherwise
    (non-negative for bitwise ops and uint8)."""
    n = 1
    for s in shape:
        n *= s
    k = torch.arange(n, dtype=torch.int64) * 3 + seed * 7 + rank * 5
    if bits or dtype == torch.uint8:
        v = k % 16
    else:
        v = k % 11 - 5
    v = v.reshape(shape)
    if dtype.is_floating_point:
        return (v.double() / 4).to(dtype).to(DEVICE)
    return v.to(dtype).to(DEVICE)


def zeros(shape, dtype=torch.float32):
    return torch.zeros(shape, dtype=dtype, device=DEVICE)


def line(name, t):
    t = t.detach().cpu().contiguous()
    if t.dtype.is_floating_point:
        vals = t.double().view(torch.int64).reshape(-1).tolist()
    else:
        vals = t.long().reshape(-1).tolist()
    shape = "x".join(str(s) for s in t.shape) or "scalar"
    return "%s %s %s : %s" % (name, NAMES[t.dtype], shape, " ".join(str(v) for v in vals))


class Out:
    def __init__(self, path):
        self.lines = []
        self.path = path

    def add(self, name, t):
        self.lines.append(line(name, t))

    def text(self, name, s):
        self.lines.append("%s %s" % (name, s))

    def unsupported(self, name, expect=None):
        self.lines.append("%s unsupported" % name)
        if expect is not None:
            self.lines.append(line("expect " + name, expect))

    def write(self):
        with open(self.path, "w") as f:
            f.write("\n".join(self.lines) + "\n")


def reduce_all(ts, op):
    out = ts[0].clone()
    for t in ts[1:]:
        if op == "SUM":
            out = out + t
        elif op == "PRODUCT":
            out = out * t
        elif op == "MIN":
            out = torch.minimum(out, t)
        elif op == "MAX":
            out = torch.maximum(out, t)
    return out


def main():
    global DEVICE
    out_dir = sys.argv[1]
    backend = sys.argv[2] if len(sys.argv) > 2 else "gloo"
    if backend == "nccl":
        DEVICE = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(DEVICE)
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    src1 = 1 if world > 1 else 0
    out = Out(os.path.join(out_dir, "torch_r%d.txt" % rank))
    last = world - 1

    # all_reduce, every op and dtype Gloo reduces
    for op in ["SUM", "PRODUCT", "MIN", "MAX"]:
        for d in ["f32", "f64", "i64", "i32"]:
            t = val((3, 5), DTYPES[d], 1, rank)
            dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
            out.add("all_reduce_%s_%s" % (op, d), t)
    for op in ["BAND", "BOR", "BXOR"]:
        for d in ["i64", "i32"]:
            t = val((3, 5), DTYPES[d], 2, rank, bits=True)
            try:  # not in NCCL
                dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
                out.add("all_reduce_%s_%s" % (op, d), t)
            except (RuntimeError, ValueError):
                out.unsupported("all_reduce_%s_%s" % (op, d))
    t = val((7,), torch.float16, 3, rank)
    dist.all_reduce(t)
    out.add("all_reduce_SUM_f16", t)
    base = val((5, 3), torch.float32, 4, rank)
    try:  # a non-contiguous view, reduced in place; PyTorch 2.x's NCCL refuses it
        dist.all_reduce(base.t())
        out.add("all_reduce_view", base)
    except (RuntimeError, ValueError):
        out.unsupported("all_reduce_view")
    t = val((4,), torch.float32, 5, rank)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True).wait()
    out.add("all_reduce_async", t)
    if backend == "nccl":  # PREMUL_SUM: NCCL's only
        t = val((4,), torch.float32, 56, rank)
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(2.0))
        out.add("all_reduce_premul_sum", t)

    # reduce: the result on dst only
    for op in ["SUM", "MAX"]:
        t = val((2, 3), torch.float32, 6, rank)
        dist.reduce(t, dst=last, op=getattr(dist.ReduceOp, op))
        if rank == last:
            out.add("reduce_%s" % op, t)

    # broadcast from rank 1
    for d in ["f32", "i64", "f16", "u8"]:
        t = val((2, 4), DTYPES[d], 7, rank)
        dist.broadcast(t, src=src1)
        out.add("broadcast_%s" % d, t)

    # all_gather into a list
    for d in ["f32", "i64"]:
        lst = [zeros((2, 3), DTYPES[d]) for _ in range(world)]
        dist.all_gather(lst, val((2, 3), DTYPES[d], 8, rank))
        for r, t in enumerate(lst):
            out.add("all_gather_%s_%d" % (d, r), t)
    # uneven sizes: Gloo refuses them (rank r gives r + 1 values)
    everyone = [val((r + 1,), torch.float32, 9, r) for r in range(world)]
    try:
        lst = [zeros(r + 1) for r in range(world)]
        dist.all_gather(lst, everyone[rank])
        out.add("all_gather_uneven", torch.cat(lst))
    except RuntimeError:
        out.unsupported("all_gather_uneven", torch.cat(everyone))

    # all_gather_into_tensor: not in 1.13's Gloo
    ins = [val((2, 2), torch.float32, 10, r) for r in range(world)]
    try:
        o = zeros((2 * world, 2))
        dist.all_gather_into_tensor(o, ins[rank])
        out.add("all_gather_into_tensor", o)
    except (RuntimeError, AttributeError):
        out.unsupported("all_gather_into_tensor", torch.cat(ins))

    # gather to 0, scatter from the last rank
    t = val((3,), torch.float32, 11, rank)
    lst = [zeros(3) for _ in range(world)] if rank == 0 else None
    dist.gather(t, lst, dst=0)
    if rank == 0:
        out.add("gather", torch.cat(lst))
    t = zeros(4, torch.int64)
    lst = [val((4,), torch.int64, 12, r) * (r + 1) for r in range(world)] if rank == last else None
    dist.scatter(t, lst, src=last)
    out.add("scatter", t)

    # reduce_scatter (a list, and one tensor): not in 1.13's Gloo
    ins = [[val((3,), torch.float32, 13 + d, r) for d in range(world)] for r in range(world)]
    try:
        o = zeros(3)
        dist.reduce_scatter(o, ins[rank])
        out.add("reduce_scatter", o)
    except RuntimeError:
        out.unsupported("reduce_scatter", reduce_all([ins[r][rank] for r in range(world)], "SUM"))
    ins = [val((world * 2,), torch.float32, 20, r) for r in range(world)]
    try:
        o = zeros(2)
        dist.reduce_scatter_tensor(o, ins[rank], op=dist.ReduceOp.MAX)
        out.add("reduce_scatter_tensor", o)
    except (RuntimeError, AttributeError):
        out.unsupported("reduce_scatter_tensor", reduce_all([i[2 * rank:2 * rank + 2] for i in ins], "MAX"))

    # all_to_all with lists (uneven: rank r sends r + d + 1 values to rank d): not in 1.13's Gloo
    ins = [[val((r + d + 1,), torch.float32, 21 + d, r) for d in range(world)] for r in range(world)]
    try:
        outs = [zeros(s + rank + 1) for s in range(world)]
        dist.all_to_all(outs, ins[rank])
        out.add("all_to_all", torch.cat(outs))
    except RuntimeError:
        out.unsupported("all_to_all", torch.cat([ins[s][rank] for s in range(world)]))

    # all_to_all_single, even and uneven
    t = val((2 * world, 3), torch.float32, 30, rank)
    o = zeros((2 * world, 3))
    dist.all_to_all_single(o, t)
    out.add("all_to_all_single", o)
    ins = [val((sum(r + d + 1 for d in range(world)), 2), torch.float64, 31, r) for r in range(world)]
    o = zeros((sum(s + rank + 1 for s in range(world)), 2), torch.float64)
    dist.all_to_all_single(o, ins[rank], output_split_sizes=[s + rank + 1 for s in range(world)],
                           input_split_sizes=[rank + d + 1 for d in range(world)])
    out.add("all_to_all_single_uneven", o)

    # subgroups: every rank but 0, and the first and last ranks (from 2 ranks on)
    if world > 1:
        subgroups(out, rank, world, last)
        point_to_point(out, rank, world, backend)
    objects(out, rank, world, last, src1)
    dist.barrier()
    out.text("get", "%d %d %s" % (dist.get_rank(), dist.get_world_size(), dist.get_backend()))
    out.write()
    parity_common.finish()


def subgroups(out, rank, world, last):
    g1 = dist.new_group(list(range(1, world)))
    g2 = dist.new_group([last, 0])
    for name, g in [("g1", g1), ("g2", g2)]:
        member = g != dist.GroupMember.NON_GROUP_MEMBER
        out.text("rank_in_" + name, "%d %d" % (dist.get_rank(g), dist.get_world_size(g) if member else -1))
    if g2 != dist.GroupMember.NON_GROUP_MEMBER:
        t = val((5,), torch.float32, 40, rank)
        dist.all_reduce(t, group=g2)
        out.add("g2_all_reduce", t)
    if g1 != dist.GroupMember.NON_GROUP_MEMBER:
        t = val((3,), torch.int64, 41, rank)
        dist.broadcast(t, src=last, group=g1)
        out.add("g1_broadcast", t)
        lst = [zeros(2) for _ in range(world - 1)]
        dist.all_gather(lst, val((2,), torch.float32, 42, rank), group=g1)
        out.add("g1_all_gather", torch.cat(lst))
        if world > 2:
            t = val((2,), torch.float32, 43, rank)
            dist.reduce(t, dst=1, op=dist.ReduceOp.MIN, group=g1)
            if rank == 1:
                out.add("g1_reduce", t)
        if world > 2:  # point-to-point on a group without rank 0: global ranks in, the sender's out
            if rank == 1:
                dist.send(val((2,), torch.float32, 44, rank), dst=last, group=g1)
                dist.isend(val((2,), torch.float32, 45, rank), dst=last, group=g1).wait()
            elif rank == last:
                t = zeros(2)
                out.text("g1_recv_sender", str(dist.recv(t, group=g1)))
                out.add("g1_recv", t)
                t = zeros(2)
                w = dist.irecv(t, group=g1)
                w.wait()
                out.text("g1_irecv_source_rank", str(w._source_rank()))
                out.add("g1_irecv", t)


def show(v):
    """An object as text, the same in dist_worker.cpp's show()."""
    if v is None:
        return "None"
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "f%d" % struct.unpack("<q", struct.pack("<d", v))[0]
    if isinstance(v, str):
        return "'%s'" % v
    if isinstance(v, torch.Tensor):
        return "T<%s>" % line("", v).strip()
    if isinstance(v, list):
        return "[" + ", ".join(show(x) for x in v) + "]"
    if isinstance(v, tuple):
        return "(" + ", ".join(show(x) for x in v) + ")"
    if isinstance(v, dict):
        return "{" + ", ".join(show(k) + ": " + show(x) for k, x in v.items()) + "}"
    raise TypeError(type(v))


def obj(r):
    """What rank r exchanges: strings, numbers, tensors, nested containers."""
    return {"rank": r, "name": "rank%d" % r, "values": [r, r * 0.25 - 1.5, r % 2 == 0, None],
            "pair": (r, "x" * r), "t": val((2, 3), torch.float32, 60, r), "i": val((r + 1,), torch.int64, 61, r),
            "nested": {"deep": [[r], [r, r + 1]]}}


def objects(out, rank, world, last, src1):
    lst = [None] * world
    dist.all_gather_object(lst, obj(rank))
    for r, o in enumerate(lst):
        out.text("all_gather_object_%d" % r, show(o))
    got = [None] * world if rank == last else None
    dist.gather_object(obj(rank + 10), got, dst=last)
    if rank == last:
        for r, o in enumerate(got):
            out.text("gather_object_%d" % r, show(o))
    objs = [obj(20 + rank), "plain", 42] if rank == src1 else [None, None, None]
    dist.broadcast_object_list(objs, src=src1)
    out.text("broadcast_object_list", show(objs))
    mine = [None]
    dist.scatter_object_list(mine, [obj(30 + r) for r in range(world)] if rank == 0 else None, src=0)
    out.text("scatter_object_list", show(mine[0]))


def point_to_point(out, rank, world, backend):
    nxt, prv, last = (rank + 1) % world, (rank - 1 + world) % world, world - 1
    s, r = val((4,), torch.float32, 50, rank), zeros(4)
    for w in [dist.isend(s, nxt), dist.irecv(r, prv)]:
        w.wait()
    out.add("p2p_ring", r)
    s, r = val((3,), torch.int64, 51, rank), zeros(3, torch.int64)
    for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, s, prv), dist.P2POp(dist.irecv, r, nxt)]):
        w.wait()
    out.add("p2p_batch_ring", r)
    t = zeros((2,), torch.float64)  # a pipeline: each rank adds its part and passes it on
    if rank > 0:
        dist.recv(t, src=rank - 1)
    t += val((2,), torch.float64, 52, rank)
    if rank < world - 1:
        dist.send(t, dst=rank + 1)
    else:
        out.add("p2p_pipeline", t)
    for d in ["f16", "u8"]:
        if rank == 0:
            dist.send(val((3,), DTYPES[d], 53, 0), dst=last)
        elif rank == last:
            t = zeros(3, DTYPES[d])
            dist.recv(t, src=0)
            out.add("p2p_" + d, t)
    if rank == 0:  # tags: sent 4 then 3, received 3 then 4
        for w in [dist.isend(val((2,), torch.float32, 54, 0), 1, tag=4),
                  dist.isend(val((2,), torch.float32, 55, 0), 1, tag=3)]:
            w.wait()
    elif rank == 1:
        a, b = zeros(2), zeros(2)
        dist.recv(a, src=0, tag=3)
        dist.recv(b, src=0, tag=4)
        out.add("p2p_tag3", a)
        out.add("p2p_tag4", b)
    if backend == "nccl":
        out.unsupported("p2p_any_source")
    elif rank == 0:  # from any source: the sender is returned
        got = []
        for _ in range(world - 1):
            t = zeros(1, torch.int64)
            sender = dist.recv(t, tag=7)
            got.append("%d:%d" % (sender, t.item()))
        out.text("p2p_any_source", " ".join(sorted(got)))
    else:
        dist.send(torch.tensor([rank * 10], device=DEVICE), dst=0, tag=7)
    g3 = dist.new_group([0, world - 1], backend="gloo")  # a gloo group whatever the default's backend
    if rank in (0, world - 1):
        t = val((3,), torch.float32, 70, rank).cpu()
        dist.all_reduce(t, group=g3)
        out.add("g3_gloo_all_reduce", t)
        lst = [None, None]
        dist.all_gather_object(lst, "from %d" % rank, group=g3)
        out.text("g3_all_gather_object", show(lst))


if __name__ == "__main__":
    main()
