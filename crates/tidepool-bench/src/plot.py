"""Draws SUITE.png from SUITE.json: one panel per (workload, metric).

Bars per system at each parameter point; when a panel has one numeric parameter that varies
(e.g. local_ratio), a line per system over it instead. Where a workload reports `machine_mib`
(the paging suites), one more panel puts its figure against the bytes: a point per system and
local ratio, so that who is faster at the same footprint reads at a glance.
"""
import json
import sys
from collections import OrderedDict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


LOWER_IS_BETTER = (
    "seconds",
    "far_bytes",
    "peak_rss_mib",
    "machine_mib",
    "far_mib",
    "unpaged_mib",
    "far_bytes_per_live_byte",
    "miss_rate",
    "oom_killed",
    "oom_kills",
    "swapped_mib",
)
REFERENCE = ("far_live_bytes",)
# Checks rather than measures (1 or 0): the table and the notes show them.
NOT_PLOTTED = ("same_output",)


def direction(metric):
    if metric in REFERENCE:
        return ", reference"
    if metric.endswith("_us") or metric.endswith("_per_op") or metric in LOWER_IS_BETTER:
        return ", lower is better"
    return ", higher is better"


def main(src, dst):
    with open(src) as f:
        data = json.load(f)
    rows = [r for r in data["results"] if r["metric"] not in NOT_PLOTTED]
    panels = OrderedDict()
    for r in rows:
        panels.setdefault((r["workload"], r["metric"], r["unit"]), []).append(r)
    tradeoffs = tradeoff_panels(rows)
    n = len(panels) + len(tradeoffs)
    if n == 0:
        print("nothing to plot", file=sys.stderr)
        return
    cols = min(3, n)
    nrows = (n + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(5.2 * cols, 3.6 * nrows), squeeze=False)
    systems = list(OrderedDict.fromkeys(r["system"] for r in rows))
    colours = {s: plt.cm.tab10(i % 10) for i, s in enumerate(systems)}
    for ax, ((workload, metric, unit), prs) in zip(axes.flat, panels.items()):
        keys = sorted({k for r in prs for k in r["params"]})
        varying = [k for k in keys if len({r["params"].get(k) for r in prs}) > 1]
        # A line over a parameter only when it takes several values (one line per system, and
        # per value of a second varying parameter); bars otherwise.
        many = [k for k in varying if len({r["params"][k] for r in prs}) >= 3]
        if many and len(varying) <= 2:
            k = max(many, key=lambda v: len({r["params"][v] for r in prs}))
            other = [v for v in varying if v != k]
            styles = ["-", "--", ":", "-."]
            groups = OrderedDict()
            for r in prs:
                g = (r["system"], r["params"][other[0]] if other else None)
                groups.setdefault(g, []).append((r["params"][k], r["value"]))
            seconds = sorted({g[1] for g in groups if g[1] is not None})
            for (s, o), pts in groups.items():
                pts.sort()
                label = s if o is None else f"{s}, {other[0]}={o:g}"
                style = styles[seconds.index(o) % len(styles)] if o is not None else "-"
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", linestyle=style,
                        label=label, color=colours[s])
            xs = [r["params"][k] for r in prs if r["params"][k] > 0]
            if xs and max(xs) / min(xs) > 30:
                ax.set_xscale("log")
            ax.set_xlabel(k)
        else:
            # Nothing varies (a single OOM row, say): the labels still say where it was.
            shown = varying or keys
            points = list(OrderedDict.fromkeys(
                ",".join(f"{k}={r['params'][k]:g}" for k in shown) for r in prs))
            # Only the systems with a row here take a slot, so the ticks sit under the bars.
            present = [s for s in systems if any(r["system"] == s for r in prs)]
            width = 0.8 / max(1, len(present))
            for i, s in enumerate(present):
                xs, ys = [], []
                for r in prs:
                    if r["system"] != s:
                        continue
                    label = ",".join(f"{k}={r['params'][k]:g}" for k in shown)
                    xs.append(points.index(label) + i * width)
                    ys.append(r["value"])
                if xs:
                    bars = ax.bar(xs, ys, width, label=s, color=colours[s])
                    ax.bar_label(bars, fmt="%.3g", fontsize=7)
            ax.set_xticks([j + width * (len(present) - 1) / 2 for j in range(len(points))])
            ax.set_xticklabels(points if any(points) else [""], fontsize=8)
        # Values spanning decades (100% local against 25%) read only on a log axis.
        values = [r["value"] for r in prs if r["value"] > 0]
        if values and max(values) / min(values) > 30:
            ax.set_yscale("log")
        ax.set_title(f"{workload}\n{metric} ({unit}){direction(metric)}", fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    for ax, (workload, metric, unit, points) in zip(list(axes.flat)[len(panels):], tradeoffs):
        for s in OrderedDict.fromkeys(p[0] for p in points):
            pts = sorted((x, y, ratio) for (sys_, x, y, ratio) in points if sys_ == s)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=s,
                    color=colours[s])
            for x, y, ratio in pts:
                if ratio is not None:
                    ax.annotate(f"{ratio:g}", (x, y), fontsize=6, xytext=(3, 3),
                                textcoords="offset points")
        ax.set_xlabel("machine_mib (MiB on this machine, lower is better)")
        ax.set_title(f"{workload}\n{metric} ({unit}) against bytes held; labels: local_ratio",
                     fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    title = f"tidepool bench {data['suite']}" + (" (quick)" if data.get("quick") else "")
    fig.suptitle(title)
    footer = describe_env(data.get("env"))
    if footer:
        fig.text(0.5, 0.005, footer, ha="center", va="bottom", fontsize=7, color="#555")
    fig.tight_layout(rect=(0, 0.03 if footer else 0, 1, 0.97))
    fig.savefig(dst, dpi=110)


FIGURES = ("seconds", "ops_per_s", "gb_per_s")


def tradeoff_panels(rows):
    """(workload, metric, unit, [(system, machine_mib, figure, local_ratio)]) for each workload
    that reports machine_mib beside its figure."""
    out = []
    workloads = OrderedDict.fromkeys(r["workload"] for r in rows if r["metric"] == "machine_mib")
    for w in workloads:
        mib = {(r["system"], json.dumps(r["params"], sort_keys=True)): r["value"]
               for r in rows if r["workload"] == w and r["metric"] == "machine_mib"}
        for metric in FIGURES:
            points, unit = [], ""
            for r in rows:
                if r["workload"] != w or r["metric"] != metric:
                    continue
                key = (r["system"], json.dumps(r["params"], sort_keys=True))
                if key in mib:
                    unit = r["unit"]
                    points.append((r["system"], mib[key], r["value"],
                                   r["params"].get("local_ratio")))
            if points:
                out.append((w, metric, unit, points))
    return out


def describe_env(env):
    """One line saying where the figures came from (the JSON's `env`), or None."""
    if not env:
        return None
    commit = env.get("commit", "unknown")
    parts = [f"commit {commit[:10]}" + (" (with local changes)" if env.get("dirty") else "")]
    parts.append(f"Linux {env.get('kernel', '?')}")
    parts.append(f"{env.get('cpus', '?')} x {env.get('cpu_model') or 'CPU'}")
    parts.append(f"{env.get('memory_bytes', 0) / 2**30:.1f} GiB")
    for name, version in sorted((env.get("peers") or {}).items()):
        version = version.split(" sha=")[0]  # redis-server's line goes on to build details
        base = name.split("-")[0].rstrip("0123456789")
        parts.append(version if base in version.lower() else f"{name} {version}")
    parts.append("quick" if env.get("quick") else "full")
    return " · ".join(parts)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
