"""``update --from_added``: the next session from the labelled images added to a run, trained as
``update --data`` trains on a folder of the same images; the added rows' embeddings untouched."""

import collections
import glob
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import unicodedata

import pytest
from fastapi.testclient import TestClient

from cvs_jax import search, update
from cvs_jax.errors import DataError
from cvs_jax.reports import html
from cvs_jax.retrieval import added_session, additions, gate
from cvs_jax.retrieval.run_reader import ADDED_BASE, Run
from cvs_jax.rundir import paths
from cvs_jax.serve import sessions
from cvs_jax.serve.app import create_app
from cvs_jax.serve.state import Served
from cvs_jax.testing import serve_process
from cvs_jax.testing.image_folders import new_photos as _photos


def _add(wd, photos: dict[str, list[str]], labelled: bool = True) -> None:
    for name, files in photos.items():
        assert search.search_or_add(wd, files, add=True, label=name if labelled else None) == 0


def _bytes(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _added_bytes(wd) -> list[bytes]:
    dim = Run(wd).config.model.embed_dim
    return [p.embeddings.tobytes() for p in additions.read(wd, dim).gallery.parts]


def _results(wd) -> list[dict]:
    """results.json's sessions, but for their wall time."""
    with open(paths.results_file(wd)) as f:
        return [{k: v for k, v in s.items() if k != "seconds"} for s in json.load(f)["per_session"]]


def _state(wd) -> dict:
    """What a refusal must leave as it was."""
    with open(paths.config_file(wd), "rb") as f:
        config = f.read()
    return {"config": config, "listing": sorted(os.listdir(wd)), "added": _added_bytes(wd)}


@pytest.mark.slow  # two sessions trained; the default suite has the served end-to-end test below
def test_from_added_trains_as_update_data_on_the_same_folder(run_copy, tmp_path, capsys):
    photos = _photos(tmp_path / "photos", {"ant": 5, "eel": 5, "dog": 4})  # eel and dog: new classes
    _add(run_copy, {"ant": photos["ant"]})
    _add(run_copy, _photos(tmp_path / "lone", {"kiwi": 1}))  # deferred: the session is the folder's without it
    _add(run_copy, {k: photos[k] for k in ("eel", "dog")})
    before = _added_bytes(run_copy)
    twin = str(tmp_path / "twin")
    shutil.copytree(run_copy, twin)  # the same run and added rows, updated from the folder instead
    assert update.update_from_added(run_copy) == 0
    assert update.update(twin, str(tmp_path / "photos")) == 0
    assert _added_bytes(run_copy) == before  # nothing re-embedded
    got, want = _results(run_copy), _results(twin)
    assert len(got) == 2 and got == want
    a, b = Run(run_copy).gallery, Run(twin).gallery
    assert [p.embeddings.tobytes() for p in a.parts] == [p.embeddings.tobytes() for p in b.parts]
    assert [p.labels.tolist() for p in a.parts] == [p.labels.tolist() for p in b.parts]
    # the rows are used once: only the lone kiwi is left, so the next request is refused and changes nothing
    state = _state(run_copy)
    capsys.readouterr()
    assert update.update_from_added(run_copy) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "error: class 'kiwi' has 1 image" in err
    assert _state(run_copy) == state


@pytest.mark.parametrize("case", ["nothing", "unlabelled", "one_image_each"])
def test_refusals_change_nothing(run_copy, tmp_path, capsys, case):
    if case == "unlabelled":
        _add(run_copy, _photos(tmp_path / "p", {"ant": 3}), labelled=False)
    elif case == "one_image_each":  # every class would be deferred: nothing is left to learn from
        _add(run_copy, _photos(tmp_path / "p", {"kiwi": 1, "bee": 1}))
    state = _state(run_copy)
    capsys.readouterr()
    assert update.update_from_added(run_copy) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:")
    want = {
        "nothing": "no image was added",
        "unlabelled": "have no label",
        "one_image_each": "classes 'bee', 'kiwi' have 1 image among the labelled images added and not yet learnt "
        "(bee: 1, kiwi: 1), and no class has more; a class needs at least 2",
    }
    assert want[case] in err[0]
    assert _state(run_copy) == state and not os.path.exists(os.path.join(run_copy, "from_added", "session-2"))


def _used(wd, folders) -> set[int]:
    return added_session.used_rows(wd, [str(f) for f in folders])


def test_a_lone_image_of_a_class_waits_for_a_later_session_and_blocks_no_other(run_copy, tmp_path, capsys, monkeypatch):
    """One photo of a rare class ("kiwi") refused every session from the adds, for every class, until a
    second one came.  The session learns the classes with two images or more; the lone one stays pending
    (not in ``rows.json``), said by a ``note:`` line and ``POST /sessions``' ``deferred``; the next session
    takes it with the rows added since, no row used twice or lost.  ``--learn_after`` counts what the
    session would learn from, not the lone image."""
    dim = Run(run_copy).config.model.embed_dim
    photos = _photos(tmp_path / "p", {"ant": 3, "kiwi": 1, "bee": 2})  # rows 0-2 ant, 3 kiwi, 4-5 bee
    _add(run_copy, photos)
    assert added_session.labelled_pending(run_copy, [], dim) == 5  # the lone kiwi does not count
    script = tmp_path / "stand_in.sh"  # the child: accepts the plan and exits (training is not the subject)
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o755)
    monkeypatch.setattr(sessions.sys, "executable", str(script))
    job = sessions.SessionJob(run_copy)
    answer = job.start()
    assert answer["session"] == 2 and answer["deferred"] == {"kiwi": 1}, answer
    current = job.current()
    assert (current["images"], current["classes"], current["deferred"]) == (5, 2, {"kiwi": 1}), current
    capsys.readouterr()
    folder, made, what = update.from_added_folder(run_copy)
    out = capsys.readouterr().out.splitlines()
    assert made and what == "5 labelled image(s) (ant: 3, bee: 2)"
    assert out[1] == (
        "note: 1 labelled image(s) (kiwi: 1) wait for a later session: a class needs at least 2 images (add "
        f"another image of it, and the next session learns it; e.g. {Run(run_copy).added_sources[3]})."
    )
    assert sorted(os.listdir(folder)) == ["ant", "bee", "rows.json"]
    with open(os.path.join(folder, "rows.json")) as f:
        assert json.load(f) == {"first": 0, "end": 6, "rows": [[0, 3], [4, 6]]}
    # the session recorded (its folder in data.updates): the kiwi alone is pending, and is not a session
    assert _used(run_copy, [folder]) == {0, 1, 2, 4, 5}
    assert added_session.labelled_pending(run_copy, [folder], dim) == 0
    with pytest.raises(DataError, match=r"^class 'kiwi' has 1 image among .* \(kiwi: 1\), and no"):
        added_session.pending(run_copy, [folder], dim)
    _add(run_copy, _photos(tmp_path / "late", {"kiwi": 1, "cat": 2}, seed=900))  # rows 6 kiwi, 7-8 cat
    plan = added_session.pending(run_copy, [folder], dim)
    assert (
        plan.used == [3, 6, 7, 8]
        and plan.deferred == []
        and added_session.labelled_pending(run_copy, [folder], dim) == 4
    )
    sources = Run(run_copy).added_sources
    assert plan.rows == [("kiwi", sources[3]), ("kiwi", sources[6]), ("cat", sources[7]), ("cat", sources[8])]
    later = added_session.make_folder(run_copy, 3, plan.used, plan.rows)
    assert _used(run_copy, [folder, later]) == set(range(9))  # each row once, none lost
    with pytest.raises(DataError, match="no image was added"):
        added_session.pending(run_copy, [folder, later], dim)


