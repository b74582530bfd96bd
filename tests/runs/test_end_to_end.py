"""The whole protocol on tiny local data: finetune, joint, resume, CVS loss terms."""

import json
import os
import shutil

import jax
import numpy as np
import pytest

from cvs_jax.engine import runner, train_loop
from cvs_jax.models import networks
from cvs_jax.rundir import paths
from cvs_jax.rundir.checkpoint import Checkpoints
from cvs_jax.testing.tiny_data import tiny_config


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_finetune_two_sessions(manual_dir, tmp_path, monkeypatch, capsys):
    c = tiny_config(manual_dir, tmp_path, sessions=2)
    c.profile_steps = "2:3"  # a jax.profiler trace of global steps 2..3 (engine/profiling.py)
    wd = str(tmp_path / "ft")
    monkeypatch.setattr(train_loop, "PROGRESS_SECONDS", -1.0)  # as if every call of a first epoch took long
    res = runner.run(c, wd)
    assert len(res["per_session"]) == 2
    assert [r["session"] for r in res["per_session"]] == [1, 2]  # numbered from 1, as printed
    out = capsys.readouterr().out
    for s in (1, 2):  # the first epoch of each session shows its progress, the later epochs do not
        assert f"  session {s} epoch 1 step 1/" in out and f"  session {s} epoch 2 step" not in out
    with open(os.path.join(wd, "results.json")) as f:
        assert json.load(f) == json.loads(json.dumps(res))
    for r in res["per_session"]:
        assert 0.0 <= r["recall"]["1"] <= r["recall"]["2"] <= r["recall"]["4"] <= 1.0
    ar1 = np.mean([r["recall"]["1"] for r in res["per_session"]])
    assert res["average_recall"]["1"] == pytest.approx(ar1)
    # the gallery holds each session's train images once, made by that session's model
    ck = Checkpoints(os.path.join(wd, "checkpoints", "sessions"), max_to_keep=None)
    assert ck.steps() == [0, 1]
    rows = [r["gallery_rows"] for r in res["per_session"]]
    assert rows[1] > rows[0] > 0
    metrics = read_jsonl(os.path.join(wd, "metrics.jsonl"))
    assert {m["session"] for m in metrics} == {1, 2}
    # what a person looks at afterwards
    for name in ("recall_per_session.png", "class_distribution.png", "compatibility.png", "protocol.json"):
        assert os.path.getsize(os.path.join(wd, name)) > 0, name
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(os.path.join(wd, "tensorboard")))
    traces = [f for _, _, files in os.walk(paths.profile_dir(wd)) for f in files if f.endswith(".xplane.pb")]
    assert len(traces) == 1  # one trace, started and stopped once
    compat = np.array(res["compatibility_recall1"], dtype=float)
    assert compat.shape == (2, 2) and np.isnan(compat[0, 1]) and np.isfinite(compat[1]).all()
    # the diagonal entry of the first session is session 1's own test recall@1 (same model, same rows)
    assert compat[0, 0] == pytest.approx(res["per_session"][0]["recall"]["1"])
    assert all(np.isfinite(m["loss"]) for m in metrics if "loss" in m)


@pytest.mark.parametrize("spec", ["3", "0:2", "5:4", "a:b"])
def test_a_bad_profile_range_is_refused_in_one_line(spec):
    from cvs_jax.engine import profiling
    from cvs_jax.errors import ConfigError

    with pytest.raises(ConfigError, match="pass --config.profile_steps=a:b with 1 <= a <= b"):
        profiling.parse(spec)
    assert profiling.parse("2:3") == (2, 3) and profiling.parse("") is None


def test_joint_reextracts_gallery(manual_dir, tmp_path):
    c = tiny_config(manual_dir, tmp_path, method="joint", sessions=2)
    wd = str(tmp_path / "jt")
    res = runner.run(c, wd)
    # joint trains on everything seen so far, and its gallery is the same union re-embedded
    assert res["per_session"][1]["trained_on_images"] == res["per_session"][1]["gallery_rows"]
    assert res["per_session"][1]["trained_on_images"] > res["per_session"][0]["trained_on_images"]


