"""A RunContext on the tiny config, for tests that drive one session phase at a time (phases, heads,
importance), and exact equality of two pytrees (a model kept or replaced, bit for bit)."""

import os

import jax
import numpy as np

from cvs_jax.engine.context_builder import build_context
from cvs_jax.rundir.run_log import RunLog
from cvs_jax.testing.tiny_data import tiny_config


def build_ctx(manual_dir, tmp_path, method="cvs", sessions=2, **train):
    c = tiny_config(manual_dir, tmp_path, method=method, sessions=sessions)
    for k, v in train.items():
        setattr(c.train, k, v)
    wd = str(tmp_path / f"wd-{method}")
    os.makedirs(wd, exist_ok=True)
    return build_context(c, wd, RunLog(wd))


def tree_equal(a, b) -> bool:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return jax.tree.structure(a) == jax.tree.structure(b) and all(np.array_equal(x, y) for x, y in zip(la, lb))
