"""Two ``serve`` replicas of one run on one collection of a real Milvus server (the ``milvus`` package's
standalone server, cvs_jax/testing/milvus_server.py; skipped where it is not installed): a row added
through one is found through the other once, under the same id; ``kill -9`` of the server gives 503s
naming it, refuses adds with every file left as it was, loses no acknowledged row, and both replicas
answer again when it is back; a rolling ``update`` switch keeps each replica's answers those of exact
search over the rows it knows.

Slow: ``pytest -m slow tests/serve/test_milvus_replicas.py`` in a venv with the ``milvus_server`` extra.
"""

import functools
import os
import time

import pytest
from absl import flags
from fastapi.testclient import TestClient

from cvs_jax import search, update
from cvs_jax.errors import IndexUnavailableError
from cvs_jax.index import registry
from cvs_jax.retrieval.run_reader import ADDED_BASE
from cvs_jax.serve.app import create_app
from cvs_jax.serve.state import Served
from cvs_jax.testing import file_tree
from cvs_jax.testing.image_folders import new_photo, photo_run, write_folder
from cvs_jax.testing.milvus_server import MilvusServer
from cvs_jax.testing.replicas import K
from cvs_jax.testing.replicas import exact_hits as _exact_hits
from cvs_jax.testing.replicas import files as _files
from cvs_jax.testing.replicas import hits as _hits
from cvs_jax.testing.replicas import recall as _recall
from cvs_jax.testing.replicas import same as _same
from cvs_jax.testing.replicas import search as _search
from cvs_jax.testing.replicas import until as _until

pytest.importorskip("pymilvus")
pytest.importorskip("milvus", reason="the Milvus server package: pip install -e '.[milvus_server]'")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    m = MilvusServer(str(tmp_path_factory.mktemp("milvus"))).start()
    yield m
    m.stop()


def _replica(wd, uri, collection):
    make = functools.partial(registry.make_index, "milvus", uri=uri, collection=collection, timeout_s=5)
    served = Served(wd, make_index=make, poll_s=0, max_wait_s=0.02)  # polls by hand: the order is the test's
    return served, TestClient(create_app(served))


def test_a_row_added_through_one_replica_is_found_once_through_the_other(server, run_copy, tmp_path):
    a, ca = _replica(run_copy, server.uri, "replicas_add")
    b, cb = _replica(run_copy, server.uri, "replicas_add")
    try:
        n = len(a.run.gallery)
        photo = new_photo(tmp_path / "new.png", "bee", seed=5)
        r = ca.post("/add", params={"label": "bee"}, files=_files([photo]))
        assert r.status_code == 200, r.text
        (added,) = r.json()["ids"]
        assert added == ADDED_BASE and a.index.count() == n + 1
        before = _hits(cb, [photo])[0]  # B has not read the row yet: left out, the rest B's to give
        assert added not in [h["id"] for h in before] and len(before) == K
        b.poll()  # reads the workdir's added rows; its upsert leaves one row
        hits = _hits(cb, [photo])[0]
        assert [h["id"] for h in hits].count(added) == 1 and hits[0]["id"] == added
        assert hits[0]["row"] == n and abs(hits[0]["score"] - 1.0) <= 1e-5
        assert b.index.count() == n + 1
        _same([hits], _hits(ca, [photo]))
        _same(_hits(cb, [photo]), _exact_hits(run_copy, [photo]))
    finally:
        a.close()
        b.close()


def _search_add(workdir, photo, label) -> int:
    """``python -m cvs_jax.search --workdir W --images PHOTO --add --label LABEL`` (it writes no index)."""
    fv = flags.FlagValues()
    search.define_flags(fv)
    return search.main(fv(["search", "--workdir", workdir, "--images", photo, "--add", "--label", label]), fv)


def test_kill_9_of_the_milvus_server(server, run_copy, tmp_path):
    """503 with one ``error`` line naming the server while it is down, adds refused with the files as they
    were, every acknowledged row there after the restart, both replicas answering again, and a row stored
    while the server was down (``search --add``) written by the replica that read it then."""
    a, ca = _replica(run_copy, server.uri, "replicas_kill")
    b, cb = _replica(run_copy, server.uri, "replicas_kill")
    try:
        n = len(a.run.gallery)
        acked = []
        for i, client in enumerate((ca, cb)):
            photo = new_photo(tmp_path / f"acked{i}.png", "cat", seed=20 + i)
            r = client.post("/add", params={"label": "cat"}, files=_files([photo]))
            assert r.status_code == 200, r.text
            acked.append((photo, r.json()["ids"][0]))
        a.poll()
        b.poll()
        queries = [p for p, _ in acked]
        server.kill()
        for client in (ca, cb):
            r = _search(client, queries)
            assert r.status_code == 503, r.text
            assert list(r.json()) == ["error"] and "\n" not in r.json()["error"]
            assert server.uri in r.json()["error"] and "Milvus" in r.json()["error"]
        before = file_tree.checksums(run_copy)
        refused = new_photo(tmp_path / "refused.png", "ant", seed=30)
        r = cb.post("/add", params={"label": "ant"}, files=_files([refused]))
        assert r.status_code == 503 and server.uri in r.json()["error"], r.text
        assert file_tree.checksums(run_copy) == before
        offline = new_photo(tmp_path / "offline.png", "bee", seed=31)  # stored while the server is down
        assert _search_add(run_copy, offline, "bee") == 0
        with pytest.raises(IndexUnavailableError):
            b.poll()  # B reads it and cannot write it: it must not count it as held
        started = time.monotonic()
        server.start()
        for client in (ca, cb):
            _until(lambda c=client: _search(c, queries).status_code == 200, 180, "an answer after the restart")
        print(f"\nrestart to both replicas answering: {time.monotonic() - started:.1f} s")
        want = _exact_hits(run_copy, queries)
        for client in (ca, cb):
            got = _hits(client, queries)
            _same(got, want)
            assert [q[0]["id"] for q in got] == [i for _, i in acked]
        assert a.index.count() == n + len(acked)
        b.poll()  # B alone writes the row stored while the server was down
        assert b.index.count() == n + 3 and _hits(cb, [offline])[0][0]["id"] == ADDED_BASE + 2
        r = cb.post("/add", params={"label": "ant"}, files=_files([refused]))  # now taken
        assert r.status_code == 200, r.text
        a.poll()
        assert _hits(ca, [refused])[0][0]["id"] == r.json()["ids"][0] and a.index.count() == n + 4
    finally:
        a.close()
        b.close()


