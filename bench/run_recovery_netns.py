#!/usr/bin/python3
"""A lost worker on one of several hosts, recovered in process against
restarted: the in-process-recovery bench (run_recovery_bench.py) across
--hosts network-namespace hosts on one switch, one ddprun and one worker
(--nproc-per-node 1) per host, the LeNet or ResNet-18 example of the
training kit on Fashion-MNIST. Root only (ip netns).

The hosts: a bridge in a hub namespace of its own and a veth pair from each
host's namespace to it (as tests/launcher/netns_util.h's NetnsHosts);
nothing of the bench appears in the root namespace's network. Every ddprun
joins the c10d rendezvous served by host 0's ddprun (--rdzv-backend c10d
--rdzv-endpoint HOST0:PORT --nnodes 1:N: a lost node leaves the others above
the minimum), GLOO_SOCKET_IFNAME is the host's veth, and the run folder
(checkpoint, --log-samples record) lies under /tmp, which every namespace
sees. One fault per run, at a random step of the second epoch, on a random
host other than host 0 (which serves the store):

  kill   SIGKILL to the host's worker
  stop   SIGSTOP to the host's worker
  cut    the host's cable pulled at the switch: `ip -n HUB link set
         <the host's veth end in the hub> down`, run from the root
         namespace; the host's worker and ddprun fall silent for the others

and each fault once in each mode, side by side:

  recover   ddprun --recover-in-process: the others re-form without the
            lost worker and go on (the example's --recovery-deadline D)
  restart   ddprun --max-restarts 1: every worker is stopped, the nodes
            rejoin, and the workers resume from the checkpoint written
            after epoch 1 (the example's --timeout D, so that a silent
            worker is given up as soon)

Both modes pass --rdzv-conf keep_alive_interval=1,keep_alive_max_attempt=K
(--keep-alive-attempts, default D: a silent node is given up after about D
seconds too), last_call_timeout=2 (a restarted round without the cut host
closes 2 s after the first survivor rejoins), join_timeout=30 (a cut
host's ddprun gives up rejoining after 30 s) and
close_timeout=5.

Each run prints the seconds from the fault to the next step committed (the
next line of rank 0's --log-samples record, rank 0 being host 0's worker),
the steps trained again (recover: the record's "# failed" lines; restart:
the steps between the checkpoint and the fault), whether a surviving host's
worker was restarted (its pid at the next step against its pid before the
fault), and each host's ddprun exit code (the faulted host's ddprun is
ended by the bench, "killed", if it still runs --victim-wait seconds (40)
after the others finished: a cut host's ddprun may still be stopping its
worker or waiting to rejoin). Every run is printed, then
each mode's spread; --out writes a CSV. Processes and namespaces are removed
on every path (Ctrl-C and exceptions included); namespaces left by an
earlier bench process that died are removed at the start.

  nice -n 5 /usr/bin/python3 bench/run_recovery_netns.py --hosts 3 --runs 2 --out /tmp/netns3.csv
  nice -n 5 /usr/bin/python3 bench/run_recovery_netns.py --hosts 4 --faults cut --runs 1
  nice -n 5 /usr/bin/python3 bench/run_recovery_netns.py --model resnet18 --batch 8 --limit-batches 8 --deadline 10

--bin (default /tmp/netns-bin) holds copies of ddprun, ddprun-store.so,
lenet_fmnist and resnet18_fmnist, so that a rebuild does not replace them
under a run.
"""
import argparse
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_recovery_bench import EXAMPLES, committed_lines, write_csv  # noqa: E402

NS_PREFIX = "ddprun_b"  # the launcher tests sweep ddprun_t*; this bench's own prefix


def ip_bin():
    for p in ("/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"):
        if os.access(p, os.X_OK):
            return p
    sys.exit("the 'ip' tool (iproute2) is not installed")


def sh(argv, check=True):
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()}")
    return r


