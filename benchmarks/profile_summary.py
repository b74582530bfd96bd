"""What a ``jax.profiler`` trace says, as a table: how busy each timeline was, and what filled it.

``benchmarks/race.py --profile DIR`` traces a few calls of a row into ``DIR/<row>/plugins/profile/<date>/
perfetto_trace.json.gz`` (Chrome trace events).  For each timeline (a device stream, XLA's op and module
lines, a host thread) this prints the events, their summed time, the union of their intervals ("busy")
and that over the traced span; then the events that take most of the busiest device timelines.  On a GPU
the question is whether the step is bound by the kernels or by the gaps between them (launches at a
small batch), which ``busy / span`` of the streams answers without TensorBoard.

Usage:
  python benchmarks/profile_summary.py DIR [DIR ...]   # each DIR holds (somewhere below) perfetto_trace.json.gz
  python benchmarks/profile_summary.py DIR --top 25 --json out.json
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os


def load(path: str) -> list[dict]:
    d = json.load(gzip.open(path) if path.endswith(".gz") else open(path))
    return d["traceEvents"] if isinstance(d, dict) else d


def union_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (microseconds): nested or overlapping events count once."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def summarize(events: list[dict], top: int = 15) -> dict:
    procs = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    by_line = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and "dur" in e:
            by_line[(e["pid"], e.get("tid"))].append(e)
    lines = []
    for (pid, tid), evs in by_line.items():
        iv = [(e["ts"], e["ts"] + e["dur"]) for e in evs]
        span = max(b for _, b in iv) - min(a for a, _ in iv)
        names = collections.Counter()
        for e in evs:
            names[e["name"]] += e["dur"]
        busy = union_us(iv)
        lines.append(
            {
                "process": procs.get(pid, str(pid)),
                "thread": threads.get((pid, tid), str(tid)),
                "events": len(evs),
                "sum_ms": sum(e["dur"] for e in evs) / 1000,
                "busy_ms": busy / 1000,
                "span_ms": span / 1000,
                "busy_frac": busy / span if span else 0.0,
                "top": [
                    {"name": n, "ms": t / 1000, "frac_of_busy": t / busy if busy else 0.0}
                    for n, t in names.most_common(top)
                ],
            }
        )
    lines.sort(key=lambda r: (not r["process"].startswith("/device"), -r["busy_ms"]))  # devices first, busiest first
    return {"lines": lines}


def render(name: str, s: dict, top: int) -> str:
    """Every device timeline and the 5 busiest host ones; then what fills the 3 busiest device timelines and
    the busiest host one (on the host, Python's lines nest: a caller's time includes its callees')."""
    devices = [r for r in s["lines"] if r["process"].startswith("/device")]
    hosts = [r for r in s["lines"] if not r["process"].startswith("/device")][:5]
    out = [f"### {name}", "", "| process | timeline | events | sum ms | busy ms | span ms | busy/span |"]
    out.append("|---|---|---:|---:|---:|---:|---:|")
    for r in devices + hosts:
        out.append(
            f"| {r['process']} | {r['thread']} | {r['events']} | {r['sum_ms']:.2f} | {r['busy_ms']:.2f} | "
            f"{r['span_ms']:.2f} | {r['busy_frac']:.2f} |"
        )
    for r in devices[:3] + hosts[:1]:
        out += ["", f"Most time on {r['process']} {r['thread']}:", "", "| event | ms | of busy |", "|---|---:|---:|"]
        out += [f"| `{t['name'][:90]}` | {t['ms']:.3f} | {t['frac_of_busy']:.1%} |" for t in r["top"][:top]]
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="+")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    results = {}
    for d in a.dirs:
        found = sorted(glob.glob(os.path.join(d, "**", "perfetto_trace.json.gz"), recursive=True))
        if not found:
            raise SystemExit(f"error: no perfetto_trace.json.gz under {d}; run race.py with --profile {d}")
        s = summarize(load(found[-1]), a.top)
        results[d] = s
        print(render(os.path.basename(os.path.normpath(d)), s, a.top) + "\n")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
