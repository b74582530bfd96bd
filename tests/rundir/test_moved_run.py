"""A run moved or copied elsewhere (``mv``, ``cp -r``, rsync): its own from-added folders, recorded in
``config.json`` by absolute path, are read where the run is now; a user's folder outside it is as
recorded.  Hand-made records (a config.json, ``rows.json`` files): no training, no JAX."""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from cvs_jax import search, update
from cvs_jax.config import defaults, recorded
from cvs_jax.errors import DataError
from cvs_jax.retrieval import added_session
from cvs_jax.rundir import paths
from cvs_jax.testing import image_folders


def _run(wd, updates: list[str], rows: dict[int, list[list[int]]], **data) -> None:
    """A run's config.json with ``data.updates`` (and ``data`` fields) and its from_added folders' ``rows.json``
    (session -> ranges)."""
    os.makedirs(wd)
    config = defaults.get_config()
    config.data.updates = updates
    config.data.update(data)
    with open(paths.config_file(wd), "w") as f:
        json.dump(config.to_dict(), f)
    for s, ranges in rows.items():
        folder = added_session.folder_of(wd, s)
        os.makedirs(os.path.join(folder, "ant"))
        with open(os.path.join(folder, added_session.ROWS_FILE), "w") as f:
            json.dump({"first": ranges[0][0], "end": ranges[-1][1], "rows": ranges}, f)


def _updates(wd) -> list[str]:
    return list(added_session.run_config(wd).data.updates)


@pytest.mark.parametrize("how", ["mv", "cp"])
def test_a_moved_or_copied_run_counts_the_added_rows_its_sessions_used(tmp_path, how):
    old, new = str(tmp_path / "W"), str(tmp_path / "disk" / "W")
    photos = str(tmp_path / "photos" / "day2")  # a user's folder, outside the run
    _run(old, [photos, added_session.folder_of(old, 3), added_session.folder_of(old, 5)], {3: [[0, 6]], 5: [[7, 9]]})
    assert added_session.used_rows(old, _updates(old)) == {0, 1, 2, 3, 4, 5, 7, 8}
    (shutil.move if how == "mv" else shutil.copytree)(old, new)  # cp -r: the original is still there
    updates = _updates(new)
    assert updates == [photos, added_session.folder_of(new, 3), added_session.folder_of(new, 5)]
    # before: the copy counted none (they lay under the old workdir), and offered rows 0-5 and 7-8 again
    assert added_session.used_rows(new, updates) == {0, 1, 2, 3, 4, 5, 7, 8}
    if how == "cp":
        assert _updates(old)[1:] == [added_session.folder_of(old, 3), added_session.folder_of(old, 5)]


def test_another_runs_from_added_folder_given_as_data_stays_as_recorded(tmp_path):
    other = str(tmp_path / "other")
    _run(other, [], {2: [[0, 4]]})
    mine = str(tmp_path / "mine")
    _run(mine, [added_session.folder_of(other, 2)], {2: [[10, 12]]})  # update --data other/from_added/session-2
    assert _updates(mine) == [added_session.folder_of(other, 2)]
    assert added_session.used_rows(mine, _updates(mine)) == set()


def test_resuming_a_moved_run_records_where_its_folders_are_now(tmp_path):
    old, new = str(tmp_path / "W"), str(tmp_path / "disk" / "W")
    _run(old, [added_session.folder_of(old, 2)], {2: [[0, 3]]})
    shutil.move(old, new)
    config = recorded.continued_config(new)  # what update --from_added resumes with
    recorded.prepare(config, new)  # the same run: accepted, and config.json now names the folder here
    with open(paths.config_file(new)) as f:
        assert json.load(f)["data"]["updates"] == [added_session.folder_of(new, 2)]


def test_a_session_from_adds_whose_images_moved_is_refused_naming_one(tmp_path):
    wd = str(tmp_path / "W")
    os.makedirs(wd)
    there = str(tmp_path / "photos" / "ant.png")
    os.makedirs(os.path.dirname(there))
    with open(there, "wb") as f:
        f.write(b"x")
    gone = str(tmp_path / "moved-away" / "bee.png")
    with pytest.raises(DataError, match="no longer where they were added, e.g. .*bee.png"):
        added_session.make_folder(wd, 2, [0, 1], [("ant", there), ("bee", gone)])
    assert os.listdir(wd) == []  # nothing made


def test_update_on_a_run_whose_first_folder_and_stores_are_gone_names_the_folder(tmp_path):
    wd, gone = str(tmp_path / "W"), str(tmp_path / "photos" / "day1")
    _run(wd, [], {}, name="image_folder", manual_dir=gone, data_dir=str(tmp_path / "data"))
    # before: the builder's "set --config.data.manual_dir", a flag update does not take
    with pytest.raises(
        DataError, match=f"learnt from {gone} \\(data.manual_dir\\), which is gone.*put the folder back"
    ):
        update.writable_config(wd)
    os.makedirs(gone)
    assert update.writable_config(wd).data.manual_dir == gone


def _results(wd) -> list[dict]:
    """results.json's sessions, but for their wall time."""
    with open(paths.results_file(wd)) as f:
        return [{k: v for k, v in s.items() if k != "seconds"} for s in json.load(f)["per_session"]]


def _rows(wd, s: int) -> dict:
    with open(os.path.join(added_session.folder_of(wd, s), added_session.ROWS_FILE)) as f:
        return json.load(f)


@pytest.mark.slow  # three sessions trained twice
def test_a_session_from_adds_killed_then_copied_resumes_to_the_unmoved_result(tmp_path):
    run, _ = image_folders.photo_run(tmp_path)
    photos = image_folders.new_photos(tmp_path / "photos", {"ant": 3, "gnu": 3})
    more = image_folders.new_photos(tmp_path / "more", {"bee": 3, "hen": 3}, seed=5000)

    def add(wd, batch):
        for name, files in batch.items():
            assert search.search_or_add(wd, files, add=True, label=name) == 0

    add(run, photos)
    twin = str(tmp_path / "twin")
    shutil.copytree(run, twin)  # unmoved: trained where it is, uninterrupted
    assert update.update_from_added(twin) == 0
    add(twin, more)
    assert update.update_from_added(twin) == 0
    child = subprocess.Popen(
        [sys.executable, "-m", "cvs_jax.update", "--workdir", run, "--from_added"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    progress = paths.progress_dir(run)
    before = set(os.listdir(progress))  # session 1's last progress checkpoints are kept

    while child.poll() is None and not {n for n in os.listdir(progress) if n.isdigit()} - before:
        time.sleep(0.01)
    child.kill()  # kill -9 once a mid-session checkpoint is on disk (the process this test started)
    child.wait()
    assert len(_results(run)) == 1  # killed mid-session, its folder recorded:
    assert _updates(run) == [added_session.folder_of(run, 2)]
    copy = str(tmp_path / "disk" / "W")
    shutil.copytree(run, copy)  # cp -r, then the original is deleted
    shutil.rmtree(run)
    assert update.update_from_added(copy) == 0  # before: refused, its rows taken for forced duplicates
    add(copy, more)
    assert update.update_from_added(copy) == 0
    assert _results(copy) == _results(twin)
    assert (
        [_rows(copy, s) for s in (2, 3)]
        == [_rows(twin, s) for s in (2, 3)]
        == [
            {"first": 0, "end": 6, "rows": [[0, 6]]},
            {"first": 6, "end": 12, "rows": [[6, 12]]},
        ]
    )
