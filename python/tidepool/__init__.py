"""Tidepool for Python: soft memory and far memory, on Linux.

Soft memory holds values that may be taken back at any moment, when memory is needed elsewhere,
and are rebuilt on their next use. Its budget is automatic by default: it grows into idle memory
and is cut at once under memory pressure (the machine's, or the memory cgroup's the process is
in), so a cache in soft memory uses what is free without getting the process OOM-killed.

- ``SoftDict(reconstruct=None)``: a mutable mapping whose values live in soft memory; a value
  that vanished is rebuilt by ``reconstruct(key)`` (without one, the key reads as missing).
- ``soft_cache``: a decorator like ``functools.lru_cache`` with no maxsize: results live in soft
  memory, and those taken back are recomputed on the next call.
- ``FarArray(length, dtype, local=..., store=...)``: an array whose bytes live in far memory, at
  most ``local`` bytes of it in this process at a time; ``numpy.asarray(far)`` views it without a
  copy (the buffer protocol).
- ``configure(...)`` sets the soft budget (automatic with a reserve, or fixed); ``stats()`` and
  ``headroom()`` say how memory stands.

Keys and values are kept pickled: keys are compared by their pickle (so ``1``, ``1.0`` and
``True`` are three keys, and two equal dicts whose items were inserted in different orders are
two), and a value read back is a copy of what was stored.

Soft memory is not shared with a forked child (``multiprocessing`` with the "fork" start
method): there, dicts and caches made before the fork start over, empty, in memory of the
child's own. Faults on memory taken back are caught by a SIGBUS handler installed when soft
memory is first used; ``faulthandler.enable()`` called after that would catch them first and
abort, so enable it before (pytest does).

The package is typed (``py.typed``; the native module's types are in ``_tidepool.pyi``), and its
version is ``tidepool.__version__``; its distribution is ``tidepool-memory``.
"""

from __future__ import annotations

import collections.abc
import functools
import os
import pickle
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final, NamedTuple, Protocol, TypeVar, cast, overload

from . import _tidepool
from ._tidepool import (
    FarArray,
    FarMemoryError,
    SoftBytesMap,
    SoftMemoryError,
    __version__ as __version__,
    configure,
    headroom,
    stats,
)

if TYPE_CHECKING:
    from ._tidepool import _MapStats

__all__ = [
    "CacheInfo",
    "FarArray",
    "FarMemoryError",
    "SoftBytesMap",
    "SoftDict",
    "SoftMemoryError",
    "configure",
    "headroom",
    "soft_cache",
    "stats",
]

_K = TypeVar("_K")
_V = TypeVar("_V")
_R = TypeVar("_R")

_PROTOCOL: Final = pickle.HIGHEST_PROTOCOL
_MISSING: Final = object()

# Soft memory is not shared with a forked child: there, the structures made before the fork
# start over (empty) in a new arena the first time they are used. This counts the forks.
_forks = [0]


def _after_fork_in_child() -> None:
    _forks[0] += 1
    _tidepool._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _dumps(obj: object, what: str) -> bytes:
    try:
        return pickle.dumps(obj, _PROTOCOL)
    except Exception as e:
        raise TypeError(
            f"tidepool keeps {what} pickled, and {type(obj).__name__!s} "
            f"object {obj!r:.80} cannot be pickled: {e}"
        ) from e


class _Items(collections.abc.ItemsView[_K, _V]):
    _mapping: SoftDict[_K, _V]

    def __iter__(self) -> Iterator[tuple[_K, _V]]:
        yield from self._mapping._iter_items()


class _Values(collections.abc.ValuesView[_V]):
    _mapping: SoftDict[Any, _V]

    def __iter__(self) -> Iterator[_V]:
        for _, v in self._mapping._iter_items():
            yield v


