"""``augment.CachedViews``: each training step picks one of a row's cached views, every view reachable."""

from __future__ import annotations

import jax
import numpy as np

from cvs_jax.augment import transforms as augment


def _rows(n: int, views: int) -> np.ndarray:
    """Row r's view v holds 10 * r + v (so a pick shows which row and which view it came from)."""
    return (10 * np.arange(n)[:, None] + np.arange(views)[None]).astype(np.float32)[..., None]


def test_training_picks_every_view_of_its_own_row_and_eval_the_first():
    for views in (2, 3):
        pipe, x = augment.CachedViews(views=views), _rows(64, views)
        picks = np.concatenate([np.asarray(pipe.train(jax.random.key(k), x))[:, 0] for k in range(4)])
        rows, view = np.divmod(picks.astype(int), 10)
        np.testing.assert_array_equal(rows, np.tile(np.arange(64), 4))
        counts = np.bincount(view, minlength=views)
        assert counts.min() > 256 / views / 2, counts  # every view, the last included, about equally often
        np.testing.assert_array_equal(np.asarray(pipe.eval(x))[:, 0], 10 * np.arange(64))
    one = _rows(5, 1)[:, 0]
    np.testing.assert_array_equal(augment.CachedViews(views=1).train(jax.random.key(0), one), one)