def test_an_old_rows_json_reads_as_every_row_of_its_span_used(run_copy, tmp_path):
    """A ``rows.json`` written before lone images were deferred holds ``first`` and ``end`` alone: all of
    ``first..end-1`` was used.  Read beside a newer one that deferred a row, the pending rows are exactly
    the deferred one and those added since."""
    dim = Run(run_copy).config.model.embed_dim
    _add(run_copy, _photos(tmp_path / "p", {"ant": 2, "bee": 3, "kiwi": 1, "cat": 2}))  # 0-1, 2-4, 5, 6-7
    old = added_session.folder_of(run_copy, 2)
    os.makedirs(old)
    with open(os.path.join(old, "rows.json"), "w") as f:
        json.dump({"first": 0, "end": 2}, f)  # as d6f7dad's make_folder wrote it
    assert _used(run_copy, [old]) == {0, 1}
    plan = added_session.pending(run_copy, [old], dim)
    assert plan.used == [2, 3, 4, 6, 7] and [name for name, _ in plan.deferred] == ["kiwi"]
    new = added_session.make_folder(run_copy, 3, plan.used, plan.rows)
    assert _used(run_copy, [old, new]) == set(range(8)) - {5}
    assert not os.path.exists(os.path.join(run_copy, "from_added", "session-3", "kiwi"))


