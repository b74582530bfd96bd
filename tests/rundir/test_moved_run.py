"""A run moved or copied elsewhere (``mv``, ``cp -r``, rsync): its own from-added folders, recorded in
``config.json`` by absolute path, are read where the run is now; a user's folder outside it is as
recorded.  Hand-made records (a config.json, ``rows.json`` files): no training, no JAX."""

import json
import os
import shutil

import pytest

from cvs_jax.config import defaults, recorded
from cvs_jax.errors import DataError
from cvs_jax.retrieval import added_session
from cvs_jax.rundir import paths


def _run(wd, updates: list[str], rows: dict[int, list[list[int]]]) -> None:
    """A run's config.json with ``data.updates`` and its from_added folders' ``rows.json`` (session -> ranges)."""
    os.makedirs(wd)
    config = defaults.get_config()
    config.data.updates = updates
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
