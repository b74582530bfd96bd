"""A fixed d-simplex head is refused where it cannot hold the run's classes, before anything is written.

* ``main`` with ``model.embed_dim`` < K - 1: one ``error:`` line naming the width it needs, exit 2, no
  workdir;
* ``update`` with a folder that brings a class past the simplex's K rows: one line, exit 2, every file
  of the run as it was; a folder of known classes trains its session on the same simplex."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from cvs_jax import update
from cvs_jax.engine import runner
from cvs_jax.testing import image_folders as photo_folders
from cvs_jax.testing.file_tree import checksums
from cvs_jax.testing.methods_runs import REPO


def test_main_refuses_a_simplex_wider_than_the_embedding(tmp_path):
    workdir = str(tmp_path / "run")
    done = subprocess.run(
        [sys.executable, "-m", "cvs_jax.main", "--config", "configs/fashion_mnist_general.py", "--workdir", workdir]
        + ["--config.method=hoc", "--config.model.embed_dim=6"],  # 10 classes: 9 dimensions needed
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: model.embed_dim=6 is too narrow"), done.stderr
    assert "--config.model.embed_dim=9" in lines[0]
    assert not os.path.exists(workdir)


def test_update_refuses_classes_past_the_simplex_and_takes_known_ones(tmp_path, capsys):
    first = photo_folders.write_folder(tmp_path / "s1", {"ant": 16, "bee": 16, "cat": 16}, 3, seed=0)
    c = photo_folders.folder_config(tmp_path, first)
    c.method, c.model.head, c.model.head_block = "cl2r", "official", 0  # the simplex, K = the 3 classes
    workdir = str(tmp_path / "run")
    runner.run(c, workdir)
    before = checksums(workdir)
    grown = photo_folders.write_folder(tmp_path / "s2", {"dog": 16, "ant": 8}, 3, seed=1)
    capsys.readouterr()
    assert update.update(workdir, grown) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "brings the run to 4 head rows, but its fixed d-simplex head holds 3" in err[0], err
    assert checksums(workdir) == before
    known = photo_folders.write_folder(tmp_path / "s3", {"ant": 8, "bee": 8}, 3, seed=2)
    assert update.update(workdir, known) == 0
    with open(os.path.join(workdir, "results.json")) as f:
        assert len(json.load(f)["per_session"]) == 2
