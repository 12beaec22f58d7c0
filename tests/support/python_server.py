"""Runs the Python scripts of one test program with torch imported once.

    python3 python_server.py

The test program (python_server.h) writes a request a line: the file for
the script's output, the script and its arguments, separated by NUL bytes.
For each, this process forks; the child runs the script as __main__ with
those arguments, its stdout and stderr into the file, and the parent
answers with a line holding the child's exit code (128+signal when it was
killed). Each request starts from the same interpreter, torch imported and
nothing else run, as a fresh `python3 SCRIPT ARGS...` would but for the
import: about a second of CPU each, which ten checks of one program paid
ten times. The server ends at the end of its input.

DDP_PYTHON_SERVER_IMPORTS names the modules imported before the forks,
comma-separated (default: torch; empty: none, as python_server_test.py
runs it)."""
import importlib
import os
import sys
import traceback

import script_main


def run_script(output, argv):
    """In the forked child: runs the script and never returns."""
    code = 1
    try:
        fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        code = script_main.run_as_main(argv[0], argv[1:])
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code & 0xFF)


def main():
    for module in os.environ.get("DDP_PYTHON_SERVER_IMPORTS", "torch").split(","):
        if module:
            importlib.import_module(module)
    requests = sys.stdin.buffer
    answers = sys.stdout
    while True:
        line = requests.readline()
        if not line:
            return
        fields = [f.decode() for f in line.rstrip(b"\n").split(b"\0")]
        if len(fields) < 2:
            print(127, file=answers, flush=True)
            continue
        pid = os.fork()
        if pid == 0:
            run_script(fields[0], fields[1:])
        _, status = os.waitpid(pid, 0)
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
        print(code, file=answers, flush=True)


if __name__ == "__main__":
    main()
