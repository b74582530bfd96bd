"""One tiny two-session run of your own photos (``main`` then ``update``, CVS with replay), read the ways a
user reads it: ``info``, ``report.html``, ``search`` (folders, ``--html``, ``--add``) and the refusals
around it.  The counts per session are checked against the gallery's own columns on a run whose
sessions differ, so a count taken from the wrong session shows."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import unicodedata

import numpy as np
import pytest
from PIL import Image

from cvs_jax import info, search, update
from cvs_jax.engine import runner
from cvs_jax.errors import UserError
from cvs_jax.reports import columns, run_page
from cvs_jax.retrieval import compatibility, run_reader, run_rows
from cvs_jax.rundir import paths
from cvs_jax.rundir import workdir as workdir_lib
from cvs_jax.testing import image_folders as pf


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The run (session 1: ant, bee, cat; session 2: dog, ant again and kiwi with 2 photos), its folders and
    what the update printed."""
    root = tmp_path_factory.mktemp("photo_sessions")
    day1 = pf.write_folder(root / "day1", pf.SESSIONS[0], 4, seed=0)
    day2 = pf.write_folder(root / "day2", {**pf.SESSIONS[1], "kiwi": 2}, 4, seed=1)
    day3 = pf.write_folder(root / "day3", pf.SESSIONS[2], 4, seed=2)
    c = pf.folder_config(root, day1)
    c.method = "cvs"
    wd = str(root / "run")
    runner.run(c, wd)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert update.update(wd, day2) == 0
    return {"workdir": wd, "day1": day1, "day2": day2, "day3": day3, "root": root, "update_out": out.getvalue()}


@pytest.fixture
def run_to_copy(run):
    """What ``run_copy`` (tests/conftest.py) copies."""
    return run["workdir"]


def _results(wd) -> dict:
    with open(paths.results_file(wd)) as f:
        return json.load(f)


def _protocol(wd) -> dict:
    with open(paths.protocol_file(wd)) as f:
        return json.load(f)


def _rows_by_model(wd) -> list[int]:
    last, rows = run_page.stored_rows(wd)
    counts = [int(np.sum(rows.model == s)) for s in range(last + 1)]
    assert last == 1 and counts[0] != counts[1]  # sessions of different sizes: a wrong session shows
    return counts


# --- counts per session -----------------------------------------------------------------------------------


def test_report_gallery_rows_per_session_are_each_models_rows(run):
    wd = run["workdir"]
    page = run_page.render(wd)
    shown = {int(s): int(n) for s, n in re.findall(r'data-gallery-rows="(\d+)">(\d+)<', page)}
    assert shown == {s + 1: n for s, n in enumerate(_rows_by_model(wd))}


def test_info_rows_per_model_are_each_models_rows(run):
    got = info.describe(run["workdir"])
    counts = _rows_by_model(run["workdir"])
    assert [s["gallery_rows_by_its_model"] for s in got["sessions"]] == counts
    assert sum(counts) == got["gallery_rows"]


def test_info_on_a_run_stopped_mid_protocol_says_the_classes_learnt_so_far(run, run_copy):
    """An update killed in session 2 (its protocol written, no session-2 checkpoint, no results.json): info
    says the 3 classes of session 1 were learnt of the 5 planned, and marks dog and kiwi as planned only (the
    header said "5 classes", the plan's count, as if the gallery held them)."""
    shutil.rmtree(os.path.join(paths.sessions_dir(run_copy), "1"))
    os.remove(paths.results_file(run_copy))
    got = info.describe(run_copy)
    assert (got["sessions_completed"], len(got["sessions"]), got["classes_learnt"], len(got["classes"])) == (1, 2, 3, 5)
    text = info.format_info(got)
    assert "1 of 2 session(s) completed, 3 classes learnt so far, of 5 planned, gallery" in text
    planned = {line.split()[0] for line in text.splitlines() if line.endswith("(planned: not learnt yet)")}
    assert planned == {"dog", "kiwi"}
    assert "2 of 2 session(s) completed, 5 classes, gallery" in info.format_info(info.describe(run["workdir"]))


