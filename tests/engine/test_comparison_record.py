"""``compare``'s per-run record: the compatibility summaries it tabulates, from a hand-made results.json."""

from __future__ import annotations

import numpy as np
import pytest

from configs import fashion_mnist_general
from cvs_jax.engine import comparison


def _results(flips):
    matrix = [[0.8, None, None], [0.6, 0.7, None], [0.5, 0.9, 0.75]]
    return {
        "average_recall": {"1": 0.7},
        "per_session": [{"recall": {"1": v}} for v in (0.8, 0.7, 0.75)],
        "compatibility_recall1": matrix,
        "negative_flip_rate": flips,
    }


def test_nfr_is_the_mean_over_every_update_in_points():
    c = fashion_mnist_general.get_config()
    record = comparison.run_record(0, "cvs", c, "/w/seed0/cvs", "/w", _results([0.10, 0.30]))
    assert record["NFR"] == pytest.approx(20.0)  # not the last update's 30
    record = comparison.run_record(0, "cvs", c, "/w/seed0/cvs", "/w", _results([None, 0.30]))
    assert record["NFR"] == pytest.approx(30.0)  # an update without queries is left out
    # BC from the matrix, in points: part 0 loses mean(0.6, 0.5) - 0.8, part 1 gains 0.9 - 0.7
    assert record["BC"] == pytest.approx(100 * np.mean([0.55 - 0.8, 0.9 - 0.7]))
