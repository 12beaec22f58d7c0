"""Reads ddp::SummaryWriter's event files with TensorBoard itself.

  check_tensorboard.py writer OURS THEIRS
      OURS: what summary_writer_test.cpp's write_the_calls wrote. Writes the
      same calls with torch.utils.tensorboard.SummaryWriter into THEIRS,
      checks every tag, step and value of OURS through TensorBoard's
      EventAccumulator (histogram buckets, text, hparams, the purge of a
      resumed writer, a torn last record skipped), then compares OURS and
      THEIRS record for record (wall times aside; a histogram's sum and sum of
      squares to 1e-6 relative).
  check_tensorboard.py run RUN_DIR TAG...
      A training kit's run folder: every TAG is there, every scalar tag's
      steps increase without repeating after the purges, and the hparams
      folder holds the options.
Prints "check_tensorboard: <mode> OK", or what differs and exits 1.
"""
import glob
import math
import os
import shutil
import struct
import sys
import time

from tensorboard.backend.event_processing import event_accumulator as ea_mod
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
from tensorboard.plugins.hparams import plugin_data_pb2

problems = []
PYTORCH_BINS = []


def expect(cond, what):
    if not cond:
        problems.append(what)


def accumulator(folder):
    acc = ea_mod.EventAccumulator(folder, size_guidance={ea_mod.SCALARS: 0, ea_mod.HISTOGRAMS: 0, ea_mod.TENSORS: 0})
    acc.Reload()
    return acc


def records(path):
    """The records of one file, both CRCs checked; stops at a torn one."""
    data = open(path, "rb").read()
    out, at = [], 0
    while at + 12 <= len(data):
        (length,) = struct.unpack("<Q", data[at:at + 8])
        (crc,) = struct.unpack("<I", data[at + 8:at + 12])
        if crc != masked_crc32c(data[at:at + 8]) or at + 16 + length > len(data):
            break
        body = data[at + 12:at + 12 + length]
        (crc,) = struct.unpack("<I", data[at + 12 + length:at + 16 + length])
        expect(crc == masked_crc32c(body), f"{path}: record at byte {at}: data CRC differs")
        out.append(body)
        at += 16 + length
    expect(at == len(data), f"{path}: {len(data) - at} bytes after the last whole record")
    return out


def events_by_folder(top):
    found = {}
    for path in sorted(glob.glob(os.path.join(top, "**", "events.out.tfevents.*"), recursive=True)):
        folder = os.path.relpath(os.path.dirname(path), top)
        for body in records(path):
            e = event_pb2.Event()
            e.ParseFromString(body)
            found.setdefault(folder, []).append(e)
    return found


def the_calls(top):
    """What summary_writer_test.cpp's write_the_calls does, with PyTorch's writer."""
    import torch
    from torch.utils.tensorboard import SummaryWriter
    with SummaryWriter(top) as w:
        PYTORCH_BINS.append(w.default_bins)  # bins='tensorflow', PyTorch's own list
        w.add_scalar("loss", 0.5, 1)
        w.add_scalar("loss", 0.25, 2)
        w.add_scalar("weird/nan", float("nan"), 3)
        w.add_scalar("weird/inf", float("inf"), 3)
        w.add_scalar("weird/inf", float("-inf"), 4)
        w.add_scalar("unicode/\u03bb", 1.0 / 3.0, 5)
        w.add_scalars("run/x", {"a": 1.0, "b": 2.0}, 6)
        w.add_histogram("hist/values", histogram_values(), 7)
        w.add_histogram("hist/tensor", torch.arange(-2.0, 2.0, 0.25), 7)
        w.add_text("notes", "# a title\nline \u03bb", 8)
        w.add_hparams({"amp": True, "bs": 64, "lr": 0.1, "opt": "sgd"}, {"hparam/acc": 0.9}, run_name="hp",
                      global_step=9)
    with SummaryWriter(os.path.join(top, "purge")) as first:
        for s in range(1, 4):
            first.add_scalar("p", s, s)
    made = int(time.time())  # as summary_writer_test.cpp: the resumed file from a later second
    while int(time.time()) == made:
        time.sleep(0.02)
    with SummaryWriter(os.path.join(top, "purge"), purge_step=2) as resumed:
        for s in range(2, 5):
            resumed.add_scalar("p", 10 * s, s)


def histogram_values():
    import numpy as np
    values = [float(i * i % 97 - 40) * 0.173 for i in range(200)] + [0.0, 1e-12, -1e-13, 2.5e19, 3e20, -7e20]
    return np.array(values)