def test_info_aligns_wide_and_combining_class_names(run):
    got = info.describe(run["workdir"])
    got["classes"][0]["class_name"], got["classes"][1]["class_name"] = "猫", unicodedata.normalize("NFD", "crème")
    text = info.format_info(got).split("classes (gallery rows, session of first arrival):\n")[1].split("\n\n")[0]
    ends = {columns.width(line) - columns.width(line.split()[-1]) for line in text.splitlines()}  # the rows column
    assert len(ends) == 1, text


def test_new_images_and_trained_on_are_named_apart(run, capsys):
    wd = run["workdir"]
    per, protocol = _results(wd)["per_session"], _protocol(wd)
    for r, sess in zip(per, protocol["sessions"]):
        assert r["new_images"] == sess["train"]
    assert per[1]["trained_on_images"] > per[1]["new_images"]  # CVS replays session 1's memory
    got = info.describe(wd)
    assert [s["new_images"] for s in got["sessions"]] == [s["train"] for s in protocol["sessions"]]
    assert [s["trained_on_images"] for s in got["sessions"]] == [r["trained_on_images"] for r in per]
    text = info.format_info(got)
    assert (
        f"session 2: {per[1]['new_images']} new training images ({per[1]['trained_on_images']} trained on, "
        "replay included)" in text
    )
    page = run_page.render(wd)
    assert "new training images" in page and "trained on (replay incl.)" in page
    assert f"<td>{per[1]['new_images']}</td><td>{per[1]['trained_on_images']}</td>" in page
    # a results.json written before the new names: its train_images is what the session trained on
    assert run_rows.trained_on({"train_images": 390}) == 390


def test_summaries_agree_in_results_info_and_page(run):
    wd = run["workdir"]
    res = _results(wd)
    matrix = res["compatibility_recall1"]
    bc = 100 * compatibility.mean_drop(matrix)
    assert res["compatibility_bc_points"] == pytest.approx(bc) and "compatibility_mean_drop" not in res
    nfr = compatibility.mean_flips(res["negative_flip_rate"])
    text = info.format_info(info.describe(wd))
    ac, am = compatibility.average_compatibility(matrix), compatibility.average_multimodel_accuracy(matrix)
    assert f"BC {bc:+.2f} points" in text and f"AC {100 * ac:.1f} %" in text and f"AM {100 * am:.1f} %" in text
    assert f"NFR {100 * nfr:.1f} %" in text
    assert "the diagonal can differ from it" in text  # the matrix's queries are not a session's R@1 queries
    page = run_page.render(wd)  # AC in % as in the text and compare's tables (it was a share here and there)
    summaries = dict(re.findall(r'data-summary="(\w+)">([^<]*)<', page))
    assert summaries == {
        "BC": f"{bc:+.2f}",
        "AC": f"{100 * ac:.2f}",
        "AM": f"{100 * am:.2f}",
        "NFR": f"{100 * nfr:.2f}",
    }
    assert "the diagonal can differ from it" in page
    # an older results.json held BC as a fraction under compatibility_mean_drop: read in points
    assert compatibility.bc_points({"compatibility_mean_drop": -0.3408}) == pytest.approx(-34.08)
    assert compatibility.bc_points({}) is None


# --- what a user looks for -----------------------------------------------------------------------------------


def test_update_warns_about_a_new_class_with_very_few_photos(run):
    lines = [line for line in run["update_out"].splitlines() if line.startswith("warning: new class")]
    assert len(lines) == 1 and lines[0].startswith("warning: new class 'kiwi' has only 2 train photo(s)")


def test_search_takes_a_folder_and_html_counts_top1_of_the_querys_class(run, tmp_path, capsys):
    wd, test_dir = run["workdir"], os.path.join(run["day2"], "test")
    files = sorted(os.path.join(d, n) for d, _, names in os.walk(test_dir) for n in names)
    assert search.search_or_add(wd, [test_dir], as_json=True) == 0
    got = json.loads(capsys.readouterr().out)
    assert [q["query"] for q in got] == files
    top1 = sum(q["hits"][0]["class_name"] == os.path.basename(os.path.dirname(q["query"])) for q in got)
    out = str(tmp_path / "hits.html")
    assert search.search_or_add(wd, [test_dir], html=out) == 0
    want = f"top-1 of the query's class: {top1} of {len(files)}"
    assert want in capsys.readouterr().err
    with open(out) as f:
        assert want.replace("'", "&#x27;") in f.read()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert search.search_or_add(wd, [str(empty)]) == 2
    assert capsys.readouterr().err.startswith(f"error: --images {empty} is a folder without image files")


