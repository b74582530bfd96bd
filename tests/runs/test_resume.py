"""Crash anywhere, rerun the same command, get the uninterrupted results.

Each case runs ``python -m cvs_jax.main`` in a subprocess that kills itself with
SIGKILL at a named point (``cvs_jax.rundir.faults``), then reruns the same command and
compares ``results.json``, ``metrics.jsonl`` and the stored gallery with an
uninterrupted run.
"""

import glob
import os

import numpy as np
import pytest

from cvs_jax.rundir.checkpoint import Checkpoints
from cvs_jax.rundir.gallery import Gallery
from cvs_jax.testing import methods_runs as mr


@pytest.fixture(scope="module")
def data_dirs(fashion_idx, tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    manual = fashion_idx(40, 6)
    return manual, str(root / "tfds"), root


def command(manual, tfds_dir, workdir):
    return mr.main_cmd(manual, tfds_dir, workdir, "cvs")


def outcome(workdir):
    """results.json and metrics.jsonl without wall times, and every session's stored gallery part."""
    results, metrics = mr.outcome(workdir)
    ck = Checkpoints(os.path.join(workdir, "checkpoints", "sessions"), max_to_keep=None)
    g = Gallery.restore(ck, max(ck.steps()), embed_dim=8)
    ck.close()
    gallery = {
        "embeddings": np.asarray(g.embeddings),
        "labels": g.labels,
        "sessions": g.sessions,
        "source_ids": g.source_ids,
    }
    return results, metrics, gallery


@pytest.fixture(scope="module")
def reference(data_dirs):
    manual, tfds_dir, root = data_dirs
    workdir = str(root / "reference")
    proc = mr.run(command(manual, tfds_dir, workdir))
    assert proc.returncode == 0, proc.stderr[-3000:]
    # --config.pictures=False (methods_runs.overrides): neither the page nor a PNG
    assert [f for f in os.listdir(workdir) if f.endswith((".html", ".png"))] == []
    return outcome(workdir)


# a kill after a session-1 step: the streamed run below (step 5) and the corrupt checkpoint's (step 10, resumed
# from the checkpoint before the newest)
@pytest.mark.parametrize("fault", ["validation:3", "progress_write:4", "session_write:1", "step:14"])
def test_kill_and_rerun_matches_uninterrupted(data_dirs, reference, fault):
    manual, tfds_dir, root = data_dirs
    workdir = str(root / f"killed-{fault.replace(':', '-')}")
    cmd = command(manual, tfds_dir, workdir)
    killed = mr.run(cmd, fault)
    assert killed.returncode == -9, f"the fault {fault} did not fire: {killed.stderr[-2000:]}"
    assert not os.path.exists(os.path.join(workdir, "results.json"))
    resumed = mr.run(cmd)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    results, metrics, gallery = outcome(workdir)
    ref_results, ref_metrics, ref_gallery = reference
    assert results == ref_results
    assert metrics == ref_metrics
    for key in ("embeddings", "labels", "sessions", "source_ids"):
        np.testing.assert_array_equal(gallery[key], ref_gallery[key])
    assert len(np.unique(gallery["source_ids"])) == len(gallery["source_ids"])  # no row lost or duplicated
    if fault == "step:14":  # resumed in session 2: the finished run, run again, changes nothing
        files = mr.checkpoint_files(workdir)
        again = mr.run(cmd)
        assert again.returncode == 0 and "== session" not in again.stdout, again.stderr[-3000:]
        assert mr.moved_aside(workdir) == [] and mr.checkpoint_files(workdir) == files
        assert outcome(workdir)[:2] == (ref_results, ref_metrics)


def test_kill_while_worker_processes_stream_matches_uninterrupted(data_dirs, reference):
    """Streamed from the records, decoded by two worker processes, killed mid-epoch (kill -9 of the
    main process while its workers run) and rerun: the in-memory uninterrupted run's results."""
    manual, tfds_dir, root = data_dirs
    workdir = str(root / "killed-workers")
    cmd = command(manual, tfds_dir, workdir) + ["--config.data.in_memory_limit_mb=0", "--config.data.loader_workers=2"]
    assert mr.run(cmd, "step:5").returncode == -9
    resumed = mr.run(cmd)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    results, metrics, gallery = outcome(workdir)
    assert (results, metrics) == reference[:2]
    np.testing.assert_array_equal(gallery["embeddings"], reference[2]["embeddings"])


def test_corrupt_latest_checkpoint_falls_back(data_dirs, reference):
    manual, tfds_dir, root = data_dirs
    workdir = str(root / "corrupt")
    cmd = command(manual, tfds_dir, workdir)
    assert mr.run(cmd, "step:10").returncode == -9
    progress = os.path.join(workdir, "checkpoints", "progress")
    latest = max((d for d in os.listdir(progress) if d.isdigit()), key=int)
    for path in glob.glob(os.path.join(progress, latest, "state", "**", "*"), recursive=True):
        if os.path.isfile(path) and os.path.getsize(path) > 0:
            with open(path, "r+b") as f:  # clobber the data files of the newest checkpoint
                f.truncate(max(os.path.getsize(path) // 3, 1))
    resumed = mr.run(cmd)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "cannot be read" in resumed.stdout
    assert any(d.startswith("unreadable-") for d in os.listdir(progress))  # moved aside, not deleted
    results, metrics, _ = outcome(workdir)
    assert results == reference[0] and metrics == reference[1]
