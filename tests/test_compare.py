"""The comparison runner: every method in the table, session 1 trained once and reused exactly."""

import csv
import os

import pytest

from cvs_jax import compare, trainer
from cvs_jax.errors import ConfigError
from tests.tiny_data import tiny_config, write_fashion_idx


def test_runner_table_and_shared_first_session(tmp_path):
    manual = write_fashion_idx(str(tmp_path / "idx"), train_per_class=60, test_per_class=10)
    c = tiny_config(manual, tmp_path, sessions=2)
    c.train.epochs = 1
    wd = str(tmp_path / "cmp")
    methods = ["finetune", "cvs", "joint", "bct", "lwf", "mmd", "ewc", "rwalk", "rainbow"]
    rows = compare.run_comparison(c, wd, methods, [0])
    assert [r["method"] for r in rows] == methods
    with open(os.path.join(wd, "comparison.md")) as f:
        table = f.read()
    for m in methods:
        assert f"| {m} |" in table
    with open(os.path.join(wd, "comparison.csv")) as f:
        assert [r["method"] for r in csv.DictReader(f)] == methods
    assert os.path.getsize(os.path.join(wd, "comparison.png")) > 0
    # session 1 was trained once: every method reports the same session-1 recall ...
    first = {r["method"]: r["recall1_per_session"][0] for r in rows}
    assert len(set(first.values())) == 1
    # ... and reusing it changes nothing: cvs from scratch gives the same results.
    c.method = "cvs"
    alone = trainer.run(c, str(tmp_path / "cvs_alone"))
    shared = [r for r in rows if r["method"] == "cvs"][0]
    assert [100 * s["recall"]["1"] for s in alone["per_session"]] == pytest.approx(shared["recall1_per_session"])


def test_unknown_method_refused(tmp_path):
    c = tiny_config(str(tmp_path), tmp_path, sessions=2)
    with pytest.raises(ConfigError, match="unknown methods"):
        compare.run_comparison(c, str(tmp_path / "cmp"), ["finetune", "lwf2"], [0])