def test_resume_after_completed_session_reproduces_results(manual_dir, tmp_path, monkeypatch):
    """Resumed after session 2's checkpoint: session 3 and the results are the uninterrupted run's, and no weight
    is drawn for a model that the checkpoint replaces (the draw is traced for its shapes only)."""
    c = tiny_config(manual_dir, tmp_path, sessions=3)
    c.pictures = False  # compared by results (a run's pictures: tests/runs/test_report_pages.py)
    full = runner.run(c, str(tmp_path / "full"))
    wd = str(tmp_path / "interrupted")
    shutil.copytree(str(tmp_path / "full"), wd)  # the same run, finished: what a second run would write
    # simulate a crash during the last session: its checkpoint and the results never got written
    shutil.rmtree(os.path.join(wd, "checkpoints", "sessions", "2"))
    shutil.rmtree(os.path.join(wd, "checkpoints", "progress"))
    os.remove(os.path.join(wd, "results.json"))
    draws = []

    def init_variables(*args, **kwargs):
        out = draw(*args, **kwargs)
        draws.append(all(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(out)))
        return out

    draw = networks.init_variables
    monkeypatch.setattr(networks, "init_variables", init_variables)
    resumed = runner.run(c, wd)
    assert draws == [True]  # the template's shapes only: never compiled or run
    for r in resumed["per_session"] + full["per_session"]:
        r.pop("seconds")  # wall time is the only thing allowed to differ
    assert resumed == full


def test_cvs_logs_nonzero_loss_terms_from_session_two(manual_dir, tmp_path):
    c = tiny_config(manual_dir, tmp_path, method="cvs", sessions=3)
    c.pictures = False  # read by its metrics
    wd = str(tmp_path / "cvs")
    res = runner.run(c, wd)
    assert len(res["per_session"]) == 3
    epochs = [m for m in read_jsonl(os.path.join(wd, "metrics.jsonl")) if "loss" in m]
    first = [m for m in epochs if m["session"] == 1]
    later = [m for m in epochs if m["session"] > 1]
    assert first and all("L_m" not in m and "L_d" not in m for m in first)
    assert later and all(m["L_m"] > 0 and m["L_d"] > 0 for m in later)
    assert all(m["loss"] > m["L_c"] for m in later)


def test_streamed_records_give_the_in_memory_results(manual_dir, tmp_path):
    """data.in_memory_limit_mb=0 reads every image from its ArrayRecord record on demand; the batches,
    embeddings and results equal those of the decoded in-memory dataset."""
    from cvs_jax.data import records, sources
    from cvs_jax.engine.protocol_builder import build_protocol

    c = tiny_config(manual_dir, tmp_path, method="cvs", sessions=2)
    in_ram = build_protocol(c)
    c.data.in_memory_limit_mb = 0.0
    streamed = build_protocol(c)
    assert isinstance(streamed.dataset.train, records.StoreSplit)
    assert isinstance(in_ram.dataset.train, sources.Split)
    idx = np.random.default_rng(0).permutation(len(in_ram.dataset.train))[:50]
    np.testing.assert_array_equal(streamed.dataset.train.read(idx), in_ram.dataset.train.read(idx))
    np.testing.assert_array_equal(streamed.dataset.train.labels, in_ram.dataset.train.labels)
    tidx = np.array([99, 3, 42, 3])
    np.testing.assert_array_equal(np.asarray(streamed.test_images(tidx)), in_ram.dataset.test.images[tidx])
    res = runner.run(c, str(tmp_path / "streamed"))
    c.data.in_memory_limit_mb = 4096.0
    ref = runner.run(c, str(tmp_path / "in_ram"))
    for r in res["per_session"] + ref["per_session"]:
        r.pop("seconds")
    assert res == ref
