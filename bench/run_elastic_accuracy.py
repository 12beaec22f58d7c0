#!/usr/bin/python3
"""Elastic jobs against unchanged ones: the LeNet example on
Fashion-MNIST, launched by ddprun over the c10d rendezvous on this machine
(one ddprun per "node", one worker each, OMP_NUM_THREADS=1). First the
run-to-run spread of an unchanged 2-node job, one run per --seeds; then each
elastic scenario at each --scenario-seeds (default: the first seed):

  grow    2 nodes of --nnodes 2:3; a third starts once epoch 1 is logged,
          plus --delay seconds (so it arrives inside epoch 2)
  shrink  3 nodes of 2:3; one is killed (SIGKILL) at that moment
  dip     2 nodes of 1:2; one is killed then, another starts once epoch 2 is
          logged plus --delay

Prints every run's final test accuracy and the spread, and writes OUT/elastic.csv.

  /usr/bin/python3 bench/run_elastic_accuracy.py                  # about 15 min on the 2-core VM
  /usr/bin/python3 bench/run_elastic_accuracy.py --epochs 1 --seeds 1,2 --scenarios grow   # a smoke test
"""
import argparse
import csv
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def final_accuracy(run_dir):
    """The last epoch's test accuracy ("epoch N: ... test acc A"), not the
    best one that the log's last line gives."""
    acc = None
    with open(os.path.join(run_dir, "log.txt")) as f:
        for line in f:
            m = re.search(r"^epoch [0-9]+:.* test acc ([0-9.]+)", line)
            if m:
                acc = float(m.group(1))
    return acc


def wait_for_log(run_dir, needle, timeout=1800):
    end = time.time() + timeout
    path = os.path.join(run_dir, "log.txt")
    while time.time() < end:
        if os.path.exists(path) and needle in open(path).read():
            return True
        time.sleep(0.5)
    return False


class Job:
    def __init__(self, args, name, seed, nnodes):
        self.args, self.nnodes = args, nnodes
        self.run_dir = os.path.join(args.out, name)
        shutil.rmtree(self.run_dir, ignore_errors=True)
        os.makedirs(self.run_dir)
        with socket.socket() as s:  # a free port: other jobs on the machine hold random ones
            s.bind(("127.0.0.1", 0))
            self.port = str(s.getsockname()[1])
        self.seed = seed
        self.nodes = []

    def start_node(self):
        a = self.args
        i = len(self.nodes)
        cmd = [a.ddprun, "--nnodes", self.nnodes, "--nproc-per-node", "1", "--rdzv-backend", "c10d",
               "--rdzv-endpoint", "127.0.0.1:" + self.port, "--rdzv-id", "bench", "--rdzv-conf",
               # The first node hosts the store (on one machine every node could): the
               # scenarios kill others, as losing the store's host ends a job.
               "last_call_timeout=2,is_host=%d" % (i == 0), "--max-restarts", "3", a.lenet, "--epochs", str(a.epochs),
               "--global-batch-size", "96", "--seed", str(self.seed), "--run-dir", self.run_dir,
               "--data-dir", a.data_dir]
        log = open(os.path.join(self.run_dir, "node%d.txt" % i), "w")
        env = dict(os.environ, OMP_NUM_THREADS="1")
        self.nodes.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env))
        return self.nodes[-1]

    def wait(self, alive):
        codes = [n.wait() for n in alive]
        return codes


def run(args, name, seed, scenario):
    t0 = time.time()
    if scenario == "unchanged":
        job = Job(args, name, seed, "2")
        job.start_node(), job.start_node()
        codes = job.wait(job.nodes)
    elif scenario == "grow":
        job = Job(args, name, seed, "2:3")
        job.start_node(), job.start_node()
        wait_for_log(job.run_dir, "epoch 1:")
        time.sleep(args.delay)
        job.start_node()
        codes = job.wait(job.nodes)
    elif scenario == "shrink":
        job = Job(args, name, seed, "2:3")
        for _ in range(3):
            job.start_node()
        wait_for_log(job.run_dir, "epoch 1:")
        time.sleep(args.delay)
        job.nodes[2].send_signal(signal.SIGKILL)
        job.nodes[2].wait()
        codes = job.wait(job.nodes[:2])
    elif scenario == "dip":
        job = Job(args, name, seed, "1:2")
        job.start_node(), job.start_node()
        wait_for_log(job.run_dir, "epoch 1:")
        time.sleep(args.delay)
        job.nodes[1].send_signal(signal.SIGKILL)
        job.nodes[1].wait()
        wait_for_log(job.run_dir, "epoch 2:")
        time.sleep(args.delay)
        job.start_node()
        codes = job.wait([job.nodes[0], job.nodes[2]])
    else:
        raise SystemExit("unknown scenario " + scenario)
    acc = final_accuracy(job.run_dir)
    secs = time.time() - t0
    print("%-10s seed %d: exit codes %s, final test acc %s, %.0f s" % (scenario, seed, codes, acc, secs), flush=True)
    return {"scenario": scenario, "seed": seed, "exit_codes": " ".join(map(str, codes)), "test_acc": acc,
            "seconds": round(secs, 1)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ddprun", default=os.path.join(ROOT, "build/launcher/ddprun"))
    p.add_argument("--lenet", default=os.path.join(ROOT, "build/examples/lenet_fmnist/lenet_fmnist"))
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--seeds", default="1,2,3,4")
    p.add_argument("--scenarios", default="grow,shrink,dip")
    p.add_argument("--scenario-seeds", default="", help="the seeds of the elastic runs (default: the first of --seeds)")
    p.add_argument("--delay", type=float, default=8.0)
    p.add_argument("--out", default="/tmp/elastic_bench")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",") if s]
    scenario_seeds = [int(s) for s in args.scenario_seeds.split(",") if s] or seeds[:1]
    rows = [run(args, "unchanged_s%d" % s, s, "unchanged") for s in seeds]
    base = [r["test_acc"] for r in rows if r["test_acc"] is not None]
    n_base = len(rows)
    for seed in scenario_seeds:
        for sc in [s for s in args.scenarios.split(",") if s]:
            rows.append(run(args, sc + "_s%d" % seed, seed, sc))
    with open(os.path.join(args.out, "elastic.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    if base:
        lo, hi = min(base), max(base)
        print("unchanged 2-node job over seeds %s: test acc %.4f .. %.4f (spread %.4f)" % (args.seeds, lo, hi, hi - lo))
        for r in rows[n_base:]:
            a = r["test_acc"]
            where = "inside" if a is not None and lo <= a <= hi else "OUTSIDE"
            print("  %-8s %s: %s the spread" % (r["scenario"], a, where))
    print("rows in", os.path.join(args.out, "elastic.csv"))


if __name__ == "__main__":
    sys.exit(main())
