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
"""

import collections.abc
import functools
import os
import pickle
from collections import namedtuple

from . import _tidepool
from ._tidepool import (
    FarArray,
    FarMemoryError,
    SoftBytesMap,
    SoftMemoryError,
    configure,
    headroom,
    stats,
)

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

_PROTOCOL = pickle.HIGHEST_PROTOCOL
_MISSING = object()

# Soft memory is not shared with a forked child: there, the structures made before the fork
# start over (empty) in a new arena the first time they are used. This counts the forks.
_forks = [0]


def _after_fork_in_child():
    _forks[0] += 1
    _tidepool._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _dumps(obj, what):
    try:
        return pickle.dumps(obj, _PROTOCOL)
    except Exception as e:
        raise TypeError(
            f"tidepool keeps {what} pickled, and {type(obj).__name__!s} "
            f"object {obj!r:.80} cannot be pickled: {e}"
        ) from e


class _Items(collections.abc.ItemsView):
    def __iter__(self):
        yield from self._mapping._iter_items()


class _Values(collections.abc.ValuesView):
    def __iter__(self):
        for _, v in self._mapping._iter_items():
            yield v


class SoftDict(collections.abc.MutableMapping):
    """A mutable mapping whose values live in soft memory.

    ``d[k]`` returns the value while it is in memory; once it has been taken back (or if it was
    never set), ``reconstruct(k)`` is called, and what it returns is stored and returned.
    Without a reconstructor such a key raises KeyError.

    ``len(d)``, ``iter(d)`` and ``k in d`` cover the keys whose values are in memory now.
    Keys and values are pickled (keys compare by their pickle). ``d.stats()`` gives hits,
    misses and reconstructions.
    """

    def __init__(self, reconstruct=None, /, *, name=None):
        if reconstruct is not None and not callable(reconstruct):
            raise TypeError(
                f"reconstruct must be callable (key -> value), not {type(reconstruct).__name__}"
            )
        self._reconstruct = reconstruct
        self._name = name or f"SoftDict@{id(self):x}"
        self._new_map()

    def _new_map(self):
        self._soft = SoftBytesMap(name=self._name)
        self._fork = _forks[0]

    @property
    def _map(self):
        if self._fork != _forks[0]:
            self._new_map()  # in a forked child: the parent's values stay with the parent
        return self._soft

    def __getitem__(self, key):
        kb = _dumps(key, "keys")
        if self._reconstruct is None:
            value = self._map.get(kb, pickle.loads, _MISSING)
            if value is _MISSING:
                raise KeyError(key)
            return value
        made = []

        def make():
            value = self._reconstruct(key)
            made.append(value)
            return _dumps(value, "values")

        value = self._map.get_or_call(kb, make, pickle.loads)
        return made[0] if made else value

    def __setitem__(self, key, value):
        self._map.insert(_dumps(key, "keys"), _dumps(value, "values"))

    def __delitem__(self, key):
        if not self._map.remove(_dumps(key, "keys")):
            raise KeyError(key)

    def __contains__(self, key):
        try:
            kb = pickle.dumps(key, _PROTOCOL)
        except Exception:
            return False
        return kb in self._map

    def __iter__(self):
        for kb in self._map.keys():
            yield pickle.loads(kb)

    def __len__(self):
        return len(self._map)

    def _iter_items(self):
        # A value may vanish between listing the keys and reading it: rebuilt if it can be,
        # else skipped.
        for kb in self._map.keys():
            key = pickle.loads(kb)
            value = self._map.get(kb, pickle.loads, _MISSING)
            if value is _MISSING:
                if self._reconstruct is None:
                    continue
                value = self[key]
            yield key, value

    def items(self):
        return _Items(self)

    def values(self):
        return _Values(self)

    def clear(self):
        """Forgets every key (and the stats)."""
        self._new_map()

    def stats(self):
        """Hits, misses, reconstructions (and their mean time in microseconds), keys present."""
        return self._map.stats()

    def __repr__(self):
        return f"<tidepool.SoftDict {self._name}: {len(self)} values in memory>"

    def __reduce__(self):
        # Pickled with the values in memory now (and the reconstructor, which must pickle).
        return (
            _rebuild_softdict,
            (self._reconstruct, self._name),
            None,
            None,
            iter(list(self._iter_items())),
        )


def _rebuild_softdict(reconstruct, name):
    return SoftDict(reconstruct, name=name)


CacheInfo = namedtuple("CacheInfo", ["hits", "misses", "maxsize", "currsize"])


def _make_key(args, kwds, typed):
    # As functools' key (keyword order matters, `typed` adds the types), but as one picklable
    # structure: positional and keyword arguments can never be mistaken for each other.
    key = (args, tuple(kwds.items()))
    if typed:
        key += (tuple(type(a) for a in args), tuple(type(v) for v in kwds.values()))
    return _dumps(key, "arguments")


def soft_cache(user_function=None, /, *, typed=False):
    """Memoizes a function in soft memory: ``@soft_cache`` or ``@soft_cache(typed=False)``.

    Like ``functools.lru_cache(maxsize=None)``, but results live in soft memory, so the cache
    grows into idle memory and is taken back under memory pressure; a result taken back is
    recomputed on the next call. Arguments and results must pickle; arguments are compared by
    their pickle (``f(1)`` and ``f(1.0)`` are cached apart, as with ``typed=True``), and a hit
    returns a copy of the result. The wrapper has ``cache_info()``, ``cache_clear()``,
    ``cache_parameters()`` and ``__wrapped__``.
    """
    if user_function is None:
        return functools.partial(soft_cache, typed=typed)
    if isinstance(user_function, int) and not isinstance(user_function, bool):
        raise TypeError(
            "soft_cache takes no maxsize: its size follows free memory; use @soft_cache or "
            "@soft_cache()"
        )
    if not callable(user_function):
        raise TypeError(f"soft_cache decorates a callable, not {type(user_function).__name__}")
    return _wrap(user_function, bool(typed))


def _wrap(func, typed):
    name = f"soft_cache({getattr(func, '__qualname__', repr(func))})"
    # The map, and the fork count it was made at (a forked child starts a map of its own).
    state = [SoftBytesMap(name=name), _forks[0]]

    def cache():
        if state[1] != _forks[0]:
            cache_clear()
        return state[0]

    def wrapper(*args, **kwds):
        kb = _make_key(args, kwds, typed)
        made = []

        def make():
            result = func(*args, **kwds)
            made.append(result)
            return _dumps(result, "results")

        result = cache().get_or_call(kb, make, pickle.loads)
        return made[0] if made else result

    def cache_info():
        """Hits, misses, maxsize (None: it follows free memory) and results in memory now."""
        m = cache()
        s = m.stats()
        return CacheInfo(s["hits"], s["misses"], None, len(m))

    def cache_clear():
        """Forgets every result, and the counts."""
        state[:] = [SoftBytesMap(name=name), _forks[0]]

    def cache_parameters():
        return {"maxsize": None, "typed": typed}

    wrapper.cache_info = cache_info
    wrapper.cache_clear = cache_clear
    wrapper.cache_parameters = cache_parameters
    return functools.update_wrapper(wrapper, func)
