"""Two ``python -m cvs_jax.serve`` replicas of one photo run on one collection of a real Milvus server
(the ``milvus`` package's standalone server, on loopback), searched by client threads on both replicas
throughout, through these phases:

* steady: both replicas on model 1;
* update: ``python -m cvs_jax.update`` adds session 2; each replica's watcher takes its rows through the
  gate (which keeps this tiny run's model 1) at its own moment;
* roll: replica A switches to model 2 (``POST /model?session=2``), B still on model 1;
* after roll: B switches too;
* Milvus kill -9 / down / restart / recovered: one ``/add`` every ``--add_every_s`` through A and B in
  turn; the server is SIGKILLed, left down, started again on the same ports and data folder.

Per replica and phase: requests, failures (503s and others), latency p50 / p99, and recall@5 against
exact search over the rows and model that answered (each answer names its model and row count; the
reference is ``search``'s exact answer for that pair).  Then: Milvus's restart time, the time until both
replicas answer again, adds acknowledged and refused, every acknowledged row found by its own image
through both replicas, and Milvus's row count against the rows on disk (nothing lost, nothing twice).

    nice -n 10 /work/milvusenv/bin/python benchmarks/milvus_replicas.py [--out milvus_replicas.json]

needs the ``milvus_server`` extra (pip install -e '.[milvus_server]'); a few minutes on a CPU (the
tiny photo run is trained first).  The shared pieces are cvs_jax/testing/ (milvus_server, replicas,
serve_process), as the slow tests use them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import _common  # noqa: F401  (puts the repo root on sys.path)
import httpx
import numpy as np

from cvs_jax.index.milvus import ROW, VECTOR
from cvs_jax.retrieval import run_reader
from cvs_jax.retrieval.run_reader import ADDED_BASE
from cvs_jax.testing import replicas, serve_process
from cvs_jax.testing.image_folders import new_photo, photo_run
from cvs_jax.testing.milvus_server import MilvusServer

COLLECTION = "bench_replicas"


class Load:
    """Client threads searching each replica with one image at a time; every answer is recorded with the
    phase its request started in."""

    def __init__(self, urls: dict[str, str], queries: list[str], clients: int):
        self.phase = "setup"
        self.records: list[dict] = []
        self.queries, self._stop, self._lock = queries, threading.Event(), threading.Lock()
        self._threads = [
            threading.Thread(target=self._client, args=(name, url, i, clients), daemon=True)
            for name, url in urls.items()
            for i in range(clients)
        ]

    def start(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)

    def _client(self, replica: str, url: str, i: int, step: int) -> None:
        with httpx.Client(base_url=url, timeout=30) as client:
            while not self._stop.is_set():
                q, i = i % len(self.queries), i + step
                phase, t = self.phase, time.perf_counter()
                rec = {"phase": phase, "replica": replica, "q": q}
                try:
                    r = replicas.search(client, [self.queries[q]])
                    rec["status"] = r.status_code
                    if r.status_code == 200:
                        body = r.json()
                        rec.update(model=body["model_session"], rows=body["gallery_rows"])
                        rec["ids"] = [h["id"] for h in body["queries"][0]["hits"]]
                except httpx.HTTPError as e:
                    rec["status"] = type(e).__name__
                rec["ms"] = (time.perf_counter() - t) * 1000
                with self._lock:
                    self.records.append(rec)
                if rec["status"] != 200:
                    time.sleep(0.2)  # a replica that refuses is asked again, not hammered


class Adder:
    """One ``/add`` of a new photo every ``every_s``, through the replicas in turn."""

    def __init__(self, urls: dict[str, str], folder: str, every_s: float):
        self.results: list[dict] = []
        self._urls, self._folder, self._every = list(urls.items()), folder, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Adder:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=120)

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            replica, url = self._urls[i % len(self._urls)]
            photo = new_photo(os.path.join(self._folder, f"add{i}.png"), "cat", seed=5000 + i)
            out = {"replica": replica, "photo": photo}
            try:
                r = httpx.post(f"{url}/add", params={"label": "cat"}, files=replicas.files([photo]), timeout=60)
                out["status"] = r.status_code
                if r.status_code == 200:
                    out["id"] = r.json()["ids"][0]
            except httpx.HTTPError as e:
                out["status"] = type(e).__name__
            self.results.append(out)
            i += 1
            self._stop.wait(self._every)


def _summary(load: Load, refs: dict, phases: list[str]) -> list[dict]:
    """Per phase and replica: requests, failures, latency p50/p99, recall@5 where a reference exists."""
    rows = []
    for phase in phases:
        for replica in ("A", "B"):
            recs = [r for r in load.records if r["phase"] == phase and r["replica"] == replica]
            ok = [r for r in recs if r["status"] == 200]
            scored = [r for r in ok if (r["model"], r["rows"]) in refs]
            got = [len(set(r["ids"]) & set(refs[r["model"], r["rows"]][r["q"]])) for r in scored]
            want = [len(refs[r["model"], r["rows"]][r["q"]]) for r in scored]
            ms = [r["ms"] for r in ok]
            rows.append(
                {
                    "phase": phase,
                    "replica": replica,
                    "requests": len(recs),
                    "ok": len(ok),
                    "503": sum(r["status"] == 503 for r in recs),
                    "other_failures": sum(r["status"] not in (200, 503) for r in recs),
                    "p50_ms": float(np.percentile(ms, 50)) if ms else None,
                    "p99_ms": float(np.percentile(ms, 99)) if ms else None,
                    "recall_at_5": sum(got) / sum(want) if want else None,
                    "answers_scored": len(scored),
                    "models": sorted({r["model"] for r in ok}),
                }
            )
    return rows


def _health(url: str) -> dict:
    return httpx.get(f"{url}/healthz", timeout=30).json()


def _refs(run: str, queries: list[str], model: int) -> tuple[tuple[int, int], list[list[int]]]:
    """((model session, gallery rows), each query's exact top-5 ids) of the run as it is on disk, with the
    model of session ``model`` (1-based)."""
    got = replicas.exact_hits(run, queries, session=model)
    rows = len(run_reader.Run(run, model_session=model - 1).rows)
    return (model, rows), [[h["id"] for h in q] for q in got]


def _phase(load: Load, name: str, seconds: float = 0.0) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] phase: {name}", flush=True)
    load.phase = name
    time.sleep(seconds)


def _roll(load: Load, urls: dict, run: str, folder: str, queries: list[str], a) -> dict:
    """steady, update, roll, after roll; returns the exact references and what each step took."""
    refs, out = dict([_refs(run, queries, 1)]), {}
    n_old = _health(urls["A"])["gallery_rows"]
    _phase(load, "steady", a.steady_s)
    _phase(load, "update (session 2's rows taken at each watcher's poll)")
    t = time.monotonic()
    cmd = [sys.executable, "-m", "cvs_jax.update", "--workdir", run, "--data", folder]
    with open(os.path.join(a.tmp, "update.log"), "w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)
    out["update_s"] = time.monotonic() - t
    n_new = len(run_reader.Run(run).rows)
    for url in urls.values():
        replicas.until(lambda u=url: _health(u)["gallery_rows"] == n_new, 300, "the new session's rows")
    out["update_start_to_both_on_new_rows_s"] = time.monotonic() - t
    for model in (1, 2):
        key, hits = _refs(run, queries, model)
        refs[key] = hits
    out["rows"] = {"session 1": n_old, "session 2": n_new}
    out["models_after_update"] = {k: _health(u)["model_session"] for k, u in urls.items()}
    for name, phase in (("A", "roll (A model 2, B model 1)"), ("B", "after roll (both model 2)")):
        _phase(load, f"{name} switching")
        t = time.monotonic()
        r = httpx.post(f"{urls[name]}/model", params={"session": 2}, timeout=300)
        r.raise_for_status()
        out[f"switch_{name}_s"] = time.monotonic() - t
        _phase(load, phase, a.roll_s)
    return refs, out


def _kill(load: Load, urls: dict, server: MilvusServer, a) -> tuple[Adder, dict]:
    """Adds through both replicas while the Milvus server is SIGKILLed, left down and started again."""
    out = {}
    adder = Adder(urls, a.tmp, a.add_every_s).start()
    _phase(load, "before kill", a.down_s / 2)
    server.kill()
    _phase(load, "Milvus down (kill -9)", a.down_s)
    _phase(load, "Milvus restarting")
    t = time.monotonic()
    server.start()
    out["milvus_restart_s"] = time.monotonic() - t

    def answers(url):
        with httpx.Client(base_url=url, timeout=30) as c:
            return replicas.search(c, load.queries[:1]).status_code == 200

    for url in urls.values():
        replicas.until(lambda u=url: answers(u), 300, "an answer after the restart", every_s=0.25)
    out["restart_to_both_answering_s"] = time.monotonic() - t
    _phase(load, "recovered", a.down_s)
    adder.stop()
    return adder, out


def _check_rows(urls: dict, server: MilvusServer, run: str, adder: Adder) -> dict:
    """Every acknowledged add found by its own image (top hit, its id) through both replicas; Milvus's
    rows are the run's on disk, each once."""
    import pymilvus  # pylint: disable=g-import-not-at-top

    acked = [r for r in adder.results if r["status"] == 200]
    on_disk = run_reader.Run(run)
    stored, total = len(on_disk.stored_added), len(on_disk.rows)
    for url in urls.values():  # the watchers read the adds made through the other replica
        replicas.until(lambda u=url: _health(u)["gallery_rows"] == total, 120, "the added rows")
    found = {}
    for name, url in urls.items():
        with httpx.Client(base_url=url, timeout=60) as c:
            found[name] = sum(replicas.hits(c, [r["photo"]], 1)[0][0]["id"] == r["id"] for r in acked)
    client = pymilvus.MilvusClient(uri=server.uri)
    try:
        count = int(client.query(COLLECTION, filter="", output_fields=["count(*)"])[0]["count(*)"])
        ids = []
        it = client.query_iterator(COLLECTION, batch_size=1000, filter=f"{ROW} >= 0", output_fields=[ROW])
        while batch := it.next():
            ids += [r[ROW] for r in batch]
        it.close()
    finally:
        client.close()
    want = set(range(total - stored)) | {ADDED_BASE + i for i in range(stored)}
    return {
        "adds": len(adder.results),
        "adds_acknowledged": len(acked),
        "adds_refused_503": sum(r["status"] == 503 for r in adder.results),
        "adds_other": sum(r["status"] not in (200, 503) for r in adder.results),
        "added_rows_on_disk": stored,
        "acknowledged_found_through": found,
        "milvus_rows": count,
        "milvus_distinct_ids": len(set(ids)),
        "run_rows_on_disk": total,
        "rows_on_disk_missing_from_milvus": len(want - set(ids)),
        "milvus_ids_not_on_disk": len(set(ids) - want),
    }


def _dim(run: str) -> int:
    return int(run_reader.Run(run).config.model.embed_dim)


def _direct_search_ms(uri: str, dim: int, n: int = 20) -> dict:
    """p50 of one pymilvus search (1 query, k=5) on the collection, at each consistency level, no load:
    what a replica's search costs in Milvus alone (the replicas read ``Strong``)."""
    import pymilvus  # pylint: disable=g-import-not-at-top

    client = pymilvus.MilvusClient(uri=uri)
    q = [np.random.default_rng(0).normal(size=dim).tolist()]
    out = {}
    try:
        for level in ("Strong", "Bounded", "Eventually"):
            ms = []
            for _ in range(n):
                t = time.perf_counter()
                client.search(COLLECTION, data=q, limit=5, anns_field=VECTOR, consistency_level=level)
                ms.append((time.perf_counter() - t) * 1000)
            out[level] = float(np.percentile(ms, 50))
    finally:
        client.close()
    return out


def _markdown(rows: list[dict], facts: dict) -> str:
    def f(x, fmt):
        return "—" if x is None else format(x, fmt)

    out = [
        "| phase | replica | requests | 503 | other failures | p50 ms | p99 ms | recall@5 vs exact (answers) | model |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['phase']} | {r['replica']} | {r['requests']} | {r['503']} | {r['other_failures']} | "
            f"{f(r['p50_ms'], '.0f')} | {f(r['p99_ms'], '.0f')} | {f(r['recall_at_5'], '.3f')} "
            f"({r['answers_scored']}) | {','.join(map(str, r['models']))} |"
        )
    out.append("")
    out += [f"- {k}: {json.dumps(v)}" for k, v in facts.items()]
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=2, help="client threads per replica")
    p.add_argument("--steady_s", type=float, default=20)
    p.add_argument("--roll_s", type=float, default=20)
    p.add_argument("--down_s", type=float, default=15)
    p.add_argument("--add_every_s", type=float, default=1.0)
    p.add_argument("--out", default="", help="the JSON's path (the table goes to stdout)")
    p.add_argument("--keep", action="store_true", help="keep the temp folder (run, Milvus data, logs)")
    a = p.parse_args()
    a.tmp = tempfile.mkdtemp(prefix="milvus_replicas_")
    started = datetime.datetime.now(datetime.timezone.utc)
    run, folder = photo_run(pathlib.Path(a.tmp))
    queries = sorted(os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs)[::2]
    server, procs, facts = MilvusServer(os.path.join(a.tmp, "milvus")), [], {}
    t = time.monotonic()
    server.start()
    facts["milvus_start_s"] = time.monotonic() - t
    load = None
    try:
        urls = {}
        for name in ("A", "B"):
            port = serve_process.free_port()
            log = open(os.path.join(a.tmp, f"serve_{name}.log"), "w")  # noqa: SIM115 -- open while it runs
            flags = ("--index", "milvus", "--milvus-uri", server.uri, "--milvus-collection", COLLECTION)
            procs.append(serve_process.start(run, port, log, *flags, "--poll_s", "1"))
            urls[name] = f"http://127.0.0.1:{port}"
        facts["milvus_search_p50_ms_by_consistency"] = _direct_search_ms(server.uri, _dim(run))
        load = Load(urls, queries, a.clients).start()
        refs, facts["roll"] = _roll(load, urls, run, folder, queries, a)
        adder, facts["kill"] = _kill(load, urls, server, a)
        load.stop()
        facts["rows"] = _check_rows(urls, server, run, adder)
    finally:
        if load is not None:
            load.stop()
        for proc in procs:
            serve_process.stop(proc)
        server.stop()
        if not a.keep:
            shutil.rmtree(a.tmp, ignore_errors=True)
    phases = list(dict.fromkeys(r["phase"] for r in load.records if r["phase"] != "setup"))
    rows = _summary(load, refs, phases)
    facts["queries"] = len(queries)
    facts["clients_per_replica"] = a.clients
    facts["host"] = f"{platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    facts["date"] = started.strftime("%Y-%m-%d %H:%M UTC")
    print(_markdown(rows, facts))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"rows": rows, "facts": facts}, f, indent=1)


if __name__ == "__main__":
    main()