def check_ours(ours):
    import numpy as np
    import torch
    from torch.utils.tensorboard.summary import make_histogram
    acc = accumulator(ours)
    scalars = {t: [(s.step, s.value) for s in acc.Scalars(t)] for t in acc.Tags()["scalars"]}
    expect(scalars.get("loss") == [(1, 0.5), (2, 0.25)], f"loss: {scalars.get('loss')}")
    nan = scalars.get("weird/nan", [])
    expect(len(nan) == 1 and math.isnan(nan[0][1]), f"weird/nan: {nan}")
    expect(scalars.get("weird/inf") == [(3, math.inf), (4, -math.inf)], f"weird/inf: {scalars.get('weird/inf')}")
    lam = scalars.get("unicode/\u03bb", [])
    expect(len(lam) == 1 and lam[0][1] == float(np.float32(1.0 / 3.0)), f"unicode: {lam}")
    for key, value in (("a", 1.0), ("b", 2.0)):
        sub = accumulator(os.path.join(ours, "run_x_" + key))
        got = [(s.step, s.value) for s in sub.Scalars("run/x")]
        expect(got == [(6, value)], f"run_x_{key}: {got}")
    # The buckets: PyTorch's own make_histogram over its default bins.
    edges = PYTORCH_BINS[0]
    for tag, values in (("hist/values", histogram_values()), ("hist/tensor", torch.arange(-2.0, 2.0, 0.25).numpy())):
        want = make_histogram(values.astype(float), edges)
        got = acc.Histograms(tag)
        expect(len(got) == 1 and got[0].step == 7, f"{tag}: {len(got)} records")
        if got:
            h = got[0].histogram_value
            expect(list(h.bucket_limit) == list(want.bucket_limit), f"{tag}: bucket limits differ")
            expect(list(h.bucket) == list(want.bucket), f"{tag}: bucket counts {list(h.bucket)} != {list(want.bucket)}")
            expect((h.min, h.max, h.num) == (want.min, want.max, want.num), f"{tag}: min, max, num")
            expect(math.isclose(h.sum, want.sum, rel_tol=1e-6, abs_tol=1e-9), f"{tag}: sum {h.sum} != {want.sum}")
            expect(math.isclose(h.sum_squares, want.sum_squares, rel_tol=1e-6), f"{tag}: sum_squares")
    text = acc.Tensors("notes/text_summary")
    expect(len(text) == 1 and text[0].step == 8 and text[0].tensor_proto.string_val[0].decode() == "# a title\nline \u03bb",
           f"text: {text}")
    check_hparams(os.path.join(ours, "hp"), {"amp": 1.0, "bs": 64.0, "lr": 0.1, "opt": "sgd"}, {"hparam/acc": 0.9})
    purge = accumulator(os.path.join(ours, "purge"))
    got = [(s.step, s.value) for s in purge.Scalars("p")]
    expect(got == [(1, 1.0), (2, 20.0), (3, 30.0), (4, 40.0)], f"purge: {got}")
    check_torn_tail(ours)


def check_hparams(folder, values, metrics):
    acc = accumulator(folder)
    meta = acc.SummaryMetadata("_hparams_/session_start_info")
    data = plugin_data_pb2.HParamsPluginData()
    data.ParseFromString(meta.plugin_data.content)
    got = {}
    for k, v in data.session_start_info.hparams.items():
        got[k] = v.string_value if v.WhichOneof("kind") == "string_value" else v.number_value
    expect(got == values, f"{folder}: hparams {got} != {values}")
    exp = plugin_data_pb2.HParamsPluginData()
    exp.ParseFromString(acc.SummaryMetadata("_hparams_/experiment").plugin_data.content)
    expect(sorted(m.name.tag for m in exp.experiment.metric_infos) == sorted(metrics), f"{folder}: metric infos")
    expect(sorted(h.name for h in exp.experiment.hparam_infos) == sorted(values), f"{folder}: hparam infos")
    for tag, value in metrics.items():
        s = acc.Scalars(tag)
        expect(len(s) == 1 and math.isclose(s[0].value, value, rel_tol=1e-6), f"{folder}: metric {tag}: {s}")


