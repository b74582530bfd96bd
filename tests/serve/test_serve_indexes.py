"""The server over each index backend (``--index``): on a small gallery every backend answers what exact
search answers (same rows, scores within 1e-5), and a Milvus collection reopened by a restarted server
inserts only the rows it lacks."""

import functools
import glob
import os
import shutil
import tempfile

import numpy as np
import pytest
from fastapi.testclient import TestClient

from cvs_jax.errors import IndexBackendError
from cvs_jax.index import registry
from cvs_jax.retrieval import run_reader
from cvs_jax.serve import __main__ as serve_main
from cvs_jax.serve.app import create_app
from cvs_jax.serve.state import Served


def _queries(wd):
    folder = os.path.join(os.path.dirname(wd), "s1")
    return sorted(glob.glob(os.path.join(folder, "train", "*", "*")))[::7]


def _hits(wd, make_index, k=5):
    """``/search``'s hits for the run's queries, served from a copy of ``wd``: a server records what it serves in
    the workdir (``served.json``), and the session's shared runs must stay as ``update`` left them."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "run")
        shutil.copytree(wd, copy)
        return _served_hits(copy, _queries(wd), make_index, k)


def _served_hits(wd, queries, make_index, k):
    served = Served(wd, make_index=make_index, poll_s=0, max_wait_s=0.01)
    try:
        files = []
        for p in queries:
            with open(p, "rb") as f:
                files.append(("file", (os.path.basename(p), f.read())))
        r = TestClient(create_app(served)).post("/search", params={"k": k}, files=files)
        assert r.status_code == 200, r.text
        return [q["hits"] for q in r.json()["queries"]], served.index
    finally:
        served.close()


def _backends(tmp_path):
    out = [("faiss-hnsw", {}), ("faiss-ivf", {"nlist": 1, "nprobe": 1})]
    try:
        import milvus_lite  # noqa: F401
        import pymilvus  # noqa: F401
    except ImportError:
        return out
    return out + [("milvus", {"uri": str(tmp_path / "milvus.db"), "collection": "served"})]


def test_every_backend_answers_as_exact_search(photo_runs, tmp_path):
    wd = photo_runs[1]  # two sessions: rows of two models
    want, _ = _hits(wd, functools.partial(registry.make_index, "exact"))
    for kind, options in _backends(tmp_path):
        got, _ = _hits(wd, functools.partial(registry.make_index, kind, **options))
        for g, w in zip(got, want):
            assert [h["row"] for h in g] == [h["row"] for h in w], kind
            np.testing.assert_allclose([h["score"] for h in g], [h["score"] for h in w], atol=1e-5)
            assert [h["model_session"] for h in g] == [h["model_session"] for h in w]


def test_a_reopened_milvus_collection_takes_only_the_new_rows(photo_runs, tmp_path):
    pytest.importorskip("milvus_lite")
    pytest.importorskip("pymilvus")
    make = functools.partial(registry.make_index, "milvus", uri=str(tmp_path / "m.db"), collection="reopened")
    _, index = _hits(photo_runs[0], make)
    first = len(index)
    _, index = _hits(photo_runs[1], make)  # the updated run: its session-2 rows are the only new ones
    assert first < len(index) == len(run_reader.Run(photo_runs[1]).gallery)


def test_a_milvus_collection_holding_rows_the_run_lacks_is_refused_before_anything_is_written(photo_runs, tmp_path):
    """An older copy of a run (fewer rows) served on a collection a newer copy filled: refused at start
    (its hits would name rows the run does not have), the collection left as it was."""
    pytest.importorskip("milvus_lite")
    pytest.importorskip("pymilvus")
    make = functools.partial(registry.make_index, "milvus", uri=str(tmp_path / "m.db"), collection="shared")
    _, index = _hits(photo_runs[1], make)
    held, mine = len(index), len(run_reader.Run(photo_runs[0]).gallery)
    why = rf"holds {held} rows, {held - mine} row id\(s\) this run lacks; this run has {mine} rows"
    with pytest.raises(IndexBackendError, match=why):
        Served(photo_runs[0], make_index=make, poll_s=0)
    assert make(index._ids.dim).count() == held


def test_the_command_refuses_milvus_without_a_uri():
    fv = type("FV", (), {"index": "milvus", "__getitem__": lambda self, k: type("V", (), {"value": None})()})()
    with pytest.raises(Exception, match="--milvus-uri"):
        serve_main.index_factory(fv)


def test_recall_check_is_one_for_exact_and_counts_misses(photo_runs):
    served = Served(photo_runs[0], poll_s=0)
    exact = served.index
    try:
        assert serve_main.recall_check(served) == 1.0

        class MissesTheBest:  # an index whose every answer lacks the true best row
            def search(self, queries, k):
                scores, rows = exact.search(queries, k + 1)
                return scores[:, 1:], rows[:, 1:]

        served.index = MissesTheBest()
        assert serve_main.recall_check(served, k=10) == pytest.approx(0.9)
    finally:
        served.index = exact
        served.close()
