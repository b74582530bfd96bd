"""A run on a frozen pretrained trunk stores only what trains: no checkpoint holds the trunk's leaves
(they are read from the weight file, whose SHA-256 the checkpoints record), the run resumes and
searches with the file's trunk, and a weight file with other bytes is refused with one error line."""

from __future__ import annotations

import os
import shutil

import numpy as np
import orbax.checkpoint as ocp
import pytest
from etils import epath
from safetensors.numpy import load_file, save_file

from cvs_jax import info
from cvs_jax.engine import runner
from cvs_jax.errors import CheckpointError, WeightsError
from cvs_jax.models import networks as models
from cvs_jax.models.frozen_trunk import FrozenTrunk, file_digest
from cvs_jax.retrieval import run_reader
from cvs_jax.rundir import paths
from cvs_jax.rundir.checkpoint import _leaves  # pylint: disable=protected-access
from cvs_jax.testing import image_folders as photo_folders

VIT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "backbones", "vit_patch16.safetensors")


def _stored_paths(step_dir: str, item: str) -> list[str]:
    handler = ocp.StandardCheckpointHandler()
    try:
        meta = handler.metadata(epath.Path(step_dir) / item)
    finally:
        handler.close()
    return list(_leaves(getattr(meta, "tree", meta)))


def _tree_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("frozen")
    folder = photo_folders.write_folder(tmp / "s1", {"ant": 8, "bee": 8}, 2, seed=0)
    weights = str(tmp / "vit.safetensors")
    shutil.copy(VIT, weights)
    c = photo_folders.folder_config(tmp, folder)
    c.model.name, c.model.pretrained, c.model.train_blocks = "vit", weights, "1"
    c.data.stored_size, c.augment.size, c.train.epochs = 32, 32, 2
    workdir = str(tmp / "run")
    runner.run(c, workdir)
    return c, workdir


def test_no_checkpoint_holds_the_frozen_trunk(run):
    c, workdir = run
    trunk = FrozenTrunk.of(c)
    assert "blocks_0" in trunk.names and "blocks_1" not in trunk.names  # train_blocks=1 of 2
    checked = 0
    for sub, items in ((paths.sessions_dir(workdir), ("variables",)), (paths.progress_dir(workdir), ("state", "best"))):
        for step in (d for d in os.listdir(sub) if d.isdigit()):
            for item in items:
                stored = _stored_paths(os.path.join(sub, step), item)
                net = [p.split("/")[p.split("/").index("net") + 1] for p in stored if "/net/" in f"/{p}"]
                assert net and not set(net) & set(trunk.names), (sub, step, item, sorted(set(net)))
                checked += 1
    assert checked >= 3


def test_search_uses_the_files_trunk_and_finds_its_rows(run):
    c, workdir = run
    got = run_reader.Run(workdir)
    want = models.load_pretrained(models.from_config(c), c.model.pretrained, models.input_shape(c, (32, 32, 3)))
    for name in set(FrozenTrunk.of(c).names) & set(want["params"]):
        for a, b in zip(
            np.asarray(list(_leaves(got.variables["params"]["net"][name]).values()), dtype=object),
            _leaves(want["params"][name]).values(),
        ):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    path = os.path.join(c.data.manual_dir, "train", "ant", "0 img 0.png")
    top = got.search(run_reader.prepare([path], got.image_shape), 1)[0][0]
    assert top["source"] == path and top["score"] > 0.99, top


def test_a_weight_file_with_other_bytes_is_refused(run, tmp_path):
    c, workdir = run
    copy = str(tmp_path / "run")
    shutil.copytree(workdir, copy)
    weights = load_file(c.model.pretrained)
    key = sorted(weights)[0]
    weights[key] = (weights[key].astype(np.float32) + 1e-2).astype(weights[key].dtype)
    other = str(tmp_path / "other.safetensors")
    save_file(weights, other)
    assert file_digest(other) != file_digest(c.model.pretrained)
    c2 = c.copy_and_resolve_references()
    c2.model.pretrained = other
    with pytest.raises(CheckpointError, match="SHA-256.*pass the weight file the run was made with"):
        run_reader.Run(_with_weights(copy, other)).variables
    before = _tree_bytes(os.path.join(copy, "checkpoints"))
    with pytest.raises(CheckpointError, match="SHA-256"):
        runner.run(c2, copy)
    assert _tree_bytes(os.path.join(copy, "checkpoints")) == before


def test_without_the_weight_file_info_reads_the_run_and_search_says_what_is_missing(run, tmp_path):
    _, workdir = run
    copy = _with_weights(str(shutil.copytree(workdir, tmp_path / "run")), str(tmp_path / "gone.safetensors"))
    assert info.describe(copy)["gallery_rows"] > 0  # the gallery needs no network
    with pytest.raises(WeightsError, match="gone.safetensors is missing.*put the weight file back"):
        run_reader.Run(copy).variables


def _with_weights(workdir: str, weights: str) -> str:
    """``workdir`` whose config.json names another weight file (as a user who swapped the file)."""
    import json

    path = paths.config_file(workdir)
    with open(path) as f:
        config = json.load(f)
    config["model"]["pretrained"] = weights
    with open(path, "w") as f:
        json.dump(config, f)
    return workdir