def test_search_add_takes_a_new_class_name_and_refuses_names_that_cannot_be_one(run_copy, tmp_path, capsys):
    photos = _photos(tmp_path / "p", {"dog": 2})
    for bad, why in [
        ("Ant", "but 'ant' is"),
        ("7", "reads as a number"),
        ("²", "reads as a number"),
        ("train", "cannot name"),
        (".x", "cannot name"),
    ]:
        state = _state(run_copy)
        capsys.readouterr()
        assert search.search_or_add(run_copy, photos["dog"], add=True, label=bad) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:") and why in err[0], (bad, err)
        assert _state(run_copy) == state
    assert search.search_or_add(run_copy, photos["dog"], add=True, label="dog") == 0
    assert "'dog' is a new class (4 classes now)" in capsys.readouterr().err
    assert search.search_or_add(run_copy, photos["dog"][:1], k=1, as_json=True) == 0
    hit = json.loads(capsys.readouterr().out)[0]["hits"][0]  # the photo's own row
    assert hit["class_name"] == "dog" and hit["label"] == 3 and hit["source"].endswith("dog-0.png")
    assert Run(run_copy).label_of("dog") == 3  # a search's label= filter knows it too


def test_a_label_in_another_unicode_form_names_the_same_class(run_copy, tmp_path, capsys):
    """``crème`` composed (NFC, what a browser sends) and decomposed (NFD, ``e`` + a combining accent, as
    macOS wrote file names) read the same: the second became a new class whose name looked identical."""
    composed, decomposed = unicodedata.normalize("NFC", "crème"), unicodedata.normalize("NFD", "crème")
    assert composed != decomposed
    photos = _photos(tmp_path / "p", {"dog": 3})
    assert search.search_or_add(run_copy, photos["dog"][:2], add=True, label=composed) == 0
    capsys.readouterr()
    assert search.search_or_add(run_copy, photos["dog"][2:], add=True, label=decomposed) == 0
    assert "new class" not in capsys.readouterr().err
    run = Run(run_copy)
    assert run.class_names.count(composed) == 1 and decomposed not in run.class_names
    assert run.label_of(decomposed) == run.label_of(composed) == 3
    state = _state(run_copy)
    assert search.search_or_add(run_copy, photos["dog"][2:], add=True, label=decomposed.upper(), force=True) == 2
    assert f"but {composed!r} is" in capsys.readouterr().err  # a case twin in the other form is still refused
    assert _state(run_copy) == state


