"""A long run of one ``python -m cvs_jax.serve`` process while its gallery grows: does it stay healthy?

One server on loopback, serving a tiny photo run (``cvs_jax.testing.image_folders.photo_run``, built in a
few seconds, or ``--built DIR`` copied), started with ``--learn_after`` so that labelled adds start
sessions (``update --from_added`` in the server's child) and the server switches to them (``--gate off``:
every completed session is a switch; the gate's reading of each verdict still runs).  A client then adds
rows in batches (``POST /add``, ``--batch`` synthetic images per request, one in ``--label_every``
labelled with a class of the run, drawn as that class's pattern so the sessions learn something) while
``--searchers`` threads search one image at a time, for ``--minutes``.  ``--seed_rows`` first writes that
many synthetic added rows straight into the run's additions (random unit embeddings, no image files: what
a gallery that has grown for months holds, without months of adds), so the soak starts at that size.

Recorded every ``--sample_s``: the server's RSS, open file descriptors and threads (``/proc``), the run
folder's size on disk (checkpoints and uploads apart), gallery rows, the served model session, the
session state; per add: its latency, rows, whether labelled and whether it started a session; per
search: latency; every failed request.  Then, with the grown gallery:

* restart: SIGTERM, a fresh server's seconds to ``/healthz`` and its RSS once up;
* ``kill -9`` under load: two adders and a searcher running, the server killed, restarted, and every
  acknowledged row id looked up (``/thumb/<id>.png`` of an acknowledged upload answers 200; the added rows
  count is at least the acknowledged ones);
* ``--learn_after``'s check: ``added_session.labelled_pending`` timed in this process on the grown run,
  with the labelled rows waiting below ``N`` (the bound alone) and at ``N`` (the full ``pending``).

    nice -n 10 python benchmarks/serve_soak.py --minutes 25 --seed_rows 100000 --out /tmp/soak/out

writes ``serve_soak.json`` (every sample and request) and ``serve_soak.png`` (RSS, fds, disk, latency
against gallery rows) in ``--out``; ``--plot JSON`` redraws the figure from a written JSON.

    python benchmarks/serve_soak.py --built RUN --store_cost 100000,1000000 --out DIR

times, in this process, what adds of 16 rows cost the additions store at those sizes (``store_cost.json``):
seconds and bytes written per add (p50/p99/max over ``--store_adds``), and the whole store's read.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import _common  # noqa: F401  (puts the repo root on sys.path)
import httpx
import numpy as np
from PIL import Image

from cvs_jax.retrieval import added_session, additions
from cvs_jax.retrieval.run_reader import ADDED_BASE
from cvs_jax.testing import serve_process
from cvs_jax.testing.image_folders import folder_image, photo_run

CLASSES = ("ant", "bee", "cat")


def _png(label: str | None, rng: np.random.Generator) -> bytes:
    """A synthetic photo: a class's pattern (``folder_image``) when labelled, noise otherwise; never twice."""
    if label is not None:
        img = folder_image(sum(map(ord, label)) % 97, rng)
    else:
        img = Image.fromarray(rng.integers(0, 255, (24, 24, 3), dtype=np.uint8))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def seed_rows(workdir: str, n: int, dim: int, chunk: int = 200_000) -> None:
    """``n`` synthetic added rows written as ``search --add`` writes rows (random unit embeddings, sources
    that name no file, distinct digests, unlabelled), in a few steps."""
    rng = np.random.default_rng(7)
    writer = additions.writer(workdir)
    try:
        current = additions.read_for_append(writer, dim)
        for start in range(0, n, chunk):
            m = min(chunk, n - start)
            emb = rng.normal(size=(m, dim)).astype(np.float32)
            emb /= np.linalg.norm(emb, axis=1, keepdims=True)
            current = additions.append(
                writer,
                current,
                emb,
                np.full(m, -1, np.int32),
                [""] * m,
                [f"uploads/seed-{start + i}.png" for i in range(m)],
                [f"{start + i:064x}" for i in range(m)],
                0,
            )
    finally:
        writer.close()