def check_torn_tail(ours):
    """A file cut inside its last record: TensorBoard reads the records before it."""
    path = sorted(glob.glob(os.path.join(ours, "events.out.tfevents.*")))[0]
    torn = os.path.join(os.path.dirname(ours), "torn")
    os.makedirs(torn, exist_ok=True)
    data = open(path, "rb").read()
    whole = len(records(path))
    cut = os.path.join(torn, os.path.basename(path))
    with open(cut, "wb") as f:
        f.write(data[:-7])
    acc = accumulator(torn)
    counted = sum(len(acc.Scalars(t)) for t in acc.Tags()["scalars"])
    counted += sum(len(acc.Histograms(t)) for t in acc.Tags()["histograms"])
    counted += sum(len(acc.Tensors(t)) for t in acc.Tags()["tensors"])
    # whole - 1 records minus the file_version one: the last (the text) is torn.
    expect(counted == whole - 2, f"torn file: {counted} records read, {whole - 2} expected")
    shutil.rmtree(torn)


def same_event(a, b, where):
    a.wall_time = b.wall_time = 0
    # The writer's name in a file's first record: ours is ours.
    if a.source_metadata.writer == "ddp.SummaryWriter" and b.source_metadata.writer:
        a.source_metadata.writer = b.source_metadata.writer
    for va, vb in zip(a.summary.value, b.summary.value):
        if va.metadata.plugin_data.plugin_name == "hparams" == vb.metadata.plugin_data.plugin_name:
            # Maps serialise in any order: compare the messages.
            pa, pb = plugin_data_pb2.HParamsPluginData(), plugin_data_pb2.HParamsPluginData()
            pa.ParseFromString(va.metadata.plugin_data.content)
            pb.ParseFromString(vb.metadata.plugin_data.content)
            expect(pa == pb, f"{where}: hparams plugin data\n{pa}\n!=\n{pb}")
            va.metadata.plugin_data.content = vb.metadata.plugin_data.content = b""
    for va, vb in zip(a.summary.value, b.summary.value):
        if va.HasField("histo") and vb.HasField("histo"):
            for f in ("sum", "sum_squares"):
                x, y = getattr(va.histo, f), getattr(vb.histo, f)
                expect(math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-12), f"{where}: histogram {f} {x} != {y}")
                setattr(va.histo, f, 0)
                setattr(vb.histo, f, 0)
    if a != b:
        problems.append(f"{where}: ours\n{a}\ntheirs\n{b}")


def compare(ours, theirs):
    a, b = events_by_folder(ours), events_by_folder(theirs)
    expect(sorted(a) == sorted(b), f"folders: ours {sorted(a)}, theirs {sorted(b)}")
    for folder in sorted(set(a) & set(b)):
        ea, eb = a[folder], b[folder]
        expect(len(ea) == len(eb), f"{folder}: {len(ea)} records, PyTorch's {len(eb)}")
        for i, (x, y) in enumerate(zip(ea, eb)):
            same_event(x, y, f"{folder} record {i}")


def check_run(run_dir, tags):
    acc = accumulator(run_dir)
    have = set(acc.Tags()["scalars"]) | set(acc.Tags()["tensors"])
    for tag in tags:
        expect(tag in have, f"{run_dir}: no tag {tag} (has {sorted(have)})")
    for tag in acc.Tags()["scalars"]:
        steps = [s.step for s in acc.Scalars(tag)]
        expect(steps == sorted(set(steps)), f"{run_dir}: {tag}: steps {steps} repeat or go back")
    if "epoch" in acc.Tags()["scalars"]:
        epochs = [s.value for s in acc.Scalars("epoch")]
        expect(epochs == list(range(1, len(epochs) + 1)), f"{run_dir}: epochs {epochs}, each once in order expected")
    hp = [d for d in glob.glob(os.path.join(run_dir, "*")) if os.path.isdir(d) and d.split("/")[-1][0].isdigit()]
    expect(hp, f"{run_dir}: no add_hparams folder")
    for folder in hp:
        meta = accumulator(folder).SummaryMetadata("_hparams_/session_start_info")
        data = plugin_data_pb2.HParamsPluginData()
        data.ParseFromString(meta.plugin_data.content)
        expect("lr" in data.session_start_info.hparams, f"{folder}: no lr among the hparams")
    return acc


def main():
    mode = sys.argv[1]
    if mode == "writer":
        ours, theirs = sys.argv[2], sys.argv[3]
        the_calls(theirs)
        check_ours(ours)
        compare(ours, theirs)
    elif mode == "run":
        check_run(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(f"check_tensorboard: unknown mode {mode}")
    if problems:
        print("\n".join(problems))
        sys.exit(1)
    print(f"check_tensorboard: {mode} OK")


if __name__ == "__main__":
    main()
