"""``update --from_added``: the next session from the labelled images added to a run, trained as
``update --data`` trains on a folder of the same images; the added rows' embeddings untouched."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from fastapi.testclient import TestClient

from cvs_jax import search, update
from cvs_jax.retrieval import additions, gate
from cvs_jax.retrieval.run_reader import ADDED_BASE, Run
from cvs_jax.rundir import paths
from cvs_jax.serve.app import create_app
from cvs_jax.serve.state import Served
from cvs_jax.testing.image_folders import new_photo


def _photos(folder, counts: dict[str, int], seed: int = 100) -> dict[str, list[str]]:
    """New photos (bytes in no run) as ``folder/<class>/<class>-<i>.png``."""
    out = {}
    for name, n in counts.items():
        os.makedirs(folder / name, exist_ok=True)
        out[name] = [new_photo(folder / name / f"{name}-{i}.png", name, seed=seed + 10 * i) for i in range(n)]
        seed += 1000
    return out


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
    photos = _photos(tmp_path / "photos", {"ant": 5, "bee": 5, "cat": 4})
    _add(run_copy, photos)
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
    # the rows are used once: nothing new since, so the next request is refused and changes nothing
    state = _state(run_copy)
    capsys.readouterr()
    assert update.update_from_added(run_copy) == 2
    assert capsys.readouterr().err.count("error:") == 1
    assert _state(run_copy) == state


@pytest.mark.parametrize("case", ["nothing", "unlabelled", "one_image"])
def test_refusals_change_nothing(run_copy, tmp_path, capsys, case):
    if case == "unlabelled":
        _add(run_copy, _photos(tmp_path / "p", {"ant": 3}), labelled=False)
    elif case == "one_image":
        _add(run_copy, _photos(tmp_path / "p", {"ant": 3, "bee": 1}))
    state = _state(run_copy)
    capsys.readouterr()
    assert update.update_from_added(run_copy) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:")
    want = {"nothing": "no image was added", "unlabelled": "have no label", "one_image": "class 'bee' has 1 image"}
    assert want[case] in err[0]
    assert _state(run_copy) == state and not os.path.exists(os.path.join(run_copy, "from_added", "session-2"))


def test_search_add_takes_a_new_class_name_and_refuses_names_that_cannot_be_one(run_copy, tmp_path, capsys):
    photos = _photos(tmp_path / "p", {"dog": 2})
    for bad, why in [("Ant", "but 'ant' is"), ("7", "not a number"), ("train", "cannot name"), (".x", "cannot name")]:
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


def _search(client, path, **params) -> list[dict]:
    with open(path, "rb") as f:
        r = client.post("/search", params=params, files=[("file", ("q.png", f.read()))])
    assert r.status_code == 200, r.text
    return r.json()["queries"][0]["hits"]


def _added_names(run: Run) -> list[str]:
    """The class name each added row shows (``describe``), in the order added."""
    n = len(run.gallery)
    return [run.describe(n + i)["class_name"] for i in range(len(run.added_sources))]


def test_post_sessions_trains_beside_serving_and_the_new_model_is_served(run_copy, tmp_path):
    served = Served(run_copy, poll_s=0, max_wait_s=0.02, thresholds=gate.Thresholds(off=True))
    client = TestClient(create_app(served, token="t"))
    auth = {"authorization": "Bearer t"}
    state = _state(run_copy)
    r = client.post("/sessions", headers=auth)  # nothing added yet: one line, nothing changed, no child
    assert r.status_code == 400 and "no image was added" in r.json()["error"], r.text
    assert _state(run_copy) == state and client.get("/sessions/current").json() == {"state": "idle"}
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
    answered, failed, deadline = 0, 0, time.monotonic() + 400
    while client.get("/sessions/current").json()["state"] == "training" and time.monotonic() < deadline:
        r = client.post("/search", params={"k": 3}, files=[("file", ("q.png", body))])
        answered, failed = answered + 1, failed + (r.status_code != 200)
        time.sleep(0.2)
    current = client.get("/sessions/current").json()
    assert current["state"] == "done", current
    assert current["epoch"] == current["epochs"] and current["loss"] is not None
    assert answered > 0 and failed == 0
    served.poll()  # the server's switch path (the watcher's poll) takes the new session
    r = client.post("/search", params={"k": 3}, files=[("file", ("q.png", body))]).json()
    assert r["model_session"] == 2 and served.model_session == 2
    assert _added_bytes(run_copy) == before
    # the session learnt eel and dog as classes of the run; every row keeps its name across the switch
    with open(paths.protocol_file(run_copy)) as f:
        names = json.load(f)["class_names"]
    assert names[:3] == ["ant", "bee", "cat"] and sorted(names[3:]) == ["dog", "eel"]
    assert served.run.class_names == names and _added_names(served.run) == added
    part = served.run.gallery.parts[-1]  # the session's rows, labelled by the protocol
    assert part.session == 1 and {names[i] for i in part.labels.tolist()} <= {"eel", "dog", "bee"}
    hits = _search(client, photos["bee"][0], k=40, label="eel")
    assert {h["class_name"] for h in hits} == {"eel"} and {h["label"] for h in hits} == {names.index("eel")}
    assert any(h["id"] >= ADDED_BASE for h in hits) and any(h["id"] < ADDED_BASE for h in hits)
    served.close()


def test_learn_after_starts_the_session_once_n_labelled_images_are_pending(run_copy, tmp_path):
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
    assert add(photos["ant"][1], "ant") is False  # 3, but bee has one image: refused, waits for more
    assert client.get("/sessions/current").json() == {"state": "idle"}
    assert add(photos["bee"][1], "bee") is True
    current = client.get("/sessions/current").json()
    job = client.app.state.ctx.sessions
    try:
        assert current["state"] == "training"
        assert current["pid"] == job._child.pid
    finally:
        os.killpg(job._child.pid, signal.SIGKILL)  # the child this test started: its training is not the subject
        job._child.wait()
    served.close()


@pytest.mark.slow  # three sessions trained
def test_a_killed_session_resumes_to_the_uninterrupted_result(run_copy, tmp_path):
    _add(run_copy, _photos(tmp_path / "photos", {"ant": 5, "bee": 5, "cat": 4}))
    twin = str(tmp_path / "twin")
    shutil.copytree(run_copy, twin)
    assert update.update_from_added(twin) == 0  # uninterrupted
    cmd = [sys.executable, "-m", "cvs_jax.update", "--workdir", run_copy, "--from_added"]
    child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    progress = paths.progress_dir(run_copy)
    while child.poll() is None and not (os.path.isdir(progress) and any(n.isdigit() for n in os.listdir(progress))):
        time.sleep(0.01)
    child.kill()  # kill -9 once a mid-session checkpoint is on disk
    child.wait()
    with open(paths.results_file(run_copy)) as f:
        assert len(json.load(f)["per_session"]) == 1  # killed mid-session, not after it
    before = _added_bytes(run_copy)
    assert update.update_from_added(run_copy) == 0  # resumes the same folder, same rows
    assert _added_bytes(run_copy) == before
    assert _results(run_copy) == _results(twin)
    a, b = Run(run_copy).gallery, Run(twin).gallery
    assert [p.embeddings.tobytes() for p in a.parts] == [p.embeddings.tobytes() for p in b.parts]
    assert os.listdir(os.path.join(run_copy, "from_added")) == ["session-2"]
