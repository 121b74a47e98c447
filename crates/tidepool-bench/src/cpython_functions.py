"""Function-style work for the alloc suite, run with PYTHONMALLOC=malloc so that every object
goes through the allocator under test: each "invocation" parses a JSON request, builds objects,
renders a template and serialises a response, as the SeBS / FunctionBench Python functions do.
Prints one JSON line: seconds, peak_rss_kib, allocator (the malloc library mapped in)."""
import json
import sys
import time


class Order:
    __slots__ = ("id", "user", "items", "total")

    def __init__(self, id, user, items):
        self.id = id
        self.user = user
        self.items = items
        self.total = sum(i["price"] * i["qty"] for i in items)


def make_request(seed):
    return json.dumps([
        {"id": seed * 1000 + i, "user": "user%d" % ((seed * 31 + i) % 97),
         "items": [{"sku": "sku-%d-%d" % (i, j), "price": (i * j) % 50 + 1, "qty": j % 4 + 1}
                   for j in range(i % 7 + 1)]}
        for i in range(300)
    ])


def handler(request):
    orders = [Order(o["id"], o["user"], o["items"]) for o in json.loads(request)]
    by_user = {}
    for o in orders:
        by_user.setdefault(o.user, []).append(o)
    rows = []
    for user, os_ in sorted(by_user.items()):
        total = sum(o.total for o in os_)
        skus = sorted({i["sku"] for o in os_ for i in o.items})
        rows.append("<tr><td>%s</td><td>%d</td><td>%s</td></tr>" % (user, total, ", ".join(skus[:5])))
    html = "<table>%s</table>" % "".join(rows)
    words = {}
    for token in html.replace("<", " ").replace(">", " ").split():
        words[token] = words.get(token, 0) + 1
    return json.dumps({"users": len(by_user), "html_bytes": len(html),
                       "top": sorted(words.items(), key=lambda kv: (-kv[1], kv[0]))[:10]})


def main():
    invocations = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    requests = [make_request(s) for s in range(8)]
    start = time.perf_counter()
    check = 0
    for n in range(invocations):
        check += len(handler(requests[n % len(requests)]))
    seconds = time.perf_counter() - start
    with open("/proc/self/status") as f:
        hwm = next(int(l.split()[1]) for l in f if l.startswith("VmHWM:"))
    with open("/proc/self/maps") as f:
        libs = [l.split()[-1] for l in f if len(l.split()) >= 6]
    alloc = next((p for p in libs if "malloc" in p or "jemalloc" in p or "tcmalloc" in p), "")
    print(json.dumps({"seconds": seconds, "peak_rss_kib": hwm, "allocator": alloc, "checksum": check}))


main()