def test_rows_of_one_name_or_bytes_the_run_holds_no_longer_block_every_later_session(
    photo_runs, run_copy, tmp_path, capsys
):
    """Two cameras' ``IMG_0001`` added to one class refused every later session (two rows, one file name),
    as did a row added with force whose bytes the run holds (a test query; the same photo twice): no added
    row can be taken out, so the run could never learn from its adds again.  The folder keeps both names
    apart and leaves the forced rows out (they stay added rows), and ``update`` accepts its plan."""
    photos = _photos(tmp_path / "p", {"ant": 3, "eel": 3})
    for i, path in enumerate(photos["ant"][:2]):  # two different photos, both named IMG_0001.png
        os.makedirs(tmp_path / f"cam{i}")
        shutil.copy(path, tmp_path / f"cam{i}" / "IMG_0001.png")
    _add(run_copy, {"ant": [str(tmp_path / "cam0" / "IMG_0001.png"), str(tmp_path / "cam1" / "IMG_0001.png")]})
    _add(run_copy, {"ant": photos["ant"][2:], "eel": photos["eel"]})
    query = sorted(glob.glob(os.path.join(os.path.dirname(photo_runs[0]), "s1", "test", "ant", "*")))[0]
    for forced in (query, photos["eel"][0]):  # a test query of the run; a photo added a moment ago
        assert (
            search.search_or_add(
                run_copy, [forced], add=True, label=os.path.basename(os.path.dirname(forced)), force=True
            )
            == 0
        )
    capsys.readouterr()
    folder, made, _ = update.from_added_folder(run_copy)
    note = capsys.readouterr().out
    assert made and "note: 2 labelled added row(s) left out of it: their bytes are in the run already" in note
    assert sorted(os.listdir(os.path.join(folder, "ant"))) == ["IMG_0001-2.png", "IMG_0001.png", "ant-2.png"]
    assert sorted(os.listdir(os.path.join(folder, "eel"))) == sorted(os.path.basename(p) for p in photos["eel"])
    for name, path in [
        ("IMG_0001.png", tmp_path / "cam0" / "IMG_0001.png"),
        ("IMG_0001-2.png", tmp_path / "cam1" / "IMG_0001.png"),
    ]:
        assert _bytes(os.path.join(folder, "ant", name)) == _bytes(path)  # each camera's photo, in the order added
    update.plan_update(run_copy, folder)  # refused both (a shared file name; images the run holds) before
    with open(os.path.join(folder, "rows.json")) as f:
        assert json.load(f) == {"first": 0, "end": 8, "rows": [[0, 8]]}  # every row used: none is offered again


class _Child:
    """A stand-in for the session's process: its pid and exit status (None while it runs)."""

    def __init__(self, code=None):
        self.pid, self.code = 4242, code

    def poll(self):
        return self.code


def _gauges(text: str) -> dict[str, float]:
    """``/metrics``' ``cvs_session_*`` samples, name (with its labels) -> value."""
    out = {}
    for line in text.splitlines():
        if line.startswith("cvs_session_"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def _want_gauges(current: dict) -> dict[str, float]:
    """The gauges a ``/sessions/current`` answer must have, written from its JSON."""
    out = {f'cvs_session_state{{state="{s}"}}': float(s == current["state"]) for s in sessions.STATES}
    keys = ("session", "epoch", "epochs", "step", "loss", "images", "classes", "seconds_left")
    out.update({f"cvs_session_{k}": float(current[k]) for k in keys if current.get(k) is not None})
    return out


def _check_progress_states_and_gauges(client):
    """States, time left and the gauges from a child's log, without training (a stand-in process); run by
    the learn_after test, whose served run and app it reuses."""
    job = client.app.state.ctx.sessions
    job._child, job._learns = _Child(), collections.Counter({"ant": 5, "dog": 4})
    os.makedirs(os.path.dirname(job.log_path), exist_ok=True)
    lines = [
        "== session 2/2 [cvs, linear_reset head]: 34 train images (4 steps/epoch), 5 classes, gallery ...",
        "  session 2: compiling the training step (or reading it from the cache)",
    ]
    steps = [
        ("training", "session 2/2 epoch 1/3 step 4 lr=0.00500 loss=4.9916 L_c=1.5 val R@1=57.14 8 img/s ETA 0:01:40"),
        ("training", "  session 2 epoch 2 step 6/12 ETA 0:01:10"),
        ("scoring", "  session 2: embedding 10 new gallery rows and 11 test queries with the selected model"),
    ]
    for i, (state, line) in enumerate([(None, None)] + steps):
        if line is not None:
            lines.append(line)
        with open(job.log_path, "w") as f:
            f.write("\n".join(lines) + "\n")
        os.utime(job.log_path, (time.time() - 10, time.time() - 10))  # the log last grew 10 s ago
        current = client.get("/sessions/current").json()
        assert current["state"] == (state or "training") and (current["images"], current["classes"]) == (9, 2)
        want_left = [None, 90, 60, None][i]  # the newest ETA less the 10 s since it was printed
        left = current["seconds_left"]
        assert (left is None) if want_left is None else abs(left - want_left) < 2, (i, current)
        if i:
            assert (current["session"], current["epoch"], current["epochs"], current["loss"]) == (2, 1, 3, 4.9916)
        assert _gauges(client.get("/metrics").text) == _want_gauges(client.get("/sessions/current").json())
        assert html.esc(current["summary"]) in client.get("/").text
    job._child.code = 2
    with open(job.log_path, "a") as f:
        f.write("error: the disk is full\n")
    current = client.get("/sessions/current").json()
    assert current["state"] == "failed" and current["error"] == "error: the disk is full"
    assert _gauges(client.get("/metrics").text) == _want_gauges(current)
    job._child.code = 0
    current = client.get("/sessions/current").json()
    assert current["state"] == "done" and current["seconds_left"] == 0
    assert _gauges(client.get("/metrics").text) == _want_gauges(current)


_LOCK_HOLDER = """
import fcntl, json, os, socket, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
command = "python -m cvs_jax.update --workdir W --from_added"
os.write(fd, json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "command": command}).encode())
print("held", flush=True)
time.sleep(600)
"""


def test_a_session_an_earlier_server_started_is_watched_by_its_pid(run_copy):
    """A server restarted while the child of the one before it trains shows that child's session (it
    holds the run's lock as ``update --from_added``), and its end: here killed, so failed."""
    job = sessions.SessionJob(run_copy)
    assert job.current()["state"] == "idle"
    folder = added_session.folder_of(run_copy, 2)
    for name in ("ant/a.png", "ant/b.png", "eel/c.png"):
        os.makedirs(os.path.dirname(os.path.join(folder, name)), exist_ok=True)
        open(os.path.join(folder, name), "wb").close()
    with open(job.log_path, "w") as f:
        f.write("session 2/2 epoch 1/2 step 4 lr=0.005 loss=4.5 val R@1=50.00 8 img/s ETA 0:00:30\n")
    cmd = [sys.executable, "-c", _LOCK_HOLDER, os.path.join(run_copy, paths.LOCK)]
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)  # plays the orphaned child
    restarted = sessions.SessionJob(run_copy)  # the restarted server's
    try:
        assert child.stdout.readline().strip() == "held"
        current = restarted.current()
        assert (current["state"], current["pid"], current["images"], current["classes"]) == (
            "training",
            child.pid,
            3,
            2,
        )
        assert (current["epoch"], current["loss"]) == (1, 4.5)
        with pytest.raises(sessions.Busy):
            restarted.start()  # 409 while it trains
    finally:
        child.kill()  # the process this test started
        child.wait()
    assert restarted.current()["state"] == "failed"  # gone, and results.json has no session 2


