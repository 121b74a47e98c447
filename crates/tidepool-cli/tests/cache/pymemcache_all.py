"""Every text-protocol command through pymemcache (a client no one here wrote), with the
replies and errors memcached gives. Run against a real memcached and against tidepool cache:
both must pass. Usage: pymemcache_all.py PORT ITEM_MAX"""

import sys

from pymemcache.client.base import Client
from pymemcache.exceptions import (
    MemcacheClientError,
    MemcacheIllegalInputError,
    MemcacheServerError,
)

port, item_max = int(sys.argv[1]), int(sys.argv[2])
c = Client(("127.0.0.1", port), default_noreply=False, connect_timeout=5, timeout=10)
c.flush_all()

# Storage and retrieval.
assert c.set("a", b"1", expire=0) is True
assert c.get("a") == b"1"
assert c.get("missing") is None
assert c.get_many(["a", "missing"]) == {"a": b"1"}
value, cas = c.gets("a")
assert value == b"1" and cas is not None
assert c.cas("a", b"2", cas) is True
assert c.cas("a", b"3", cas) is False, "a stale CAS unique: EXISTS"
assert c.cas("never", b"3", 1) is None, "NOT_FOUND"
assert c.get("a") == b"2"
assert c.add("a", b"x") is False
assert c.add("b", b"x") is True
assert c.replace("never", b"x") is False
assert c.replace("b", b"y") is True
assert c.append("b", b"z") is True
assert c.prepend("b", b"w") is True
assert c.get("b") == b"wyz"
assert c.append("never", b"z") is False
got = c.gets_many(["a", "b"])
assert set(got) == {"a", "b"} and got["b"][0] == b"wyz"
# Flags are kept (pymemcache's serde puts the type there).
c2 = Client(("127.0.0.1", port), default_noreply=False)
assert c2.raw_command(b"set f 77 0 1\r\nx", b"\r\n") == b"STORED"
# (raw_command strips the terminator it was told to read up to)
assert c2.raw_command(b"get f", b"END\r\n") == b"VALUE f 77 1\r\nx\r\n"

# Arithmetic.
assert c.set("n", b"10") is True
assert c.incr("n", 5) == 15
assert c.decr("n", 100) == 0
assert c.incr("never", 1) is None
assert c.decr("never", 1) is None
assert c.set("n", b"18446744073709551615") is True
assert c.incr("n", 1) == 0, "incr wraps at 64 bits"
assert c.set("s", b"abc") is True
try:
    c.incr("s", 1)
    raise AssertionError("incr of a non-number succeeded")
except MemcacheClientError as e:
    assert "non-numeric" in str(e), e

# Expiry. (After the wrap above the value is "0" padded with spaces to its old length, as
# memcached rewrites numbers in place.)
assert c.get("n") == b"0" + b" " * 19
assert c.set("n", b"0") is True
assert c.touch("n", 100) is True
assert c.touch("never", 100) is False
# pymemcache 4.0 has no gat/gats: sent raw.
assert c.raw_command(b"gat 100 n never", b"END\r\n") == b"VALUE n 0 1\r\n0\r\n"
assert c.raw_command(b"gats 100 n", b"END\r\n").startswith(b"VALUE n 0 1 ")
assert c.set("gone", b"x", expire=-1) is True
assert c.get("gone") is None, "a negative expiry is expired at once"
assert c.touch("n", -1) is True
assert c.get("n") is None

# Deletion.
assert c.delete("a") is True
assert c.delete("a") is False
assert c.delete_many(["b", "never"]) is True
assert c.get("b") is None

# Noreply.
c.set("q", b"quiet", noreply=True)
assert c.get("q") == b"quiet"

# Limits and errors.
try:
    c.set("k" * 251, b"x")
    raise AssertionError("a 251-byte key was taken")
except MemcacheIllegalInputError:
    pass
assert c.set("k" * 250, b"x") is True
try:
    c.set("big", b"x" * (item_max + 1))
    raise AssertionError("an item over the limit was stored")
except MemcacheServerError as e:
    assert "too large" in str(e), e
assert c.get("big") is None
assert c.set("after", b"fine") is True, "the connection goes on after the refusal"
assert c.get("after") == b"fine"

# Administration.
stats = c.stats()
for name in [b"curr_items", b"get_hits", b"get_misses", b"evictions", b"bytes", b"cmd_get", b"total_items"]:
    assert name in stats, (name, sorted(stats))
assert stats[b"get_hits"] > 0 and stats[b"get_misses"] > 0
assert c.version().startswith(b"1.6"), c.version()
c.raw_command(b"verbosity 1", b"\r\n")
assert c.flush_all() is True
assert c.get("after") is None
c.quit()
print("pymemcache: all commands passed")
