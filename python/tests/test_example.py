"""The example script, run as a user would, with both caches."""

import subprocess
import sys

import pytest
from _example import SCRIPT, load, printed_answer


@pytest.mark.parametrize("cache", ["soft", "lru"])
def test_memoize_example_prints_the_right_answer(cache):
    args = ["--keys", "40", "--size-kib", "64", "--rounds", "3"]
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--cache", cache, *args],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert printed_answer(out.stdout) == load().answer(40, 64 << 10, 3), out.stdout
    # Every key computed once, then hits (nothing squeezed it).
    assert "hits=80, misses=40" in out.stdout, out.stdout
