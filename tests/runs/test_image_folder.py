"""Your own images: the image_folder builder, live sessions with `update`, and their equivalence to one
run whose sessions come from a manifest."""

from __future__ import annotations

import collections
import csv
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from cvs_jax import update
from cvs_jax.data import folder_inventory, records, sources
from cvs_jax.data.builders import resize
from cvs_jax.engine import runner
from cvs_jax.errors import ConfigError, DataError
from cvs_jax.retrieval import run_reader
from cvs_jax.rundir import paths
from cvs_jax.testing.image_folders import SESSIONS, folder_config, write_folder

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("photos")
    return [write_folder(root / f"s{i + 1}", classes, 4, seed=i) for i, classes in enumerate(SESSIONS)]


def test_builder_stores_every_format_at_the_stored_size(folders, tmp_path):
    with open(os.path.join(folders[0], "train", "ant", "notes.txt"), "w") as f:
        f.write("not an image")
    ds = sources.load_dataset(
        "image_folder",
        data_dir=str(tmp_path),
        manual_dir=folders[0],
        options={"stored_size": 16, "test_fraction": 0.2, "test_seed": 0},
    )
    os.remove(os.path.join(folders[0], "train", "ant", "notes.txt"))
    assert ds.class_names == ("ant", "bee", "cat") and ds.image_shape == (16, 16, 3)
    assert len(ds.train) == 72 and len(ds.test) == 12
    assert records.read_info(ds.store)["metadata"]["ignored"] == {"not an image": 1}
    paths = ds.source_names("train")
    assert all(os.path.isfile(p) for p in paths) and {os.path.splitext(p)[1] for p in paths} == {
        ".png",
        ".jpg",
        ".webp",
        ".bmp",
    }
    for j in (0, 1, 2, 3):  # stored = the resize rule, then one JPEG encode (lossless for nothing else)
        with Image.open(paths[j]) as im:
            want = resize.to_square_uint8(im, 16)
        stored = records.decode(records.encode(records.Example(want, 0, ""), "jpeg"), want.shape)
        np.testing.assert_array_equal(ds.train.images[j], stored)


def test_image_folder_refusals(tmp_path):
    c = folder_config(tmp_path, tmp_path / "missing")
    with pytest.raises(ConfigError, match="manual_dir"):
        c.data.manual_dir = None
        from cvs_jax.engine import config_checks

        config_checks.check(c, num_devices=1)
    empty = tmp_path / "empty" / "ant"
    empty.mkdir(parents=True)
    with pytest.raises(DataError, match="holds no image"):
        sources.load_dataset("image_folder", data_dir=str(tmp_path), manual_dir=str(empty.parent))


def _manifest(folders, path):
    """One manifest naming the same files with their split and session."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "label", "split", "session"])
        for s, folder in enumerate(folders):
            for split in ("train", "test"):
                for name in sorted(os.listdir(os.path.join(folder, split))):
                    for file in sorted(os.listdir(os.path.join(folder, split, name))):
                        w.writerow([os.path.join(folder, split, name, file), name, split, s + 1])
    return str(path)


def _outcome(workdir):
    with open(os.path.join(workdir, "results.json")) as f:
        res = json.load(f)
    for r in res["per_session"]:
        r.pop("seconds")
    run = run_reader.Run(workdir)
    return res["per_session"], np.asarray(run.gallery.embeddings), run, res


def _count_scans(monkeypatch) -> collections.Counter:
    """How many times each folder is scanned from now on (``folder_inventory._scan`` counted)."""
    scanned: collections.Counter = collections.Counter()
    real = folder_inventory._scan  # pylint: disable=protected-access
    monkeypatch.setattr(folder_inventory, "_scan", lambda s, *a: scanned.update([s]) or real(s, *a))
    return scanned


def test_main_then_two_updates_equal_one_manifest_run(folders, tmp_path, monkeypatch, capsys):
    live = str(tmp_path / "live")
    first = folder_config(tmp_path, folders[0])
    first.pictures = False  # compared by results and rows (updates keep it: the stored config's)
    scanned = _count_scans(monkeypatch)  # a run and an update scan each folder once (folder_inventory.scans_held)
    runner.run(first, live)
    assert scanned == {folders[0]: 1}, scanned
    assert update.update(live, folders[1]) == 0
    assert scanned == {folders[0]: 2, folders[1]: 1}, scanned
    # the second update is killed mid-training (like kill -9) and rerun: it resumes exactly
    env = dict(os.environ, CVS_JAX_FAULT="step:3")
    cmd = [sys.executable, "-m", "cvs_jax.update", "--workdir", live, "--data", folders[2]]
    killed = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert killed.returncode == -9, killed.stderr[-2000:]
    capsys.readouterr()
    assert update.update(live, folders[2]) == 0
    # the two earlier models' counts were read, as the first update stored them (engine.compat_counts)
    said = capsys.readouterr().out.split("compatibility: ")[1].split("\n")[0]
    assert "x 3 models; " in said and "the counts of 2 models read" in said, said

    ref = str(tmp_path / "ref")
    manifest = folder_config(tmp_path, _manifest(folders, tmp_path / "manifest.csv"))
    manifest.pictures = False
    runner.run(manifest, ref)
    got, want = _outcome(live), _outcome(ref)
    assert len(got[0]) == 3
    assert got[0] == want[0]
    np.testing.assert_array_equal(got[1], want[1])
    assert got[2].protocol["class_names"] == want[2].protocol["class_names"]
    # the updates' compatibility counts, read from the earlier finishes and added to, are the ones counted from
    # scratch (engine.compat_counts)
    for key in ("compatibility_recall1", "negative_flip_rate"):
        assert got[3][key] == want[3][key], key
    assert os.path.exists(paths.compat_counts_file(live))

    # search shows the files the gallery rows came from
    hits = got[2].search(
        run_reader.prepare([os.path.join(folders[2], "test", "fox", "2 img 0.png")], got[2].image_shape), 3
    )
    for h in hits[0]:
        assert os.path.isfile(h["source"])

    # feeding a folder again, or a copy of it, is refused: no gallery row is duplicated
    assert update.update(live, folders[1]) == 2
    copy = shutil.copytree(folders[1], tmp_path / "copy")
    with pytest.raises(DataError, match="already in the run"):
        update.plan_update(live, str(copy))
    # the original command on an updated run is refused with the way forward
    with pytest.raises(ConfigError, match="cvs_jax.update"):
        runner.run(folder_config(tmp_path, folders[0]), live)


def test_a_comparison_scans_its_photo_folder_once(folders, tmp_path, monkeypatch):
    """``run_comparison`` checks every entry's config and plan, then runs them: one scan of the folder for all
    (``folder_inventory.scans_held``); the runs are replaced by two more reads of it."""
    scanned = _count_scans(monkeypatch)

    def runs_that_read_the_folder(config, *args, **kwargs):
        for _ in range(2):
            sources.load_run_dataset(sources.streamed(config).data)
        return []

    monkeypatch.setattr(runner, "_compare", runs_that_read_the_folder)
    runner.run_comparison(folder_config(tmp_path, folders[0]), str(tmp_path / "cmp"), ["finetune", "cvs"], [0])
    assert scanned == {folders[0]: 1}, scanned
