"""What a server running for weeks must not do per request (``benchmarks/serve_soak.py`` measures it).

Each read of the added rows restores the whole store, and orbax/tensorstore kept about 330 kB per read
at 100,000 rows (and ~170 kB per save through a writer opened for it): a server reading it on every
``/add`` (and again for ``--learn_after``'s count) grew from 570 MiB to 2.4 GiB in 25 minutes of adds.
The server appends to the rows it last wrote, with the writer that wrote them, while no other writer
has written since; another writer's step is read, so its rows are kept.
"""

from __future__ import annotations

import gc
import os
import shutil
import weakref

import jax
import numpy as np
from fastapi.testclient import TestClient

from cvs_jax.retrieval import additions, gate
from cvs_jax.retrieval.run_reader import ADDED_BASE, Run, load_images
from cvs_jax.rundir import paths
from cvs_jax.rundir import workdir as workdir_lib
from cvs_jax.serve.app import create_app
from cvs_jax.serve.state import Served
from cvs_jax.testing.image_folders import new_photos


def _counting(monkeypatch, name: str) -> list[int]:
    calls = [0]
    real = getattr(additions, name)

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(additions, name, counted)
    return calls


def test_adds_append_to_what_the_server_wrote_and_keep_another_writers_rows(run_copy, tmp_path, monkeypatch):
    photos = new_photos(tmp_path / "photos", {"ant": 4, "bee": 3})
    served = Served(run_copy, poll_s=0)
    client = TestClient(create_app(served, learn_after=100))  # labelled adds count what is pending

    def add(path, label):
        with open(path, "rb") as f:
            r = client.post("/add", params={"label": label}, files=[("file", (path, f.read()))])
        assert r.status_code == 200, r.text
        return r.json()

    try:
        add(photos["ant"][0], "ant")  # the first add reads what is stored
        reads, appends = _counting(monkeypatch, "read"), _counting(monkeypatch, "read_for_append")
        for path in photos["ant"][1:3]:
            add(path, "ant")
        assert (reads[0], appends[0]) == (0, 0)  # the old server restored the store 2 times per labelled add
        served._added_step = None  # the watcher polls between an add's write and its rows taken in
        served.poll()
        assert reads[0] == 0  # a step this server wrote is not read back

        with workdir_lib.hold_additions(run_copy):  # search --add, another process's writer
            Run(run_copy, for_add=True).add(
                load_images([photos["bee"][0]], served.run.image_shape), [photos["bee"][0]], "bee"
            )
        before = appends[0]
        got = add(photos["bee"][1], "bee")  # its step is read: its row is kept, the new one after it
        assert appends[0] == before + 1 and got["ids"] == [ADDED_BASE + 4]
        add(photos["bee"][2], "bee")
    finally:
        served.close()
    stored = additions.read(run_copy, served.dim)
    assert [s.rsplit("/", 1)[-1] for s in stored.sources][3] == photos["bee"][0].rsplit("/", 1)[-1]
    assert stored.names == ["ant"] * 3 + ["bee"] * 3 and len(stored.digests) == 6
    assert len(set(stored.digests)) == 6
    steps = sorted(int(n) for n in os.listdir(paths.additions_dir(run_copy)) if n.isdigit())
    assert steps == [s.step for s in stored.segments]  # the writer kept open keeps the chain's segments only
    mine = served.added_now()  # what the server holds is what a reader reads back
    assert mine is not None and mine.step == stored.step and mine.sources == stored.sources
    np.testing.assert_array_equal(mine.gallery.embeddings, stored.gallery.embeddings)
    np.testing.assert_array_equal(mine.gallery.labels, stored.gallery.labels)


def test_a_second_model_of_the_same_network_traces_nothing(run_copy):
    """A switch to a new session's model (same network, new weights) reuses the compiled embed function:
    a new one per model was traced and compiled for every batch bucket at each switch."""
    traced = []

    def listen(event: str, duration_secs: float, **kwargs) -> None:
        if event == "/jax/core/compile/jaxpr_trace_duration":
            traced.append(duration_secs)

    jax.monitoring.register_event_duration_secs_listener(listen)
    first, second = Run(run_copy), Run(run_copy)
    images = np.zeros((3, *first.image_shape), np.uint8)
    first.embed(images)
    before = len(traced)
    second.variables["params"] = jax.tree.map(lambda x: x * 2, second.variables["params"])  # other weights
    got = second.embed(images)
    assert len(traced) == before
    assert not np.allclose(got, first.embed(images))  # its own weights, not the first model's


