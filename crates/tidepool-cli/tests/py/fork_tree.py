"""A CPython parent whose data is several times tidepool run's local budget forks a child that
reads all of it, writes all of it and forks a grandchild that reads the child's version; the
parent checks that its own version never changed. Prints one line per generation and exits 0,
or names what was wrong and exits 1. Run natively it prints the same.

usage: fork_tree.py MIB   (about MIB MiB of ints and bytes objects)
"""
import os
import sys

mib = int(sys.argv[1])
# An int object and its list slot take about 40 bytes; a 100-byte bytes object about 140.
n = mib * (1 << 20) // 2 // 40
ints = list(range(n))
blobs = [bytes([i % 251]) * 100 for i in range(mib * (1 << 20) // 2 // 140)]


def check(who, offset):
    total = sum(ints)
    want = n * (n - 1) // 2 + offset * n
    if total != want:
        print(f"{who}: sum {total}, expected {want}", flush=True)
        return False
    for i, b in enumerate(blobs):
        if b[0] != (i + offset) % 251 or len(b) != 100:
            print(f"{who}: blob {i} is {b[:4]!r}..., expected byte {(i + offset) % 251}", flush=True)
            return False
    return True


def rewrite(offset):
    # Every element replaced: new int objects, new bytes objects (allocation and writes).
    for i in range(n):
        ints[i] = i + offset
    for i in range(len(blobs)):
        blobs[i] = bytes([(i + offset) % 251]) * 100


def generation(name, offset, depth):
    if not check(name + " before its child", offset):
        return 1
    if depth == 0:
        return 0
    pid = os.fork()
    if pid == 0:
        ok = check("the child of " + name, offset)
        rewrite(offset + 1)
        status = generation(name + "'s child", offset + 1, depth - 1) if ok else 1
        os._exit(status)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    print(f"{name}'s child exited {code}", flush=True)
    if code != 0:
        return 1
    return 0 if check(name + " after its child", offset) else 1


sys.exit(generation("parent", 0, 2))
