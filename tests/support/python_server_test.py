"""The Python server of the test programs (python_server.py): each request
runs its script as `python3 SCRIPT ARGS...` would, its output and exit code
included, from an interpreter no earlier request changed. The scripts import
no torch (DDP_PYTHON_SERVER_IMPORTS is empty), so any python3 runs this.

    python3 python_server_test.py   (unittest's options after it)"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))

SCRIPT = """
import sys
import sibling
print("argv", sys.argv[1:], "sibling", sibling.VALUE)
print("to stderr", file=sys.stderr)
if getattr(sys, "touched", False):
    print("an earlier request's change is visible")
sys.touched = True
what = sys.argv[1]
if what == "code":
    sys.exit(int(sys.argv[2]))
if what == "message":
    sys.exit("a message")
if what == "raise":
    raise ValueError("raised")
if what == "kill":
    import os, signal
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)
"""


class PythonServerTest(unittest.TestCase):
    def setUp(self):
        self.work = tempfile.mkdtemp(prefix="ddp_python_server_test_")
        self.script = os.path.join(self.work, "script.py")
        with open(self.script, "w") as f:
            f.write(SCRIPT)
        with open(os.path.join(self.work, "sibling.py"), "w") as f:
            f.write("VALUE = 7\n")

    def tearDown(self):
        shutil.rmtree(self.work)

    def serve(self, *requests):
        """[(exit code, output)] of each request's args, through one server."""
        lines = b""
        for i, args in enumerate(requests):
            fields = [os.path.join(self.work, "out%d" % i), self.script] + list(args)
            lines += b"\0".join(f.encode() for f in fields) + b"\n"
        env = dict(os.environ, DDP_PYTHON_SERVER_IMPORTS="")
        done = subprocess.run([sys.executable, os.path.join(HERE, "python_server.py")], input=lines, env=env,
                              capture_output=True, timeout=60, check=True)
        codes = [int(c) for c in done.stdout.split()]
        outputs = []
        for i in range(len(requests)):
            with open(os.path.join(self.work, "out%d" % i)) as f:
                outputs.append(f.read())
        return list(zip(codes, outputs))

    def test_each_request_gets_its_arguments_output_and_exit_code_from_a_fresh_interpreter(self):
        results = self.serve(["code", "0"], ["code", "3"], ["message"], ["raise"], ["kill"])
        self.assertEqual([c for c, _ in results], [0, 3, 1, 1, 128 + 9])
        for args, (_, out) in zip([["code", "0"], ["code", "3"], ["message"], ["raise"], ["kill"]], results):
            self.assertIn("argv %r sibling 7" % args, out)
            self.assertIn("to stderr", out)
            self.assertNotIn("earlier request", out)
        self.assertIn("a message", results[2][1])
        self.assertIn("ValueError: raised", results[3][1])

    def test_the_server_ends_at_the_end_of_its_input(self):
        self.assertEqual(self.serve(), [])


if __name__ == "__main__":
    unittest.main()