def test_a_duplicate_refused_after_another_writers_add_closes_the_writer_it_opened(run_copy, tmp_path, monkeypatch):
    """Another writer's step makes the next /add open a writer and read the store; when those rows hold the
    upload's bytes the add is refused (409), and that writer is closed, not left open beside the next."""
    photos = new_photos(tmp_path / "photos", {"bee": 2})
    served = Served(run_copy, poll_s=0)  # no watcher: the other writer's row is first seen under the lock
    client = TestClient(create_app(served))
    opened = []  # [writer, closed] per writer opened
    real = additions.writer

    def tracked(workdir):
        w = real(workdir)
        entry, close = [w, False], w.close

        def closing():
            entry[1] = True
            close()

        opened.append(entry)
        w.close = closing
        return w

    monkeypatch.setattr(additions, "writer", tracked)
    try:
        with workdir_lib.hold_additions(run_copy):  # search --add, another process's writer
            Run(run_copy, for_add=True).add(
                load_images([photos["bee"][0]], served.run.image_shape), [photos["bee"][0]], "bee"
            )
        opened.clear()
        with open(photos["bee"][0], "rb") as f:
            r = client.post("/add", params={"label": "bee"}, files=[("file", ("again.png", f.read()))])
        assert r.status_code == 409, r.text
        assert len(opened) == 1 and opened[0][1]  # the old server left it open
        with open(photos["bee"][1], "rb") as f:  # the next add opens its own and succeeds
            r = client.post("/add", params={"label": "bee"}, files=[("file", ("new.png", f.read()))])
        assert r.status_code == 200, r.text
    finally:
        served.close()
    assert [o[1] for o in opened] == [True, True]  # close() closed the kept one


def test_a_switch_reads_only_the_added_rows_the_server_lacks(run_copy, tmp_path, monkeypatch):
    """A switch (a pin here; a new session's model the same way) read a new ``Run`` with every added row
    through orbax: ~2 s at 1,000,000 rows, and memory orbax keeps per restore.  It now reads only the segments
    written after the rows the server holds: none after its own adds, the other writer's one after that (as
    the watcher does)."""
    photos = new_photos(tmp_path / "photos", {"ant": 3})
    served = Served(run_copy, poll_s=0)
    client = TestClient(create_app(served))
    try:
        for path in photos["ant"][:2]:
            with open(path, "rb") as f:
                r = client.post("/add", params={"label": "ant"}, files=[("file", (path, f.read()))])
            assert r.status_code == 200, r.text
        restored = []
        real = additions._restore

        def counted(checkpoints, step):
            restored.append(step)
            return real(checkpoints, step)

        monkeypatch.setattr(additions, "_restore", counted)
        served.pin(0)
        assert restored == [] and len(served.run.added_sources) == 2
        with workdir_lib.hold_additions(run_copy):  # search --add, another process's writer
            Run(run_copy, for_add=True).add(
                load_images([photos["ant"][2]], served.run.image_shape), [photos["ant"][2]], "ant"
            )
        restored.clear()
        served.pin(None)
        read, stored = list(restored), additions.read(run_copy, served.dim)
        assert read == [stored.segments[-1].step] and stored.segments[-1].first == 2
        restored.clear()
        served.poll()  # the watcher takes the other writer's row in, reading its segment alone too
        assert restored == read and served.run.added_sources == stored.sources
    finally:
        served.close()


def test_switching_models_back_and_forth_keeps_nothing(photo_runs, tmp_path):
    """Each switch reads a model through orbax, and tensorstore's to_json() under it kept ~2,150 objects (1.3
    MiB) per switch on this run (``rundir/tensorstore_json.py``); the model switched away from is freed."""
    wd = str(tmp_path / "run")
    shutil.copytree(photo_runs[1], wd)  # two sessions
    if os.path.exists(paths.served_file(wd)):  # never served: the gate, off, starts it on the newest model
        os.remove(paths.served_file(wd))
    served = Served(wd, poll_s=0, thresholds=gate.Thresholds(off=True))
    try:
        for session in (0, 1):  # first-use caches (orbax's, jax's, the compiles)
            served.pin(session)
        left = weakref.ref(served.run)
        gc.collect()
        objects, arrays = len(gc.get_objects()), len(jax.live_arrays())
        for session in (0, 1, 0):
            served.pin(session)
        gc.collect()
        grown = len(gc.get_objects()) - objects
        assert served.model_session == 1 and served.switches == 5
        assert left() is None and len(jax.live_arrays()) == arrays
        assert grown < 150  # 6,443 before
    finally:
        served.close()
