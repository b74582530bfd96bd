"""A session whose loss explodes while it stays finite (a linear head at a far too large lr) stops
with one error naming the session, the step and what to change, instead of training on silently."""

from __future__ import annotations

import pytest

from cvs_jax.engine import runner
from cvs_jax.errors import DivergedError
from cvs_jax.testing import tiny_data


def test_an_exploding_loss_stops_the_run(fashion_idx, tmp_path):
    manual = fashion_idx(60, 10)
    c = tiny_data.tiny_config(manual, tmp_path, method="finetune", sessions=2)
    c.model.head, c.train.lr = "linear_reset", 10.0  # measured: the loss passes 1e20 within 3 steps, no NaN
    with pytest.raises(DivergedError) as e:
        runner.run(c, str(tmp_path / "run"))
    msg = str(e.value)
    assert msg.startswith("session 1 (finetune) diverged at step ") and "train.lr (now 10" in msg, msg
    assert "model.head=cosine" in msg
