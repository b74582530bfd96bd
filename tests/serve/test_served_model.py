"""Which model a run's commands use: the one a server of the run serves (``gate.served_model``).

``update`` printed "gate: kept session 2 ...: the served model stays", but ``search``, ``export`` and a
server started on the run for the first time then used session 2's model anyway: an exported model broke
the old rows as silently as before the gate.  Now all of them take the sessions through the gate from
session 1 (a server's pin, recorded in ``served.json``, holds), say so in one ``note:`` line when that is
not the newest model, and ``--session N|newest`` picks one.  The gate reads ``results.json``; the tests set
the candidate's scores there, so the verdict does not hang on how the tiny run happened to train."""

import json
import os

import flax.serialization
import jax
import numpy as np
import pytest
from absl import flags
from fastapi.testclient import TestClient

from cvs_jax import export, info, search
from cvs_jax.retrieval import gate, run_reader
from cvs_jax.rundir import paths
from cvs_jax.serve.app import create_app
from cvs_jax.serve.state import Served
from cvs_jax.testing import image_folders


@pytest.fixture
def run_to_copy(photo_runs):
    """What ``run_copy`` copies: the two-session run."""
    return photo_runs[1]


@pytest.fixture
def never_served(run_copy):
    """The copy as a run no server has served: without the record a test serving the shared run may have left."""
    if os.path.exists(paths.served_file(run_copy)):
        os.remove(paths.served_file(run_copy))
    return run_copy


def _scores(workdir: str, passes: bool | None) -> None:
    """Session 2's scores in results.json: within the gate's thresholds (``passes``), 60 points of recall@1
    lost on session 1's rows (not ``passes``), or none at all (None: a run whose end was never scored)."""
    path = paths.results_file(workdir)
    with open(path) as f:
        results = json.load(f)
    if passes is None:
        results.pop("compatibility_recall1")
    else:
        results["compatibility_recall1"] = [[0.9, None], [0.9 if passes else 0.3, 0.8]]
        results["negative_flip_rate"] = [0.0]
    with open(path, "w") as f:
        json.dump(results, f)


def _command(module, *args: str) -> int:
    fv = flags.FlagValues()
    module.define_flags(fv)
    return module.main(fv([module.__name__, *args]), fv)


def _search(workdir, query, capsys, *flags_):
    capsys.readouterr()
    assert _command(search, "--workdir", workdir, "--images", query, "--k", "3", "--json", *flags_) == 0
    out = capsys.readouterr()
    return json.loads(out.out)[0], out.err.strip().splitlines()


def _query(photo_runs):
    return os.path.join(photo_runs[2], "test", "dog", sorted(os.listdir(os.path.join(photo_runs[2], "test", "dog")))[0])


def test_search_export_and_info_use_the_model_the_gate_keeps(photo_runs, never_served, tmp_path, capsys):
    run_copy = never_served
    query = _query(photo_runs)
    _scores(run_copy, passes=False)
    answer, err = _search(run_copy, query, capsys)
    assert answer["model_session"] == 1
    assert len(err) == 1 and err[0].startswith("note: queries are embedded by the model of session 1, not the newest")
    assert "gate kept session 2 out (session 2: BC -60.00 points < -20)" in err[0] and "--session 2" in err[0]
    older = run_reader.Run(run_copy, model_session=0)
    want = older.search(run_reader.load_images([query], older.image_shape), k=3)[0]
    assert [h["row"] for h in answer["hits"]] == [h["row"] for h in want]
    for flag in ("newest", "2", " 2"):
        answer, err = _search(run_copy, query, capsys, "--session", flag)
        assert answer["model_session"] == 2 and err == []
    answer, err = _search(run_copy, query, capsys, "--session", "1")
    assert answer["model_session"] == 1 and err == []
    # a refusal is still its one error line, without the note
    html = str(tmp_path / "hits.html")
    assert search.search_or_add(run_copy, [query], label="no such class", html=html) == 2
    assert search.search_or_add(run_copy, [str(tmp_path / "missing.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("error: ") for line in err), err
    for bad, says in (("0", "pass a session number"), ("two", "pass a session number"), ("3", "not a completed")):
        assert _command(search, "--workdir", run_copy, "--images", query, "--session", bad) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:") and says in err[0], err

    # export ships that model, and says so
    out = str(tmp_path / "export")
    assert _command(export, "--workdir", run_copy, "--out", out) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("note: the export holds the model of session 1, not the newest (2)")
    with open(os.path.join(out, "export.json")) as f:
        assert json.load(f)["session"] == 1
    with open(os.path.join(out, "model.msgpack"), "rb") as f:
        assert f.read() == flax.serialization.to_bytes(jax.device_get(older.variables))
    assert export.load(out).embed([query]).shape == (1, older.gallery.embed_dim)

    # info names it under its first line
    assert _command(info, "--workdir", run_copy, "--json") == 0
    described = json.loads(capsys.readouterr().out)
    assert described["served_model_session"] == 1 and "gate kept session 2 out" in described["served_model_note"]
    assert _command(info, "--workdir", run_copy) == 0
    assert (
        capsys.readouterr().out.splitlines()[1].startswith("note: search, export and serve use the model of session 1")
    )

    # an add is embedded by that model, as the server's /add embeds with the model it serves
    new = image_folders.new_photo(tmp_path / "new ant.png")
    assert search.search_or_add(run_copy, [new], add=True, label="ant") == 0
    added = run_reader.Run(run_copy, model_session=0)
    assert added.describe(len(added.gallery))["model_session"] == 1


def test_the_newest_model_when_the_gate_passes_it_or_nothing_scored_it_and_a_recorded_pin(
    photo_runs, never_served, capsys
):
    query, run_copy = _query(photo_runs), never_served
    for passes in (True, None):
        _scores(run_copy, passes=passes)
        answer, err = _search(run_copy, query, capsys)
        assert answer["model_session"] == 2 and err == []
        decisions = [v["decision"] for v in gate.served_model(run_copy, 1).verdicts]
        assert decisions == ([] if passes is None else ["switched"])  # nothing scored: no verdict, the newest
    # a pin a server recorded holds for search too, past a gate that would switch
    _scores(run_copy, passes=True)
    with open(paths.served_file(run_copy), "w") as f:
        json.dump({"model_session": 0, "gallery_session": 1, "pinned_session": 0}, f)
    answer, err = _search(run_copy, query, capsys)
    assert answer["model_session"] == 1 and len(err) == 1 and "a server pinned it" in err[0]


def test_a_server_started_on_a_run_never_served_serves_what_search_uses(photo_runs, never_served, capsys):
    """It served the newest model, kept out or not; now its first start takes session 2 through the gate, as
    ``search`` does, and answers as ``search --json`` does."""
    query, run_copy = _query(photo_runs), never_served
    _scores(run_copy, passes=False)
    cli, _ = _search(run_copy, query, capsys)
    served = Served(run_copy, poll_s=0)
    try:
        client = TestClient(create_app(served))
        assert client.get("/healthz").json()["model_session"] == 1
        verdict = client.get("/info").json()["gate"]
        assert (verdict["candidate_session"], verdict["decision"]) == (2, "kept")
        (api,) = client.post("/search", params={"k": 3}, files=image_folders.uploads([query])).json()["queries"]
        assert api["model_session"] == cli["model_session"] == 1
        assert [h["id"] for h in api["hits"]] == [h["id"] for h in cli["hits"]]
        np.testing.assert_allclose([h["score"] for h in api["hits"]], [h["score"] for h in cli["hits"]], atol=1e-5)
    finally:
        served.close()
