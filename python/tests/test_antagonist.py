"""The example script under a memory antagonist, in a memory cgroup with no swap: with
soft_cache it gives memory back and finishes with the right answer; with
functools.lru_cache(maxsize=None) it is OOM-killed.

Both processes join a fresh memory cgroup (cgroup v1 under this process's own, or v2) limited
to LIMIT bytes. The script fills its cache (300 results of 1000 KiB, ~300 MiB) in a first round
and waits; the antagonist then takes ANTAGONIST bytes and holds them; the script goes on with
two more rounds over every key. The script is the OOM killer's first choice (oom_score_adj
1000), so an OOM in the cgroup kills it, never the antagonist. No step waits on a clock: each
waits for the other process to say it is done (or to die).
"""

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
from _example import SCRIPT, load, printed_answer

MiB = 1 << 20
LIMIT = 512 * MiB
ANTAGONIST = 320 * MiB
KEYS, SIZE_KIB, ROUNDS = 300, 1000, 3

# Joins the cgroup named by argv[1] (its cgroup.procs), sets its oom_score_adj to argv[2],
# then becomes the command after them.
JOIN = (
    "import os, sys\n"
    "with open(sys.argv[1], 'w') as f: f.write(str(os.getpid()))\n"
    "with open('/proc/self/oom_score_adj', 'w') as f: f.write(sys.argv[2])\n"
    "os.execv(sys.argv[3], sys.argv[3:])\n"
)

# Waits for a line, takes its memory in 16 MiB blocks that it writes to, says so, and holds it
# until its standard input closes.
ANTAGONIST_CODE = (
    "import sys\n"
    "sys.stdin.readline()\n"
    "held = [bytearray(b'\\x01') * (16 << 20) for _ in range(int(sys.argv[1]) // (16 << 20))]\n"
    "print('holding', flush=True)\n"
    "sys.stdin.read()\n"
)


def own_cgroup_v1():
    for line in pathlib.Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return pathlib.Path("/sys/fs/cgroup/memory") / path.lstrip("/")
    return None


class Cgroup:
    """A memory cgroup limited to `limit` bytes with no swap, removed by `remove`."""

    def __init__(self, limit):
        name = f"tidepool-py-antagonist-{os.getpid()}-{time.monotonic_ns()}"
        v1 = own_cgroup_v1()
        v2_root = pathlib.Path("/sys/fs/cgroup")
        if v1 is not None and v1.is_dir():
            self.v2 = False
            self.dir = v1 / name
        elif (v2_root / "cgroup.controllers").exists() and "memory" in (
            v2_root / "cgroup.subtree_control"
        ).read_text().split():
            # A leaf under the root, whose memory controller is on for its children.
            self.v2 = True
            self.dir = v2_root / name
        else:
            raise OSError("no cgroup memory controller (v1 or v2) found")
        self.dir.mkdir()
        try:
            if self.v2:
                self.write("memory.max", limit)
                self.write("memory.swap.max", 0)
            else:
                self.write("memory.limit_in_bytes", limit)
                if (self.dir / "memory.memsw.limit_in_bytes").exists():
                    self.write("memory.memsw.limit_in_bytes", limit)
                else:
                    self.write("memory.swappiness", 0)
        except OSError:
            self.remove()
            raise

    def write(self, name, value):
        (self.dir / name).write_text(str(value))

    @property
    def procs(self):
        return str(self.dir / "cgroup.procs")

    def oom_kills(self):
        name, key = ("memory.events", "oom_kill") if self.v2 else ("memory.oom_control", "oom_kill")
        for line in (self.dir / name).read_text().splitlines():
            k, _, v = line.partition(" ")
            if k == key:
                return int(v)
        return 0

    def remove(self):
        for _ in range(100):
            try:
                self.dir.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.05)


@pytest.fixture
def cgroup():
    if os.geteuid() != 0:
        pytest.skip("the antagonist test needs root to make a memory cgroup")
    try:
        cg = Cgroup(LIMIT)
    except OSError as e:
        pytest.skip(f"the antagonist test needs a writable memory cgroup: {e}")
    yield cg
    cg.remove()


@pytest.fixture(scope="module")
def expected():
    return load().answer(KEYS, SIZE_KIB << 10, ROUNDS)


def spawn(cg, oom_score_adj, *cmd):
    return subprocess.Popen(
        [sys.executable, "-c", JOIN, cg.procs, str(oom_score_adj), sys.executable, *cmd],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def run_under_antagonist(cg, cache):
    """Runs the script and the antagonist; returns the script's (returncode, stdout, stderr)."""
    script = spawn(cg, 1000, "-u", str(SCRIPT), "--cache", cache, "--keys", str(KEYS),
                   "--size-kib", str(SIZE_KIB), "--rounds", str(ROUNDS), "--pause")
    antagonist = spawn(cg, 0, "-c", ANTAGONIST_CODE, str(ANTAGONIST))
    out = []
    try:
        # Until the cache is warm (or the script died filling it).
        for line in script.stdout:
            out.append(line)
            if line.strip() == "warm":
                break
        # The antagonist takes its memory (the script may be killed meanwhile).
        antagonist.stdin.write("go\n")
        antagonist.stdin.flush()
        said = antagonist.stdout.readline()
        assert said.strip() == "holding", f"the antagonist did not take its memory: {said!r}"
        # Buffered, flushed by communicate (which lets a broken pipe pass: killed already).
        script.stdin.write("go\n")
        rest, err = script.communicate(timeout=120)
        out.append(rest)
        return script.returncode, "".join(out), err
    finally:
        for p in (script, antagonist):
            if p.poll() is None:
                p.kill()
            p.wait()
            for f in (p.stdin, p.stdout, p.stderr):
                try:
                    f.close()
                except (OSError, BrokenPipeError):
                    pass


def test_soft_cache_gives_memory_back_and_finishes(cgroup, expected):
    code, out, err = run_under_antagonist(cgroup, "soft")
    assert code == 0, f"the soft_cache script died ({code}): {out}\n{err}"
    assert printed_answer(out) == expected, out
    assert cgroup.oom_kills() == 0
    # Results were dropped under pressure and recomputed: more misses than keys.
    last = [line for line in out.splitlines() if line.startswith("round 3")][0]
    misses = int(last.split("misses=")[1].split(",")[0])
    assert misses > KEYS, out


def test_lru_cache_is_oom_killed(cgroup):
    code, out, err = run_under_antagonist(cgroup, "lru")
    assert code == -signal.SIGKILL or cgroup.oom_kills() > 0, (
        f"the lru_cache script was not OOM-killed ({code}): {out}\n{err}"
    )
    assert code != 0 and printed_answer(out) is None
