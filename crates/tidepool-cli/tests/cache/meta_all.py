"""The meta commands (mg, ms, md, ma, mn) through meta-memcache (RevenueCat's client, no one
here wrote it). Run against a real memcached and against tidepool cache: both must pass.
Usage: meta_all.py PORT"""

import sys

from meta_memcache import (
    CacheClient,
    Key,
    ServerAddress,
    SetMode,
    connection_pool_factory_builder,
)

port = int(sys.argv[1])
import socket

with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
    s.sendall(b"flush_all\r\n")
    assert s.recv(64) == b"OK\r\n"
client = CacheClient.cache_client_from_servers(
    servers=[ServerAddress(host="127.0.0.1", port=port)],
    connection_pool_factory_fn=connection_pool_factory_builder(recv_timeout=10),
)

# ms / mg
assert client.set(Key("m1"), "hello", ttl=0) is True
assert client.get(Key("m1")) == "hello"
assert client.get(Key("never")) is None
assert client.multi_get([Key("m1"), Key("never")]) == {Key("m1"): "hello", Key("never"): None}
assert client.get_typed(Key("m1"), str) == "hello"
value, cas = client.get_cas(Key("m1"))
assert value == "hello" and cas
assert client.set(Key("m1"), "world", ttl=0, cas_token=cas) is True
assert client.set(Key("m1"), "stale", ttl=0, cas_token=cas) is False, "a stale CAS token"
assert client.get(Key("m1")) == "world"
# Set modes: add, replace, append, prepend.
assert client.set(Key("m1"), "again", ttl=0, set_mode=SetMode.ADD) is False
assert client.set(Key("m2"), "b", ttl=0, set_mode=SetMode.ADD) is True
assert client.set(Key("never"), "x", ttl=0, set_mode=SetMode.REPLACE) is False
assert client.set(Key("m2"), "c", ttl=0, set_mode=SetMode.REPLACE) is True
# Keys with spaces or beyond ASCII go base64-encoded (the b flag).
assert client.set(Key("une clé"), "bytes", ttl=0) is True
assert client.get(Key("une clé")) == "bytes"
assert client.get(Key("une cle")) is None
# Large keys are hashed by the client; long values work.
long = "v" * 100_000
assert client.set(Key("long"), long, ttl=0) is True
assert client.get(Key("long")) == long
# TTL: touch and get-and-touch.
assert client.touch(Key("m1"), ttl=100) is True
assert client.touch(Key("never"), ttl=100) is False
assert client.get(Key("m1"), touch_ttl=100) == "world"

# md
assert client.delete(Key("m1")) is True
assert client.get(Key("m1")) is None
assert client.delete(Key("m1")) is False, "NF"
# Invalidation marks an item stale instead of deleting it.
assert client.set(Key("m3"), "x", ttl=0) is True

# ma
assert client.delta(Key("counter"), 1) is False, "no counter yet"
assert client.delta_initialize(Key("counter"), 1, initial_value=10, initial_ttl=0) is True
assert client.delta_and_get(Key("counter"), 5) == 15
assert client.delta_and_get(Key("counter"), -20) == 0, "decrements stop at zero"
assert client.delta_initialize_and_get(Key("counter2"), 1, initial_value=7, initial_ttl=0) == 7

# mn: a quiet miss answers nothing, and the no-op ends the batch.
with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
    s.sendall(b"mg never v q\r\nmg never2 v q\r\nmn\r\n")
    reply = b""
    while not reply.endswith(b"MN\r\n"):
        reply += s.recv(4096)
    assert reply == b"MN\r\n", reply
print("meta-memcache: all commands passed")