def _search(client, path, **params) -> list[dict]:
    with open(path, "rb") as f:
        r = client.post("/search", params=params, files=[("file", ("q.png", f.read()))])
    assert r.status_code == 200, r.text
    return r.json()["queries"][0]["hits"]


def _added_names(run: Run) -> list[str]:
    """The class name each added row shows (``describe``), in the order added."""
    n = len(run.gallery)
    return [run.describe(n + i)["class_name"] for i in range(len(run.added_sources))]


@pytest.mark.parametrize("child", ["stand_in", pytest.param("update", marks=pytest.mark.slow)])
def test_too_few_images_for_a_batch_are_refused_naming_what_was_added(run_copy, tmp_path, capsys, monkeypatch, child):
    """The run's batch made bigger than the session's images plus its replay (24): the command and
    ``POST /sessions`` (its child checks the plan) refuse with one line, and nothing changes.  The
    server's child is ``update --from_added`` itself (slow: a process that imports JAX), or, in the default
    suite, a stand-in that prints the command's error line and exits 2 as it does."""
    with open(paths.config_file(run_copy)) as f:
        config = json.load(f)
    config["train"]["batch_size"] = 64
    with open(paths.config_file(run_copy), "w") as f:
        json.dump(config, f)
    _add(run_copy, _photos(tmp_path / "p", {"ant": 3, "bee": 2}))
    state = _state(run_copy)
    capsys.readouterr()
    assert update.update_from_added(run_copy) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: too few images were added since the last session"), err
    assert "(5 labelled image(s) (ant: 3, bee: 2))" in err[0] and "fewer than train.batch_size=64" in err[0]
    assert "Each class needs at least 2 images" in err[0]
    assert _state(run_copy) == state
    if child == "stand_in":
        script = tmp_path / "stand_in.sh"
        script.write_text(f"#!/bin/sh\necho 'the next session from ...'\necho {json.dumps(err[0])}\nexit 2\n")
        script.chmod(0o755)
        monkeypatch.setattr(sessions.sys, "executable", str(script))
    with pytest.raises(sessions.SessionRefused) as refused:  # the server's 400 (app.py: a UserError)
        sessions.SessionJob(run_copy).start()
    assert str(refused.value) == err[0].removeprefix("error: ")
    assert _state(run_copy) == state and not os.path.exists(os.path.join(run_copy, "from_added"))


