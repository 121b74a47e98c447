import gc

import pytest

import tidepool

np = pytest.importorskip("numpy")

try:
    tidepool.FarArray(1).close()
except tidepool.FarMemoryError as e:  # pragma: no cover - depends on the machine
    pytest.skip(f"no far memory here: {e}", allow_module_level=True)

MiB = 1 << 20


def test_numpy_views_it_and_pages_go_far():
    n = 4 * MiB  # 32 MiB of doubles, 2 MiB of them local
    far = tidepool.FarArray(n, "d", local=2 * MiB)
    assert len(far) == n and far.typecode == "d" and far.itemsize == 8
    assert far.nbytes == 32 * MiB and far.local == 2 * MiB and "local" in far.store
    a = np.asarray(far)
    assert a.dtype == np.float64 and a.shape == (n,) and a.flags.writeable
    assert not a.flags.owndata  # a view, no copy
    assert a[:1000].sum() == 0  # zero to start with
    a[:] = np.arange(n, dtype=np.float64)
    assert a.sum() == n * (n - 1) / 2
    assert a[12345] == 12345.0 and a[-1] == n - 1
    b = np.frombuffer(far, dtype=np.float64)
    assert b[777_777] == 777_777.0
    s = far.stats()
    assert s["far_fetches"] > 0 and s["evicted"] > 0 and s["written_back"] > 0, s
    assert s["budget_pages"] == 2 * MiB // 4096
    assert s["bytes_read"] > 0 and 0 <= s["local_hit_ratio"] <= 1
    del a, b
    far.close()


def test_writes_through_one_view_are_seen_through_another():
    far = tidepool.FarArray(1 << 16, "q", local=MiB)
    a = np.asarray(far)
    m = memoryview(far)
    assert m.format == "q" and m.shape == (1 << 16,) and m.itemsize == 8 and not m.readonly
    a[5] = -42
    assert m[5] == -42
    m[6] = 7
    assert a[6] == 7
    m.release()
    del a


@pytest.mark.parametrize(
    "dtype, numpy_type",
    [("f", np.float32), ("B", np.uint8), ("i", np.int32), ("Q", np.uint64), ("h", np.int16),
     (np.dtype("float64"), np.float64), (np.dtype(np.int8), np.int8)],
)
def test_element_types(dtype, numpy_type):
    far = tidepool.FarArray(1000, dtype, local=MiB)
    a = np.asarray(far)
    assert a.dtype == numpy_type and a.shape == (1000,)
    a[:] = 3
    assert int(a.sum()) == 3000


def test_close_waits_for_exports_to_end():
    far = tidepool.FarArray(1000, "d")
    a = np.asarray(far)
    with pytest.raises(BufferError, match="still in use"):
        far.close()
    del a
    gc.collect()
    far.close()
    assert far.closed and "closed" in repr(far)
    with pytest.raises(ValueError, match="closed"):
        memoryview(far)
    with pytest.raises(ValueError, match="closed"):
        far.stats()
    with tidepool.FarArray(10, "B") as f:
        np.asarray(f)[:] = 1
    assert f.closed


def test_local_budget_can_change():
    far = tidepool.FarArray(1 << 20, "d", local=4 * MiB)
    a = np.asarray(far)
    a[:] = 1.0
    far.local = 1 * MiB
    assert far.local == 1 * MiB
    assert a.sum() == 1 << 20
    del a


def test_bad_arguments_say_what_to_do():
    with pytest.raises(ValueError, match="typecode"):
        tidepool.FarArray(10, "z")
    with pytest.raises(ValueError, match="0 or more"):
        tidepool.FarArray(-1)
    with pytest.raises(ValueError, match="above 0"):
        tidepool.FarArray(10, local=0)
    with pytest.raises(TypeError, match="dtype"):
        tidepool.FarArray(10, 5)
    with pytest.raises(tidepool.FarMemoryError, match="far store"):
        tidepool.FarArray(10, store="nowhere")
