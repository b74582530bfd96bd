"""An ``update`` whose new classes grow the head past a ``model.head_block`` boundary, with its own
``--config.train.lr`` and ``--config.train.epochs``: the older sessions' checkpoints (a shorter head)
are restored for the compatibility matrix and the run ends; the new session trains with its recipe,
recorded in config.json and shown by ``info``.  The run's config.json lacks a loss term, as if recorded
before the term existed: the update trains with the weight the method declares."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from cvs_jax import info, update
from cvs_jax.engine import runner
from cvs_jax.errors import ConfigError
from cvs_jax.methods import registry
from cvs_jax.testing import image_folders as photo_folders

DROPPED = "L_d"  # a term of the run's method (cvs)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("head_block")
    first = photo_folders.write_folder(tmp / "s1", {"ant": 16, "bee": 16, "cat": 16}, 3, seed=0)
    second = photo_folders.write_folder(tmp / "s2", {"dog": 16, "ant": 8}, 3, seed=1)
    c = photo_folders.folder_config(tmp, first)
    c.model.head_block = 3  # 3 classes fill the block: the fourth grows the head to 6 rows
    workdir = str(tmp / "run")
    runner.run(c, workdir)
    config_file = os.path.join(workdir, "config.json")
    with open(config_file) as f:
        recorded = json.load(f)
    del recorded["loss_weights"][DROPPED]
    with open(config_file, "w") as f:
        json.dump(recorded, f)
    status = update.update(workdir, second, {"train.lr": 0.004, "train.epochs": 2})
    return workdir, status, c


def test_update_past_a_head_block_completes(run):
    workdir, status, _ = run
    assert status == 0
    with open(os.path.join(workdir, "results.json")) as f:
        results = json.load(f)
    assert len(results["per_session"]) == 2
    matrix = results["compatibility_recall1"]
    # row i: the queries of model i on the rows up to session i (upper triangle: not measured)
    assert matrix[0][0] is not None and matrix[1][0] is not None and matrix[1][1] is not None


def test_update_trains_its_session_with_its_own_lr_and_epochs(run):
    workdir, _, c = run
    with open(os.path.join(workdir, "config.json")) as f:
        stored = json.load(f)
    assert stored["train"]["lr"] == c.train.lr and stored["train"]["epochs"] == c.train.epochs == 1
    assert stored["train"]["session_lr"] == [None, 0.004] and stored["train"]["session_epochs"] == [None, 2]
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        epochs = [r for r in map(json.loads, f) if "loss" in r]
    # the official schedule: epoch 1 at 0.1 x lr, epoch 2 at lr
    lrs = {(r["session"], r["epoch"]): r["lr"] for r in epochs}
    assert lrs.keys() == {(1, 1), (2, 1), (2, 2)}
    assert lrs[(1, 1)] == pytest.approx(0.1 * c.train.lr) and lrs[(2, 1)] == pytest.approx(0.0004)
    assert lrs[(2, 2)] == pytest.approx(0.004)
    shown = info.describe(workdir)["sessions"]
    assert [(s["lr"], s["epochs"]) for s in shown] == [(c.train.lr, 1), (0.004, 2)]
    assert "lr 0.004, 2 epochs" in info.format_info(info.describe(workdir))


def test_update_trains_a_term_the_run_did_not_record_with_its_declared_weight(run):
    workdir, status, c = run
    assert status == 0  # the train step refuses a method's term that config.loss_weights lacks
    with open(os.path.join(workdir, "config.json")) as f:
        weights = json.load(f)["loss_weights"]  # the config session 2 trained with
    assert weights[DROPPED] == registry.get_method(c).loss_terms[DROPPED] == c.loss_weights[DROPPED]


@pytest.mark.parametrize("results_json", ["session 1 recorded", "deleted"])
def test_an_interrupted_update_resumes_with_the_recipe_it_started_with(run, tmp_path, results_json):
    """The update's session is counted from the plan: with results.json deleted (it is written anew as the run
    resumes) the old code counted no completed session and checked the recipe of session 1."""
    workdir, _, _ = run
    copy = str(tmp_path / "run")
    shutil.copytree(workdir, copy)
    if results_json == "deleted":
        os.remove(os.path.join(copy, "results.json"))
    else:
        with open(os.path.join(copy, "results.json")) as f:
            results = json.load(f)
        results["per_session"] = results["per_session"][:1]  # as after a kill during session 2
        with open(os.path.join(copy, "results.json"), "w") as f:
            json.dump(results, f)
    with open(os.path.join(copy, "config.json")) as f:
        second = json.load(f)["data"]["updates"][-1]
    with pytest.raises(ConfigError, match=r"session 2 was started with train.lr=0.004.*--config.train.lr=0.004"):
        update.plan_update(copy, second, {"train.lr": 0.01})
    with pytest.raises(ConfigError, match="must be at least 1"):
        update.plan_update(copy, second, {"train.epochs": 0})
    resumed = update.plan_update(copy, second, {"train.lr": 0.004, "train.epochs": 2})
    assert list(resumed.train.session_lr) == [None, 0.004] and list(resumed.train.session_epochs) == [None, 2]