def test_post_sessions_trains_beside_serving_and_the_new_model_is_served(run_copy, tmp_path):
    served = Served(run_copy, poll_s=0, max_wait_s=0.02, thresholds=gate.Thresholds(off=True))
    client = TestClient(create_app(served, token="t"))
    auth = {"authorization": "Bearer t"}
    state = _state(run_copy)
    r = client.post("/sessions", headers=auth)  # nothing added yet: one line, nothing changed, no child
    assert r.status_code == 400 and "no image was added" in r.json()["error"], r.text
    assert os.path.abspath(run_copy) not in r.text and f"added to {os.path.basename(run_copy)} since" in r.text
    assert _state(run_copy) == state and client.get("/sessions/current").json()["state"] == "idle"
    # eel and dog are new classes, added in the reverse of the order the session's plan numbers them
    # (its folder's classes are sorted): a label kept as the number given at the add names the wrong class
    photos = _photos(tmp_path / "photos", {"eel": 5, "dog": 5, "bee": 4})
    for name, files in photos.items():
        for path in files:
            with open(path, "rb") as f:
                r = client.post("/add", params={"label": name}, files=[("file", (path, f.read()))], headers=auth)
            assert r.status_code == 200, r.text
            assert r.json()["class_name"] == name and r.json()["new_class"] == (name != "bee" and path == files[0])
    added = [name for name, files in photos.items() for _ in files]
    assert _added_names(served.run) == added  # searchable under their names at once, before any session
    hit = _search(client, photos["eel"][0], k=1)[0]
    assert hit["class_name"] == "eel" and hit["id"] >= ADDED_BASE  # the photo's own added row
    hits = _search(client, photos["bee"][0], k=8, label="dog")
    assert len(hits) == 5 and {h["class_name"] for h in hits} == {"dog"}  # a new class filters like a known one
    page = client.post(
        "/search", params={"k": 1, "html": "true"}, files=[("file", ("q.png", _bytes(photos["dog"][1])))]
    )
    assert '<span class="name">dog</span>' in page.json()["html"]
    before = _added_bytes(run_copy)
    assert client.post("/sessions").status_code == 401
    r = client.post("/sessions", headers=auth)
    assert r.status_code == 200 and r.json()["session"] == 2, r.text
    assert client.post("/sessions", headers=auth).status_code == 409
    query = photos["bee"][0]
    with open(query, "rb") as f:
        body = f.read()
    late = _photos(tmp_path / "late", {"ant": 2}, seed=900)["ant"]  # added while the session trains
    late_digests = sorted(hashlib.sha256(_bytes(p)).hexdigest() for p in late)
    answered, failed, deadline = 0, 0, time.monotonic() + 400
    while client.get("/sessions/current").json()["state"] in ("training", "scoring") and time.monotonic() < deadline:
        r = client.post("/search", params={"k": 3}, files=[("file", ("q.png", body))])
        answered, failed = answered + 1, failed + (r.status_code != 200)
        if late and answered > 1:
            path = late.pop()
            r = client.post("/add", params={"label": "ant"}, files=[("file", (path, _bytes(path)))], headers=auth)
            assert r.status_code == 200, r.text
        time.sleep(0.2)
    assert not late, "the session ended before the late adds"
    current = client.get("/sessions/current").json()
    assert current["state"] == "done", current
    assert current["epoch"] == current["epochs"] and current["loss"] is not None
    assert (current["images"], current["classes"], current["seconds_left"]) == (14, 3, 0)
    assert _gauges(client.get("/metrics").text) == _want_gauges(current)
    assert answered > 0 and failed == 0
    # the late adds belong to the next session: this one used the 14 before them, none is lost or used twice
    folder = os.path.join(run_copy, "from_added", "session-2")
    with open(os.path.join(folder, "rows.json")) as f:
        assert json.load(f) == {"first": 0, "end": 14, "rows": [[0, 14]]}
    assert sum(len(files) for _, _, files in os.walk(folder)) == 14 + 1  # the images and rows.json
    with open(os.path.join(run_copy, "from_added", "child.log")) as f:
        child_log = f.read()
    drawn = "test split drawn: 0.2 of each class, seed 0"  # and no "; ignored: 1 not in a class folder" (rows.json)
    assert f"from folders {folder}: 3 classes, 12 train / 2 test images ({drawn}) into " in child_log
    config = Run(run_copy).config
    used, rows, _, _ = added_session.pending(run_copy, list(config.data.updates), config.model.embed_dim)
    stored = additions.read(run_copy, config.model.embed_dim)
    assert used == [14, 15] and [src for _, src in rows] == stored.sources[14:]
    assert [name for name, _ in rows] == ["ant", "ant"] and sorted(stored.digests[14:]) == late_digests
    # a server started now (say, after one killed while the child trained) takes session 2 through the gate
    with open(paths.served_file(run_copy), "rb") as f:
        record = f.read()
    assert json.loads(record) == {"model_session": 0, "gallery_session": 0, "pinned_session": None}
    restarted = Served(run_copy, poll_s=0)  # the default gate
    verdict = gate.for_workdir(run_copy, 1, 0, gate.Thresholds())
    assert restarted.gate == verdict and verdict["decision"] in ("switched", "kept")
    assert restarted.model_session == (2 if verdict["decision"] == "switched" else 1)
    assert restarted.run.gallery_session == 1 and len(restarted.run.rows) == len(Run(run_copy).rows)
    restarted.close()
    with open(paths.served_file(run_copy), "wb") as f:
        f.write(record)  # the first server's record again: its own switch below
    served.poll()  # the server's switch path (the watcher's poll) takes the new session
    r = client.post("/search", params={"k": 3}, files=[("file", ("q.png", body))]).json()
    assert r["model_session"] == 2 and served.model_session == 2
    assert b"".join(_added_bytes(run_copy)).startswith(b"".join(before))  # byte-identical; the late rows after
    # the session learnt eel and dog as classes of the run; every row keeps its name across the switch
    with open(paths.protocol_file(run_copy)) as f:
        names = json.load(f)["class_names"]
    assert names[:3] == ["ant", "bee", "cat"] and sorted(names[3:]) == ["dog", "eel"]
    assert served.run.class_names == names and _added_names(served.run) == added + ["ant", "ant"]
    part = served.run.gallery.parts[-1]  # the session's rows, labelled by the protocol
    assert part.session == 1 and {names[i] for i in part.labels.tolist()} <= {"eel", "dog", "bee"}
    hits = _search(client, photos["bee"][0], k=40, label="eel")
    assert {h["class_name"] for h in hits} == {"eel"} and {h["label"] for h in hits} == {names.index("eel")}
    assert any(h["id"] >= ADDED_BASE for h in hits) and any(h["id"] < ADDED_BASE for h in hits)
    served.close()