def test_a_rolling_update_switch(server, photo_runs, run_copy):
    """``update`` completes; replica A switches first (``POST /model?session=2``), B still serves the old
    model on the same collection (A has put the new session's rows in it), then B switches. At each step
    each replica's answers are exact search's over the rows it serves (recall@5 against exact search,
    printed)."""
    _, _, folder = photo_runs
    queries = sorted(os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs)[::2]
    a, ca = _replica(run_copy, server.uri, "replicas_roll")
    b, cb = _replica(run_copy, server.uri, "replicas_roll")
    try:
        old = _exact_hits(run_copy, queries, session=1)
        assert update.update(run_copy, folder) == 0
        # pinned: a server starting now takes session 2 through the gate (checkpoints/served.json), which keeps
        # this tiny run's old model
        new = _exact_hits(run_copy, queries, session=2)
        n_old = len(b.run.gallery)
        roll = {"session": 2}  # past the gate (it keeps this tiny run's old model): the operator's switch
        assert ca.post("/model", params=roll).status_code == 200
        assert a.run.session == 1 and b.run.session == 0 and a.index.count() > n_old
        during = {"A (new model)": _recall(_hits(ca, queries), new), "B (old model)": _recall(_hits(cb, queries), old)}
        assert cb.post("/model", params=roll).status_code == 200
        assert b.run.session == 1
        after = {"A": _recall(_hits(ca, queries), new), "B": _recall(_hits(cb, queries), new)}
        print(f"\nrolling switch, recall@{K} against exact search, {len(queries)} queries: {during} then {after}")
        _same(_hits(cb, queries), new)
        _same(_hits(ca, queries), new)
        assert min(during.values()) == 1.0 and min(after.values()) == 1.0
    finally:
        a.close()
        b.close()


@pytest.fixture(scope="module")
def joint_run(tmp_path_factory):
    """A one-session ``joint`` photo run (each session re-embeds the whole gallery) and two next folders."""
    root = tmp_path_factory.mktemp("joint")
    run, second = photo_run(root, method="joint")
    return run, second, write_folder(root / "s3", {"emu": 16, "bee": 4}, 3, seed=2)


def test_a_rolling_switch_to_a_re_embedded_gallery(server, joint_run):
    """``joint``: the new model's gallery holds the same ids with other vectors. A replica switching gets a
    collection of that generation (``<name>_g<session>``) and answers exact search's hits of the new model;
    the other, not switched yet, still answers from the collection it serves.  The collection before the
    one a replica leaves is dropped (never one a replica one switch behind still serves)."""
    import pymilvus

    run, second, third = joint_run
    queries = sorted(os.path.join(d, f) for d, _, fs in os.walk(second) for f in fs)[::2]
    a, ca = _replica(run, server.uri, "replicas_joint")
    b, cb = _replica(run, server.uri, "replicas_joint")
    milvus = pymilvus.MilvusClient(uri=server.uri)

    def held():
        return sorted(c for c in milvus.list_collections() if c.startswith("replicas_joint"))

    try:
        old = _exact_hits(run, queries)
        assert update.update(run, second) == 0
        new = _exact_hits(run, queries, session=2)
        assert ca.post("/model", params={"session": 2}).status_code == 200
        assert (a.index.collection, b.index.collection) == ("replicas_joint_g1", "replicas_joint")
        _same(_hits(ca, queries), new)  # the old code reopened one collection: model 1's vectors under model 2
        _same(_hits(cb, queries), old)
        assert a.index.count() == len(a.run.rows) and b.index.count() == len(b.run.rows)
        assert cb.post("/model", params={"session": 2}).status_code == 200
        _same(_hits(cb, queries), new)
        assert held() == ["replicas_joint", "replicas_joint_g1"]  # the one left stays (one switch of slack)
        assert update.update(run, third) == 0
        newest = _exact_hits(run, queries, session=3)
        assert ca.post("/model", params={"session": 3}).status_code == 200
        assert held() == ["replicas_joint_g1", "replicas_joint_g2"]  # generation 0 dropped, B's kept
        _same(_hits(ca, queries), newest)
        _same(_hits(cb, queries), new)
        assert cb.post("/model", params={"session": 3}).status_code == 200
        _same(_hits(cb, queries), newest)
        assert b.index.collection == "replicas_joint_g2" and b.index.count() == len(b.run.rows)
    finally:
        a.close()
        b.close()
        milvus.close()
