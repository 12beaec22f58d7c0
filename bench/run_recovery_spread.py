#!/usr/bin/python3
"""Does a run that loses a worker and recovers in process end within the
seed spread of runs without a fault? The LeNet example of the training kit on
Fashion-MNIST under `ddprun --standalone --nproc-per-node 3
--recover-in-process` on this machine (OMP_NUM_THREADS=1), for each seed of
--seeds twice:

  nofault   the run as it is
  fault     the same run (same seed, same options); SIGKILL to one worker
            other than rank 0 at a random step of epoch 2 (steps L+2 ..
            2L-2 of rank 0's --log-samples record); the other two re-form
            without it and go on to the end with 2 workers, or with
            --replace (ddprun --max-restarts 1 as well) ddprun starts a
            worker in the lost one's slot, which the other two take in live
            at a step boundary (it receives the model, optimizer and sampler
            position from a peer), and the run ends with 3 again

The number compared is the last epoch's test loss and test accuracy (the
last line of the run folder's metrics.csv, on the 10,000 test images); each
run also says in which epoch its test accuracy first passed 0.2 (left the
initial plateau at 0.1). Prints
every run, the no-fault runs' mean and min..max, whether each faulted run
lies inside that min..max (and by how much outside if not), and the faulted
minus unfaulted difference of each seed against the spread across seeds.
--out writes a CSV of every run. A run whose ddprun exits non-zero keeps its
run folder and prints the last 40 lines of its log.txt and of ddprun's stderr;
so does a --replace run whose replacement never trained a step.

Every run counts from the --log-samples record of every rank (samples/
rankN.txt by launch slot; a replacement appends to its predecessor's file
after a "# resumed" line of its own) the samples of the committed steps:
samples_per_epoch ("/"-separated), samples (their sum), distinct (the sum of
each epoch's distinct indices), short_steps (steps fewer than --nproc ranks
took) and with --replace joined_at_step (the replacement's first step, in
rank 0's count) and replacement_steps (how many it took). A faulted run
whose seed also ran without a fault is compared with that twin epoch by
epoch: twin_not_in, the twin's samples it did not train, and not_in_twin,
those it trained that the twin did not. The failed step (the "# failed"
lines) is not counted: the ranks left train it again from the same sample.

Note that after the fault the recovered run's steps carry 2 x the per-worker
batch (170 samples at --global-batch-size 255), and an epoch keeps its
--limit-batches steps, so a faulted run trains on fewer samples than its
unfaulted twin: the question is whether that, with the step redone at the
fault, shows beyond the seed spread. With --replace only the steps between
the fault and the replacement's first step are short (170 samples), so the
faulted run trains nearly the samples of its twin (those of the epochs it
shares are the same indices: the sampler goes on from the same position).

The defaults (8 epochs of 60 steps at the example's --lr 0.2) are what
leaves LeNet's initial plateau for every seed in about 75 s a run on the
2-core VM: LeNet's normal(0, 0.01) weights sit on the loss plateau (test
accuracy 0.1) for about 250-350 steps of 255 samples at lr 0.2 (seeds 1..5
passed 0.2 in epoch 6 or 7 of 60 steps); lr 0.3 left it no sooner (seed 3:
epoch 7, against 6 at lr 0.2), and at lr 0.5 one seed of five (two at 5
epochs) never left it, which made the spread bimodal.

  /usr/bin/python3 bench/run_recovery_spread.py --out bench/results/recovery_spread.csv   # about 12 min on the 2-core VM
  /usr/bin/python3 bench/run_recovery_spread.py --seeds 1 --modes fault                   # a smoke test
  /usr/bin/python3 bench/run_recovery_spread.py --replace --seeds 1 --modes fault --epochs 3   # the same, replaced
  /usr/bin/python3 bench/run_recovery_spread.py --replace --seeds 1,2,3,4,5,6,7,8 --out bench/results/recovery_spread_replaced.csv
  /usr/bin/python3 bench/run_recovery_spread.py --ddprun /tmp/bin/ddprun --example /tmp/bin/lenet_fmnist
"""
import argparse
import csv
import glob
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


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_recovery_bench import committed_lines, worker_pid, write_csv  # noqa: E402


def final_metrics(run_dir):
    """From metrics.csv: (last epoch, its test_loss, its test_acc, the first
    epoch whose test accuracy passed 0.2 (left the initial plateau at 0.1) or
    None), or None."""
    try:
        with open(os.path.join(run_dir, "metrics.csv")) as f:
            rows = list(csv.DictReader(f))
    except OSError:
        return None
    if not rows:
        return None
    last = rows[-1]
    left = next((int(r["epoch"]) for r in rows if float(r["test_acc"]) > 0.2), None)
    return int(last["epoch"]), float(last["test_loss"]), float(last["test_acc"]), left