def pid_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def sweep_stale_namespaces(ip):
    """Namespaces of an earlier bench process that is gone."""
    try:
        names = os.listdir("/run/netns")
    except OSError:
        return
    for name in names:
        if not name.startswith(NS_PREFIX):
            continue
        owner = name[len(NS_PREFIX):].split("_")[0]
        if owner.isdigit() and not pid_alive(int(owner)):
            kill_namespace_pids(ip, name)
            sh([ip, "netns", "del", name], check=False)


def kill_namespace_pids(ip, ns):
    r = sh([ip, "netns", "pids", ns], check=False)
    for p in r.stdout.split():
        try:
            os.kill(int(p), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


class Hosts:
    """N namespace hosts on one bridge, the bridge in a hub namespace."""

    def __init__(self, ip, n):
        self.ip, self.n = ip, n
        tag = f"{NS_PREFIX}{os.getpid()}_"
        short = f"{os.getpid() % 100000}"
        self.hub = tag + "hub"
        self.ns = [tag + f"n{i}" for i in range(n)]
        self.veth = [f"rb{short}h{i}" for i in range(n)]      # in host i
        self.hub_end = [f"rb{short}b{i}" for i in range(n)]   # in the hub
        c = random.Random(os.getpid()).randint(0, 249)
        self.addr = [f"10.250.{c}.{i + 1}" for i in range(n)]
        self.created = []

    def create(self):
        ip = self.ip
        sh([ip, "netns", "add", self.hub])
        self.created.append(self.hub)
        sh([ip, "-n", self.hub, "link", "add", "br0", "type", "bridge"])
        sh([ip, "-n", self.hub, "link", "set", "br0", "up"])
        for i in range(self.n):
            sh([ip, "netns", "add", self.ns[i]])
            self.created.append(self.ns[i])
            sh([ip, "link", "add", self.veth[i], "netns", self.ns[i], "type", "veth", "peer", "name",
                self.hub_end[i], "netns", self.hub])
            sh([ip, "-n", self.hub, "link", "set", self.hub_end[i], "master", "br0"])
            sh([ip, "-n", self.hub, "link", "set", self.hub_end[i], "up"])
            sh([ip, "-n", self.ns[i], "addr", "add", self.addr[i] + "/24", "dev", self.veth[i]])
            sh([ip, "-n", self.ns[i], "link", "set", self.veth[i], "up"])
            sh([ip, "-n", self.ns[i], "link", "set", "lo", "up"])

    def cut(self, i):
        sh([self.ip, "-n", self.hub, "link", "set", self.hub_end[i], "down"])

    def plug(self, i):
        sh([self.ip, "-n", self.hub, "link", "set", self.hub_end[i], "up"], check=False)

    def kill_processes(self):
        for ns in self.created:
            kill_namespace_pids(self.ip, ns)

    def remove(self):
        self.kill_processes()
        for ns in reversed(self.created):
            sh([self.ip, "netns", "del", ns], check=False)
        self.created = []


def descendants(root):
    """root's descendants (any process group), from /proc."""
    children = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_tree(proc):
    for p in descendants(proc.pid) + [proc.pid]:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def node_worker(ddprun_pid):
    """(pid, RANK) of the worker of the ddprun `ddprun_pid` (one per node)."""
    try:
        kids = open(f"/proc/{ddprun_pid}/task/{ddprun_pid}/children").read().split()
    except OSError:
        return None, None
    for child in kids:
        try:
            env = open(f"/proc/{child}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        for e in env:
            if e.startswith(b"RANK="):
                return int(child), int(e[5:])
    return None, None


def run_once(args, hosts, mode, fault, fault_step, victim, run_dir):
    ddprun = os.path.join(args.bin, "ddprun")
    example = os.path.join(args.bin, EXAMPLES[args.model])
    n = hosts.n
    # Below the ephemeral range (32768..60999): the namespaces serve one run
    # after another, and a port an earlier run's outgoing connection left in
    # TIME_WAIT cannot be bound, SO_REUSEADDR or not (ddprun then takes host 0
    # for a client of another store there and waits join_timeout for it).
    port = random.randint(20000, 32000)
    deadline = f"{args.deadline:g}"
    conf = (f"join_timeout=30,last_call_timeout=2,close_timeout=5,keep_alive_interval=1,"
            f"keep_alive_max_attempt={args.keep_alive_attempts}")
    procs, logs = [], []
    fault_at = next_step = None
    before = 0
    pids_before, pids_after, victim_rank = [], [], None
    try:
        for i in range(n):
            cmd = [hosts.ip, "netns", "exec", hosts.ns[i], ddprun, "--nnodes", f"1:{n}", "--nproc-per-node", "1",
                   "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{hosts.addr[0]}:{port}",
                   "--rdzv-id", f"bench{port}", "--rdzv-conf", conf]
            cmd += ["--recover-in-process"] if mode == "recover" else ["--max-restarts", "1"]
            cmd += [example, "--epochs", "2", "--limit-batches", str(args.limit_batches), "--batch-size",
                    str(args.batch), "--run-dir", run_dir, "--log-samples", "--checkpoint-every", "1",
                    "--no-tensorboard"]
            cmd += ["--recovery-deadline", deadline] if mode == "recover" else ["--timeout", deadline]
            env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME=hosts.veth[i])
            log = open(os.path.join(run_dir, f"host{i}.log"), "w")
            logs.append(log)
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True))
            if i == 0:
                time.sleep(0.5)  # host 0 joins first: node 0, rank 0
        samples = os.path.join(run_dir, "samples", "rank0.txt")
        start = time.monotonic()
        while procs[0].poll() is None and time.monotonic() - start < args.run_timeout:
            lines, _ = committed_lines(samples)
            if fault_at is None and len(lines) >= fault_step:
                workers = [node_worker(p.pid) for p in procs]
                pid, victim_rank = workers[victim]
                if pid and workers[0][1] == 0:
                    pids_before = [w[0] for w in workers]
                    if fault == "kill":
                        os.kill(pid, signal.SIGKILL)
                    elif fault == "stop":
                        os.kill(pid, signal.SIGSTOP)
                    else:
                        hosts.cut(victim)
                    fault_at = time.monotonic()
                    before = len(lines)
            if fault_at is not None and len(lines) > before:
                next_step = time.monotonic() - fault_at
                pids_after = [node_worker(p.pid)[0] if i != victim else None for i, p in enumerate(procs)]
                break
            time.sleep(0.002)
        # The others to the end; then the faulted host, which may wait to rejoin.
        end_by = time.monotonic() + args.run_timeout
        for i, p in enumerate(procs):
            if i != victim:
                try:
                    p.wait(timeout=max(1, end_by - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        try:
            procs[victim].wait(timeout=args.victim_wait)
        except subprocess.TimeoutExpired:
            pass
    finally:
        codes = []
        for p in procs:
            codes.append(p.returncode if p.poll() is not None else "killed")
            if p.poll() is None:
                kill_tree(p)
        for log in logs:
            log.close()
        hosts.kill_processes()
        if fault == "cut":
            hosts.plug(victim)
    failed = [i for i, c in enumerate(codes) if i != victim and c != 0]
    if failed or next_step is None:
        for i in failed or range(n):
            with open(os.path.join(run_dir, f"host{i}.log")) as f:
                text = "".join(l for l in f.readlines() if "frame #" not in l)
            print(f"--- host {i} (exit {codes[i]}):\n{text[-4000:]}", file=sys.stderr)
    lines, comments = committed_lines(os.path.join(run_dir, "samples", "rank0.txt"))
    if mode == "recover":
        again = sum(1 for c in comments if c.startswith("# failed"))
    else:
        resumed = [c for c in comments if c.startswith("# resumed ") and not c.startswith("# resumed 0 ")]
        again = before - int(resumed[0].split()[3]) if resumed else None
    restarted = None
    if pids_before and pids_after:
        restarted = any(pids_after[i] != pids_before[i] for i in range(n) if i != victim)
    return {"model": args.model, "hosts": n, "mode": mode, "fault": fault, "fault_step": fault_step,
            "victim_host": victim, "victim_rank": victim_rank,
            "seconds_to_next_step": None if next_step is None else round(next_step, 3), "steps_again": again,
            "survivors_restarted": restarted, "pids_before": " ".join(str(p) for p in pids_before),
            "pids_after": " ".join("-" if p is None else str(p) for p in pids_after),
            "exit_codes": " ".join(str(c) for c in codes), "steps_committed": len(lines)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default="/tmp/netns-bin", help="ddprun, ddprun-store.so and the examples")
    p.add_argument("--hosts", type=int, default=3)
    p.add_argument("--model", choices=sorted(EXAMPLES), default="lenet")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--limit-batches", type=int, default=40)
    p.add_argument("--deadline", type=float, default=5)
    p.add_argument("--keep-alive-attempts", type=int, default=0, help="keep_alive_max_attempt (0: the deadline)")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--faults", default="kill,stop,cut")
    p.add_argument("--modes", default="recover,restart")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--run-timeout", type=float, default=300, help="seconds a run may take before it is ended")
    p.add_argument("--victim-wait", type=float, default=40,
                   help="seconds the faulted host's ddprun may run on after the others finished")
    p.add_argument("--keep-failed", action="store_true", help="keep the run folder of a run that failed")
    p.add_argument("--logs", default="", help="copy every run's ddprun logs (host<i>.log) into DIR/<run>_<fault>_<mode>/")
    p.add_argument("--out", default="")
    args = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (ip netns)")
    if args.keep_alive_attempts <= 0:
        args.keep_alive_attempts = max(1, int(round(args.deadline)))
    for name in ("ddprun", "ddprun-store.so", EXAMPLES[args.model]):
        if not os.path.exists(os.path.join(args.bin, name)):
            sys.exit(f"{args.bin}/{name} is missing: copy it from the build (see the docstring)")

    def on_signal(signum, frame):
        raise KeyboardInterrupt
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)

    ip = ip_bin()
    sweep_stale_namespaces(ip)
    hosts = Hosts(ip, args.hosts)
    rng = random.Random(args.seed)
    rows = []
    faults = args.faults.split(",")
    modes = args.modes.split(",")
    try:
        hosts.create()
        for run in range(args.runs):
            for fault in faults:
                # A step of the second epoch and a host other than host 0; the same for both modes.
                fault_step = args.limit_batches + rng.randint(2, args.limit_batches - 2)
                victim = rng.randint(1, args.hosts - 1)
                for mode in (modes if run % 2 == 0 else list(reversed(modes))):
                    run_dir = tempfile.mkdtemp(prefix="recovery_netns_", dir="/tmp")
                    row = None
                    try:
                        row = run_once(args, hosts, mode, fault, fault_step, victim, run_dir)
                    finally:
                        if args.logs:
                            dest = os.path.join(args.logs, f"{args.hosts}h_{run}_{fault}_{mode}")
                            os.makedirs(dest, exist_ok=True)
                            for i in range(args.hosts):
                                src = os.path.join(run_dir, f"host{i}.log")
                                if os.path.exists(src):
                                    shutil.copy(src, dest)
                        bad = row is None or row["seconds_to_next_step"] is None or any(
                            c != "0" for i, c in enumerate(row["exit_codes"].split()) if i != victim)
                        if args.keep_failed and bad:
                            print(f"kept {run_dir}", file=sys.stderr)
                        else:
                            shutil.rmtree(run_dir, ignore_errors=True)
                    row["run"] = run
                    rows.append(row)
                    print(row, flush=True)
    except KeyboardInterrupt:
        print("interrupted; cleaning up", file=sys.stderr)
    finally:
        hosts.remove()
    for fault in faults:
        for mode in modes:
            sel = [r for r in rows if r["mode"] == mode and r["fault"] == fault]
            got = [r["seconds_to_next_step"] for r in sel if r["seconds_to_next_step"] is not None]
            if got:
                print(f"{args.model} {args.hosts} hosts {mode:8s} {fault:4s}: seconds to the next step "
                      f"{min(got):.2f} .. {max(got):.2f} (median {statistics.median(got):.2f}, {len(got)} runs); "
                      f"steps trained again {[r['steps_again'] for r in sel]}; survivors restarted "
                      f"{[r['survivors_restarted'] for r in sel]}")
    write_csv(args.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
