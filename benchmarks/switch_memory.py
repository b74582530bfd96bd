"""What one model switch of a server leaves in its memory: many switches in one process, no adds, measured after each.

A tiny photo run of ``--sessions`` sessions (``cvs_jax.testing.image_folders.photo_run``, then ``update`` with
new folders; or ``--built DIR`` copied), optionally grown by ``--seed_rows`` synthetic added rows (as
``serve_soak.py`` seeds them), is served in-process (``serve.state.Served``, no watcher), and the served model
is moved ``--switches`` times through the sessions with ``Served.pin``: the path of ``POST /model?session=N``
(a new ``run_reader.Run`` read through orbax, its first runs, the switch between two batches).  After each
switch (and a ``gc.collect``): the process's RSS, Python objects tracked by the collector, jax's live
arrays, threads; ``--malloc_trim`` first hands glibc's free pages back (what RSS keeps then is held, not
fragmentation); ``--tracemalloc N`` prints the N allocation sites that grew most over the switches.

Each measurement runs in a child process of its own, ``--rounds`` times each, interleaved: ``--arms fixed``
(the code as it is), ``leak`` (``rundir.tensorstore_json.uninstall()``: tensorstore's own ``to_json``).

    python benchmarks/switch_memory.py --switches 50 --out /tmp/switch_memory
    python benchmarks/switch_memory.py --built DIR --seed_rows 100000 --switches 30 --malloc_trim

prints a line per switch and a summary (growth per switch over the second half of the switches, a
least-squares slope; the first ones fill caches), and writes ``switch_memory.json`` in ``--out``.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

import _common  # noqa: F401  (puts the repo root on sys.path)
import numpy as np

ARMS = ("fixed", "leak")


def build(root: Path, sessions: int) -> str:
    """A tiny photo run of ``sessions`` (>= 2) sessions: ``photo_run``'s two, then one folder of two new
    classes per further session."""
    from cvs_jax import update
    from cvs_jax.testing.image_folders import photo_run, write_folder

    run, second = photo_run(root)
    assert update.update(run, second) == 0
    for s in range(3, sessions + 1):
        folder = write_folder(root / f"s{s}", {f"class{s}a": 16, f"class{s}b": 16}, 3, seed=s)
        assert update.update(run, folder) == 0
    return run


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def child(args) -> dict:
    """One arm: a server over a copy of the run, ``--switches`` pins through its sessions, a sample after each."""
    import jax

    from cvs_jax.rundir import tensorstore_json
    from cvs_jax.serve.state import Served, newest_session

    if args.arm == "leak":
        tensorstore_json.uninstall()
    trim = ctypes.CDLL("libc.so.6").malloc_trim if args.malloc_trim else None
    served = Served(args.workdir, poll_s=0)
    sessions = (newest_session(args.workdir) or 0) + 1

    def sample(i: int, seconds: float) -> dict:
        gc.collect()
        if trim is not None:
            trim(0)
        return {
            "switch": i,
            "model_session": served.model_session,
            "rss_mib": round(rss_mib(), 2),
            "objects": len(gc.get_objects()),
            "live_arrays": len(jax.live_arrays()),
            "threads": threading.active_count(),
            "seconds": round(seconds, 3),
        }

    samples = [sample(0, 0.0)]
    if args.tracemalloc:
        tracemalloc.start(25)
    first = None
    for i in range(1, args.switches + 1):
        if i == args.switches // 2 + 1 and args.tracemalloc:
            first = tracemalloc.take_snapshot()
        t = time.perf_counter()
        served.pin((served.run.session + 1) % sessions)  # the next session's model, round and round
        samples.append(sample(i, time.perf_counter() - t))
        s, p = samples[-1], samples[-2]
        print(
            f"  [{args.arm}] switch {i}: model {s['model_session']}, rss {s['rss_mib']:.1f} MiB "
            f"({s['rss_mib'] - p['rss_mib']:+.2f}), objects {s['objects']} ({s['objects'] - p['objects']:+d}), "
            f"live arrays {s['live_arrays']}, threads {s['threads']}, {s['seconds']:.2f} s",
            flush=True,
        )
    sites = []
    if first is not None:
        grown = tracemalloc.take_snapshot().compare_to(first, "traceback")
        for stat in grown[: args.tracemalloc]:
            frames = [f"{f.filename}:{f.lineno}" for f in stat.traceback][-6:]
            sites.append({"kib": round(stat.size_diff / 1024, 1), "blocks": stat.count_diff, "where": frames})
    served.close()
    return {"arm": args.arm, "sessions": sessions, "samples": samples, "tracemalloc": sites}


def slope(samples: list[dict], key: str) -> float:
    """Growth per switch over the second half of the switches (least squares; the first ones fill caches)."""
    half = samples[len(samples) // 2 :]
    x = np.array([s["switch"] for s in half], float)
    y = np.array([s[key] for s in half], float)
    return float(np.polyfit(x, y, 1)[0]) if len(half) > 1 else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--out", default="switch_memory")
    p.add_argument("--built", help="a finished photo run of 2 or more sessions to copy (else a tiny one is built)")
    p.add_argument("--sessions", type=int, default=2, help="sessions of the tiny run built (>= 2)")
    p.add_argument("--seed_rows", type=int, default=0, help="synthetic added rows written first")
    p.add_argument("--switches", type=int, default=50)
    p.add_argument("--rounds", type=int, default=1, help="child processes per arm, interleaved")
    p.add_argument("--arms", default=",".join(ARMS), help="fixed, leak or both")
    p.add_argument("--malloc_trim", action="store_true", help="malloc_trim(0) before each RSS reading")
    p.add_argument("--tracemalloc", type=int, default=0, help="print the N sites that grew most (second half)")
    p.add_argument("--arm", help=argparse.SUPPRESS)  # a child: measure this arm on --workdir
    p.add_argument("--workdir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.arm:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="switch_memory_"))
    built = args.built or build(root / "built", args.sessions)
    results = []
    for r in range(args.rounds):
        for arm in args.arms.split(","):
            workdir = str(root / f"{arm}-{r}")
            shutil.copytree(built, workdir)
            if args.seed_rows:
                from serve_soak import _dim, seed_rows

                seed_rows(workdir, args.seed_rows, _dim(workdir))
            cmd = [sys.executable, __file__, "--arm", arm, "--workdir", workdir, "--switches", str(args.switches)]
            cmd += ["--malloc_trim"] * args.malloc_trim + ["--tracemalloc", str(args.tracemalloc)]
            print(f"round {r + 1}, {arm}: {' '.join(cmd[1:])}", flush=True)
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=os.environ.copy())
            lines = proc.stdout.splitlines()
            print("\n".join(line for line in lines if not line.startswith("RESULT ")), flush=True)
            got = [json.loads(line[len("RESULT ") :]) for line in lines if line.startswith("RESULT ")]
            if proc.returncode or not got:
                sys.exit(f"error: the {arm} child failed (exit {proc.returncode})")
            results.append(got[0] | {"round": r + 1})
            shutil.rmtree(workdir, ignore_errors=True)
    print(
        f"\n{args.switches} switches per child, {results[0]['sessions']} sessions, {args.seed_rows} seeded rows, "
        f"malloc_trim {'on' if args.malloc_trim else 'off'}, MALLOC_ARENA_MAX={os.environ.get('MALLOC_ARENA_MAX', '-')}"
    )
    print("| arm | round | RSS start MiB | RSS end MiB | MiB per switch (2nd half) | objects per switch (2nd half) |")
    print("|---|---|---|---|---|---|")
    for res in results:
        s = res["samples"]
        res["mib_per_switch"] = slope(s, "rss_mib")
        res["objects_per_switch"] = slope(s, "objects")
        print(
            f"| {res['arm']} | {res['round']} | {s[0]['rss_mib']:.1f} | {s[-1]['rss_mib']:.1f} | "
            f"{res['mib_per_switch']:+.3f} | {res['objects_per_switch']:+.1f} |"
        )
        for site in res["tracemalloc"]:
            print(f"    {site['kib']:+.1f} KiB, {site['blocks']:+d} blocks: {' <- '.join(reversed(site['where']))}")
    meta = {"args": vars(args), "host": os.uname().nodename, "cpus": os.cpu_count(), "results": results}
    (out / "switch_memory.json").write_text(json.dumps(meta, indent=1))
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
