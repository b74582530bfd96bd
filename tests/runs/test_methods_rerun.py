"""Every method: a finished two-session run, run again with the same command, changes nothing.

(The rerun of a finished ``lwf`` run once moved its good session checkpoint aside as
"unreadable" and trained session 2 again.)

Marked ``slow`` (a 14-method ``compare``: 160-200 s of the default suite's test time on a 2-core CPU host,
2026-12-07): the default suite reruns the finished runs of the methods with extra state (lwf, ewc, rainbow) in
``tests/runs/test_methods_kill.py`` and of cvs in ``tests/runs/test_resume.py``; ``pytest -m slow`` runs this.
"""

import os

import pytest

from cvs_jax.testing import methods_runs as mr

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def compared(fashion_idx, tmp_path_factory):
    root = tmp_path_factory.mktemp("rerun")
    manual = fashion_idx(40, 6)
    workdir = str(root / "cmp")
    # one epoch per session (the overrides' last --config.train.epochs wins): a finished session is what
    # the rerun must leave alone, however many epochs trained it
    cmd = mr.compare_cmd(manual, str(root / "tfds"), workdir, mr.ALL_METHODS) + ["--config.train.epochs=1"]
    proc = mr.run(cmd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return cmd, workdir


def test_rerun_of_every_finished_method_changes_nothing(compared):
    cmd, workdir = compared
    before = {m: mr.outcome(os.path.join(workdir, "seed0", m)) for m in mr.ALL_METHODS}
    files = mr.checkpoint_files(workdir)
    again = mr.run(cmd)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "cannot be read" not in again.stdout + again.stderr
    assert mr.moved_aside(workdir) == []
    assert mr.checkpoint_files(workdir) == files  # no checkpoint written, moved or removed
    assert "== session" not in again.stdout  # no finished session is trained again
    for m in mr.ALL_METHODS:
        assert mr.outcome(os.path.join(workdir, "seed0", m)) == before[m], m
