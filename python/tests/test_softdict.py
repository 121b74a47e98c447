import ctypes
import gc
import pickle

import pytest
from conftest import BIG, squeeze

import tidepool


def big(k):
    return bytes([k % 256]) * BIG


def test_behaves_as_a_mapping():
    d = tidepool.SoftDict()
    assert len(d) == 0 and list(d) == []
    d["a"] = 1
    d[(2, "b")] = [1, 2, {"x": None}]
    d[3] = "three"
    assert d["a"] == 1
    assert d[(2, "b")] == [1, 2, {"x": None}]
    assert len(d) == 3
    assert sorted(map(repr, d)) == sorted(map(repr, ["a", (2, "b"), 3]))
    assert "a" in d and 4 not in d and [] not in d
    d["a"] = 2
    assert d["a"] == 2 and len(d) == 3
    del d["a"]
    assert "a" not in d and len(d) == 2
    with pytest.raises(KeyError):
        d["a"]
    with pytest.raises(KeyError):
        del d["a"]
    assert d.get("a", "default") == "default"
    assert dict(d.items()) == {(2, "b"): [1, 2, {"x": None}], 3: "three"}
    assert sorted(d.values(), key=repr) == sorted([[1, 2, {"x": None}], "three"], key=repr)
    d.update({5: 5, 6: 6})
    assert d.pop(5) == 5 and 5 not in d
    assert d.setdefault(7, "seven") == "seven" and d[7] == "seven"
    d.clear()
    assert len(d) == 0 and 6 not in d


def test_keys_compare_by_their_pickle():
    d = tidepool.SoftDict()
    d[1] = "int"
    d[1.0] = "float"
    assert d[1] == "int" and d[1.0] == "float" and len(d) == 2


def test_a_value_read_back_is_a_copy():
    d = tidepool.SoftDict()
    v = [1, 2]
    d["k"] = v
    v.append(3)
    assert d["k"] == [1, 2]


def test_unpicklable_keys_and_values_say_so():
    d = tidepool.SoftDict()
    with pytest.raises(TypeError, match="pickled"):
        d[lambda: 0] = 1
    with pytest.raises(TypeError, match="pickled"):
        d["k"] = lambda: 0


def test_the_reconstructor_rebuilds_what_a_shrink_dropped():
    built = []

    def rebuild(k):
        built.append(k)
        return big(k)

    d = tidepool.SoftDict(rebuild)
    for k in range(16):
        d[k] = big(k)
    assert len(d) == 16 and built == []
    squeeze()
    present = len(d)
    assert present < 16, "the shrink dropped nothing"
    assert sorted(d) == sorted(k for k in range(16) if k in d)
    for k in range(16):
        assert d[k] == big(k)
    assert len(built) == 16 - present
    s = d.stats()
    assert s["reconstructions"] == 16 - present
    assert s["hits"] == present
    assert len(d) == 16
    # A key never set is built too.
    assert d[100] == big(100) and built[-1] == 100


def test_without_a_reconstructor_dropped_values_read_as_missing():
    d = tidepool.SoftDict()
    for k in range(16):
        d[k] = big(k)
    squeeze()
    present = set(d)
    assert len(present) < 16
    for k in range(16):
        if k in present:
            assert d[k] == big(k)
        else:
            with pytest.raises(KeyError):
                d[k]
    assert dict(d.items()).keys() == present


def test_reconstructor_errors_propagate_and_nothing_is_stored():
    def rebuild(k):
        if k == "bad":
            raise ValueError("no such thing")
        return k.upper()

    d = tidepool.SoftDict(rebuild)
    with pytest.raises(ValueError, match="no such thing"):
        d["bad"]
    assert "bad" not in d
    assert d["good"] == "GOOD" and "good" in d
    assert d.stats()["reconstruct_failures"] == 1


def test_a_reconstructor_may_read_its_own_dict():
    d = None

    def rebuild(n):
        return n if n < 2 else d[n - 1] + d[n - 2]

    d = tidepool.SoftDict(rebuild)
    assert d[80] == 23416728348467685
    assert len(d) == 81


def test_pickles_with_its_values():
    d = tidepool.SoftDict(str.upper)
    d["a"] = "x"
    d["b"] = "y"
    e = pickle.loads(pickle.dumps(d))
    assert dict(e.items()) == {"a": "x", "b": "y"}
    assert e["c"] == "C"


