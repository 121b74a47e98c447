#!/usr/bin/env python3
"""Memoizes an expensive function whose results are about a megabyte each, with
tidepool.soft_cache (--cache soft) or functools.lru_cache(maxsize=None) (--cache lru).

Each round calls the function for every key and adds up the CRC-32 of the results; the script
prints the total ("answer 0x...") and the cache's counts. Under memory pressure, soft_cache
gives memory back and recomputes what it dropped; lru_cache(maxsize=None) keeps everything and
can get the process OOM-killed.

    python examples/python/memoize.py --cache soft --keys 300 --rounds 3

With --pause, the script prints "warm" after the first round and waits for a line on standard
input before the next (tests use it to squeeze memory at a known point).
"""

import argparse
import functools
import hashlib
import sys
import time
import zlib
from typing import Protocol

# Results of 1000 KiB: two fit in one of soft memory's 2 MiB segments.
DEFAULT_SIZE_KIB = 1000


class Cached(Protocol):
    """What both caches give: the memoized function, and its counts."""

    def __call__(self, key: int, /) -> bytes: ...

    def cache_info(self) -> tuple[int, int, int | None, int]: ...


def expensive(key: int, size: int) -> bytes:
    """The slow function being memoized: `size` pseudo-random bytes derived from `key`."""
    return hashlib.shake_256(f"tidepool-{key}".encode()).digest(size)


def answer(keys: int, size: int, rounds: int) -> int:
    """What the script should print, computed without a cache."""
    one_round = sum(zlib.crc32(expensive(k, size)) for k in range(keys))
    return one_round * rounds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--cache", choices=["soft", "lru"], default="soft")
    p.add_argument("--keys", type=int, default=300, help="distinct arguments (default 300)")
    p.add_argument("--size-kib", type=int, default=DEFAULT_SIZE_KIB, help="result size")
    p.add_argument("--rounds", type=int, default=3, help="passes over every key (default 3)")
    p.add_argument(
        "--reserve-mib",
        type=int,
        help="soft memory's reserve: memory left to everything else (default: tidepool's)",
    )
    p.add_argument("--pause", action="store_true", help="wait for a line after the first round")
    args = p.parse_args(argv)
    size = args.size_kib << 10

    if args.cache == "soft":
        import tidepool

        if args.reserve_mib is not None:
            tidepool.configure(reserve=args.reserve_mib << 20)
        cached: Cached = tidepool.soft_cache(lambda k: expensive(k, size))
    else:
        cached = functools.lru_cache(maxsize=None)(lambda k: expensive(k, size))

    t0 = time.monotonic()
    total = 0
    for r in range(args.rounds):
        for k in range(args.keys):
            total += zlib.crc32(cached(k))
        print(f"round {r + 1} done at {time.monotonic() - t0:.2f}s: {cached.cache_info()}",
              flush=True)
        if r == 0 and args.pause:
            print("warm", flush=True)
            sys.stdin.readline()
    print(f"answer {total:#x}", flush=True)
    if args.cache == "soft":
        s = tidepool.stats()
        print(f"soft memory: budget {s['budget'] >> 20} MiB, used {s['used'] >> 20} MiB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
