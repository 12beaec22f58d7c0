"""The cache of PyTorch oracles' results (fork_ranks.py), as ccache is for
compiles: a job's key is everything its result can depend on, and a job
whose key is in the cache gets the files its ranks wrote, their logs and
exit codes, without importing torch.

The key holds:
- the interpreter (its path, version and flags) and every installed
  distribution's name and version (torch, numpy, ...);
- the size and modification time of torch's native libraries (the wheel's
  torch/lib, or Debian's libtorch and libc10 under /usr/lib), and of the
  system's package list (an upgraded BLAS, libm or OpenMP changes it), the
  C library's version and the BLAS the alternatives choose;
- the CPU (model and flags, which choose LibTorch's kernels), any GPU and
  its driver;
- the content of every Python file in the tests' tree (the script, what it
  imports from there, this file);
- the arguments, with a file named by its content and a folder (the job's
  own, and any other an argument names) by a placeholder;
- the environment, but the variables that only place the job (its port,
  its folder, the working directory) and those of the tools around it
  (ccache, the terminal, CI's own).

What a job reads is its arguments and environment: the oracles read no file
of the folders they are given, which they only write to; what is kept is
what the job wrote into them, and it goes back into the same places of the
next job's folders. Only jobs whose every rank exited 0 are kept. DDP_ORACLE_CACHE=0 turns the cache off; another value
than 1 names its folder (default: $XDG_CACHE_HOME or ~/.cache, then
libddp/oracle). It keeps at most MAX_BYTES, the least recently used going
first."""
import glob
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import sys
import tempfile
import time

VERSION = 1
MAX_BYTES = 1 << 30

# Variables that say where a job runs, not what it computes; and those of
# the tools around it (the build's ccache, the shell, the terminal, CI).
PLACE_ONLY = {"MASTER_PORT", "DDP_TEST_DIR", "DDP_TEST_FORK_RANKS", "DDP_ORACLE_CACHE", "DDP_TEST_JOBS", "PWD", "OLDPWD",
              "SHLVL", "_", "CI", "TERM", "COLORTERM", "LS_COLORS", "DISPLAY", "TMUX", "STY", "WINDOW", "MAIL"}
TOOLS = ("CCACHE_", "SSH_", "CTEST_", "XDG_SESSION_", "DBUS_", "GITHUB_", "GITLAB_", "RUNNER_")


def counts(variable):
    """Whether an environment variable is part of a job's key."""
    return variable not in PLACE_ONLY and not variable.startswith(TOOLS)



def cache_folder():
    """The cache's folder, or None when DDP_ORACLE_CACHE=0."""
    setting = os.environ.get("DDP_ORACLE_CACHE", "1")
    if setting == "0":
        return None
    if setting != "1":
        return setting
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "libddp", "oracle")


def file_digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def native_libraries():
    """(path, size, mtime) of the libraries torch runs on, found without importing it."""
    spec = importlib.util.find_spec("torch")
    places = []
    if spec and spec.origin:
        package = os.path.dirname(spec.origin)
        places += [os.path.join(package, "_C*.so"), os.path.join(package, "lib", "*.so*")]
    places += ["/usr/lib/*/libtorch*.so*", "/usr/lib/*/libc10*.so*", "/var/lib/dpkg/status"]
    found = [platform.libc_ver(), sorted(os.path.realpath(p) for p in glob.glob("/etc/alternatives/lib*blas*"))]
    for pattern in places:
        for path in sorted(glob.glob(pattern)):
            try:
                st = os.stat(path)
                found.append((path, st.st_size, st.st_mtime_ns))
            except OSError:  # a link to nothing
                found.append((path, "missing"))
    return found


def machine():
    """The CPU's model and flags, and the GPUs' descriptions, as text."""
    parts = []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "flags")):
                    parts.append(line.strip())
                if not line.strip() and parts:
                    break  # the first processor is enough: they are alike
    except OSError:
        pass
    for info in sorted(glob.glob("/proc/driver/nvidia/gpus/*/information")) + glob.glob("/proc/driver/nvidia/version"):
        with open(info) as f:
            parts.append(f.read())
    return parts