def test_stats_list_live_structures():
    d = tidepool.SoftDict(name="stats-test")
    d["k"] = "v"
    d["k"]
    with pytest.raises(KeyError):
        d["missing"]
    s = tidepool.stats()
    for key in ("budget", "used", "capacity", "mode", "reserve", "hits", "misses",
                "reconstructions", "segments_evicted", "structures"):
        assert key in s, key
    assert s["mode"] == "fixed" and s["reserve"] is None and s["used"] > 0
    mine = [x for x in s["structures"] if x["name"] == "stats-test"]
    assert len(mine) == 1
    assert mine[0]["hits"] == 1 and mine[0]["misses"] == 1 and mine[0]["present"] == 1
    del d, mine
    gc.collect()
    assert not [x for x in tidepool.stats()["structures"] if x["name"] == "stats-test"]


def test_configure_checks_its_arguments():
    with pytest.raises(ValueError, match="either"):
        tidepool.configure(budget=1 << 20, reserve=1 << 20)
    with pytest.raises(ValueError, match="0 or more"):
        tidepool.configure(budget=-1)
    tidepool.configure(budget=64 << 20)
    s = tidepool.stats()
    assert s["mode"] == "fixed" and s["budget"] == 64 << 20
    tidepool.configure(reserve=64 << 20, max=1 << 30)
    s = tidepool.stats()
    assert s["mode"] == "auto" and s["reserve"] == 64 << 20 and s["max"] == 1 << 30
    tidepool.configure()
    s = tidepool.stats()
    assert s["mode"] == "auto" and 32 << 20 <= s["reserve"] <= 256 << 20
    assert tidepool.headroom() > 0


def test_soft_bytes_map_with_a_reconstructor():
    m = tidepool.SoftBytesMap(lambda k: k * 2, name="bytes")
    assert m.get(b"ab") is None
    assert m.get_or_reconstruct(b"ab") == b"abab"
    assert m.get(b"ab") == b"abab" and b"ab" in m and len(m) == 1
    m.insert(b"x", b"y")
    assert sorted(m.keys()) == [b"ab", b"x"]
    assert m.remove(b"x") and not m.remove(b"x")
    bad = tidepool.SoftBytesMap(lambda k: 5)
    with pytest.raises(TypeError, match="must return bytes"):
        bad.get_or_reconstruct(b"k")
    plain = tidepool.SoftBytesMap()
    assert plain.get_or_reconstruct(b"k") is None


def test_soft_bytes_map_cycles_are_collected():
    def make():
        m = tidepool.SoftBytesMap(name="cycle")
        holder = [m]
        m2 = tidepool.SoftBytesMap(lambda k: bytes(len(holder)), name="cycle")
        holder.append(m2)

    make()
    gc.collect()
    assert not [x for x in tidepool.stats()["structures"] if x["name"] == "cycle"]


def test_a_value_larger_than_the_budget_is_refused_with_advice():
    tidepool.configure(budget=2 << 20)
    d = tidepool.SoftDict()
    with pytest.raises(tidepool.SoftMemoryError, match="budget"):
        d["huge"] = b"x" * (8 << 20)


def test_a_forked_child_starts_over_with_memory_of_its_own():
    import multiprocessing

    d = tidepool.SoftDict(str.upper)
    d["parent"] = "kept"

    def child(q):
        out = ["parent" in d, d["x"], "x" in d, len(d)]
        d["set"] = 1
        out.append(d["set"])
        q.put(out)

    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(q,))
    p.start()
    got = q.get(timeout=30)
    p.join(timeout=30)
    assert p.exitcode == 0
    # The parent's values stayed with it; in the child the dict rebuilt and held values.
    assert got == [False, "X", True, 1, 1]
    assert d["parent"] == "kept" and "x" not in d and "set" not in d


def test_soft_bytes_map_decodes_a_view_without_a_copy():
    m = tidepool.SoftBytesMap()
    m.insert(b"k", pickle.dumps({"a": 1}))
    assert m.get(b"k", pickle.loads) == {"a": 1}
    assert m.get(b"missing", pickle.loads, "default") == "default"
    assert m.get(b"k", bytes) == pickle.dumps({"a": 1})
    # The view is the decoder's for the length of its call: kept, it reads as released.
    kept = m.get(b"k", lambda view: view)
    with pytest.raises(ValueError, match="decoder's call only"):
        bytes(kept)
    # A decoder that keeps a memoryview keeps the bytes it sees, whatever is read next.
    mv = m.get(b"k", memoryview)
    first = bytes(mv)
    m.insert(b"other", b"z" * 1000)
    assert m.get(b"other", bytes) == b"z" * 1000
    assert m.get(b"k", bytes) == first
    assert bytes(mv) == first and mv.readonly
    with pytest.raises(TypeError):
        mv[0] = 1
    mv.release()
    with pytest.raises((BufferError, TypeError), match="not writable|read-only"):
        m.get(b"k", lambda v: ctypes.c_char.from_buffer(v))  # asks for a writable buffer
    # Stored None is not missing.
    d = tidepool.SoftDict()
    d["none"] = None
    assert d["none"] is None and "none" in d
