#!/usr/bin/python3
"""DDP across two hosts on a limited link: two network namespaces joined by a
veth pair, the link shaped with tc (tbf) on both ends, one rank per
namespace, Gloo bound to the veth addresses. Needs root.

  /usr/bin/python3 bench/run_netns_bench.py --rate 1gbit                       # the malloc-threshold table
  /usr/bin/python3 bench/run_netns_bench.py --rate 1gbit --rounds 5 --modes local,ddp,pytorch_ddp

Every round runs each mode once as its own pair of processes (the order
rotates from round to round) and prints every run: ms per step, the main
thread's CPU per step, all threads' CPU per step and page faults per step,
for each rank. The namespaces are removed at the end, also on failure or
Ctrl-C. Model and step: bench/lenet_bench.cpp (default: --model mlp100
--batch 16, 8 timed steps after 1 warm-up).

Modes (see MODES): local (no communication), ddp (the library's defaults),
ddp_malloc_auto (DDPOptions::malloc_mmap_threshold_mb(-1): glibc's
thresholds fixed at the largest gradient), ddp_no_retain
(retain_step_memory(false)), ddp_hook_allreduce and ddp_hook_fp16 (ddp with
ddp::hooks::allreduce_hook or fp16_compress_hook registered; bf16_compress_hook
is left out: Gloo in LibTorch 1.13 cannot sum bfloat16), ddp_hook_powersgd1
and ddp_hook_powersgd4 (powerSGD_hook at rank 1 or 4 from the third step on:
run them with --warmup 2 so that every timed step compresses), pytorch_ddp
(python3-torch's DDP, same model).

Bytes per step: "asked" is what the reducer or the hook handed to all-reduce
in one step (bytes_reduced, or hook_bytes with a hook); "veth" is what rank 1's
end of the link sent during the run (tx_bytes of its veth, read in its
namespace before and after), divided by the steps (warm-up included). Rank 1's
end, because the parameter broadcast at construction goes from rank 0 to rank
1; with two ranks Gloo's ring all-reduce sends about the buffer's size from
each end, plus TCP/IP headers and the barriers.
"""
import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import run_lenet_bench as lb

MODES = {
    "local": ("cpp", ["--mode", "local"]),
    "ddp": ("cpp", ["--mode", "ddp"]),
    "ddp_malloc_auto": ("cpp", ["--mode", "ddp", "--malloc-mmap-mb", "-1"]),
    "ddp_no_retain": ("cpp", ["--mode", "ddp", "--retain-step-memory", "0"]),
    "ddp_hook_allreduce": ("cpp", ["--mode", "ddp", "--hook", "allreduce"]),
    "ddp_hook_fp16": ("cpp", ["--mode", "ddp", "--hook", "fp16"]),
    "ddp_hook_powersgd1": ("cpp", ["--mode", "ddp", "--hook", "powersgd", "--powersgd-rank", "1"]),
    "ddp_hook_powersgd4": ("cpp", ["--mode", "ddp", "--hook", "powersgd", "--powersgd-rank", "4"]),
    "pytorch_ddp": ("py", ["--mode", "ddp"]),
}


def sh(*cmd, check=True):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")
    return r


class Link:
    """Two namespaces, a veth pair between them, tbf on both ends."""

    def __init__(self, rate):
        tag = f"{os.getpid() % 100000}"
        self.ns = [f"ddpbench{tag}a", f"ddpbench{tag}b"]
        self.veth = [f"db{tag}a", f"db{tag}b"]
        b = random.randint(100, 199)
        self.addr = [f"10.{b}.77.1", f"10.{b}.77.2"]
        self.rate = rate

    def __enter__(self):
        try:
            for ns in self.ns:
                sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", self.veth[0], "netns", self.ns[0], "type", "veth", "peer", "name", self.veth[1],
               "netns", self.ns[1])
            for i in range(2):
                sh("ip", "-n", self.ns[i], "addr", "add", self.addr[i] + "/24", "dev", self.veth[i])
                sh("ip", "-n", self.ns[i], "link", "set", self.veth[i], "up")
                sh("ip", "-n", self.ns[i], "link", "set", "lo", "up")
                if self.rate != "none":
                    # A bucket of 1 ms at the rate (at least 64 KiB), queueing at most 50 ms.
                    sh("ip", "netns", "exec", self.ns[i], "tc", "qdisc", "add", "dev", self.veth[i], "root", "tbf",
                       "rate", self.rate, "burst", "1mbit", "latency", "50ms")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def tx_bytes(self, i):
        r = sh("ip", "netns", "exec", self.ns[i], "cat", f"/sys/class/net/{self.veth[i]}/statistics/tx_bytes")
        return int(r.stdout.strip())

    def __exit__(self, *exc):
        for ns in self.ns:
            sh("ip", "netns", "del", ns, check=False)  # takes its veth end with it


