#!/usr/bin/env python3
"""Seconds to compile single translation units of a configured build, ccache bypassed.

Reads <build>/compile_commands.json (configure with -DCMAKE_EXPORT_COMPILE_COMMANDS=ON),
runs the compile command of each file whose path ends with one of the given suffixes,
one at a time, and prints the wall time of each run. The object goes to a scratch file,
so the build folder is left as it was. Precompiled headers the command uses must exist
(build the pch targets first: `cmake --build build --target ddp` builds the core's).

  bench/compile_cost.py build src/parallel/reducer/reducer.cpp tests/amp/amp_test.cpp --runs 2
"""
import argparse, json, os, shlex, subprocess, sys, tempfile, time

ap = argparse.ArgumentParser()
ap.add_argument("build")
ap.add_argument("files", nargs="+", help="path suffixes, e.g. src/comm/dist/dist.cpp")
ap.add_argument("--runs", type=int, default=1)
args = ap.parse_args()

entries = json.load(open(os.path.join(args.build, "compile_commands.json")))
scratch = tempfile.mkdtemp(prefix="compile_cost_")
for suffix in args.files:
    matches = [e for e in entries if e["file"].endswith(suffix)]
    if not matches:
        sys.exit(f"compile_cost: no compile command for {suffix} in {args.build}")
    e = matches[0]
    argv = shlex.split(e["command"]) if "command" in e else e["arguments"]
    if os.path.basename(argv[0]) == "ccache":
        argv = argv[1:]
    out = argv.index("-o")
    argv[out + 1] = os.path.join(scratch, "out.o")
    times = []
    for _ in range(args.runs):
        t = time.monotonic()
        subprocess.run(argv, cwd=e["directory"], check=True)
        times.append(time.monotonic() - t)
    print(f"{suffix}\t" + "\t".join(f"{s:.1f}" for s in times), flush=True)