@pytest.mark.slow  # a server process started twice and a session trained
def test_a_session_outlives_a_killed_server_and_the_restarted_one_takes_it(run_copy, tmp_path):
    photos = _photos(tmp_path / "photos", {"ant": 5, "bee": 5, "cat": 4})
    _add(run_copy, photos)
    port = serve_process.free_port()
    url = f"http://127.0.0.1:{port}"
    with open(tmp_path / "serve.log", "ab") as log:
        server = serve_process.start(run_copy, port, log, "--poll_s", "0.2")
        try:
            r = serve_process.http().post(f"{url}/sessions", timeout=300)
            assert r.status_code == 200, r.text
            pid = r.json()["pid"]
            assert serve_process.http().get(f"{url}/sessions/current").json()["state"] == "training"
        finally:
            server.send_signal(signal.SIGKILL)  # kill -9 of the server alone: the child has its own group
            server.wait(timeout=60)
        assert _alive(pid), "the child died with the server"
        deadline = time.monotonic() + 540
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _alive(pid)
        assert len(_results(run_copy)) == 2  # the child finished the session on its own
        with open(os.path.join(run_copy, "from_added", "child.log")) as f:
            assert f.read().strip().splitlines()[-1].startswith("gate: ")
        server = serve_process.start(run_copy, port, log, "--poll_s", "0.2")
        try:
            info = serve_process.http().get(f"{url}/info", timeout=60).json()
            verdict = gate.for_workdir(run_copy, 1, 0, gate.Thresholds())
            assert info["gate"] == json.loads(json.dumps(verdict))  # session 2 went through the gate at start
            assert info["model_session"] == (2 if verdict["decision"] == "switched" else 1)
            assert serve_process.http().get(f"{url}/healthz").json()["gallery_rows"] == len(Run(run_copy).rows)
        finally:
            serve_process.stop(server)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie left unreaped, its parent the killed server, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_learn_after_starts_the_session_once_n_labelled_images_are_pending(run_copy, tmp_path, caplog):
    served = Served(run_copy, poll_s=0, max_wait_s=0.02)
    client = TestClient(create_app(served, learn_after=3))
    photos = _photos(tmp_path / "photos", {"ant": 2, "bee": 2, "cat": 1})

    def add(path, label=None):
        with open(path, "rb") as f:
            r = client.post("/add", params={"label": label} if label else {}, files=[("file", (path, f.read()))])
        assert r.status_code == 200, r.text
        return r.json().get("session_started")

    assert add(photos["ant"][0], "ant") is False and add(photos["cat"][0]) is None  # 1 pending; unlabelled
    assert add(photos["bee"][0], "bee") is False  # 2 of 3
    assert add(photos["ant"][1], "ant") is False  # 3 added, but the lone bee waits: 2 to learn from
    assert "not started" not in caplog.text  # no session tried (and refused) while lone images are counted
    assert client.get("/sessions/current").json()["state"] == "idle"
    assert _gauges(client.get("/metrics").text) == _want_gauges({"state": "idle"})
    assert add(photos["bee"][1], "bee") is True
    current = client.get("/sessions/current").json()
    job = client.app.state.ctx.sessions
    try:
        assert current["state"] == "training"
        assert current["pid"] == job._child.pid
    finally:
        os.killpg(job._child.pid, signal.SIGKILL)  # the child this test started: its training is not the subject
        job._child.wait()
    _check_progress_states_and_gauges(client)
    served.close()


