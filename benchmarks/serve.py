"""``python -m cvs_jax.serve`` against what a user has without it, on loopback with bounded request loops.

In one run, for 1, 4 and 16 concurrent clients (threads, each with its own HTTP connection), the
latency p50/p95/p99 and queries/s of:

* ``serve``: ``POST /search`` with one photo, k=5;
* one ``python -m cvs_jax.search --json`` process per query (what a script calls today);
* the baseline a user would write instead: a small FastAPI app (sync handler) over
  ``cvs_jax.export.load(...).embed`` and a faiss ``IndexFlatIP`` of the exported rows.

Also: the cold start of ``serve`` (process start to ``/healthz``, then the first answer), the index
alone at 10k and 1M synthetic rows x 128 (``ExactIndex``, what ``serve`` searches, beside faiss
``IndexFlatIP``: one query and 16 queries, and one added row), and a loop of at least 1,000 requests
from 4 clients while ``update`` trains and completes the next session (failures, sessions seen).

Usage:
  python benchmarks/serve.py                                   # builds a tiny photo run in a temp folder
  python benchmarks/serve.py --workdir W --update_data DIR     # an existing run (update changes it!)
  python benchmarks/serve.py --quick                           # few requests, 10k rows only, no update
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import _common  # noqa: F401  (puts the repository on sys.path)
import httpx
import index_scale
import numpy as np
from fastapi import FastAPI, File, UploadFile  # module level: the baseline's handler annotations resolve

from cvs_jax.testing import serve_process

CONCURRENCY = (1, 4, 16)


def _summary(latencies: list[float], wall: float, failed: int) -> dict:
    lat = np.asarray(latencies) * 1000
    return {
        "requests": len(latencies) + failed,
        "failed": failed,
        "p50_ms": float(np.percentile(lat, 50)) if lat.size else None,
        "p95_ms": float(np.percentile(lat, 95)) if lat.size else None,
        "p99_ms": float(np.percentile(lat, 99)) if lat.size else None,
        "qps": len(latencies) / wall,
    }


def http_loop(url: str, photos: list[tuple[str, bytes]], clients: int, requests: int, until=None) -> dict:
    """``requests`` POSTs (or, with ``until``, at least that many and until ``until()`` is true) from
    ``clients`` threads; latencies of the answered ones, failures counted, sessions seen."""
    counter = itertools.count()
    latencies, sessions, failures = [], [], []
    lock = threading.Lock()

    def more(i):
        return i < requests or (until is not None and not until())

    def client():
        with httpx.Client(timeout=300) as c:
            while more(i := next(counter)):
                name, data = photos[i % len(photos)]
                t0 = time.perf_counter()
                try:
                    r = c.post(url, params={"k": 5}, files=[("file", (name, data))])
                    ok = r.status_code == 200
                except httpx.HTTPError as e:
                    ok, r = False, e
                dt = time.perf_counter() - t0
                with lock:
                    if ok:
                        latencies.append(dt)
                        sessions.append(r.json().get("model_session"))
                    else:
                        failures.append(str(getattr(r, "text", r))[:200])

    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out = _summary(latencies, time.perf_counter() - t0, len(failures))
    out["sessions_seen"] = sorted({s for s in sessions if s is not None})
    out["failures"] = failures[:3]
    return out


def median_round(rounds: list[dict]) -> dict:
    """Several rounds of one loop as one row: requests and failures summed, each latency percentile and
    queries/s the median over the rounds (``qps_rounds`` keeps each round's)."""
    out = dict(rounds[0])
    out["requests"] = sum(r["requests"] for r in rounds)
    out["failed"] = sum(r["failed"] for r in rounds)
    for key in ("p50_ms", "p95_ms", "p99_ms", "qps"):
        values = [r[key] for r in rounds if r[key] is not None]
        out[key] = float(np.median(values)) if values else None
    out["qps_rounds"] = [r["qps"] for r in rounds]
    out["failures"] = [f for r in rounds for f in r["failures"]][:3]
    return out


def process_loop(workdir: str, photos: list[str], clients: int, requests: int) -> dict:
    """One ``python -m cvs_jax.search --json`` process per query, ``clients`` at a time."""
    counter = itertools.count()
    latencies, failed = [], []

    def client():
        while (i := next(counter)) < requests:
            cmd = [sys.executable, "-m", "cvs_jax.search", "--workdir", workdir, "--images", photos[i % len(photos)]]
            t0 = time.perf_counter()
            r = subprocess.run([*cmd, "--k", "5", "--json"], capture_output=True)
            (latencies if r.returncode == 0 else failed).append(time.perf_counter() - t0)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return _summary(latencies, time.perf_counter() - t0, len(failed))


def photo_folder(workdir: str, photos: str | None = None) -> str:
    """Where the query photos come from: ``photos`` when given, the built run's session-1 training photos,
    else the run's own photo folder (its ``data.manual_dir``); never the workdir itself, whose PNGs are the
    run's plots and report images, not photos of its classes."""
    if photos:
        return photos
    built = os.path.join(os.path.dirname(workdir), "s1", "train")
    if os.path.isdir(built):
        return built
    from cvs_jax.config import stored

    folder = str(stored.stored_config(workdir).data.get("manual_dir") or "")
    if folder and os.path.isdir(folder) and not os.path.abspath(folder).startswith(os.path.abspath(workdir) + os.sep):
        return folder
    raise SystemExit(f"error: no photo folder for {workdir}'s queries; pass --photos DIR (images of its classes).")


def photo_payloads(
    workdir: str, limit: int = 64, photos: str | None = None
) -> tuple[list[str], list[tuple[str, bytes]]]:
    """The photos a loop sends (``photo_folder``) and their (name, bytes)."""
    root = photo_folder(workdir, photos)
    found = sorted(
        os.path.join(dp, f) for dp, _, fs in os.walk(root) for f in fs
        if f.lower().endswith((".png", ".jpg", ".jpeg", ".webp", ".bmp"))
    )[:limit]  # fmt: skip
    return found, [(os.path.basename(f), Path(f).read_bytes()) for f in found]  # closes each file


def baseline_index(export_dir: str):
    """(``export.load(export_dir)``, a faiss ``IndexFlatIP`` of its normalised rows): the baseline's search."""
    import faiss

    from cvs_jax import export

    exported = export.load(export_dir)
    rows = np.array(exported.embeddings(), np.float32)  # a writable copy of the memory map
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    index = faiss.IndexFlatIP(rows.shape[1])
    index.add(rows)
    return exported, index


def baseline_app(export_dir: str):
    """What a user writes over an export: FastAPI, ``export.load(...).embed``, faiss ``IndexFlatIP``."""
    import io

    from PIL import Image

    exported, index = baseline_index(export_dir)
    app = FastAPI()

    @app.get("/healthz")
    def healthz():
        return {"status": "ok"}

    @app.post("/search")
    def search(file: UploadFile = File(...), k: int = 5):
        q = exported.embed([Image.open(io.BytesIO(file.file.read()))])
        q /= np.linalg.norm(q, axis=1, keepdims=True)
        scores, idx = index.search(q, k)
        return {"hits": [{"row": int(i), "score": float(s)} for s, i in zip(scores[0], idx[0])]}

    exported.embed(np.zeros((1, *exported.image_shape), np.uint8))  # compiled before the first request
    return app


def start_baseline(export_dir: str, port: int, log) -> subprocess.Popen:
    cmd = [sys.executable, os.path.abspath(__file__), "--baseline_app", export_dir, "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if serve_process.http().get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the baseline app did not start (see servers.log)")


def _fmt(x, digits=1):
    return "-" if x is None else f"{x:,.{digits}f}"


def table(results: dict) -> str:
    lines = [
        "| system | clients | requests | failed | p50 ms | p95 ms | p99 ms | queries/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for system in ("serve", "search process per query", "FastAPI + export + faiss IndexFlatIP"):
        for c, r in results["loops"].get(system, {}).items():
            lines.append(
                f"| {system} | {c} | {r['requests']} | {r['failed']} | {_fmt(r['p50_ms'])} | {_fmt(r['p95_ms'])} | "
                f"{_fmt(r['p99_ms'])} | {_fmt(r['qps'], 2)} |"
            )
    return "\n".join(lines)


def _met(ok: bool) -> str:
    return "MET" if ok else "NOT MET"


def goals(results: dict) -> list[str]:
    loops = results["loops"]
    serve = loops.get("serve", {})
    cli = loops.get("search process per query", {})
    base = loops.get("FastAPI + export + faiss IndexFlatIP", {})
    out = []
    if "1" in serve and "1" in cli:
        r = cli["1"]["p50_ms"] / serve["1"]["p50_ms"]
        out.append(
            f"single query p50: serve {serve['1']['p50_ms']:.1f} ms, one search process {cli['1']['p50_ms']:.0f} ms: "
            f"1/{r:.0f} (goal: at most 1/100) {_met(r >= 100)}"
        )
    if "1" in serve and "16" in serve:
        r = serve["16"]["qps"] / serve["1"]["qps"]
        out.append(f"queries/s of 16 clients over 1 client: {r:.2f}x (goal: at least 4x) {_met(r >= 4)}")
    if serve and base:
        ratios = {c: serve[c]["qps"] / max(base[c]["qps"], 1e-9) for c in serve if c in base}
        r = min(ratios.values())
        each = ", ".join(f"{c}: {x:.2f}x" for c, x in ratios.items())
        out.append(
            f"serve / baseline queries/s (medians), lowest over concurrencies: {r:.2f}x ({each}) "
            f"(goal: at least 1x) {_met(r >= 1)}"
        )
        for c in ratios:
            paired = [
                s_ / max(b_, 1e-9) for s_, b_ in zip(serve[c].get("qps_rounds", []), base[c].get("qps_rounds", []))
            ]
            if len(paired) > 1:
                out.append(f"  {c} clients, serve / baseline round by round: " + ", ".join(f"{x:.2f}x" for x in paired))
    if results.get("during_update"):
        u = results["during_update"]
        ok = u["failed"] == 0 and u["requests"] >= 1000
        out.append(
            f"during update: {u['failed']} failed of {u['requests']} requests, sessions seen {u['sessions_seen']} "
            f"(goal: 0 of at least 1,000) {_met(ok)}"
        )
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", help="a finished run (default: a tiny photo run built in a temp folder)")
    p.add_argument("--update_data", help="a folder for update to train on during the last loop")
    p.add_argument("--requests", type=int, default=200, help="requests per concurrency level (serve, baseline)")
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="serve and the baseline measured in turn this many times; the table gives the median round "
        "(a shared 2-core host moved one round's queries/s by 10-40 %% between runs)",
    )
    p.add_argument("--process_requests", type=int, nargs=3, default=(3, 4, 16), help="search processes per level")
    p.add_argument("--update_requests", type=int, default=1000)
    p.add_argument("--update_timeout_s", type=float, default=1800, help="the update loop stops after this")
    p.add_argument("--photos", help="a folder of query photos (default: the run's own photo folder)")
    p.add_argument("--sizes", type=int, nargs="*", default=(10_000, 1_000_000))
    p.add_argument("--quick", action="store_true")
    p.add_argument(
        "--network",
        choices=("tiny", "walkthrough"),
        default="tiny",
        help="the built run's network: the tests' tiny one, or the :cpu walkthrough's (64-pixel images)",
    )
    p.add_argument("--out", help="also write the results as JSON here")
    p.add_argument("--baseline_app", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.baseline_app:
        import uvicorn

        uvicorn.run(baseline_app(a.baseline_app), host="127.0.0.1", port=a.port, log_level="warning")
        return
    if a.quick:
        a.requests, a.process_requests, a.sizes, a.update_requests, a.rounds = 20, (1, 2, 4), (10_000,), 0, 1
    tmp = tempfile.mkdtemp(prefix="bench-serve-")
    from cvs_jax.testing.image_folders import photo_run

    if a.workdir is None:
        t = time.perf_counter()
        a.workdir, folder = photo_run(Path(tmp), a.network)
        a.update_data = a.update_data or folder
        print(f"built a tiny photo run in {time.perf_counter() - t:.0f} s: {a.workdir}", file=sys.stderr)
    workdir = os.path.abspath(a.workdir)
    photos, payloads = photo_payloads(workdir, photos=a.photos)
    results: dict = {"workdir": workdir, "network": a.network, "environment": _common.environment(), "loops": {}}
    log = open(os.path.join(tmp, "servers.log"), "wb")

    # serve: cold start, then the loops
    port = serve_process.free_port()
    t0 = time.perf_counter()
    server = serve_process.start(workdir, port, log, "--poll_s", "0.5", "--gate", "off")  # the update loop's switch
    healthy = time.perf_counter() - t0
    url = f"http://127.0.0.1:{port}/search"
    t = time.perf_counter()
    httpx.post(url, params={"k": 5}, files=[("file", payloads[0])], timeout=300).raise_for_status()
    results["cold_start"] = {"to_healthz_s": healthy, "first_query_s": time.perf_counter() - t}
    http_loop(url, payloads, 4, 16)  # warm every batch-size bucket a loop will use

    # the baseline over an export of the same run, up at the same time: the two are measured in turn at
    # each concurrency, so that the shared machine's load drifts over both alike
    export_dir = os.path.join(tmp, "export")
    subprocess.run([sys.executable, "-m", "cvs_jax.export", "--workdir", workdir, "--out", export_dir], check=True)
    base_port = serve_process.free_port()
    base = start_baseline(export_dir, base_port, log)
    base_url = f"http://127.0.0.1:{base_port}/search"
    http_loop(base_url, payloads, 4, 16)
    baseline_name = "FastAPI + export + faiss IndexFlatIP"
    rounds: dict = {"serve": {}, baseline_name: {}}
    for r in range(a.rounds):  # in turn, the first of each pair alternating: drift falls on both alike
        for c in CONCURRENCY:
            pair = [("serve", url), (baseline_name, base_url)]
            for system, target in pair if r % 2 == 0 else pair[::-1]:
                rounds[system].setdefault(str(c), []).append(http_loop(target, payloads, c, a.requests))
    results["loops"]["serve"] = {c: median_round(rs) for c, rs in rounds["serve"].items()}
    results["loops"][baseline_name] = {c: median_round(rs) for c, rs in rounds[baseline_name].items()}
    serve_process.stop(base)
    print(json.dumps(results["loops"], indent=1), file=sys.stderr)

    # one search process per query
    results["loops"]["search process per query"] = {
        str(c): process_loop(workdir, photos, c, n) for c, n in zip(CONCURRENCY, a.process_requests)
    }

    results["index"] = index_scale.index_sizes(list(a.sizes))

    if a.update_requests and a.update_data:
        update = subprocess.Popen(
            [sys.executable, "-m", "cvs_jax.update", "--workdir", workdir, "--data", a.update_data],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        t = time.perf_counter()
        health = url.replace("/search", "/healthz")
        first = httpx.get(health).json()["model_session"]

        seen = []  # when /healthz first named the new session

        deadline = t + a.update_timeout_s

        def switched():  # the update is over and its session served for a second (or it failed: stop too)
            if time.perf_counter() > deadline:  # bounded: an update that hangs ends the loop
                update.kill()
                return True
            if update.poll() is None:
                return False
            if update.returncode != 0:
                return True
            if not seen and httpx.get(health).json()["model_session"] > first:
                seen.append(time.perf_counter())
            return bool(seen) and time.perf_counter() - seen[0] > 1.0

        results["during_update"] = http_loop(url, payloads, 4, a.update_requests, until=switched)
        results["during_update"]["update_status"] = update.wait()
        results["during_update"]["seconds"] = time.perf_counter() - t
    serve_process.stop(server)

    print(table(results))
    print()
    print(
        "cold start: {to_healthz_s:.1f} s to /healthz, first query {first_query_s:.2f} s".format(
            **results["cold_start"]
        )
    )
    print()
    print(index_scale.table(results["index"]))
    if results.get("during_update"):
        u = results["during_update"]
        print(
            f"\nwhile update trained and completed session 2 ({u['seconds']:.0f} s, exit status {u['update_status']}),"
        )
        print(f"4 clients: {u['requests']} requests, {u['failed']} failed, p50 {_fmt(u['p50_ms'])} ms, p99 ")
        print(f"{_fmt(u['p99_ms'])} ms, {u['qps']:.1f} queries/s, model sessions seen {u['sessions_seen']}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)
    print()
    for line in goals(results):
        print("- " + line)
    log.close()
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