def python_tree(tests_root):
    """(relative path, digest) of every Python file under `tests_root`."""
    files = []
    for folder, dirs, names in os.walk(tests_root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(names):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                files.append((os.path.relpath(path, tests_root), file_digest(path)))
    return files


def output_folders(folder, args):
    """Where the job writes: its own folder, then every folder an argument names."""
    folders = [folder]
    for a in args:
        if os.path.isdir(a) and os.path.realpath(a) not in map(os.path.realpath, folders):
            folders.append(a)
    return folders


def placed(value, folders):
    """`value` with each of the job's folders as a placeholder (the longest first)."""
    for i, f in sorted(enumerate(folders), key=lambda x: -len(x[1])):
        value = value.replace(f.rstrip("/"), "<folder %d>" % i)
    return value


def job_key(folders, world, script, args):
    """The job's key: a digest of everything its result can depend on."""
    tests_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    described_args = []
    for a in args:
        if os.path.isfile(a):
            described_args.append("file " + file_digest(a))
        else:
            described_args.append(placed(a, folders))
    what = {
        "version": VERSION,
        "python": [os.path.realpath(sys.executable), sys.version, repr(sys.flags)],
        "distributions": sorted("%s %s" % (d.metadata["Name"], d.version) for d in importlib.metadata.distributions()),
        "libraries": native_libraries(),
        "machine": machine(),
        "tests": python_tree(tests_root),
        "world": world,
        "script": [os.path.relpath(os.path.abspath(script), tests_root), file_digest(script)],
        "args": described_args,
        "environment": sorted((k, placed(v, folders)) for k, v in os.environ.items() if counts(k)),
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


def snapshot(folders):
    """{(folder index, relative path): (size, mtime)} of the files under `folders`."""
    files = {}
    for i, folder in enumerate(folders):
        for root, _, names in os.walk(folder):
            for name in names:
                path = os.path.join(root, name)
                if os.path.isfile(path) and not os.path.islink(path):
                    st = os.stat(path)
                    files[(i, os.path.relpath(path, folder))] = (st.st_size, st.st_mtime_ns)
    return files


def is_result(where):
    """Whether a file the job wrote is kept: not the starter's own log (ranks.log in the job's folder), not a
    rank's process id (it would name another process) nor a file half written."""
    i, relative = where
    name = os.path.basename(relative)
    return (i, relative) != (0, "ranks.log") and not (name.startswith("rank") and name.endswith((".pid", ".partial")))


class OracleCache:
    def __init__(self, root, key, folders):
        self.root, self.key, self.folders = root, key, folders
        self.entry = os.path.join(root, key[:2], key)

    @classmethod
    def for_job(cls, folder, world, script, args):
        """The job's place in the cache, or None when the cache is off."""
        root = cache_folder()
        if root is None:
            return None
        folders = output_folders(folder, args)
        return cls(root, job_key(folders, world, script, args), folders)

    def restore(self):
        """Writes the cached files into the job's folders; False when the key is not cached."""
        try:
            with open(os.path.join(self.entry, "manifest.json")) as f:
                manifest = json.load(f)
            for i, relative in manifest["files"]:
                if not 0 <= i < len(self.folders) or os.path.isabs(relative) or ".." in relative.split(os.sep):
                    return False
                target = os.path.join(self.folders[i], relative)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                shutil.copyfile(os.path.join(self.entry, "files", str(i), relative), target + ".partial")
                os.replace(target + ".partial", target)
            os.utime(os.path.join(self.entry, "manifest.json"))  # recently used
            return True
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            return False

    def store(self, before):
        """Keeps what the job wrote into its folders (files new or changed since `before`)."""
        after = snapshot(self.folders)
        written = sorted(p for p, st in after.items() if before.get(p) != st and is_result(p))
        os.makedirs(os.path.dirname(self.entry), exist_ok=True)
        staging = tempfile.mkdtemp(prefix=".staging-", dir=os.path.dirname(self.entry))
        try:
            for i, relative in written:
                target = os.path.join(staging, "files", str(i), relative)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                shutil.copyfile(os.path.join(self.folders[i], relative), target)
            with open(os.path.join(staging, "manifest.json"), "w") as f:
                json.dump({"files": written, "stored": time.time()}, f)
            os.rename(staging, self.entry)  # whole or not at all; a job beside this one may have won
        except OSError:
            pass
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        self.trim()

    def trim(self):
        """Removes the least recently used entries while the cache holds more than MAX_BYTES, and what a store
        that was killed left (a staging folder older than an hour)."""
        entries, total = [], 0
        for staging in glob.glob(os.path.join(self.root, "*", ".staging-*")):
            try:
                if time.time() - os.path.getmtime(staging) > 3600:
                    shutil.rmtree(staging, ignore_errors=True)
            except OSError:
                pass  # another job's trim took it
        for manifest in glob.glob(os.path.join(self.root, "*", "*", "manifest.json")):
            entry = os.path.dirname(manifest)
            try:
                size = sum(os.path.getsize(os.path.join(r, n)) for r, _, ns in os.walk(entry) for n in ns)
                entries.append((os.path.getmtime(manifest), size, entry))
            except OSError:
                continue  # another job's trim took it
            total += size
        for _, size, entry in sorted(entries):
            if total <= MAX_BYTES:
                break
            shutil.rmtree(entry, ignore_errors=True)
            total -= size