def samples_record(run_dir, nproc, victim):
    """From every rank's --log-samples record: (the samples of each epoch's
    committed steps, as a list by epoch; the distinct indices of each epoch,
    a dict; the steps fewer than nproc ranks took; the replacement's first
    step and its step count, (None, 0) if none). A committed line is "ROUND
    EPOCH STEP INDEX...", the same STEP on every rank that took it."""
    per_epoch, trained, ranks_of_step = {}, {}, {}
    joined_at, replacement_steps = None, 0
    for path in sorted(glob.glob(os.path.join(run_dir, "samples", "rank*.txt"))):
        processes = 0  # "# resumed" lines: one at each process's first epoch
        with open(path) as f:
            for line in f.read().splitlines():
                if line.startswith("# resumed "):
                    processes += 1
                if not line or line.startswith("#"):
                    continue
                fields = line.split()
                epoch, step, indices = int(fields[1]), int(fields[2]), fields[3:]
                per_epoch[epoch] = per_epoch.get(epoch, 0) + len(indices)
                trained.setdefault(epoch, set()).update(indices)
                ranks_of_step[step] = ranks_of_step.get(step, 0) + 1
                if path.endswith(f"rank{victim}.txt") and processes > 1:
                    joined_at = step if joined_at is None else joined_at
                    replacement_steps += 1
    epochs = [per_epoch[e] for e in sorted(per_epoch)]
    return epochs, trained, sum(1 for n in ranks_of_step.values() if n < nproc), joined_at, replacement_steps


def log_lines(path, text):
    """The lines of a file that contain text."""
    try:
        with open(path, errors="replace") as f:
            return [l.rstrip("\n") for l in f if text in l]
    except OSError:
        return []


def tail(path, n=40):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError as e:
        return f"({e})\n"


