"""A run stopped by the NaN guard ends cleanly: its reading threads are stopped before the error leaves
the training loop, and the command exits with status 2 and one ``error:`` line (a daemon thread still
inside the runtime at interpreter exit aborted it: "terminate called", "Fatal Python error")."""

from __future__ import annotations

import gc
import threading

import pytest

from cvs_jax.engine import runner
from cvs_jax.errors import NonFiniteError
from cvs_jax.testing import methods_runs as mr
from cvs_jax.testing import tiny_data

DIVERGING_LR = "1e30"  # the first steps' loss is NaN/inf


@pytest.fixture(scope="module")
def manual(fashion_idx):
    return fashion_idx(60, 10)


def test_no_reading_thread_outlives_the_nan_error(manual, tmp_path):
    c = tiny_data.tiny_config(manual, tmp_path, method="ewc", sessions=2)
    c.train.lr = float(DIVERGING_LR)
    # This run reads in memory, with no worker processes, yet one fresh-clone suite saw a multiprocessing
    # "QueueFeederThread" appear during it: likely an earlier test's streamed pipeline (grain's
    # mp_prefetch) finalized by the collector. Collect first, so the snapshot holds such leftovers.
    gc.collect()
    before = set(threading.enumerate())
    with pytest.raises(NonFiniteError):
        runner.run(c, str(tmp_path / "run"))
    left = [t.name for t in threading.enumerate() if t not in before and t.is_alive()]
    assert not left, f"threads still running after the error: {left}"


def test_nan_exit_is_one_line_and_status_2(manual, tmp_path):
    cmd = mr.main_cmd(manual, str(tmp_path / "tfds"), str(tmp_path / "run"), "ewc")
    done = mr.run(cmd + [f"--config.train.lr={DIVERGING_LR}"])
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Fatal Python error" not in done.stderr and "terminate called" not in done.stderr, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "NaN/inf" in errors[0] and "train.lr" in errors[0], done.stderr[-3000:]
