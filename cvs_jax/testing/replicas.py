"""Requests to ``serve`` replicas and exact search's answers to compare them with: shared by the slow
tests of several replicas on one Milvus server (tests/serve/test_milvus_replicas.py) and their benchmark
(benchmarks/milvus_replicas.py).  A ``client`` is anything with ``post(url, params=, files=)``: FastAPI's
``TestClient`` of an in-process replica, or an ``httpx.Client`` of a ``python -m cvs_jax.serve`` process.
"""

from __future__ import annotations

import os
import time

import numpy as np

K = 5


def files(paths) -> list:
    """The multipart ``file`` fields of ``paths`` (what ``/search`` and ``/add`` take)."""
    out = []
    for p in paths:
        with open(p, "rb") as f:
            out.append(("file", (os.path.basename(p), f.read())))
    return out


def search(client, paths, k: int = K):
    return client.post("/search", params={"k": k}, files=files(paths))


def hits(client, paths, k: int = K) -> list[list[dict]]:
    """Each query's hits (a non-200 answer fails, showing its body)."""
    r = search(client, paths, k)
    assert r.status_code == 200, r.text
    return [q["hits"] for q in r.json()["queries"]]


def until(fn, timeout_s: float, what: str, every_s: float = 0.5):
    """``fn()`` until it is truthy; fails naming ``what`` after ``timeout_s``."""
    end = time.monotonic() + timeout_s
    while True:
        out = fn()
        if out or time.monotonic() > end:
            assert out, f"{what} not within {timeout_s} s"
            return out
        time.sleep(every_s)


def exact_hits(workdir: str, paths, k: int = K, session: int | None = None) -> list[list[dict]]:
    """What exact search over the run on disk answers (the reference of every replica), with the model of
    ``session`` (1-based) pinned, or the one the gate serves."""
    from fastapi.testclient import TestClient  # pylint: disable=g-import-not-at-top  # the serve extra

    from cvs_jax.serve.app import create_app  # pylint: disable=g-import-not-at-top
    from cvs_jax.serve.state import Served  # pylint: disable=g-import-not-at-top

    served = Served(workdir, poll_s=0, max_wait_s=0.02)
    try:
        client = TestClient(create_app(served))
        if session is not None:
            r = client.post("/model", params={"session": session})
            assert r.status_code == 200, r.text
        return hits(client, paths, k)
    finally:
        served.close()


def same(got, want) -> None:
    """The same ids in the same order, scores within 1e-5."""
    for g, w in zip(got, want):
        assert [h["id"] for h in g] == [h["id"] for h in w]
        np.testing.assert_allclose([h["score"] for h in g], [h["score"] for h in w], atol=1e-5)


def recall(got, want) -> float:
    """recall@k of ``got`` (hits per query) against ``want``'s (exact search)."""
    found = [len({h["id"] for h in g} & {h["id"] for h in w}) for g, w in zip(got, want)]
    return sum(found) / max(1, sum(len(w) for w in want))