class SoftDict(collections.abc.MutableMapping[_K, _V]):
    """A mutable mapping whose values live in soft memory.

    ``d[k]`` returns the value while it is in memory; once it has been taken back (or if it was
    never set), ``reconstruct(k)`` is called, and what it returns is stored and returned.
    Without a reconstructor such a key raises KeyError.

    ``len(d)``, ``iter(d)`` and ``k in d`` cover the keys whose values are in memory now.
    Keys and values are pickled (keys compare by their pickle). ``d.stats()`` gives hits,
    misses and reconstructions.
    """

    _soft: SoftBytesMap
    _fork: int

    def __init__(
        self, reconstruct: Callable[[_K], _V] | None = None, /, *, name: str | None = None
    ) -> None:
        if reconstruct is not None and not callable(reconstruct):
            raise TypeError(
                f"reconstruct must be callable (key -> value), not {type(reconstruct).__name__}"
            )
        self._reconstruct = reconstruct
        self._name = name or f"SoftDict@{id(self):x}"
        self._new_map()

    def _new_map(self) -> None:
        self._soft = SoftBytesMap(name=self._name)
        self._fork = _forks[0]

    @property
    def _map(self) -> SoftBytesMap:
        if self._fork != _forks[0]:
            self._new_map()  # in a forked child: the parent's values stay with the parent
        return self._soft

    def __getitem__(self, key: _K) -> _V:
        kb = _dumps(key, "keys")
        reconstruct = self._reconstruct
        if reconstruct is None:
            value = self._map.get(kb, pickle.loads, _MISSING)
            if value is _MISSING:
                raise KeyError(key)
            return cast(_V, value)
        made: list[_V] = []

        def make() -> bytes:
            value = reconstruct(key)
            made.append(value)
            return _dumps(value, "values")

        value = self._map.get_or_call(kb, make, pickle.loads)
        return made[0] if made else cast(_V, value)

    def __setitem__(self, key: _K, value: _V) -> None:
        self._map.insert(_dumps(key, "keys"), _dumps(value, "values"))

    def __delitem__(self, key: _K) -> None:
        if not self._map.remove(_dumps(key, "keys")):
            raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        try:
            kb = pickle.dumps(key, _PROTOCOL)
        except Exception:
            return False
        return kb in self._map

    def __iter__(self) -> Iterator[_K]:
        for kb in self._map.keys():
            yield pickle.loads(kb)

    def __len__(self) -> int:
        return len(self._map)

    def _iter_items(self) -> Iterator[tuple[_K, _V]]:
        # A value may vanish between listing the keys and reading it: rebuilt if it can be,
        # else skipped.
        for kb in self._map.keys():
            key = pickle.loads(kb)
            value = self._map.get(kb, pickle.loads, _MISSING)
            if value is _MISSING:
                if self._reconstruct is None:
                    continue
                value = self[key]
            yield key, cast(_V, value)

    def items(self) -> collections.abc.ItemsView[_K, _V]:
        return _Items(self)

    def values(self) -> collections.abc.ValuesView[_V]:
        return _Values(self)

    def clear(self) -> None:
        """Forgets every key (and the stats)."""
        self._new_map()

    def stats(self) -> _MapStats:
        """Hits, misses, reconstructions (and their mean time in microseconds), keys present."""
        return self._map.stats()

    def __repr__(self) -> str:
        return f"<tidepool.SoftDict {self._name}: {len(self)} values in memory>"

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled with the values in memory now (and the reconstructor, which must pickle).
        return (
            _rebuild_softdict,
            (self._reconstruct, self._name),
            None,
            None,
            iter(list(self._iter_items())),
        )


def _rebuild_softdict(reconstruct: Callable[[_K], _V] | None, name: str) -> SoftDict[_K, _V]:
    return SoftDict(reconstruct, name=name)


class CacheInfo(NamedTuple):
    """A soft cache's counts, as ``functools.lru_cache``'s (``maxsize`` is always None)."""

    hits: int
    misses: int
    maxsize: int | None
    currsize: int


