"""Checks a DDP timeline (DDP_TIMELINE's Chrome trace-event JSON) of a job:
python3 check_timeline.py TRACE WORLD STEPS. Prints what it checked; exits 1
with the first violation."""
import json
import sys
from collections import defaultdict


def fail(msg):
    print("timeline check failed: " + msg)
    sys.exit(1)


def main(path, world, steps):
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    if sorted(names) != list(range(world)):
        fail(f"expected one process row per rank 0..{world - 1}, got {sorted(names)}")
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    for r in range(world):
        if threads.get((r, 0)) != "compute" or threads.get((r, 1)) != "communication":
            fail(f"rank {r}: expected thread rows compute (0) and communication (1), got {threads}")
    rtt = max(e["args"]["round_trip_us"] for e in events if e.get("name") == "clock offset to rank 0")

    # bucket -> per (rank, step): ready, launch, done
    ready, launch, done = {}, {}, {}
    forwards, backwards = defaultdict(int), defaultdict(int)
    for e in events:
        if e["ph"] == "M":
            continue
        key = (e["pid"], e["args"]["step"])
        if e["name"] == "forward":
            forwards[e["pid"]] += 1
        elif e["name"] == "backward":
            backwards[e["pid"]] += 1
        elif e["name"].endswith(" ready"):
            ready[key + (e["args"]["bucket"],)] = e["ts"]
        elif e["name"].endswith(" launched"):
            launch[key + (e["args"]["bucket"],)] = e["ts"]
        elif e["ph"] == "X" and e["cat"] == "communication":
            done[key + (e["args"]["bucket"],)] = e["args"]["done_us"]
            if e["ts"] < e["args"]["launch_us"] or e["ts"] + e["dur"] != e["args"]["done_us"]:
                fail(f"span of {e['name']} is not within launch..done: {e}")
    for r in range(world):
        if forwards[r] != steps or backwards[r] != steps:
            fail(f"rank {r}: {forwards[r]} forward and {backwards[r]} backward spans, expected {steps} each")
    if set(launch) != set(done) or set(launch) != set(ready):
        fail("every bucket must be ready, launched and done exactly once per step")
    buckets = sorted({k[2] for k in launch})
    checked = 0
    for r in range(world):
        for s in range(steps):
            # A rank's times are on rank 0's time base: its first events can be
            # slightly negative (the clock offset's error, up to the round trip).
            previous_launch = float("-inf")
            for b in buckets:
                k = (r, s, b)
                if k not in launch:
                    continue
                if not ready[k] <= launch[k] <= done[k]:
                    fail(f"rank {r} step {s} bucket {b}: ready {ready[k]}, launched {launch[k]}, done {done[k]}")
                if launch[k] < previous_launch:
                    fail(f"rank {r} step {s}: bucket {b} launched before the bucket ahead of it")
                previous_launch = launch[k]
                # One time base: an all-reduce cannot end on any rank before
                # every rank has launched it (up to the offsets' error).
                for other in range(world):
                    if done[k] + rtt < launch[(other, s, b)]:
                        fail(f"step {s} bucket {b}: done on rank {r} at {done[k]} before rank {other} launched it at "
                             f"{launch[(other, s, b)]} (clock error bound {rtt} us)")
                checked += 1
    # The skew report beside the trace: one row per step and bucket, the
    # last rank the one with the latest launch, its lag over the first.
    skew = path[:-5] + ".skew.csv" if path.endswith(".json") else path + ".skew.csv"
    with open(skew) as f:
        rows = [line.strip().split(",") for line in f][1:]
    expected = len({(k[1], k[2]) for k in launch if k[0] == 0})  # the first step has one bucket, before the rebuild
    if len(rows) != expected:
        fail(f"{skew}: {len(rows)} rows, expected {expected}")
    for row in rows:
        launches = [int(v) for v in row[4:]]
        if int(row[2]) != launches.index(max(launches)) or int(row[3]) != max(launches) - min(launches):
            fail(f"{skew}: wrong last rank or lag in {row}")
    print(f"timeline ok: {world} ranks, {steps} steps, {len(buckets)} buckets, {checked} bucket records, "
          f"clock round trip <= {rtt} us")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