def run_once(args, seed, mode, fault_step, victim, run_dir):
    cmd = [args.ddprun, "--standalone", "--nproc-per-node", str(args.nproc), "--recover-in-process", args.example,
           "--epochs", str(args.epochs), "--limit-batches", str(args.limit_batches),
           "--global-batch-size", str(args.global_batch_size), "--seed", str(seed),
           "--run-dir", os.path.join(run_dir, "run"), "--log-samples", "--no-tensorboard"]
    if args.lr:
        cmd += ["--lr", f"{args.lr:g}"]
    if args.deadline:
        cmd += ["--recovery-deadline", f"{args.deadline:g}"]
    if args.data_dir:
        cmd += ["--data-dir", args.data_dir]
    replace = args.replace and mode == "fault"
    if replace:  # a worker in the lost one's slot, taken in live (docs/launcher.md, "In-process recovery")
        cmd[1:1] = ["--max-restarts", "1"]
    if args.nice:
        cmd = ["nice", "-n", str(args.nice)] + cmd
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = open(os.path.join(run_dir, "ddprun.stdout"), "w")
    err = open(os.path.join(run_dir, "ddprun.stderr"), "w")
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
    samples = os.path.join(run_dir, "run", "samples", "rank0.txt")
    killed_at = None
    try:
        if mode == "fault":
            while proc.poll() is None:
                lines, _ = committed_lines(samples)
                if len(lines) >= fault_step:
                    pid = worker_pid(proc.pid, victim)
                    if pid:
                        os.kill(pid, signal.SIGKILL)
                        killed_at = len(lines)
                    break
                time.sleep(0.005)
        proc.wait(timeout=args.run_timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out.close()
        err.close()
    seconds = time.monotonic() - start
    lines, comments = committed_lines(samples)
    got = final_metrics(os.path.join(run_dir, "run"))
    epochs, trained, short, joined_at, replacement_steps = samples_record(os.path.join(run_dir, "run"), args.nproc,
                                                                           victim if mode == "fault" else -1)
    row = {"seed": seed, "mode": mode, "victim": victim if mode == "fault" else "",
           "fault_step": fault_step if mode == "fault" else "", "killed_after_step": killed_at or "",
           "exit": proc.returncode, "seconds": round(seconds, 1),
           "steps_again": sum(1 for c in comments if c.startswith("# failed")) if mode == "fault" else "",
           "epochs_logged": got[0] if got else "", "test_loss": got[1] if got else "",
           "test_acc": got[2] if got else "", "left_plateau_epoch": (got[3] or "") if got else "",
           "replace": int(replace), "joined_at_step": joined_at if joined_at is not None else "",
           "replacement_steps": replacement_steps if replace else "", "short_steps": short,
           "samples": sum(epochs), "distinct": sum(len(v) for v in trained.values()),
           "samples_per_epoch": "/".join(map(str, epochs)), "not_in_twin": "", "twin_not_in": ""}
    if mode == "fault":
        # What the run folder's log and ddprun say of the re-forming (and the replacement).
        for l in log_lines(os.path.join(run_dir, "run", "log.txt"), " ranks go on from sample "):
            print(f"  seed {seed} log.txt: {l}", flush=True)
        for l in log_lines(os.path.join(run_dir, "ddprun.stderr"), "--recover-in-process") + \
                log_lines(os.path.join(run_dir, "ddprun.stderr"), "in place of rank"):
            print(f"  seed {seed} ddprun: {l}", flush=True)
    failed = proc.returncode != 0 or not got or got[0] != args.epochs or (mode == "fault" and killed_at is None) \
        or (replace and joined_at is None)
    if failed:
        print(f"FAILED: seed {seed} {mode}: ddprun exit {proc.returncode}, "
              f"last epoch in metrics.csv {got[0] if got else None}, killed after step {killed_at}"
              f"{', the replacement took no step' if replace and joined_at is None else ''}; "
              f"kept {run_dir}\n  {' '.join(cmd)}", file=sys.stderr)
        print(f"--- last 40 lines of {run_dir}/run/log.txt\n{tail(os.path.join(run_dir, 'run', 'log.txt'))}"
              f"--- last 40 lines of ddprun's stderr\n{tail(os.path.join(run_dir, 'ddprun.stderr'))}"
              f"--- last 40 lines of ddprun's stdout\n{tail(os.path.join(run_dir, 'ddprun.stdout'))}",
              file=sys.stderr, flush=True)
    return row, failed, trained


def outside(value, lo, hi):
    """0 inside [lo, hi], else the signed distance past the nearer end."""
    return value - hi if value > hi else value - lo if value < lo else 0.0


def report(rows):
    ok = [r for r in rows if r["test_acc"] != "" and r["exit"] == 0]
    base = {r["seed"]: r for r in ok if r["mode"] == "nofault"}
    faulted = {r["seed"]: r for r in ok if r["mode"] == "fault"}
    print("\nseed  mode      victim  killed after  joined at  exit  seconds  again  short  samples  distinct  "
          "test loss  test acc  left plateau")
    for r in rows:
        print(f"{r['seed']:4}  {r['mode']:8s}  {str(r['victim']):6s}  {str(r['killed_after_step']):12s}  "
              f"{str(r['joined_at_step']) if r['replace'] else '':9s}  {r['exit']:4}  "
              f"{r['seconds']:7.1f}  {str(r['steps_again']):5s}  {r['short_steps']:5}  {r['samples']:7}  "
              f"{r['distinct']:8}  "
              f"{r['test_loss'] if r['test_loss'] == '' else format(r['test_loss'], '.4f'):9}  "
              f"{r['test_acc'] if r['test_acc'] == '' else format(r['test_acc'], '.4f'):8}  "
              f"{'epoch ' + str(r['left_plateau_epoch']) if r['left_plateau_epoch'] != '' else 'never'}")
    for seed in sorted(set(base) & set(faulted)):
        print(f"seed {seed}: the faulted run trained {faulted[seed]['samples']} samples "
              f"({faulted[seed]['samples_per_epoch']} by epoch), {faulted[seed]['samples'] - base[seed]['samples']:+d} "
              f"against its unfaulted twin's {base[seed]['samples']} ({faulted[seed]['twin_not_in']} of the twin's "
              f"not trained, {faulted[seed]['not_in_twin']} not the twin's, epoch by epoch); "
              f"{faulted[seed]['short_steps']} short steps"
              + (f", the replacement's first step {faulted[seed]['joined_at_step']} "
                 f"({faulted[seed]['replacement_steps']} steps)" if faulted[seed]['replace'] else ""))
    if len(base) < 2:
        print("\nfewer than 2 no-fault runs finished: no spread")
        return
    print()
    spread = {}
    for key in ("test_acc", "test_loss"):
        v = [r[key] for r in base.values()]
        spread[key] = (min(v), max(v))
        print(f"no-fault {key}: mean {statistics.mean(v):.4f}, min..max {min(v):.4f} .. {max(v):.4f} "
              f"(range {max(v) - min(v):.4f}, sd {statistics.stdev(v):.4f}, {len(v)} seeds)")
    for key in ("test_acc", "test_loss"):
        lo, hi = spread[key]
        inside = 0
        for seed, r in sorted(faulted.items()):
            d = outside(r[key], lo, hi)
            inside += d == 0
            print(f"fault seed {seed} {key} {r[key]:.4f}: " +
                  ("inside the no-fault min..max" if d == 0 else f"OUTSIDE by {d:+.4f}"))
        print(f"{key}: {inside} of {len(faulted)} faulted runs inside the no-fault min..max")
    for key in ("test_acc", "test_loss"):
        diffs = [faulted[s][key] - base[s][key] for s in sorted(faulted) if s in base]
        v = [r[key] for r in base.values()]
        if diffs:
            sd = statistics.stdev(diffs) if len(diffs) > 1 else 0.0
            print(f"{key}: fault minus no-fault of the same seed: mean {statistics.mean(diffs):+.4f}, "
                  f"min..max {min(diffs):+.4f} .. {max(diffs):+.4f} (sd {sd:.4f}, {len(diffs)} seeds); "
                  f"spread across seeds: range {max(v) - min(v):.4f}, sd {statistics.stdev(v):.4f}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(ROOT, "build-torch2"))
    p.add_argument("--ddprun", default="", help="ddprun binary (default BUILD/launcher/ddprun; "
                   "ddprun-store.so must lie beside it)")
    p.add_argument("--example", default="", help="lenet_fmnist binary (default BUILD/examples/lenet_fmnist/...)")
    p.add_argument("--seeds", default="1,2,3,4,5")
    p.add_argument("--modes", default="nofault,fault")
    p.add_argument("--nproc", type=int, default=3)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--limit-batches", type=int, default=60)
    p.add_argument("--global-batch-size", type=int, default=255)
    p.add_argument("--lr", type=float, default=0.2, help="the kit's --lr (0: the example's default, 0.2)")
    p.add_argument("--deadline", type=float, default=0, help="the kit's --recovery-deadline (0: its default)")
    p.add_argument("--data-dir", default="", help="the kit's --data-dir (default: the example's)")
    p.add_argument("--replace", action="store_true",
                   help="fault mode: ddprun --max-restarts 1 as well, so that a replacement takes the lost one's slot")
    p.add_argument("--fault-seed", type=int, default=1, help="seed of the fault steps and victims")
    p.add_argument("--nice", type=int, default=19)
    p.add_argument("--run-timeout", type=float, default=900)
    p.add_argument("--keep", action="store_true", help="keep every run's folder (printed), not only failed ones")
    p.add_argument("--out", default="")
    args = p.parse_args()
    args.ddprun = args.ddprun or os.path.join(args.build, "launcher", "ddprun")
    args.example = args.example or os.path.join(args.build, "examples", "lenet_fmnist", "lenet_fmnist")
    if args.limit_batches < 5:
        p.error("--limit-batches must be at least 5 (the fault falls in steps L+2 .. 2L-2)")
    if args.epochs < 2:
        p.error("--epochs must be at least 2 (the fault falls in epoch 2)")
    rng = random.Random(args.fault_seed)
    modes = args.modes.split(",")
    rows = []
    failures = 0
    seeds = [int(s) for s in args.seeds.split(",")]
    # Drawn for seeds 1, 2, .. in turn (then any other), so that a seed's fault is the same whatever
    # --modes says and whichever seeds --seeds lists (--seeds 4 gets the fault of --seeds 1,2,3,4's seed 4).
    faults = {}
    for seed in list(range(1, max(seeds) + 1)) + seeds:
        if seed not in faults:
            faults[seed] = (args.limit_batches + rng.randint(2, args.limit_batches - 2), rng.randint(1, args.nproc - 1))
    for seed in seeds:
        fault_step, victim = faults[seed]
        trained = {}  # by mode: each epoch's distinct sample indices
        for mode in ("nofault", "fault"):
            if mode not in modes:
                continue
            run_dir = tempfile.mkdtemp(prefix=f"recovery_spread_{seed}_{mode}_")
            row, failed, trained[mode] = run_once(args, seed, mode, fault_step, victim, run_dir)
            failures += failed
            if args.keep:
                print(f"kept {run_dir}", flush=True)
            elif not failed:
                shutil.rmtree(run_dir, ignore_errors=True)
            if mode == "fault" and "nofault" in trained:
                # The faulted run's samples against its unfaulted twin's, epoch by epoch.
                twin = trained["nofault"]
                row["not_in_twin"] = sum(len(v - twin.get(e, set())) for e, v in trained[mode].items())
                row["twin_not_in"] = sum(len(v - trained[mode].get(e, set())) for e, v in twin.items())
            rows.append(row)
            print(row, flush=True)
    write_csv(args.out, rows)
    report(rows)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