@pytest.mark.slow  # three sessions trained
def test_a_killed_session_resumes_to_the_uninterrupted_result(run_copy, tmp_path):
    _add(run_copy, _photos(tmp_path / "photos", {"ant": 5, "bee": 5, "cat": 4}))
    twin = str(tmp_path / "twin")
    shutil.copytree(run_copy, twin)
    assert update.update_from_added(twin) == 0  # uninterrupted
    cmd = [sys.executable, "-m", "cvs_jax.update", "--workdir", run_copy, "--from_added"]
    progress = paths.progress_dir(run_copy)
    kept = set(os.listdir(progress)) if os.path.isdir(progress) else set()  # session 1's last checkpoints
    child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while child.poll() is None and not (
        os.path.isdir(progress) and any(n.isdigit() and n not in kept for n in os.listdir(progress))
    ):
        time.sleep(0.01)
    child.kill()  # kill -9 once a checkpoint of the new session is on disk (not one session 1 left)
    child.wait()
    with open(paths.results_file(run_copy)) as f:
        assert len(json.load(f)["per_session"]) == 1  # killed mid-session, not after it
    folder = added_session.folder_of(run_copy, 2)
    assert list(added_session.run_config(run_copy).data.updates)[-1] == folder  # so the rerun is a resume
    before = _added_bytes(run_copy)
    assert update.update_from_added(run_copy) == 0  # resumes the same folder, same rows
    assert _added_bytes(run_copy) == before
    assert _results(run_copy) == _results(twin)
    a, b = Run(run_copy).gallery, Run(twin).gallery
    assert [p.embeddings.tobytes() for p in a.parts] == [p.embeddings.tobytes() for p in b.parts]
    assert os.listdir(os.path.join(run_copy, "from_added")) == ["session-2"]