# --- search --add: the same bytes never twice ------------------------------------------------------------------


def _new_png(path, seed: int) -> str:
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(path)
    return str(path)


def test_add_refuses_two_identical_new_files_in_one_call(run_copy, tmp_path, capsys):
    a = _new_png(tmp_path / "a.png", 0)
    b = str(tmp_path / "b.png")
    shutil.copyfile(a, b)
    assert search.search_or_add(run_copy, [a, b], add=True, label="dog") == 2
    assert "already in the run (same bytes)" in capsys.readouterr().err
    assert len(run_reader.Run(run_copy).added) == 0  # all or none
    assert search.search_or_add(run_copy, [a], add=True, label="dog") == 0


@pytest.mark.parametrize("split", ["train", "test"])
def test_add_refuses_the_bytes_of_a_train_or_test_image(run, run_copy, tmp_path, split, capsys):
    folder = os.path.join(run["day2"], split, "dog")
    known = str(tmp_path / "known.png")
    shutil.copyfile(os.path.join(folder, sorted(os.listdir(folder))[0]), known)
    assert search.search_or_add(run_copy, [known], add=True, label="dog") == 2
    assert "already in the run (same bytes)" in capsys.readouterr().err


# --- messages -----------------------------------------------------------------------------------------------


def test_second_update_while_one_runs_names_the_holder(run, run_copy, capsys):
    config_path = paths.config_file(run_copy)
    with open(config_path) as f:
        stored = json.load(f)
    stored["data"]["updates"].append(os.path.join(str(run["root"]), "arriving"))  # what a running update wrote
    with open(config_path, "w") as f:
        json.dump(stored, f)
    with workdir_lib.hold(run_copy):
        assert update.update(run_copy, run["day3"]) == 2
    err = capsys.readouterr().err
    assert f"is in use by pid {os.getpid()}" in err and "finish it first" not in err


def test_re_adding_the_first_folder_names_its_session(run, run_copy, capsys):
    assert update.update(run_copy, run["day1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {run['day1']} is the folder {run_copy} started with (session 1)")
    assert update.update(run_copy, run["day2"]) == 2
    assert "(update 1: session 2)" in capsys.readouterr().err


def test_a_misspelt_label_gets_the_close_class_name(run, capsys):
    query = os.path.join(run["day2"], "test", "dog", sorted(os.listdir(os.path.join(run["day2"], "test", "dog")))[0])
    assert search.search_or_add(run["workdir"], [query], html=os.devnull, label="Dgo") == 2
    assert "did you mean 'dog'?" in capsys.readouterr().err
    assert search.search_or_add(run["workdir"], [query], html=os.devnull, label="zebra") == 2
    assert "did you mean" not in capsys.readouterr().err


def test_a_decompression_bomb_query_is_told_it_is_too_large(run, tmp_path, capsys, monkeypatch):
    big = _new_png(tmp_path / "big.png", 1)  # 480 pixels: a bomb under a limit of 200
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    assert search.search_or_add(run["workdir"], [big]) == 2
    err = capsys.readouterr().err
    assert "too large to decode safely" in err and "pass PNG/JPEG" not in err


def test_a_refused_main_leaves_no_folder_behind(run, tmp_path):
    c = pf.folder_config(tmp_path, run["day1"])
    c.train.batch_size = 4096  # more than a session holds: refused by the data checks, after the lock
    where = tmp_path / "new" / "runs" / "wd"
    with pytest.raises(UserError, match="train.batch_size"):
        runner.run(c, str(where))
    assert not (tmp_path / "new").exists()
    existing = tmp_path / "existing"
    existing.mkdir()
    with pytest.raises(UserError, match="train.batch_size"):
        runner.run(c, str(existing))
    assert existing.is_dir()  # a folder that was there stays
