"""A whole rainbow run: its memories follow the fork's rules, and the earlier switches still give the earlier
behaviour."""

import os
from collections import Counter

import numpy as np

from cvs_jax.engine import runner
from cvs_jax.rundir.checkpoint import Checkpoints
from cvs_jax.testing.tiny_data import tiny_config


def _memory_after_session(workdir, s):
    """The memory built after session s (1-based): stored with the checkpoint of session s + 1."""
    ck = Checkpoints(os.path.join(workdir, "checkpoints", "sessions"), max_to_keep=None)
    try:
        meta = ck.restore(s, {})["meta"]["memory"]
    finally:
        ck.close()
    assert meta["built_after"] == s - 1
    return np.asarray(meta["source_ids"]), np.asarray(meta["labels"])


def test_rainbow_run_fork_rules_and_earlier_switches(manual_dir, tmp_path):
    c = tiny_config(manual_dir, tmp_path, method="rainbow", sessions=3)  # session 3: RandAugment votes + stride
    res = runner.run(c, str(tmp_path / "fork"))
    assert len(res["per_session"]) == 3
    for s in (1, 2):
        ids, labels = _memory_after_session(str(tmp_path / "fork"), s)
        assert len(ids) == len(set(ids.tolist())) == c.memory.budget  # equal shares / stride + refill: the budget
        quota = c.memory.budget // len(set(labels.tolist()))
        assert min(Counter(labels.tolist()).values()) >= quota
    # the earlier cvs-jax rules, all switched back
    old = tiny_config(manual_dir, tmp_path, method="rainbow", sessions=2)
    old.rainbow.update(
        perturbations=8,
        perturbation="train_pipeline",
        selection="spread",
        refill=False,
        first_session="uncertainty",
        memory_batches="with_replacement",
    )
    res = runner.run(old, str(tmp_path / "old"))
    assert len(res["per_session"]) == 2
    ids, labels = _memory_after_session(str(tmp_path / "old"), 1)
    k = len(set(labels.tolist()))
    assert len(ids) == (old.memory.budget // k) * k < old.memory.budget  # no refill: the floor leaves slots empty
