"""A run on a read-only disk, or owned by another user: the readers (info, search, search --html, export to a
writable folder, the server's searches) work on it as on the writable run; every command that would write into
it (update, search --add, main, the server's /add and POST /sessions) refuses in one line naming the folder,
before any work, and nothing anywhere changes.  The read-only disk is a real one (a read-only bind mount,
``cvs_jax.testing.disks``); the tests skip where the sandbox does not allow mounts."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from fastapi.testclient import TestClient

from cvs_jax import export as export_lib
from cvs_jax import info, search, update
from cvs_jax.engine import runner
from cvs_jax.errors import NotWritableError
from cvs_jax.serve.app import create_app
from cvs_jax.serve.state import Served
from cvs_jax.testing import disks, file_tree, image_folders

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished one-session photo run, its next folder and its config."""
    root = tmp_path_factory.mktemp("ro")
    run, second = image_folders.photo_run(root)
    return run, second, image_folders.folder_config(root, os.path.join(root, "s1"))


@pytest.fixture
def read_only(trained, tmp_path):
    """The run seen through a read-only mount."""
    with disks.or_skip(disks.read_only_view(trained[0], str(tmp_path / "ro")), "a read-only mount") as view:
        yield view


def _query(trained) -> str:
    folder = os.path.join(trained[1], "test", "dog")
    return os.path.join(folder, sorted(os.listdir(folder))[0])


def _hits(wd, query, capsys, **kw):
    capsys.readouterr()
    assert search.search_or_add(wd, [query], as_json=True, **kw) == 0, capsys.readouterr().err
    hits = json.loads(capsys.readouterr().out)
    for h in hits["queries"][0]["hits"] if isinstance(hits, dict) else hits[0]["hits"]:
        h.pop("source")  # named under the view's path
    return hits


def test_readers_work_on_a_read_only_run(trained, read_only, tmp_path, capsys):
    run, _, _ = trained
    query = _query(trained)
    assert _hits(read_only, query, capsys) == _hits(run, query, capsys)
    assert search.search_or_add(read_only, [query], html=str(tmp_path / "hits.html")) == 0
    assert os.path.getsize(tmp_path / "hits.html") > 0
    described = info.describe(read_only)
    assert described["gallery_rows"] == info.describe(run)["gallery_rows"] and described["model_problem"] is None
    export_lib.export(read_only, str(tmp_path / "exported"))
    export_lib.export(run, str(tmp_path / "exported-writable"))
    np.testing.assert_array_equal(
        np.load(tmp_path / "exported" / "embeddings.npy"), np.load(tmp_path / "exported-writable" / "embeddings.npy")
    )


def _one_line(capsys, folder: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {folder} is not writable (it is on a read-only file system)")
    return err[0]


def test_writers_refuse_a_read_only_run_in_one_line_before_any_work(trained, read_only, capsys):
    """update prepared the new folder's record store (seconds of work, a folder written in data_dir) before it
    stopped on the lock file; search --add named checkpoints/additions.lock, main the .lock file."""
    run, folder, config = trained
    before = file_tree.checksums(run)
    data_dir = config.data.data_dir
    stores_before = sorted(os.listdir(os.path.join(data_dir, "cvs_records")))
    capsys.readouterr()
    assert update.update(read_only, folder) == 2
    line = _one_line(capsys, read_only)
    assert "Copy the run to a writable folder (cp -r) or mount it read-write" in line
    assert sorted(os.listdir(os.path.join(data_dir, "cvs_records"))) == stores_before  # nothing prepared
    assert search.search_or_add(read_only, [_query(trained)], add=True, label="dog") == 2
    _one_line(capsys, read_only)
    with pytest.raises(NotWritableError, match=f"^{read_only} is not writable"):
        runner.run(config, read_only)
    assert file_tree.checksums(run) == before


def test_a_served_read_only_run_answers_searches_and_refuses_adds_with_a_403(trained, read_only):
    """/add answered 503 ("retry") for every add to a run that stays read-only; now one 403 saying so."""
    run, _, _ = trained
    before = file_tree.checksums(run)
    served = Served(read_only, poll_s=0, max_wait_s=0.02)
    try:
        client = TestClient(create_app(served))
        query = _query(trained)
        with open(query, "rb") as f:
            files = [("file", (os.path.basename(query), f.read()))]
        found = client.post("/search", files=files)
        assert found.status_code == 200 and found.json()["queries"][0]["hits"]
        added = client.post("/add", files=files, data={"label": "dog"})
        assert added.status_code == 403, added.text
        assert added.json()["error"].startswith("this server serves a read-only run (it is on a read-only file")
        assert read_only not in added.text  # no server path in an answer
        session = client.post("/sessions")
        assert session.status_code == 403 and "read-only run" in session.json()["error"]
        assert client.post("/search", files=files).status_code == 200
    finally:
        served.close()
    assert file_tree.checksums(run) == before


def test_update_of_another_user_s_run_refuses_in_one_line_before_preparing_anything(trained, tmp_path):
    """The run owned by another user (write permission denied, not a read-only disk): ``update`` as this
    user, in a process that cannot override permissions (root without its DAC capabilities)."""
    reason = disks.unavailable(setpriv=True)
    if reason is not None:
        pytest.skip(reason)
    run, folder, config = trained
    theirs = str(tmp_path / "theirs")
    shutil.copytree(run, theirs)
    for root, dirs, names in os.walk(theirs):
        for name in dirs + names:
            os.chown(os.path.join(root, name), 65534, 65534)
    os.chown(theirs, 65534, 65534)
    before = file_tree.checksums(theirs)
    stores_before = sorted(os.listdir(os.path.join(config.data.data_dir, "cvs_records")))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
    cmd = [*disks.AS_ANOTHER_USER, sys.executable, "-m", "cvs_jax.update", "--workdir", theirs, "--data", folder]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert done.returncode == 2, done
    assert done.stderr.splitlines() == [
        f"error: {theirs} is not writable (this user may not write into it): adding to a run or training it writes "
        "into it, while search, info, export and serve's searches read it as it is. Copy the run to a writable "
        "folder (cp -r) or give this user write access to it, then rerun."
    ], done.stderr
    assert "Preparing" not in done.stdout
    assert sorted(os.listdir(os.path.join(config.data.data_dir, "cvs_records"))) == stores_before
    assert file_tree.checksums(theirs) == before
