"""Whole runs of cvs and joint, checked against their stored gallery parts and saved weights: stored rows are
never re-embedded (joint alone replaces them)."""

import os

import numpy as np
import pytest

from cvs_jax.engine import runner
from cvs_jax.retrieval import topk
from cvs_jax.rundir.checkpoint import Checkpoints
from cvs_jax.rundir.gallery import Gallery, GalleryPart
from cvs_jax.testing.run_contexts import build_ctx
from cvs_jax.testing.tiny_data import tiny_config


@pytest.mark.parametrize("method", ["cvs", "joint"])
def test_stored_rows_are_never_reembedded(manual_dir, tmp_path, method):
    """Recompute each session's test recall from the stored gallery parts and that session's saved
    weights: it equals results.json.  Stored rows stay the rows their own session's model made."""
    c = tiny_config(manual_dir, tmp_path, method=method, sessions=3)
    wd = str(tmp_path / method)
    res = runner.run(c, wd)
    ctx = build_ctx(manual_dir, tmp_path, method=method, sessions=3)
    ck = Checkpoints(os.path.join(wd, "checkpoints", "sessions"), max_to_keep=None)
    template = {"variables": ctx.initial_variables()}
    weights = [ck.restore(s, template)["variables"] for s in range(3)]
    parts = [GalleryPart.from_dict(ck.restore(s, {"gallery": None})["gallery"]) for s in range(3)]
    plan, proto = ctx.proto.plan, ctx.proto
    for s in range(3):
        gallery = Gallery(parts[: s + 1], 8) if method != "joint" else Gallery([parts[s]], 8)
        test_idx = plan.test_queries(s, proto.test_labels)
        q = ctx.embed(weights[s], proto.test_images(test_idx))
        # the evaluator itself is checked against brute force in test_evaluate.py (near-ties of this
        # tiny 8-d model make a float64 numpy ranking differ in single queries)
        got = topk.recall_at_k(q, proto.test_labels[test_idx], np.asarray(gallery.embeddings), gallery.labels, ctx.ks)
        assert got == {int(k): v for k, v in res["per_session"][s]["recall"].items()}
        # each part holds its own session's images, embedded by that session's model
        own = proto.training_indices(ctx.method, s)
        np.testing.assert_array_equal(parts[s].source_ids, own)
        np.testing.assert_allclose(parts[s].embeddings, ctx.embed(weights[s], proto.train_images(own)), rtol=1e-6)
    if method != "joint":  # session 1's rows are not what session 3's model would make of them
        later = ctx.embed(weights[2], proto.train_images(parts[0].source_ids))
        assert not np.allclose(parts[0].embeddings, later, atol=1e-3)
    ck.close()
    ctx.close()