def proc_stats(pid: int) -> dict:
    """RSS (MiB), open file descriptors and threads of a process, from ``/proc``."""
    out: dict = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    out["rss_mib"] = int(line.split()[1]) / 1024
                elif line.startswith("Threads:"):
                    out["threads"] = int(line.split()[1])
        out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        pass
    return out


def tree_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


class Recorder:
    """Requests and samples, appended by the client threads under one lock."""

    def __init__(self):
        self.lock = threading.Lock()
        self.adds: list[dict] = []
        self.searches: list[list[float]] = []  # [t, seconds, gallery rows]
        self.errors: list[dict] = []
        self.samples: list[dict] = []
        self.acked: list[int] = []  # ids of acknowledged rows
        self.t0 = time.monotonic()

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 3)

    def error(self, route: str, what: str) -> None:
        with self.lock:
            self.errors.append({"t": self.now(), "route": route, "error": what[:300]})


def timed(rec: Recorder, route: str, stop: threading.Event, send):
    """(the 200 answer's body, its seconds), or None for a failed request (recorded; after a transport error
    it waits 0.5 s, a server restarting, unless asked to stop)."""
    t = time.perf_counter()
    try:
        r = send()
    except httpx.TransportError as e:
        rec.error(route, repr(e))
        stop.wait(0.5)
        return None
    dt = time.perf_counter() - t
    if r.status_code != 200:
        rec.error(route, f"{r.status_code} {r.text}")
        return None
    return r.json(), dt


