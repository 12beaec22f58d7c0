#!/usr/bin/python3
"""Two builds of ddp_bench_lenet side by side: the LeNet bench's ddp mode (2 ranks,
Gloo over loopback, one core a rank) run by build A, then by build B, as pairs
whose order alternates, so that the machine's drift falls on both alike. Prints
every pair, its B/A ratio, and the median and spread of the ratios.

  /usr/bin/python3 bench/run_ab_lenet.py --a /tmp/before/build/bench/ddp_bench_lenet \\
      --b build/bench/ddp_bench_lenet --pairs 8

A run disturbed by other processes is run again (run_lenet_bench.py's rule)."""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_lenet_bench as lenet  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="ddp_bench_lenet of build A (before)")
    ap.add_argument("--b", required=True, help="ddp_bench_lenet of build B (after)")
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--flags", default="--mode ddp", help="the bench's flags for the mode compared")
    args = ap.parse_args()
    # run_lenet_bench's run_mode reads these.
    args.timeout, args.wait_idle, args.max_foreign, args.retries, args.pin = 900, 60, 0.25, 2, False
    args.python = "/usr/bin/python3"
    common = ["--model", "lenet", "--iters", str(args.iters), "--warmup", str(args.warmup), "--batch", str(args.batch)]
    flags = args.flags.split()
    print(f"A {args.a}\nB {args.b}\nflags {args.flags}; {args.pairs} pairs x {args.iters} timed steps "
          f"(+{args.warmup} warm-up), 2 ranks; the slower rank's it/s", flush=True)
    ratios = []
    for k in range(args.pairs):
        order = ["a", "b"] if k % 2 == 0 else ["b", "a"]
        its = {}
        for which in order:
            args.bin = getattr(args, which)
            res = lenet.run_mode(args, "cpp", flags, common, 2, which)
            its[which] = min(r["it_s"] for r in res)
        ratios.append(its["b"] / its["a"])
        print(f"  pair {k + 1}/{args.pairs} ({'A first' if order[0] == 'a' else 'B first'}): "
              f"A {its['a']:.2f} it/s, B {its['b']:.2f} it/s, B/A {ratios[-1]:.3f}", flush=True)
    print(f"B/A: median {statistics.median(ratios):.3f}, min {min(ratios):.3f}, max {max(ratios):.3f} "
          f"over {len(ratios)} pairs")


if __name__ == "__main__":
    main()
