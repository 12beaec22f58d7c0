#!/usr/bin/python3
"""The core's layout (issue 28), checked on the source tree:
  - no file in src/, include/ or launcher/ is over 600 lines;
  - every folder of src/ and include/ddp/ has its line in that tree's README.md;
  - every header starts with a comment that says what it is for;
  - the old flat header paths are one-line forwarders to files that exist, and
    nothing in the tree includes them (they are for users' code, until 1.0).
Usage: check_layout.py SOURCE_DIR. Prints each problem; exit 1 if any."""
import os
import re
import sys

MAX_LINES = 600


def main():
    root = sys.argv[1]
    problems = []

    def files_under(*tops):
        for top in tops:
            for d, _, names in os.walk(os.path.join(root, top)):
                for n in names:
                    yield os.path.join(d, n)

    code = [p for p in files_under("src", "include", "launcher") if p.endswith((".h", ".cpp"))]
    for p in code:
        with open(p, encoding="utf-8") as f:
            lines = f.read().splitlines()
        rel = os.path.relpath(p, root)
        if len(lines) > MAX_LINES:
            problems.append(f"{rel}: {len(lines)} lines, over {MAX_LINES}: split it by what owns which state")
        if p.endswith(".h") and not (lines and lines[0].startswith("//")):
            problems.append(f"{rel}: a header starts with a comment saying what it is for")

    for tree in ("src", "include/ddp"):
        readme = os.path.join(root, tree, "README.md")
        text = open(readme, encoding="utf-8").read() if os.path.exists(readme) else ""
        for d, subdirs, _ in os.walk(os.path.join(root, tree)):
            for s in subdirs:
                rel = os.path.relpath(os.path.join(d, s), os.path.join(root, tree))
                if f"`{rel}/`" not in text:
                    problems.append(f"{tree}/README.md: no line for the folder `{rel}/`")

    forwarders = {}
    inc = os.path.join(root, "include", "ddp")
    for n in sorted(os.listdir(inc)):
        p = os.path.join(inc, n)
        if not n.endswith(".h") or not os.path.isfile(p):
            continue
        m = re.search(r'^#include "(ddp/[a-z]+/[a-z_]+\.h)"$', open(p, encoding="utf-8").read(), re.M)
        if "Moved to" in open(p, encoding="utf-8").readline():
            if not m or not os.path.exists(os.path.join(root, "include", m.group(1))):
                problems.append(f"include/ddp/{n}: a forwarding header whose target does not exist")
            forwarders[f"ddp/{n}"] = m.group(1) if m else None
    pattern = re.compile(r'#include [<"](' + "|".join(re.escape(k) for k in forwarders) + r')[">]') if forwarders else None
    for p in files_under("src", "include", "launcher", "tests", "examples", "bench", "fuzz"):
        # forwarding_headers_test.cpp includes them on purpose: they must compile.
        if not p.endswith((".h", ".cpp")) or os.path.dirname(p) == inc or p.endswith("forwarding_headers_test.cpp"):
            continue
        for i, line in enumerate(open(p, encoding="utf-8", errors="replace"), 1):
            m = pattern.search(line) if pattern else None
            if m:
                problems.append(f"{os.path.relpath(p, root)}:{i}: includes the forwarding header {m.group(1)}; "
                                f"include {forwarders[m.group(1)]}")
    for p in problems:
        print(p)
    print(f"layout: {len(code)} source files, {len(forwarders)} forwarding headers, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
