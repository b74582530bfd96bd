"""A run on a disk that fills up (a real small tmpfs, ``cvs_jax.testing.disks``; skipped where the sandbox forbids
mounts): an add that meets "no space left" acknowledges nothing (exit 2 / HTTP 503, one line saying the disk is
full), the rows added before stay readable and the store takes the same add once space is freed; a server
keeps answering searches; an ``update`` that fills the disk while checkpointing stops in one line and, rerun
once space is freed, ends with the results of an uninterrupted update."""

import os
import shutil
import subprocess
import sys

import pytest
from fastapi.testclient import TestClient

from cvs_jax import search, update
from cvs_jax.retrieval import run_reader
from cvs_jax.serve.app import create_app
from cvs_jax.serve.state import Served
from cvs_jax.testing import disks, image_folders, methods_runs

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# free space left for an add: the lock file's page fits, an additions step (a dozen files) does not
ADD_LEAVES = 8192


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished one-session photo run, its next folder, and new photos to add."""
    root = tmp_path_factory.mktemp("full")
    run, second = image_folders.photo_run(root)
    photos = image_folders.new_photos(root / "photos", {"ant": 2, "gnu": 2})
    return run, second, photos


@pytest.fixture
def small_disk(trained, tmp_path):
    """A copy of the run on a 16 MB tmpfs of its own."""
    with disks.or_skip(disks.small_disk(str(tmp_path / "disk"), "16m"), "a tmpfs mount") as disk:
        wd = os.path.join(disk, "run")
        shutil.copytree(trained[0], wd)
        yield disk, wd


def _added(wd) -> list[str]:
    return list(run_reader.Run(wd).added_sources)


@pytest.mark.parametrize("leave", [0, ADD_LEAVES], ids=["full", "room-for-the-lock-only"])
def test_search_add_on_a_full_disk_adds_nothing_and_the_store_takes_it_once_space_is_freed(
    trained, small_disk, capsys, leave
):
    """Was a traceback (exit 1: tensorstore's RESOURCE_EXHAUSTED is no OSError) once the lock was written, or
    "cannot write a file" when the lock could not be."""
    disk, wd = small_disk
    photos = trained[2]
    assert search.search_or_add(wd, photos["ant"], add=True, label="ant") == 0
    filler = disks.fill(disk, leave=leave)
    capsys.readouterr()
    assert search.search_or_add(wd, photos["gnu"], add=True, label="gnu") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: cannot write {wd}") and "(no space left on its disk)" in err[0]
    assert _added(wd) == photos["ant"]  # the rows added before, readable on the full disk
    os.remove(filler)
    assert search.search_or_add(wd, photos["gnu"], add=True, label="gnu") == 0
    assert _added(wd) == photos["ant"] + photos["gnu"]


_files = image_folders.uploads


def test_a_server_s_add_on_a_full_disk_is_a_503_and_it_keeps_searching(trained, small_disk):
    """Was a 500 (tensorstore's RESOURCE_EXHAUSTED is no OSError)."""
    disk, wd = small_disk
    photos = trained[2]
    served = Served(wd, poll_s=0, max_wait_s=0.02)
    try:
        client = TestClient(create_app(served))
        assert client.post("/add", files=_files(photos["ant"]), data={"label": "ant"}).status_code == 200
        filler = disks.fill(disk, leave=ADD_LEAVES)
        refused = client.post("/add", files=_files(photos["gnu"]), data={"label": "gnu"})
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"].startswith("the server cannot write to its workdir (no space left on its disk)")
        found = client.post("/search", files=_files(photos["gnu"][:1]))
        assert found.status_code == 200 and found.json()["queries"][0]["hits"]
        assert client.get("/info").json()["added_rows"] == len(photos["ant"])
        os.remove(filler)
        again = client.post("/add", files=_files(photos["gnu"]), data={"label": "gnu"})
        assert again.status_code == 200, again.text
        assert client.get("/info").json()["added_rows"] == len(photos["ant"]) + len(photos["gnu"])
    finally:
        served.close()
    assert len(_added(wd)) == len(photos["ant"]) + len(photos["gnu"])


def test_an_update_that_fills_the_disk_stops_in_one_line_and_resumes_to_the_uninterrupted_result(
    trained, small_disk, tmp_path
):
    """The session's checkpoints fill the disk: was the error line under ~400 lines of orbax's logs and
    tracebacks (its background threads' failures, which it also raises to the waiter)."""
    disk, wd = small_disk
    run, folder, _ = trained
    uninterrupted = str(tmp_path / "uninterrupted")
    shutil.copytree(run, uninterrupted)
    assert update.update(uninterrupted, folder) == 0
    filler = disks.fill(disk, leave=400_000)  # less than one session's checkpoints
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "cvs_jax.update", "--workdir", wd, "--data", folder]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert done.returncode == 2, done
    (line,) = done.stderr.splitlines()
    # the checkpoint's folder, or tensorboard/ or metrics.jsonl when the disk fills there (the closing run
    # flushes TensorBoard last): was "cannot write a file" for those
    assert line.startswith(f"error: cannot write {wd}{os.sep}") and "(no space left on its disk)" in line
    os.remove(filler)
    assert update.update(wd, folder) == 0
    assert methods_runs.outcome(wd) == methods_runs.outcome(uninterrupted)