def adder(url: str, rec: Recorder, stop: threading.Event, batch: int, label_every: int, seed: int) -> None:
    rng, i = np.random.default_rng(seed), 0
    client = httpx.Client(timeout=120)
    while not stop.is_set():
        label = CLASSES[(i // label_every) % len(CLASSES)] if i % label_every == 0 else None
        files = [("file", (f"{seed}-{i}-{j}.png", _png(label, rng), "image/png")) for j in range(batch)]
        params = {"label": label} if label else {}
        got = timed(rec, "/add", stop, lambda: client.post(f"{url}/add", files=files, params=params))
        if got is not None:
            body, dt = got
            with rec.lock:
                rec.acked += body["ids"]
                rec.adds.append(
                    {
                        "t": rec.now(),
                        "s": round(dt, 5),
                        "rows": body["gallery_rows"],
                        "labelled": label is not None,
                        "started": bool(body.get("session_started")),
                        "model": body["model_session"],
                    }
                )
        i += 1
    client.close()


def searcher(url: str, rec: Recorder, stop: threading.Event, seed: int) -> None:
    rng = np.random.default_rng(seed)
    queries = [_png(CLASSES[i % 3], rng) for i in range(16)]
    client, i = httpx.Client(timeout=120), 0
    while not stop.is_set():
        query = queries[i % len(queries)]
        got = timed(
            rec,
            "/search",
            stop,
            lambda: client.post(f"{url}/search?k=5", content=query, headers={"content-type": "image/png"}),
        )
        if got is not None:
            with rec.lock:
                rec.searches.append([rec.now(), round(got[1], 5), got[0]["gallery_rows"]])
        i += 1
    client.close()


def sampler(url: str, pid: int, workdir: str, rec: Recorder, stop: threading.Event, every_s: float) -> None:
    client = httpx.Client(timeout=60)
    while True:
        sample = {"t": rec.now(), **proc_stats(pid)}
        sample["checkpoints_bytes"] = tree_bytes(os.path.join(workdir, "checkpoints"))
        sample["uploads_bytes"] = tree_bytes(os.path.join(workdir, "uploads"))
        sample["run_bytes"] = tree_bytes(workdir)
        try:
            health = client.get(f"{url}/healthz").json()
            sample["gallery_rows"], sample["model_session"] = health["gallery_rows"], health["model_session"]
            sample["session_state"] = client.get(f"{url}/sessions/current").json()["state"]
        except (httpx.HTTPError, ValueError, KeyError) as e:
            sample["probe_error"] = repr(e)
        with rec.lock:
            rec.samples.append(sample)
        print(json.dumps(sample), flush=True)
        if stop.wait(every_s):
            break
    client.close()


def soak(url: str, pid: int, workdir: str, args) -> Recorder:
    rec, stop = Recorder(), threading.Event()
    threads = [threading.Thread(target=adder, args=(url, rec, stop, args.batch, args.label_every, 1))]
    threads += [threading.Thread(target=searcher, args=(url, rec, stop, 100 + i)) for i in range(args.searchers)]
    threads.append(threading.Thread(target=sampler, args=(url, pid, workdir, rec, stop, args.sample_s)))
    for t in threads:
        t.start()
    try:
        stop.wait(args.minutes * 60)
    finally:
        stop.set()
        for t in threads:
            t.join()
    return rec


def restart(workdir: str, port: int, log, flags: list[str]) -> tuple[subprocess.Popen, dict]:
    """A fresh server on the grown run: seconds to ``/healthz`` and its RSS, fds and threads once up."""
    t = time.perf_counter()
    server = serve_process.start(workdir, port, log, *flags, timeout_s=900)
    up = time.perf_counter() - t
    rows = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=60).json()["gallery_rows"]
    return server, {"seconds_to_healthz": round(up, 2), "gallery_rows": rows, **proc_stats(server.pid)}


def kill_under_load(
    workdir: str, port: int, log, flags: list[str], server, seconds: float
) -> tuple[subprocess.Popen, dict]:
    """Two adders and a searcher; ``kill -9`` after ``seconds``; restart; every acknowledged row is there."""
    url = f"http://127.0.0.1:{port}"
    rec, stop = Recorder(), threading.Event()
    threads = [threading.Thread(target=adder, args=(url, rec, stop, 16, 10**9, 50 + i)) for i in range(2)]
    threads.append(threading.Thread(target=searcher, args=(url, rec, stop, 60)))
    for t in threads:
        t.start()
    time.sleep(seconds)
    server.send_signal(signal.SIGKILL)
    server.wait(timeout=60)
    stop.set()
    for t in threads:
        t.join()
    server, up = restart(workdir, port, log, flags)
    stored = len(additions.read(workdir, _dim(workdir)))
    missing = [i for i in rec.acked if not i - ADDED_BASE < stored]
    client = httpx.Client(timeout=60)
    probe = rec.acked[-50:]  # the newest acknowledged rows' images are served by id
    thumbs_ok = sum(client.get(f"{url}/thumb/{i}.png").status_code == 200 for i in probe)
    client.close()
    result = {
        "acknowledged_adds": len(rec.adds),
        "acknowledged_rows": len(rec.acked),
        "stored_added_rows": stored,
        "acknowledged_missing": len(missing),
        "thumbs_of_newest_acknowledged_ok": f"{thumbs_ok}/{len(probe)}",
        "failed_requests_around_the_kill": len(rec.errors),
        "restart": up,
    }
    return server, result


def _dim(workdir: str) -> int:
    return int(added_session.run_config(workdir).model.embed_dim)


def pending_cost(workdir: str, n: int, repeats: int = 3) -> dict:
    """``labelled_pending`` timed on the grown run, after ``n`` labelled synthetic rows are appended (so that
    ``n`` wait): the bound alone (``at_least`` above what waits) and the full count (``at_least`` = ``n``,
    what ``--learn_after n`` reads on each labelled add once that many wait and no session trains)."""
    updates, dim = list(added_session.run_config(workdir).data.updates), _dim(workdir)
    writer, rng = additions.writer(workdir), np.random.default_rng(9)
    try:
        names = [CLASSES[i % len(CLASSES)] for i in range(n)]
        additions.append(
            writer,
            additions.read_for_append(writer, dim),
            rng.normal(size=(n, dim)).astype(np.float32),
            np.zeros(n, np.int32),
            names,
            [f"uploads/pending-{i}.png" for i in range(n)],
            [f"{i:064x}".replace("0", "e", 1) for i in range(n)],
            0,
        )
    finally:
        writer.close()
    stored = additions.read(workdir, dim)
    out: dict = {"rows": len(stored)}
    for name, at_least, given in (
        ("bound_only", 10**12, None),
        ("full", n, None),
        ("bound_only_given_rows", 10**12, stored),  # the server passes the rows it holds (no store read)
        ("full_given_rows", n, stored),
    ):
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            count = added_session.labelled_pending(workdir, updates, dim, at_least=at_least, added=given)
            times.append(time.perf_counter() - t)
        out[name] = {"seconds_median": round(float(np.median(times)), 4), "count": count}
    return out


def summarise(rec: Recorder, bins: int = 8) -> dict:
    """Add and search latency p50/p99 (ms) per gallery-size bin, and the first and last samples."""
    out: dict = {"adds": len(rec.adds), "searches": len(rec.searches), "errors": len(rec.errors)}
    if rec.adds:
        rows = np.array([a["rows"] for a in rec.adds])
        edges = np.linspace(rows.min(), rows.max() + 1, bins + 1)
        table = []
        search_rows = np.array([s[2] for s in rec.searches]) if rec.searches else np.zeros(0)
        search_s = np.array([s[1] for s in rec.searches]) if rec.searches else np.zeros(0)
        for lo, hi in zip(edges[:-1], edges[1:]):
            a = np.array([x["s"] for x in rec.adds if lo <= x["rows"] < hi])
            lab = np.array([x["s"] for x in rec.adds if lo <= x["rows"] < hi and x["labelled"]])
            s = search_s[(search_rows >= lo) & (search_rows < hi)]
            table.append(
                {
                    "rows_from": int(lo),
                    "rows_to": int(hi),
                    "adds": len(a),
                    "add_p50_ms": _pct(a, 50),
                    "add_p99_ms": _pct(a, 99),
                    "labelled_add_p50_ms": _pct(lab, 50),
                    "searches": len(s),
                    "search_p50_ms": _pct(s, 50),
                    "search_p99_ms": _pct(s, 99),
                }
            )
        out["by_gallery_rows"] = table
        out["sessions_started"] = sum(a["started"] for a in rec.adds)
        out["model_sessions_seen"] = sorted({a["model"] for a in rec.adds})
    if rec.samples:
        out["first_sample"], out["last_sample"] = rec.samples[0], rec.samples[-1]
    return out


def _pct(x: np.ndarray, q: float) -> float | None:
    return round(float(np.percentile(x, q)) * 1000, 2) if len(x) else None


def _written_bytes() -> int:
    """Bytes this process has written through system calls so far (``wchar`` of ``/proc/self/io``)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))


def _stats(x: list[float]) -> dict:
    a = np.asarray(x, np.float64)
    return {
        "p50": round(float(np.percentile(a, 50)), 4),
        "p99": round(float(np.percentile(a, 99)), 4),
        "max": round(float(a.max()), 4),
    }


def store_cost(built: str, sizes: list[int], root: str, adds: int = 100) -> list[dict]:
    """What adds of 16 rows cost the additions store at each size, in this process: ``adds`` of them in a row
    on the seeded store (each one's seconds and bytes written, p50/p99/max: the adds that merge segments
    included), the bytes of the newest step, the whole store read back (what a restart reads) and
    ``labelled_pending``'s bound (a read of the store, then a pass over its rows).  Seeding's own appends (200,000
    rows each, with their merges) are timed too.  Runs with the store of any version (``PYTHONPATH``)."""
    out = []
    for n in sizes:
        workdir = os.path.join(root, f"store_{n}")
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.copytree(built, workdir)
        dim = _dim(workdir)
        t = time.perf_counter()
        seed_rows(workdir, n, dim)
        seed_s = time.perf_counter() - t
        writer = additions.writer(workdir)
        seconds, written = [], []
        try:
            t = time.perf_counter()
            current = additions.read_for_append(writer, dim)
            read_s = time.perf_counter() - t
            for k in range(adds):
                b0, t = _written_bytes(), time.perf_counter()
                current = additions.append(
                    writer,
                    current,
                    np.zeros((16, dim), np.float32),
                    np.full(16, -1, np.int32),
                    [""] * 16,
                    [f"uploads/x{k}-{i}.png" for i in range(16)],
                    [f"{k:032x}{i:032x}".replace("0", "f", 1) for i in range(16)],
                    0,
                )
                seconds.append(time.perf_counter() - t)
                written.append(_written_bytes() - b0)
        finally:
            writer.close()
        t = time.perf_counter()
        whole = additions.read(workdir, dim)
        whole_s = time.perf_counter() - t
        assert len(whole) == n + 16 * adds
        t = time.perf_counter()
        added_session.labelled_pending(workdir, [], dim, at_least=10**12)
        bound_s = time.perf_counter() - t
        step_bytes = tree_bytes(os.path.join(workdir, "checkpoints", "additions", str(current.step)))
        out.append(
            {
                "rows": n,
                "seed_s": round(seed_s, 2),
                "adds": adds,
                "read_for_append_s": round(read_s, 3),
                "add_s": _stats(seconds),
                "add_bytes_written": _stats(written),
                "mean_bytes_written_per_add": int(np.mean(written)),
                "newest_step_bytes": step_bytes,
                "segments": len(getattr(whole, "segments", ())) or 1,
                "read_whole_store_s": round(whole_s, 3),
                "pending_bound_s": round(bound_s, 3),
            }
        )
        print(json.dumps(out[-1]), flush=True)
        shutil.rmtree(workdir)
    return out


def worst_add(built: str, n: int, root: str) -> dict:
    """The add that merges a whole store of ``n`` rows: adds of ``n/2``, ``n/4 - 8`` and ``n/4 - 8`` rows (so
    the newest segments reach the first one's rows with the next add), then one add of 16 rows, timed with its
    bytes written (with the store before segments, every add writes every row: this add too)."""
    workdir = os.path.join(root, f"worst_{n}")
    shutil.rmtree(workdir, ignore_errors=True)
    shutil.copytree(built, workdir)
    dim = _dim(workdir)
    writer = additions.writer(workdir)
    rng = np.random.default_rng(3)
    try:
        current = additions.read_for_append(writer, dim)
        for k, m in enumerate((n // 2, n // 4 - 8, n // 4 - 8, 16)):
            b0, t = _written_bytes(), time.perf_counter()
            current = additions.append(
                writer,
                current,
                rng.normal(size=(m, dim)).astype(np.float32),
                np.full(m, -1, np.int32),
                [""] * m,
                [f"uploads/w{k}-{i}.png" for i in range(m)],
                [f"{k:032x}{i:032x}".replace("0", "e", 1) for i in range(m)],
                0,
            )
            seconds, written = time.perf_counter() - t, _written_bytes() - b0
    finally:
        writer.close()
    out = {"rows": len(current), "merging_add_s": round(seconds, 3), "merging_add_bytes_written": written}
    out["segments_after"] = len(getattr(current, "segments", ())) or 1
    print(json.dumps(out), flush=True)
    shutil.rmtree(workdir)
    return out


def plot(result: dict, path: str) -> None:
    """RSS, fds and threads, disk, and add/search latency against gallery rows, over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = [s for s in result["samples"] if "rss_mib" in s]
    t = [s["t"] / 60 for s in samples]
    fig, ax = plt.subplots(2, 2, figsize=(11, 7))
    ax[0, 0].plot(t, [s["rss_mib"] for s in samples])
    ax[0, 0].set(title="server RSS (MiB)", xlabel="minutes")
    ax[0, 1].plot(t, [s["fds"] for s in samples], label="open fds")
    ax[0, 1].plot(t, [s["threads"] for s in samples], label="threads")
    ax[0, 1].set(title="fds and threads", xlabel="minutes")
    ax[0, 1].legend()
    ax[1, 0].plot(t, [s["checkpoints_bytes"] / 2**20 for s in samples], label="checkpoints/")
    ax[1, 0].plot(t, [s["uploads_bytes"] / 2**20 for s in samples], label="uploads/")
    ax[1, 0].plot(t, [s["run_bytes"] / 2**20 for s in samples], label="run folder")
    ax[1, 0].set(title="on disk (MiB)", xlabel="minutes")
    ax[1, 0].legend()
    adds = result["adds"]
    ax[1, 1].scatter([a["rows"] for a in adds], [a["s"] * 1000 for a in adds], s=2, label="/add (16 images)")
    searches = result["searches"][:: max(1, len(result["searches"]) // 5000)]
    ax[1, 1].scatter([s[2] for s in searches], [s[1] * 1000 for s in searches], s=2, label="/search (1 image)")
    ax[1, 1].set(title="latency (ms) against gallery rows", xlabel="gallery rows", yscale="log")
    ax[1, 1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--out", default="soak")
    p.add_argument("--built", help="a finished photo run to copy (else a tiny one is built)")
    p.add_argument("--minutes", type=float, default=25)
    p.add_argument("--seed_rows", type=int, default=0)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--label_every", type=int, default=4, help="one add in this many is labelled")
    p.add_argument("--learn_after", type=int, default=200)
    p.add_argument("--searchers", type=int, default=2)
    p.add_argument("--sample_s", type=float, default=20)
    p.add_argument("--kill_after_s", type=float, default=20)
    p.add_argument("--store_adds", type=int, default=100, help="--store_cost: adds of 16 rows timed at each size")
    p.add_argument("--plot", help="only redraw the figure of this serve_soak.json")
    p.add_argument("--store_cost", help="only time one add's store read and write at these sizes (100000,1000000)")
    args = p.parse_args()
    if args.store_cost:
        if not args.built:
            p.error("--store_cost needs --built (a finished run to copy)")
        sizes = [int(x) for x in args.store_cost.split(",")]
        result = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        result["store_cost"] = store_cost(args.built, sizes, args.out, args.store_adds)
        result["merging_add"] = [worst_add(args.built, n, args.out) for n in sizes]
        with open(os.path.join(args.out, "store_cost.json"), "w") as f:
            json.dump(result, f)
        return
    if args.plot:
        with open(args.plot) as f:
            plot(json.load(f), os.path.join(os.path.dirname(args.plot), "serve_soak.png"))
        return
    os.makedirs(args.out, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="soak-", dir=args.out))
    if args.built:
        workdir = str(root / "run")
        shutil.copytree(args.built, workdir)
    else:
        workdir, _ = photo_run(root)
    t = time.perf_counter()
    seed_rows(workdir, args.seed_rows, _dim(workdir))
    seeded_s = time.perf_counter() - t
    port = serve_process.free_port()
    flags = ["--poll_s", "1", "--gate", "off", "--learn_after", str(args.learn_after)]
    result: dict = {
        "command": " ".join(sys.argv),
        "host": f"{platform.node()}, {os.cpu_count()} CPUs",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "seed_rows": args.seed_rows,
        "seed_seconds": round(seeded_s, 1),
    }
    with open(os.path.join(args.out, "serve.log"), "wb") as log:
        server, result["start"] = restart(workdir, port, log, flags)
        print("started", result["start"], flush=True)
        rec = soak(f"http://127.0.0.1:{port}", server.pid, workdir, args)
        result.update(
            summary=summarise(rec), samples=rec.samples, adds=rec.adds, searches=rec.searches, errors=rec.errors
        )
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=120)
        server, result["restart"] = restart(workdir, port, log, flags)
        print("restart", result["restart"], flush=True)
        server, result["kill9"] = kill_under_load(workdir, port, log, flags, server, args.kill_after_s)
        print("kill -9", result["kill9"], flush=True)
        serve_process.stop(server)
    result["learn_after_check"] = pending_cost(workdir, args.learn_after)
    print("pending check", result["learn_after_check"], flush=True)
    with open(os.path.join(args.out, "serve_soak.json"), "w") as f:
        json.dump(result, f)
    plot(result, os.path.join(args.out, "serve_soak.png"))
    print(json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
    main()
