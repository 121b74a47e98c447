# Types of the native module, tidepool._tidepool (crates/tidepool-py/src), as it exports them:
# mypy's stubtest checks this file against the built module (scripts/test-python). The names
# starting with an underscore other than `_after_fork_in_child` exist only for type checkers.

from collections.abc import Callable
from typing import Literal, Protocol, Self, TypedDict, TypeVar, final, overload, type_check_only

# In the order the module adds them (pyo3 keeps `__all__` as it goes).
__all__ = [
    "__version__",
    "configure",
    "headroom",
    "stats",
    "_after_fork_in_child",
    "SoftBytesMap",
    "FarArray",
    "ValueView",
    "SoftMemoryError",
    "FarMemoryError",
]

__version__: str

_T = TypeVar("_T")
_D = TypeVar("_D")

@type_check_only
class _HasChar(Protocol):
    """A numpy dtype, as FarArray reads it: its one-character typecode."""

    @property
    def char(self) -> str: ...

@type_check_only
class _MapStats(TypedDict):
    name: str
    hits: int
    misses: int
    reconstructions: int
    reconstruct_failures: int
    reconstruct_us: float
    miss_rate: float
    present: int
    indexed: int

@type_check_only
class _SoftStats(TypedDict):
    budget: int
    used: int
    capacity: int
    mode: Literal["auto", "fixed"]
    reserve: int | None
    max: int | None
    segments_populated: int
    segments_evicted: int
    direct_evictions: int
    segments_revoked: int
    bytes_allocated: int
    hits: int
    misses: int
    reconstructions: int
    structures: list[_MapStats]

@type_check_only
class _FarStats(TypedDict):
    missing_faults: int
    wp_faults: int
    zero_fills: int
    far_fetches: int
    writeback_hits: int
    prefetched: int
    prefetch_planned: int
    prefetch_credited: int
    evicted: int
    evicted_clean: int
    evicted_zero: int
    written_back: int
    moved_out: int
    frames_repaired: int
    bytes_read: int
    bytes_written: int
    discarded: int
    resident_pages: int
    budget_pages: int
    local_hit_ratio: float
    prefetch_accuracy: float | None
    local: int

class SoftMemoryError(MemoryError): ...
class FarMemoryError(OSError): ...

def configure(
    *, reserve: int | None = None, max: int | None = None, budget: int | None = None
) -> None: ...
def headroom() -> int: ...
def stats() -> _SoftStats: ...
def _after_fork_in_child() -> None: ...

# The buffer protocol's methods (__buffer__, __release_buffer__) are declared on every version,
# as typeshed declares them on bytes and memoryview, so that memoryview(), numpy and
# pickle.loads accept these objects; Python shows them at run time from 3.12 on (PEP 688).

@final
class ValueView:
    """A value's bytes, read-only, handed to SoftBytesMap's `decode` for the length of its call."""

    def __len__(self) -> int: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...
    def __release_buffer__(self, buffer: memoryview, /) -> None: ...

@final
class SoftBytesMap:
    """A map of bytes to bytes whose values live in soft memory, rebuilt by `reconstruct`."""

    def __new__(
        cls,
        reconstruct: Callable[[bytes], bytes | bytearray] | None = None,
        *,
        name: str | None = None,
    ) -> Self: ...
    @property
    def name(self) -> str: ...
    @overload
    def get(self, key: bytes, decode: None = None, default: None = None) -> bytes | None: ...
    @overload
    def get(self, key: bytes, decode: None, default: _D) -> bytes | _D: ...
    @overload
    def get(self, key: bytes, *, default: _D) -> bytes | _D: ...
    @overload
    def get(
        self, key: bytes, decode: Callable[[ValueView], _T], default: None = None
    ) -> _T | None: ...
    @overload
    def get(self, key: bytes, decode: Callable[[ValueView], _T], default: _D) -> _T | _D: ...
    # A value just rebuilt is returned as the reconstructor returned it (bytes), not decoded.
    @overload
    def get_or_reconstruct(self, key: bytes, decode: None = None) -> bytes | None: ...
    @overload
    def get_or_reconstruct(
        self, key: bytes, decode: Callable[[ValueView], _T]
    ) -> _T | bytes | None: ...
    # A value just made is returned as `make` returned it (bytes), not decoded.
    @overload
    def get_or_call(
        self, key: bytes, make: Callable[[], bytes | bytearray], decode: None = None
    ) -> bytes: ...
    @overload
    def get_or_call(
        self, key: bytes, make: Callable[[], bytes | bytearray], decode: Callable[[ValueView], _T]
    ) -> _T | bytes: ...
    def insert(self, key: bytes, value: bytes) -> None: ...
    def remove(self, key: bytes) -> bool: ...
    def __contains__(self, key: bytes, /) -> bool: ...
    def keys(self) -> list[bytes]: ...
    def __len__(self) -> int: ...
    def stats(self) -> _MapStats: ...

@final
class FarArray:
    """A one-dimensional array of `length` elements of `dtype` whose bytes live in far memory."""

    def __new__(
        cls,
        length: int,
        dtype: str | _HasChar | None = None,
        *,
        local: int | None = None,
        store: str = "local:",
    ) -> Self: ...
    def __len__(self) -> int: ...
    @property
    def typecode(self) -> str: ...
    @property
    def itemsize(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def local(self) -> int: ...
    @local.setter
    def local(self, value: int, /) -> None: ...
    @property
    def store(self) -> str: ...
    @property
    def closed(self) -> bool: ...
    def stats(self) -> _FarStats: ...
    def close(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *_args: object) -> None: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...
    def __release_buffer__(self, buffer: memoryview, /) -> None: ...
