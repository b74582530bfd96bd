"""``kill -9`` in the middle of session 2 and a rerun give the uninterrupted results, and a rerun of the finished
run changes nothing, for the methods with extra state: lwf (trainable old-head copy in the training state),
ewc (importance and anchor), rainbow (uncertainty memory, half-memory batches).  Also: a second
process on a live workdir is refused, naming the holder; the rerun after ``kill -9`` is not."""

import os
import signal
import subprocess
import time

import pytest

from cvs_jax.engine.comparison import share_first_session
from cvs_jax.testing import methods_runs as mr

KILLED = ["lwf", "ewc", "rainbow"]  # cvs: tests/runs/test_resume.py kills it at six points, session 2 included


@pytest.fixture(scope="module")
def reference(fashion_idx, tmp_path_factory):
    root = tmp_path_factory.mktemp("kill")
    manual = fashion_idx(40, 6)
    tfds_dir = str(root / "tfds")
    workdir = str(root / "ref")
    proc = mr.run(mr.compare_cmd(manual, tfds_dir, workdir, ["finetune"] + KILLED))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return manual, tfds_dir, root, workdir


@pytest.mark.parametrize("method", KILLED)
def test_kill_in_session_two_and_rerun_matches_uninterrupted(reference, method):
    manual, tfds_dir, root, ref_dir = reference
    workdir = str(root / f"killed-{method}")
    ref_results, _ = mr.outcome(os.path.join(ref_dir, "seed0", method))
    first_steps = 0
    if mr.shares_first_session(method):
        share_first_session(os.path.join(ref_dir, "seed0", "finetune"), workdir)  # starts at session 2
    else:  # fork EWC keeps statistics of its own session 1 (as compare does, it trains it)
        first_steps = ref_results["per_session"][0]["steps"]
    cmd = mr.main_cmd(manual, tfds_dir, workdir, method)
    # after session 2's first progress checkpoint and epoch end
    killed = mr.run(cmd, fault=f"step:{first_steps + 5}")
    assert killed.returncode == -9, f"the fault did not fire: {killed.stdout[-2000:]} {killed.stderr[-2000:]}"
    assert not os.path.exists(os.path.join(workdir, "results.json"))
    resumed = mr.run(cmd)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed session 2 at step" in resumed.stdout  # from the mid-session checkpoint, not from scratch
    assert mr.moved_aside(workdir) == []
    assert mr.outcome(workdir) == mr.outcome(os.path.join(ref_dir, "seed0", method))
    # the finished run, run again, changes nothing (a finished lwf run's rerun once moved its good session
    # checkpoint aside as "unreadable" and trained session 2 again; every method: tests/runs/test_methods_rerun.py)
    files = mr.checkpoint_files(workdir)
    again = mr.run(cmd)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "cannot be read" not in again.stdout + again.stderr and "== session" not in again.stdout
    assert mr.moved_aside(workdir) == [] and mr.checkpoint_files(workdir) == files
    assert mr.outcome(workdir) == mr.outcome(os.path.join(ref_dir, "seed0", method))


def test_second_process_on_a_live_workdir_is_refused_and_kill_does_not_block(reference):
    manual, tfds_dir, root, ref_dir = reference
    workdir = str(root / "live")
    cmd = mr.main_cmd(manual, tfds_dir, workdir, "finetune")
    first = subprocess.Popen(cmd, cwd=mr.REPO, env=mr.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 300
        while not os.path.exists(os.path.join(workdir, "metrics.jsonl")):  # training has started
            assert first.poll() is None and time.time() < deadline, "the first run ended before the check"
            time.sleep(0.2)
        second = mr.run(cmd)
        assert second.returncode == 2, second.stderr[-2000:]
        assert second.stderr.startswith("error:") and f"pid {first.pid}" in second.stderr
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    rerun = mr.run(cmd)  # the dead process's lock file is still there: it must not block
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert mr.outcome(workdir) == mr.outcome(os.path.join(ref_dir, "seed0", "finetune"))
