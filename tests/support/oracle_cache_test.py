"""The oracle cache (oracle_cache.py) through fork_ranks.py, as run_ranks
starts it: a job run twice runs once, and anything its result can depend on
(its arguments, its environment, its script) runs it again; a failed job is
not kept; DDP_ORACLE_CACHE=0 always runs; the job's folders and port do not
count. The jobs are small scripts that write their process id into a folder
named in their arguments: a cached result shows the first run's. They
import no torch (DDP_FORK_RANKS_IMPORTS is empty), so any python3 runs this.

    python3 oracle_cache_test.py   (unittest's options after it)"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))

SCRIPT = """
import os, sys
with open(os.path.join(sys.argv[1], "torch_out_rank%s.txt" % os.environ["RANK"]), "w") as f:
    f.write("%d %s %s" % (os.getpid(), sys.argv[2], os.environ.get("ORACLE_TEST_KNOB", "")))
print("rank", os.environ["RANK"], "wrote its file")
sys.exit(int(os.environ.get("ORACLE_TEST_EXIT", "0")))
"""


class OracleCacheTest(unittest.TestCase):
    def setUp(self):
        self.work = tempfile.mkdtemp(prefix="ddp_oracle_cache_test_")
        self.cache = os.path.join(self.work, "cache")
        # A tests' tree of its own, laid out as ours (the key holds every
        # Python file in it): support/ with the two files under test, and
        # the script beside it, as every oracle is.
        tree = os.path.join(self.work, "tests")
        os.makedirs(os.path.join(tree, "support"))
        for name in ("fork_ranks.py", "oracle_cache.py", "script_main.py"):
            shutil.copy(os.path.join(HERE, name), os.path.join(tree, "support", name))
        self.fork_ranks = os.path.join(tree, "support", "fork_ranks.py")
        self.script = os.path.join(tree, "oracle.py")
        with open(self.script, "w") as f:
            f.write(SCRIPT)
        self.port = 29000

    def tearDown(self):
        shutil.rmtree(self.work, ignore_errors=True)

    def run_job(self, arg="a", world=2, **env_extra):
        """Runs the job in a new folder; returns {rank: (pid, arg, knob)}, the exit codes and the starter's log."""
        folder = self.last_folder = tempfile.mkdtemp(dir=self.work)
        out = tempfile.mkdtemp(dir=self.work)  # another folder to write to, as the parity tests give theirs
        self.port += 1
        env = dict(os.environ, WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(self.port), DDP_TEST_DIR=folder, DDP_TEST_FORK_RANKS=folder,
                   DDP_ORACLE_CACHE=self.cache, DDP_FORK_RANKS_IMPORTS="")
        env.update(env_extra)
        with open(os.path.join(folder, "ranks.log"), "w") as log:
            subprocess.run([sys.executable, self.fork_ranks, self.script, out, arg], env=env, stdout=log,
                           stderr=subprocess.STDOUT, check=True, timeout=120)
        outs, codes = {}, {}
        for r in range(world):
            with open(os.path.join(folder, "rank%d.exit" % r)) as f:
                codes[r] = int(f.read())
            path = os.path.join(out, "torch_out_rank%d.txt" % r)
            if os.path.exists(path):
                with open(path) as f:
                    pid, a, knob = (f.read().split(" ") + [""])[:3]
                outs[r] = (int(pid), a, knob)
            with open(os.path.join(folder, "rank%d.log" % r)) as f:
                self.assertIn("wrote its file", f.read())
        with open(os.path.join(folder, "ranks.log")) as f:
            return outs, codes, f.read()

    def test_the_same_job_runs_once_and_what_it_depends_on_runs_it_again(self):
        first, codes, log = self.run_job()
        self.assertEqual(codes, {0: 0, 1: 0})
        self.assertNotIn("from", log)
        again, codes, log = self.run_job()
        self.assertEqual(again, first)  # the first run's process ids: not run again
        self.assertFalse([n for n in os.listdir(self.last_folder) if n.endswith(".pid")])  # no stale process ids
        self.assertEqual(codes, {0: 0, 1: 0})
        self.assertIn("results for this job from " + self.cache, log)
        for changed in (dict(arg="b"), dict(ORACLE_TEST_KNOB="1"), dict(world=3), dict(OMP_NUM_THREADS="7")):
            outs, _, log = self.run_job(**changed)
            self.assertNotEqual(outs[0][0], first[0][0], changed)
            self.assertNotIn("from " + self.cache, log, changed)

    def test_a_failed_job_is_not_kept_and_zero_turns_the_cache_off(self):
        outs, codes, _ = self.run_job(ORACLE_TEST_EXIT="3")
        self.assertEqual(codes, {0: 3, 1: 3})
        again, codes, log = self.run_job(ORACLE_TEST_EXIT="3")
        self.assertNotEqual(again[0][0], outs[0][0])
        self.assertNotIn("from " + self.cache, log)
        first, _, _ = self.run_job()
        off, _, log = self.run_job(DDP_ORACLE_CACHE="0")
        self.assertNotEqual(off[0][0], first[0][0])
        self.assertNotIn("from", log)

    def test_a_changed_script_runs_again(self):
        first, _, _ = self.run_job()
        with open(self.script, "a") as f:
            f.write("\n# changed\n")
        again, _, log = self.run_job()
        self.assertNotEqual(again[0][0], first[0][0])
        self.assertNotIn("from " + self.cache, log)

    def test_a_damaged_entry_runs_the_job(self):
        first, _, _ = self.run_job()
        for root, _, names in os.walk(self.cache):
            if "manifest.json" in names:
                with open(os.path.join(root, "manifest.json"), "w") as f:
                    f.write("{not json")
        again, codes, _ = self.run_job()
        self.assertNotEqual(again[0][0], first[0][0])
        self.assertEqual(codes, {0: 0, 1: 0})


if __name__ == "__main__":
    unittest.main()
