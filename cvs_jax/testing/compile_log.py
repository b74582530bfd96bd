"""Where the test suite's XLA compile time goes: every compile of every process, per test (docs/testing.md).

With ``CVS_JAX_COMPILE_LOG=DIR`` set, each process that imports ``cvs_jax`` (a pytest worker, and every
``main``/``update``/server/worker process a test starts: they inherit the variable) appends one JSON line
per XLA compile to ``DIR/<pid>.jsonl``: the test that was running (``CVS_JAX_COMPILE_TEST``, which
``tests/conftest.py`` sets before each test so that processes started in it inherit it), the jitted
function's name, whether the persistent cache served it, its wall seconds and the process's CPU seconds
over it. A line is written when its compile ends, so a process killed with ``kill -9`` keeps what it
compiled before. ``summarize(DIR)`` (or ``python scripts/compile_log.py DIR``) sums the lines per
test, per test file and per function, and ``tests/conftest.py`` writes ``DIR/summary.json`` and prints the
table at the end of the run. Off (no variable), importing this module registers nothing.

The events are jax.monitoring's: the backend compile's start (a scalar event carrying its start time) and
end (a duration event, ``/jax/core/compile/backend_compile_duration``, which covers a persistent-cache
read too), and ``/jax/compilation_cache/cache_hits``, recorded inside that span when the cache served it.
"""

from __future__ import annotations

import atexit
import collections
import json
import os
import sys
import threading
import time

DIR_VAR = "CVS_JAX_COMPILE_LOG"
TEST_VAR = "CVS_JAX_COMPILE_TEST"
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
HIT_EVENT = "/jax/compilation_cache/cache_hits"

_installed = False
_local = threading.local()


def install() -> None:
    """Register the listeners in this process (once); a no-op without ``CVS_JAX_COMPILE_LOG``."""
    global _installed
    folder = os.environ.get(DIR_VAR)
    if _installed or not folder:
        return
    from jax import monitoring

    os.makedirs(folder, exist_ok=True)
    fd = os.open(os.path.join(folder, f"{os.getpid()}.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    argv = " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv[:3]))
    sub = TEST_VAR in os.environ  # started by a test (a pytest process installs before its first test)
    lock = threading.Lock()

    def on_start(event: str, value: float | int, **_: str | int) -> None:
        if event == COMPILE_EVENT:
            _local.cpu0, _local.hit = time.process_time(), False

    def on_hit(event: str, **_: str | int) -> None:
        if event == HIT_EVENT:
            _local.hit = True

    def on_end(event: str, duration_secs: float, **kwargs: str | int) -> None:
        if event != COMPILE_EVENT:
            return
        cpu0 = getattr(_local, "cpu0", None)
        line = {
            "test": os.environ.get(TEST_VAR, ""),
            "fun": str(kwargs.get("fun_name", "")),
            "hit": bool(getattr(_local, "hit", False)),
            "wall": round(duration_secs, 4),
            "cpu": round(time.process_time() - cpu0, 4) if cpu0 is not None else None,
            "sub": sub,
            "pid": os.getpid(),
            "argv": argv,
        }
        _local.cpu0 = None
        write(line)

    def write(line: dict) -> None:
        with lock:  # one write per line, O_APPEND: lines from concurrent threads never interleave
            os.write(fd, (json.dumps(line) + "\n").encode())

    def on_exit() -> None:  # the process's whole CPU: compiles are part of it, tracing and running the rest
        line = {
            "exit": True,
            "test": os.environ.get(TEST_VAR, ""),
            "cpu": round(time.process_time(), 3),
            "wall": round(time.monotonic() - wall0, 3),
            "sub": sub,
            "pid": os.getpid(),
            "argv": argv,
        }
        write(line)

    wall0 = time.monotonic()
    atexit.register(on_exit)
    monitoring.register_scalar_listener(on_start)
    monitoring.register_event_listener(on_hit)
    monitoring.register_event_duration_secs_listener(on_end)
    _installed = True


