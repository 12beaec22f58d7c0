#!/usr/bin/env python3
"""A chart of a run folder's TensorBoard files, read back with TensorBoard's
own EventAccumulator (not metrics.csv): the per-step training loss, the
epochs' train and test loss and the test accuracy over the optimizer step,
drawn with matplotlib where this Python has it, else with gnuplot.

  ~/.cache/libddp/torch2/bin/python bench/plot_tensorboard.py runs/lenet docs/img/tensorboard_lenet.png
"""
import os
import subprocess
import sys
import tempfile

from tensorboard.backend.event_processing import event_accumulator as ea


def series(run_dir):
    acc = ea.EventAccumulator(run_dir, size_guidance={ea.SCALARS: 0})
    acc.Reload()
    have = acc.Tags()["scalars"]
    return {t: [(s.step, s.value) for s in acc.Scalars(t)] for t in
            ("train/step_loss", "train/loss", "test/loss", "test/acc") if t in have}


def with_matplotlib(data, out, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, left = plt.subplots(figsize=(8, 4.5), dpi=100)
    for tag, style in (("train/step_loss", "-"), ("train/loss", "o-"), ("test/loss", "s-")):
        if tag in data:
            left.plot(*zip(*data[tag]), style, label=tag)
    left.set_xlabel("optimizer step")
    left.set_ylabel("loss")
    right = left.twinx()
    if "test/acc" in data:
        right.plot(*zip(*data["test/acc"]), "^-", color="tab:red", label="test/acc")
    right.set_ylabel("accuracy")
    fig.legend(loc="lower left")
    left.set_title(title, y=-0.25)
    fig.tight_layout()
    fig.savefig(out)


def with_gnuplot(data, out, title):
    tmp = tempfile.mkdtemp()
    plots = []
    for tag, style, axes in (("train/step_loss", "lines", "x1y1"), ("train/loss", "linespoints", "x1y1"),
                             ("test/loss", "linespoints", "x1y1"), ("test/acc", "linespoints", "x1y2")):
        if tag not in data:
            continue
        path = os.path.join(tmp, tag.replace("/", "_") + ".dat")
        with open(path, "w") as f:
            f.writelines(f"{s} {v}\n" for s, v in data[tag])
        plots.append(f"'{path}' using 1:2 with {style} axes {axes} title '{tag}'")
    script = (f"set terminal pngcairo size 800,450\nset output '{out}'\nset title '{title}' noenhanced\n"
              "set xlabel 'optimizer step'\nset ylabel 'loss'\nset y2label 'accuracy'\nset y2tics\n"
              "set ytics nomirror\nset key noenhanced bottom left box opaque\nplot " + ", ".join(plots) + "\n")
    subprocess.run(["gnuplot"], input=script, text=True, check=True)


def main():
    run_dir, out = sys.argv[1], sys.argv[2]
    data = series(run_dir)
    if not data:
        sys.exit(f"{run_dir}: no scalars of the kit's")
    title = f"{os.path.basename(os.path.normpath(run_dir))}: read from its TensorBoard files"
    try:
        with_matplotlib(data, out, title)
    except ImportError:
        with_gnuplot(data, out, title)
    print(f"plot_tensorboard: {out}")


if __name__ == "__main__":
    main()
