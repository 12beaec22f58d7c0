"""Runs a Python rank script (a PyTorch oracle) as ranks 0..WORLD_SIZE-1 of
one job, each rank a process of its own, forked from one interpreter that
has imported torch once: importing it costs each process 1.4 s (1.13) to
2.5 s (2.11) of CPU, more than most oracles' own work.

    python3 [flags] fork_ranks.py SCRIPT [ARGS...]

with the torchrun variables but RANK and LOCAL_RANK in the environment, and
DDP_TEST_FORK_RANKS naming a folder: rank r runs SCRIPT as __main__ with
RANK=LOCAL_RANK=r, its stdout and stderr to <folder>/rank<r>.log, and its
exit code goes to <folder>/rank<r>.exit (128+signal when killed) and its
process id to <folder>/rank<r>.pid, as run_ranks and find_rank_pid
(tests/support/multiprocess.h) read them. Nothing runs in the parent
but the imports, so no thread exists when it forks.

An oracle's results are a function of what it reads, so a job whose every
rank exited 0 leaves what it wrote in a cache (oracle_cache.py), and the
same job again takes it from there without importing torch.
DDP_ORACLE_CACHE=0 always runs PyTorch."""
import importlib
import os
import sys

import oracle_cache
import script_main


def write_file(path, text):
    """Written whole under another name, then renamed: a reader never sees part."""
    with open(path + ".partial", "w") as f:
        f.write(text)
    os.replace(path + ".partial", path)


def run_rank(rank, folder, script, args):
    """In the forked child: becomes rank `rank` and never returns."""
    fd = os.open(os.path.join(folder, "rank%d.log" % rank), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ["RANK"] = os.environ["LOCAL_RANK"] = str(rank)
    os._exit(script_main.run_as_main(script, args))


def run_job(folder, world, script, args):
    """Imports torch once (the modules DDP_FORK_RANKS_IMPORTS names, comma-separated; by default torch,
    torch.distributed and torch.nn.parallel), forks the ranks, waits for them; returns their exit codes by rank."""
    for module in os.environ.get("DDP_FORK_RANKS_IMPORTS", "torch,torch.distributed,torch.nn.parallel").split(","):
        if module:
            importlib.import_module(module)  # the point: imported once, before the fork

    sys.stdout.flush()
    sys.stderr.flush()
    ranks, codes = {}, {}
    for rank in range(world):
        pid = os.fork()
        if pid == 0:
            run_rank(rank, folder, script, args)
        ranks[pid] = rank
        write_file(os.path.join(folder, "rank%d.pid" % rank), str(pid))
    while ranks:
        pid, status = os.wait()
        rank = ranks.pop(pid, None)
        if rank is None:
            continue
        code = os.waitstatus_to_exitcode(status)
        codes[rank] = code if code >= 0 else 128 - code
        write_file(os.path.join(folder, "rank%d.exit" % rank), str(codes[rank]))
    return codes


def main():
    folder = os.environ.pop("DDP_TEST_FORK_RANKS")
    world = int(os.environ["WORLD_SIZE"])
    script, args = sys.argv[1], sys.argv[2:]
    try:
        cache = oracle_cache.OracleCache.for_job(folder, world, script, args)
    except Exception as e:  # the cache is an aid: without it PyTorch runs
        print("fork_ranks: no oracle cache for this job: %r" % e, flush=True)
        cache = None
    if cache and cache.restore():
        print("fork_ranks: PyTorch's results for this job from %s (DDP_ORACLE_CACHE=0 runs PyTorch)" % cache.entry,
              flush=True)
        return
    before = oracle_cache.snapshot(cache.folders) if cache else {}
    codes = run_job(folder, world, script, args)
    if cache and all(c == 0 for c in codes.values()):
        cache.store(before)


if __name__ == "__main__":
    main()