def read(folder: str) -> list[dict]:
    """Every line of every process's file in ``folder`` (a torn last line of a killed process is skipped)."""
    lines = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".jsonl"):
            with open(os.path.join(folder, name)) as f:
                for text in f:
                    try:
                        lines.append(json.loads(text))
                    except json.JSONDecodeError:
                        pass
    return lines


def _totals() -> dict:
    return {"compiles": 0, "compile_wall_s": 0.0, "compile_cpu_s": 0.0, "hits": 0, "hit_wall_s": 0.0}


def _add(totals: dict, line: dict) -> None:
    if line["hit"]:
        totals["hits"] += 1
        totals["hit_wall_s"] += line["wall"]
    else:
        totals["compiles"] += 1
        totals["compile_wall_s"] += line["wall"]
        totals["compile_cpu_s"] += line["cpu"] or 0.0


def summarize(folder: str) -> dict:
    """Totals of the whole run, per test, per test file and per jitted function, each list sorted by compile
    CPU seconds, largest first. A compile is an XLA compile the persistent cache did not serve; a hit, one
    it served (read and deserialized)."""
    total, tests, functions = _totals(), collections.defaultdict(_totals), collections.defaultdict(_totals)
    files = collections.defaultdict(_totals)
    subprocess_compiles = collections.Counter()
    processes = collections.defaultdict(lambda: {"processes": 0, "cpu_s": 0.0, "wall_s": 0.0})
    for line in read(folder):
        test = line["test"] or "(outside a test)"
        if line.get("exit"):
            if line["sub"]:
                for group in (processes[test], processes[test.split("::")[0]]):
                    group["processes"] += 1
                    group["cpu_s"] += line["cpu"]
                    group["wall_s"] += line["wall"]
            continue
        for group in (total, tests[test], files[test.split("::")[0]], functions[line["fun"]]):
            _add(group, line)
        if not line["hit"] and line["sub"]:
            subprocess_compiles[test] += 1
    for test in tests:
        tests[test]["in_subprocesses"] = subprocess_compiles[test]

    def ranked(groups: dict) -> list[dict]:
        rows = [
            {"name": name, **{k: round(v, 2) if isinstance(v, float) else v for k, v in t.items()}}
            for name, t in groups.items()
        ]
        return sorted(rows, key=lambda r: (-r["compile_cpu_s"], r["name"]))

    return {
        "total": {k: round(v, 2) if isinstance(v, float) else v for k, v in total.items()},
        "files": ranked(files),
        "tests": ranked(tests),
        "functions": ranked(functions),
        # processes the tests started (main, update, a server...) that exited: how many and their whole CPU,
        # per test file and per test (a name with "::"), largest first
        "subprocesses": sorted(
            ({"name": name, **{k: round(v, 2) for k, v in p.items()}} for name, p in processes.items()),
            key=lambda r: (-r["cpu_s"], r["name"]),
        ),
    }


def table(summary: dict, rows: int = 25) -> str:
    """The totals and the top ``rows`` test files, tests and jitted functions by compile CPU seconds."""
    t = summary["total"]
    out = [
        f"XLA compiles: {t['compiles']} ({t['compile_cpu_s']:.0f} s CPU, {t['compile_wall_s']:.0f} s wall), "
        f"persistent-cache hits: {t['hits']} ({t['hit_wall_s']:.0f} s wall)"
    ]
    for title in ("files", "tests", "functions"):
        out.append(f"{'compiles':>8} {'cpu s':>8} {'wall s':>8} {'hits':>6}  {title} (top {rows} by compile CPU s)")
        for r in summary[title][:rows]:
            out.append(
                f"{r['compiles']:>8} {r['compile_cpu_s']:>8.1f} {r['compile_wall_s']:>8.1f} {r['hits']:>6}  {r['name']}"
            )
    subs = summary.get("subprocesses", [])
    if subs:
        out.append(f"{'started':>8} {'cpu s':>8} {'wall s':>8}  processes the tests started (top {rows} by CPU s)")
        for r in subs[:rows]:
            out.append(f"{r['processes']:>8} {r['cpu_s']:>8.1f} {r['wall_s']:>8.1f}  {r['name']}")
    return "\n".join(out)


install()  # on import: cvs_jax/__init__.py imports this module, so in every process that imports cvs_jax
