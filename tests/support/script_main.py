"""Running a Python script as `python3 SCRIPT ARGS...` would, in a process
that has imported what the script needs already (fork_ranks.py's ranks,
python_server.py's requests): the script runs as __main__ with its
arguments and its folder first on sys.path, and the exit code is what an
uncaught SystemExit or exception would give the interpreter's."""
import os
import runpy
import sys
import traceback


def run_as_main(script, args):
    """Runs `script` with `args`; returns its exit code, its output flushed."""
    sys.argv = [script] + list(args)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:  # what an uncaught exception does to `python3 script`
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code
