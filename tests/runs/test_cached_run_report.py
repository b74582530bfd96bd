"""The page of a run that trains on cached trunk features shows its photos, not the features."""

from __future__ import annotations

import os

import numpy as np

from cvs_jax.config.stored import stored_config
from cvs_jax.engine import features, runner
from cvs_jax.reports import html, run_page
from cvs_jax.retrieval import run_rows
from cvs_jax.testing import image_folders as photo_folders

VIT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "backbones", "vit_patch16.safetensors")


def test_cached_feature_run_report_shows_the_photos(tmp_path):
    folder = photo_folders.write_folder(tmp_path / "s1", {"ant": 8, "bee": 8}, 2, seed=0)
    c = photo_folders.folder_config(tmp_path, folder)
    c.model.name, c.model.pretrained, c.model.train_blocks = "vit", VIT, "1"
    c.data.stored_size, c.augment.size = 32, 32
    assert features.cached(c)
    workdir = str(tmp_path / "run")
    runner.run(c, workdir)
    with open(os.path.join(workdir, "report.html")) as f:
        page = f.read()
    last, rows = run_page.stored_rows(workdir)
    photos = run_rows.train_split(stored_config(workdir))
    ids = rows.source_ids[rows.source_ids >= 0][:4]
    shown = [html.thumbnail_uri(im) for im in photos.read(np.asarray(ids, np.int64))]
    assert sum(uri in page for uri in shown) >= 2, "the gallery samples are not the run's photos"
