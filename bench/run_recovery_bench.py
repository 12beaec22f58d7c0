#!/usr/bin/python3
"""A lost worker, recovered in process against restarted: an example of the
training kit (LeNet or ResNet-18 on Fashion-MNIST) under ddprun on this
machine, one fault per run at a random step of the second epoch, side by
side:

  recover   ddprun --recover-in-process: the others re-form without the
            lost worker and go on (--recovery-deadline DEADLINE)
  restart   ddprun --max-restarts 1: every worker is restarted and resumes
            from the last checkpoint, written after epoch 1 (--timeout
            DEADLINE, so that a silent worker is given up as soon)

Faults: kill (SIGKILL to a worker other than rank 0), stop (SIGSTOP). Each
run prints the seconds from the fault to the next step committed (the next
line of rank 0's --log-samples record) and the steps trained again (recover:
the "# failed" lines; restart: the steps between the checkpoint and the
fault). Every run is printed, then each mode's spread; --out writes a CSV.

  /usr/bin/python3 bench/run_recovery_bench.py --build build-torch2 --runs 3
  /usr/bin/python3 bench/run_recovery_bench.py --model resnet18 --limit-batches 8 --runs 2
"""
import argparse
import csv
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = {"lenet": "lenet_fmnist", "resnet18": "resnet18_fmnist"}


def worker_pid(ddprun_pid, rank):
    """The pid of ddprun's worker whose RANK is `rank`."""
    for child in open(f"/proc/{ddprun_pid}/task/{ddprun_pid}/children").read().split():
        try:
            env = open(f"/proc/{child}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env:
            return int(child)
    return None


def committed_lines(path):
    """Rank 0's committed steps so far (lines that are not comments), and
    the comment lines."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return [], []
    return [l for l in lines if l and not l.startswith("#")], [l for l in lines if l.startswith("#")]


def write_csv(path, rows):
    """Every run as a CSV row (nothing without a path or a row)."""
    if not path or not rows:
        return
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)


def run_once(args, mode, fault, fault_step, victim, run_dir):
    example = os.path.join(args.build, "examples", EXAMPLES[args.model], EXAMPLES[args.model])
    cmd = [os.path.join(args.build, "launcher", "ddprun"), "--standalone", "--nproc-per-node", str(args.nproc)]
    cmd += ["--recover-in-process"] if mode == "recover" else ["--max-restarts", "1"]
    cmd += [example, "--epochs", "2", "--limit-batches", str(args.limit_batches), "--batch-size", str(args.batch),
            "--run-dir", run_dir, "--log-samples", "--checkpoint-every", "1", "--no-tensorboard"]
    deadline = f"{args.deadline:g}"
    cmd += ["--recovery-deadline", deadline] if mode == "recover" else ["--timeout", deadline]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    log = open(os.path.join(run_dir, "ddprun.log"), "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    samples = os.path.join(run_dir, "samples", "rank0.txt")
    fault_at = None
    before = 0
    try:
        while proc.poll() is None:
            lines, _ = committed_lines(samples)
            if fault_at is None and len(lines) >= fault_step:
                pid = worker_pid(proc.pid, victim)
                if pid:
                    os.kill(pid, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
                    fault_at = time.monotonic()
                    before = len(lines)
            if fault_at is not None and len(lines) > before:
                next_step = time.monotonic() - fault_at
                break
            time.sleep(0.002)
        else:
            next_step = None
        proc.wait(timeout=args.deadline * 10 + 600)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    if proc.returncode != 0:
        with open(os.path.join(run_dir, "ddprun.log")) as f:
            print("".join(l for l in f.readlines() if "frame #" not in l)[-6000:], file=sys.stderr)
    lines, comments = committed_lines(samples)
    if mode == "recover":
        again = sum(1 for c in comments if c.startswith("# failed"))
    else:
        resumed = [c for c in comments if c.startswith("# resumed ") and not c.startswith("# resumed 0 ")]
        again = before - int(resumed[0].split()[3]) if resumed else None
    return {"model": args.model, "mode": mode, "fault": fault, "fault_step": fault_step, "exit": proc.returncode,
            "seconds_to_next_step": None if next_step is None else round(next_step, 3), "steps_again": again}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(ROOT, "build-torch2"))
    p.add_argument("--model", choices=sorted(EXAMPLES), default="lenet")
    p.add_argument("--nproc", type=int, default=3)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--limit-batches", type=int, default=40)
    p.add_argument("--deadline", type=float, default=5)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--faults", default="kill,stop")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default="")
    args = p.parse_args()
    rng = random.Random(args.seed)
    rows = []
    for run in range(args.runs):
        for fault in args.faults.split(","):
            # A step of the second epoch, and a worker other than rank 0
            # (whose record the bench reads); the same for both modes.
            fault_step = args.limit_batches + rng.randint(2, args.limit_batches - 2)
            victim = rng.randint(1, args.nproc - 1)
            for mode in ("recover", "restart") if run % 2 == 0 else ("restart", "recover"):
                run_dir = tempfile.mkdtemp(prefix="recovery_bench_")
                try:
                    row = run_once(args, mode, fault, fault_step, victim, run_dir)
                finally:
                    shutil.rmtree(run_dir, ignore_errors=True)
                row["run"] = run
                rows.append(row)
                print(row, flush=True)
    for mode in ("recover", "restart"):
        for fault in args.faults.split(","):
            got = [r["seconds_to_next_step"] for r in rows if r["mode"] == mode and r["fault"] == fault
                   and r["seconds_to_next_step"] is not None]
            again = [r["steps_again"] for r in rows if r["mode"] == mode and r["fault"] == fault]
            if got:
                print(f"{args.model} {mode:8s} {fault}: seconds to the next step {min(got):.2f} .. {max(got):.2f} "
                      f"(median {statistics.median(got):.2f}, {len(got)} runs); steps trained again {again}")
    write_csv(args.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