def run_pair(link, impl, flags, args, binary, common=None, extra_env=None, steps=None, timeout=None):
    """Runs one rank in each namespace and returns their parsed RESULT lines,
    each with veth_bytes_per_step (rank 1's end, over `steps` steps: default
    args.iters + args.warmup) and asked_bytes_per_step. `common`: the flags
    after `flags` (default: args' model, batch, iters, warmup, threads);
    `extra_env`: more environment for both ranks. A rank that fails ends its
    peer (which would wait for it until Gloo's timeout); past `timeout`
    (default args.timeout) seconds both are killed. Raises RuntimeError."""
    if common is None:
        common = ["--model", args.model, "--batch", str(args.batch), "--iters", str(args.iters), "--warmup",
                  str(args.warmup), "--lr", "0.01", "--threads", str(args.threads)]
    steps = steps if steps is not None else args.iters + args.warmup
    timeout = timeout if timeout is not None else args.timeout
    port = random.randint(20000, 40000)
    procs, logs = [], []
    tx0 = link.tx_bytes(1)
    try:
        for rank in range(2):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                       MASTER_ADDR=link.addr[0], MASTER_PORT=str(port), GLOO_SOCKET_IFNAME=link.veth[rank],
                       OMP_NUM_THREADS=str(args.threads))
            env.update(extra_env or {})
            if impl == "cpp":
                cmd = [binary]
            else:
                cmd = [args.python, os.path.join(lb.HERE, "pytorch_lenet_bench.py")]
            cmd += flags + common
            # Files, not pipes: a chatty rank cannot block on a full pipe.
            out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
            logs.append((out, err))
            procs.append(subprocess.Popen(["ip", "netns", "exec", link.ns[rank]] + cmd, env=env, stdout=out,
                                          stderr=err, text=True))
        deadline = time.time() + timeout
        failed_at = None
        while any(p.poll() is None for p in procs):
            if failed_at is None and any(p.returncode not in (None, 0) for p in procs):
                failed_at = time.time()
            if failed_at is not None and time.time() > failed_at + 5:
                break  # the peer of a failed rank: ended below
            if time.time() > deadline:
                raise RuntimeError(f"ran past {timeout} s (--timeout)")
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    results, failures = [], []
    for rank, (p, (out, err)) in enumerate(zip(procs, logs)):
        out.seek(0)
        err.seek(0)
        text, errors = out.read(), err.read()
        out.close()
        err.close()
        lines = [lb.parse_result(x) for x in text.splitlines() if x.startswith("RESULT")]
        if p.returncode != 0 or not lines:
            # The rank that failed by itself first, not the peer killed after it.
            failures.append((p.returncode == -9, f"rank {rank} exited {p.returncode}: {errors.strip()[-2000:]}"))
        else:
            results.append(lines[-1])
    if failures:
        raise RuntimeError(sorted(failures)[0][1])
    veth_per_step = (link.tx_bytes(1) - tx0) / steps
    for x in results:
        x["veth_bytes_per_step"] = veth_per_step
        x["asked_bytes_per_step"] = x.get("hook_bytes") or x.get("bytes_reduced", 0)
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", help="ddp_bench_lenet (default: build-bench/ or build/ under the repo)")
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--rate", default="1gbit", help="tbf rate on both ends (tc syntax), or none")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="local,ddp,ddp_malloc_auto,pytorch_ddp")
    ap.add_argument("--model", default="mlp100")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--timeout", type=int, default=600)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run_netns_bench.py: needs root to create network namespaces")
    for tool in ("ip", "tc"):
        if not shutil.which(tool):
            sys.exit(f"run_netns_bench.py: '{tool}' is missing (iproute2)")
    binary = lb.find_binary(args.bin)
    modes = args.modes.split(",")
    for m in modes:
        if m not in MODES:
            sys.exit(f"unknown mode {m}; known: {', '.join(MODES)}")
    print(f"binary {binary}\nlink: tbf {args.rate} on both ends of a veth pair between two namespaces; "
          f"model {args.model}, batch {args.batch}/rank, {args.iters} timed steps (+{args.warmup} warm-up), "
          f"{args.threads} thread(s)/rank", flush=True)
    runs = {m: [] for m in modes}
    with Link(args.rate) as link:
        for r in range(args.rounds):
            order = modes[r % len(modes):] + modes[:r % len(modes)]
            for m in order:
                impl, flags = MODES[m]
                res = run_pair(link, impl, flags, args, binary)
                runs[m].append(res)
                cells = "; ".join(f"rank {x['rank']:.0f}: {x['ms_per_iter']:.0f} ms/step, main CPU "
                                  f"{x['main_cpu_ms_per_iter']:.0f}, CPU {x['cpu_ms_per_iter']:.0f} ms/step, "
                                  f"{x.get('faults_per_iter', float('nan')):.0f} faults/step" for x in res)
                cells += (f"; asked {res[0]['asked_bytes_per_step'] / 1e6:.2f} MB/step, "
                          f"veth (rank 1) {res[0]['veth_bytes_per_step'] / 1e6:.2f} MB/step")
                print(f"  round {r + 1}/{args.rounds} {m:16s} {cells}", flush=True)
    print(f"\n| run | ms per step (rank 0, every round) | main-thread CPU ms per step (rank 0) | "
          f"page faults per step (rank 0) | MB asked to all-reduce per step | MB sent per step on the veth (rank 1) |")
    print("|---|---|---|---|---|---|")
    for m in modes:
        ms = [x[0]["ms_per_iter"] for x in runs[m]]
        cpu = [x[0]["main_cpu_ms_per_iter"] for x in runs[m]]
        pf = [x[0].get("faults_per_iter", float("nan")) for x in runs[m]]
        print(f"| {m} | {' '.join('%.0f' % v for v in ms)} (median {statistics.median(ms):.0f}) | "
              f"{' '.join('%.0f' % v for v in cpu)} (median {statistics.median(cpu):.0f}) | "
              f"{' '.join('%.0f' % v for v in pf)} | "
              f"{statistics.median(x[0]['asked_bytes_per_step'] for x in runs[m]) / 1e6:.2f} | "
              f"{' '.join('%.2f' % (x[0]['veth_bytes_per_step'] / 1e6) for x in runs[m])} |")


if __name__ == "__main__":
    main()
