"""How user code sees tidepool's types: checked by `mypy --strict` (scripts/test-python), never
run. stubtest holds the stub to the module; this holds it to its uses (a decoder such as
pickle.loads, memoryview and numpy over a FarArray, a cache on a method)."""

import pickle
from typing import Any, assert_type

import numpy

import tidepool


def soft_dict() -> None:
    d: tidepool.SoftDict[str, int] = tidepool.SoftDict(len, name="lengths")
    d["a"] = 1
    assert_type(d["a"], int)
    assert_type(list(d.items()), list[tuple[str, int]])
    assert_type(d.stats()["miss_rate"], float)


def caches() -> None:
    @tidepool.soft_cache
    def f(a: int) -> list[int]:
        return [a]

    @tidepool.soft_cache(typed=True)
    def g(a: int) -> str:
        return str(a)

    class Point:
        @tidepool.soft_cache
        def norm(self) -> float:
            return 1.0

    assert_type(f(1), list[int])
    assert_type(g(1), str)
    assert_type(Point().norm(), float)
    assert_type(f.cache_info(), tidepool.CacheInfo)
    assert_type(g.cache_info().maxsize, int | None)
    f.cache_clear()


def bytes_map() -> None:
    m = tidepool.SoftBytesMap(lambda k: k * 2, name="twice")
    m.insert(b"k", b"v")
    assert_type(m.get(b"k"), bytes | None)
    assert_type(m.get(b"k", default=0), bytes | int)
    assert_type(m.get(b"k", pickle.loads), Any | None)
    assert_type(m.get(b"k", bytes, b""), bytes)
    assert_type(m.get_or_call(b"k", lambda: b"v"), bytes)
    assert_type(m.get_or_reconstruct(b"k", len), int | bytes | None)
    assert_type(b"k" in m, bool)


def far_array() -> None:
    with tidepool.FarArray(1 << 20, "d", local=1 << 20, store="local:") as a:
        view = memoryview(a)
        assert_type(numpy.asarray(a), numpy.ndarray[tuple[Any, ...], numpy.dtype[Any]])
        view.release()
        a.local = 2 << 20
        assert_type(a.stats()["prefetch_accuracy"], float | None)
    tidepool.FarArray(8, numpy.dtype("f")).close()


def module() -> None:
    tidepool.configure(reserve=64 << 20, max=1 << 30)
    assert_type(tidepool.stats()["structures"][0]["hits"], int)
    assert_type(tidepool.headroom(), int)
    assert_type(tidepool.__version__, str)
    try:
        tidepool.configure(budget=0)
    except (tidepool.SoftMemoryError, tidepool.FarMemoryError) as e:
        assert_type(e, tidepool.SoftMemoryError | tidepool.FarMemoryError)
