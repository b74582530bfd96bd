"""The methods published since CVS on a user's photo folders: a run started with ``main`` and one
``update``, with a Procrustes query map.

For each method: both sessions are in ``results.json``; the update fitted and stored the map of model 2
to model 1; ``search`` scores a day-1 photo against day-1 rows through that map and against day-2 rows
without it (checked by hand from the stored map and rows); ``info`` names the map.  The simplex methods
keep their fixed head (K = ``model.head_block`` rows, never trained) across the update.  Two methods run
by default (cl2r: simplex head and random memory; lce: class centres from the stored rows); the rest are
slow-marked (each run costs about a minute here).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from cvs_jax import info, search, update
from cvs_jax.engine import runner
from cvs_jax.methods import registry
from cvs_jax.models.simplex_head import simplex_rows
from cvs_jax.retrieval import run_reader
from cvs_jax.retrieval.query_maps import QueryMap
from cvs_jax.rundir import paths
from cvs_jax.rundir.checkpoint import Checkpoints
from cvs_jax.testing import image_folders as photo_folders

SIMPLEX_ROWS = 16  # model.head_block: room for the 4 classes of the two days; embed_dim >= 15


def _run(tmp, method):
    first = photo_folders.write_folder(tmp / "s1", photo_folders.SESSIONS[0], 3, seed=0)
    second = photo_folders.write_folder(tmp / "s2", photo_folders.SESSIONS[1], 3, seed=1)
    c = photo_folders.folder_config(tmp, first)
    c.method = method
    c.retrieval.query_map = "procrustes"
    c.ract.topk_neg = 4  # ract's official 10 exceeds the tiny batch of 8 (refused, as it should be)
    if registry.get_method(c).official_head == "simplex":
        c.model.head = "official"  # the photo config's default is the fork's trained head
        c.model.embed_dim, c.model.head_block = SIMPLEX_ROWS, SIMPLEX_ROWS
    workdir = str(tmp / "run")
    runner.run(c, workdir)
    assert update.update(workdir, second, {}) == 0
    return workdir, c


@pytest.mark.parametrize(
    "method",
    ["cl2r", "lce"] + [pytest.param(m, marks=pytest.mark.slow) for m in ("ract", "hoc", "cores")],
)
def test_a_photo_run_and_its_update_with_a_query_map(tmp_path, capsys, method):
    workdir, c = _run(tmp_path, method)
    with open(paths.results_file(workdir)) as f:
        results = json.load(f)
    assert [p["session"] for p in results["per_session"]] == [1, 2]
    assert results["query_map"] == "procrustes"
    # the map of model 2 to model 1 (0-based file 1), none before it
    assert os.path.exists(paths.query_map_file(workdir, 1)) and not os.path.exists(paths.query_map_file(workdir, 0))
    described = info.describe(workdir)
    assert described["method"] == method and described["query_map_sessions"] == [2]

    # a day-1 gallery photo, searched with model 2: every hit's score is the query mapped by the stored map
    # down to model 1's space (day-1 rows) or left as it is (day-2 rows, model 2's), against the stored row
    run = run_reader.Run(workdir)
    assert run.session == 1 and len(run.gallery.parts) == 2
    source = run.source(0)
    capsys.readouterr()
    assert search.search_or_add(workdir, [source], k=len(run.rows), as_json=True) == 0
    (answer,) = json.loads(capsys.readouterr().out)
    assert answer["model_session"] == 2
    q = run.embed(run_reader.load_images([source], run.image_shape))[0]
    mapped = QueryMap.load(paths.query_map_file(workdir, 1)).apply(q)
    stored = np.asarray(run.rows.embeddings[0 : len(run.rows)], np.float64)
    norm = stored / np.linalg.norm(stored, axis=1, keepdims=True)
    first_rows = len(run.gallery.parts[0].labels)
    for hit in answer["hits"]:
        query = mapped if hit["row"] < first_rows else q
        expected = (query / np.linalg.norm(query)) @ norm[hit["row"]]
        assert hit["score"] == pytest.approx(float(expected), abs=1e-4), hit
    assert sorted(h["row"] for h in answer["hits"]) == list(range(len(run.rows)))

    if c.model.head != "official":
        return
    ck = Checkpoints(paths.sessions_dir(workdir), max_to_keep=None)
    try:
        for step in ck.steps():  # the head never trained: both sessions hold the d-simplex exactly
            head = np.asarray(ck.restore(step, {"variables": None})["variables"]["params"]["head"])
            np.testing.assert_array_equal(head, np.asarray(simplex_rows(SIMPLEX_ROWS, c.model.embed_dim)))
    finally:
        ck.close()
