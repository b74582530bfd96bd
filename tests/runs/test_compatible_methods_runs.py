"""The compatible-training methods registered beside the paper's train a tiny two-session run each.

For each: ``results.json`` holds both sessions, session 2 logs the method's own terms, and the logged
loss is L_c plus the terms at their configured weights (a term computed but left out of the loss, or
weighted by another term's weight, breaks it).  The simplex methods end with their head's rows exactly
the d-simplex they started with (an optimizer that decays or moves them breaks it)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from cvs_jax.engine import runner
from cvs_jax.methods import registry
from cvs_jax.models.simplex_head import simplex_rows
from cvs_jax.rundir import paths
from cvs_jax.rundir.checkpoint import Checkpoints
from cvs_jax.testing.methods_runs import REPO
from cvs_jax.testing.tiny_data import tiny_config

METHODS = ["ract", "lce", "cl2r", "hoc"]


def _tiny(manual_dir, tmp_path, method):
    config = tiny_config(manual_dir, tmp_path, method=method, sessions=2)
    config.train.epochs = 1
    config.data.samples_per_new_class = 30
    return config


@pytest.mark.parametrize("method", METHODS)
def test_a_tiny_run_trains_it_and_logs_its_terms(manual_dir, tmp_path, method):
    config = _tiny(manual_dir, tmp_path, method)
    workdir = str(tmp_path / method)
    results = runner.run(config, workdir)
    assert len(results["per_session"]) == 2
    with open(os.path.join(workdir, "results.json")) as f:
        assert len(json.load(f)["per_session"]) == 2
    terms = registry.get_method(config).loss_terms
    with open(paths.metrics_file(workdir)) as f:
        records = [json.loads(line) for line in f]
    logged = [r for r in records if all(t in r for t in terms)]
    assert logged, f"session 2 logs {sorted(terms)}"
    for r in logged:  # epoch means of a linear sum: loss = L_c + sum_t w_t L_t
        extra = sum(config.loss_weights[t] * r[t] for t in terms)
        assert r["loss"] - r["L_c"] == pytest.approx(extra, rel=1e-3, abs=1e-5)
        assert any(r[t] != 0 for t in terms)
    if registry.head_name(config) == "simplex":  # K = 6 classes in embed_dim 8 >= 5
        ck = Checkpoints(os.path.join(workdir, "checkpoints", "sessions"), max_to_keep=None)
        try:
            for step in ck.steps():
                head = np.asarray(ck.restore(step, {"variables": None})["variables"]["params"]["head"])
                np.testing.assert_array_equal(head, np.asarray(simplex_rows(6, config.model.embed_dim)))
        finally:
            ck.close()


def _compare(workdir, methods):
    cmd = [sys.executable, "-m", "cvs_jax.compare", "--config", "configs/fashion_mnist_general.py"]
    cmd += ["--workdir", workdir, "--methods", methods, "--seeds", "0", "--tabulate"]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_compare_takes_the_new_methods_their_heads_and_settings(tmp_path):
    workdir = str(tmp_path / "cmp")
    done = _compare(workdir, "ract,lce,cl2r,hoc,hoc@cosine,ract+ract.topk_neg=5")
    assert done.returncode == 0, done.stderr
    with open(os.path.join(workdir, "comparison.json")) as f:
        listed = json.load(f)["methods"]
    assert listed == ["ract", "lce", "cl2r", "hoc", "hoc@cosine", "ract+ract.topk_neg=5"]
    # a setting its method refuses stops compare with one line, before any run
    done = _compare(str(tmp_path / "bad"), "ract+ract.topk_neg=64")  # the tiny config's batch: 32
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ract.topk_neg=64 exceeds train.batch_size=32"), done.stderr


def test_cores_trains_on_all_data_seen_and_adds_only_its_own_rows(manual_dir, tmp_path):
    config = _tiny(manual_dir, tmp_path, "cores")
    workdir = str(tmp_path / "cores")
    runner.run(config, workdir)
    with open(os.path.join(workdir, "results.json")) as f:
        first, second = json.load(f)["per_session"]
    assert first["trained_on_images"] == first["new_images"] == first["gallery_rows"]
    # session 2: its own images plus every image of session 1; the gallery gains its own rows only
    assert second["trained_on_images"] == first["new_images"] + second["new_images"]
    assert second["gallery_rows"] == first["gallery_rows"] + second["new_images"]
    with open(paths.metrics_file(workdir)) as f:
        records = [json.loads(line) for line in f]
    trained = [r for r in records if "loss" in r]
    assert trained and all(r["loss"] == pytest.approx(r["L_c"]) for r in trained)  # L_c alone