class _SoftCacheWrapper(Protocol[_R]):
    """What ``soft_cache`` returns: the function, memoized, with functools' cache methods."""

    __wrapped__: Callable[..., _R]
    cache_info: Callable[[], CacheInfo]
    cache_clear: Callable[[], None]
    cache_parameters: Callable[[], dict[str, Any]]

    def __call__(self, *args: Any, **kwargs: Any) -> _R: ...


def _make_key(args: tuple[Any, ...], kwds: dict[str, Any], typed: bool) -> bytes:
    # As functools' key (keyword order matters, `typed` adds the types), but as one picklable
    # structure: positional and keyword arguments can never be mistaken for each other.
    key: tuple[Any, ...] = (args, tuple(kwds.items()))
    if typed:
        key += (tuple(type(a) for a in args), tuple(type(v) for v in kwds.values()))
    return _dumps(key, "arguments")


@overload
def soft_cache(
    user_function: Callable[..., _R], /, *, typed: bool = False
) -> _SoftCacheWrapper[_R]: ...
@overload
def soft_cache(
    user_function: None = None, /, *, typed: bool = False
) -> Callable[[Callable[..., _R]], _SoftCacheWrapper[_R]]: ...
def soft_cache(
    user_function: Callable[..., _R] | None = None, /, *, typed: bool = False
) -> _SoftCacheWrapper[_R] | Callable[[Callable[..., _R]], _SoftCacheWrapper[_R]]:
    """Memoizes a function in soft memory: ``@soft_cache`` or ``@soft_cache(typed=False)``.

    Like ``functools.lru_cache(maxsize=None)``, but results live in soft memory, so the cache
    grows into idle memory and is taken back under memory pressure; a result taken back is
    recomputed on the next call. Arguments and results must pickle; arguments are compared by
    their pickle (``f(1)`` and ``f(1.0)`` are cached apart, as with ``typed=True``), and a hit
    returns a copy of the result. The wrapper has ``cache_info()``, ``cache_clear()``,
    ``cache_parameters()`` and ``__wrapped__``.
    """
    if user_function is None:

        def decorate(f: Callable[..., _R]) -> _SoftCacheWrapper[_R]:
            return soft_cache(f, typed=typed)

        return decorate
    if isinstance(user_function, int) and not isinstance(user_function, bool):
        raise TypeError(
            "soft_cache takes no maxsize: its size follows free memory; use @soft_cache or "
            "@soft_cache()"
        )
    if not callable(user_function):
        raise TypeError(f"soft_cache decorates a callable, not {type(user_function).__name__}")
    return _wrap(user_function, bool(typed))


def _wrap(func: Callable[..., _R], typed: bool) -> _SoftCacheWrapper[_R]:
    name = f"soft_cache({getattr(func, '__qualname__', repr(func))})"
    # The map, and the fork count it was made at (a forked child starts a map of its own).
    soft = SoftBytesMap(name=name)
    fork = _forks[0]

    def cache() -> SoftBytesMap:
        if fork != _forks[0]:
            cache_clear()
        return soft

    def wrapper(*args: Any, **kwds: Any) -> _R:
        kb = _make_key(args, kwds, typed)
        made: list[_R] = []

        def make() -> bytes:
            result = func(*args, **kwds)
            made.append(result)
            return _dumps(result, "results")

        result = cache().get_or_call(kb, make, pickle.loads)
        return made[0] if made else cast(_R, result)

    def cache_info() -> CacheInfo:
        """Hits, misses, maxsize (None: it follows free memory) and results in memory now."""
        m = cache()
        s = m.stats()
        return CacheInfo(s["hits"], s["misses"], None, len(m))

    def cache_clear() -> None:
        """Forgets every result, and the counts."""
        nonlocal soft, fork
        soft, fork = SoftBytesMap(name=name), _forks[0]

    def cache_parameters() -> dict[str, Any]:
        return {"maxsize": None, "typed": typed}

    w = cast("_SoftCacheWrapper[_R]", wrapper)
    w.cache_info = cache_info
    w.cache_clear = cache_clear
    w.cache_parameters = cache_parameters
    functools.update_wrapper(w, func)
    return w
