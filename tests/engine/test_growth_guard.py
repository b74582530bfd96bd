"""The training loop's growth guard (``train_loop._Watch``): a loss or gradient norm more than 1e3 times its
value at the session's first step stops the run at that step, for a plain run (one step or k steps
per call) and per member of a population; ordinary ups and downs never do."""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvs_jax.engine import train_loop
from cvs_jax.errors import DivergedError, NonFiniteError


def _member(head="linear_reset"):
    ctx = types.SimpleNamespace(method=types.SimpleNamespace(name="cvs"), head=types.SimpleNamespace(name=head))
    ctx.workdir = "w"
    return types.SimpleNamespace(reference=None, view=types.SimpleNamespace(s=1), ctx=ctx)


class _Plain(train_loop.Driver):
    def __init__(self, stacked, head="linear_reset"):
        self.members, self.stacked = [_member(head)], stacked


class _Population(train_loop.Driver):
    stacked = True

    def __init__(self, n):
        self.members = [_member() for _ in range(n)]

    def member(self, tree, m):
        return jax.tree.map(lambda x: x[m], tree)

    def per_member(self, values):
        return values


def _run(driver, losses, grads, k):
    """``losses``/``grads``: [steps] (a plain run) or [members, steps], fed in calls of k steps."""
    watch = train_loop._Watch.start()
    losses, grads = np.asarray(losses, np.float32), np.asarray(grads, np.float32)
    for first in range(0, losses.shape[-1], k):
        sl = slice(first, first + k)
        metrics = {"loss": jnp.asarray(losses[..., sl]), "grad_norm": jnp.asarray(grads[..., sl])}
        if not driver.stacked:
            metrics = {key: v[0] for key, v in metrics.items()}
        watch = watch.after_call(driver, metrics, first)
    return watch


@pytest.mark.parametrize("stacked,k", [(False, 1), (True, 1), (True, 3)])
def test_a_loss_past_1e3_times_the_first_stops_at_that_step(stacked, k):
    losses = [2.8, 3.1, 40.0, 2.7e3, 2.1e20, 3.0]  # x1e3 of 2.8 is 2800: step 5 (index 4), not 2700
    grads = [1.0] * 6
    driver = _Plain(stacked)
    watch = _run(driver, losses, grads, k)
    with pytest.raises(
        DivergedError, match=r"session 2 \(cvs\) diverged at step 5: its loss went from 2.8 to 2.1e\+20"
    ):
        watch.check(driver, 0.05)


def test_the_gradient_norm_alone_stops_it_and_the_message_says_what_to_change():
    driver = _Plain(False)
    watch = _run(driver, [2.0] * 4, [0.5, 2.0, 400.0, 600.0], 1)  # 0.5 x 1e3 = 500: step 4
    with pytest.raises(DivergedError) as e:
        watch.check(driver, 0.05)
    msg = str(e.value)
    assert "step 4" in msg and "train.lr (now 0.05" in msg and "model.head=cosine" in msg
    cosine = _Plain(False, head="cosine")
    watch = _run(cosine, [2.0] * 4, [0.5, 2.0, 400.0, 600.0], 1)
    with pytest.raises(DivergedError) as e:
        watch.check(cosine, 0.05)
    assert "model.head=cosine" not in str(e.value)  # already the cosine head


def test_ordinary_runs_and_small_first_values_pass():
    driver = _Plain(True)
    # a loss that first rises 300x, a gradient norm that starts near zero (floored at 0.1): no stop
    _run(driver, [0.01, 3.0, 0.5, 0.2], [1e-6, 50.0, 90.0, 20.0], 2).check(driver, 0.05)


def test_a_nan_is_reported_as_nan_before_growth():
    driver = _Plain(False)
    watch = _run(driver, [2.0, 3.0, float("nan"), float("inf")], [1.0] * 4, 1)
    with pytest.raises(NonFiniteError, match="NaN/inf at step 3") as e:
        watch.check(driver, 0.05)
    assert not isinstance(e.value, DivergedError)


def test_population_members_are_watched_apart():
    driver = _Population(3)
    losses = [[2.0, 2.5, 3.0, 1.0], [2.0, 2.5, 1.9e3, 1e6], [4.0, 2.0, 1.0, 1.0]]
    watch = _run(driver, losses, np.ones((3, 4)), 2)
    assert [m.reference[0] for m in driver.members] == [2.0, 2.0, 4.0]
    with pytest.raises(
        DivergedError, match=r"session 2 \(cvs\) in w diverged at step 4"
    ):  # member 1: 1e6 > 2e3, 1.9e3 is not
        watch.check(driver, 0.05)
