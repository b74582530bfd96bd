"""``benchmarks/learning_loop.py``: its day (adds with labels, new classes too, then the day's queries through
``/search``) on the serve tests' tiny photo run, checked against numpy; the whole benchmark at a minimal
size (three arms, real servers, sessions trained) is slow-marked."""

import os

import numpy as np
import pytest
from fastapi.testclient import TestClient

from cvs_jax.retrieval.run_reader import Run, load_images
from cvs_jax.serve.app import create_app
from cvs_jax.serve.state import Served
from cvs_jax.testing.image_folders import new_photos as _photos

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")
ZIP = os.path.join(BENCH, "..", "..", "shared", "data", "tiny-imagenet-200-mini.zip")


@pytest.fixture(scope="module")
def loop(benchmark_module):
    return benchmark_module("learning_loop")


def brute_force_top1(workdir: str, queries: dict[str, list[str]]) -> tuple[list[bool], list[int]]:
    """Top-1 of each query by numpy over every stored row (cosine, first row on a tie), queries embedded by
    the run's newest model: what R@1 "against everything stored" is."""
    run = Run(workdir)
    rows = np.asarray(run.rows.embeddings[: len(run.rows)], np.float64)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    names = run.class_names  # the protocol's, then the new classes only added rows carry
    correct, ids = [], []
    for name, paths in queries.items():
        q = np.asarray(run.embed(load_images(paths, run.image_shape)), np.float64)
        q /= np.linalg.norm(q, axis=1, keepdims=True)
        best = np.argmax(q @ rows.T, axis=1)
        correct += [names[run.rows.labels[b]] == name for b in best]
        ids += [int(run.ids[b]) for b in best]
    return correct, ids


def test_a_day_adds_new_and_known_classes_and_its_r1_is_numpys(loop, run_copy, tmp_path):
    served = Served(run_copy, poll_s=0, max_wait_s=0.02)
    client = TestClient(create_app(served, token=loop.TOKEN))
    days = [
        {"day": 0, "new": ["ant"], "returning": [], "train": {}, "queries": _photos(tmp_path / "q0", {"ant": 2}, 1)},
        {
            "day": 1,
            "new": ["eel"],
            "returning": ["bee"],
            "train": _photos(tmp_path / "t1", {"eel": 3, "bee": 2}, 50),
            "queries": _photos(tmp_path / "q1", {"eel": 3, "bee": 2, "ant": 2}, 90),
        },
    ]
    rows = loop.run_days(client, run_copy, days, learn=False)
    day = rows[1]
    assert day["add_failed"] == 0 and day["rows_added"] == 5 and day["rows_reembedded"] == 0
    assert day["gallery_rows"] == rows[0]["gallery_rows"] + 5 == len(Run(run_copy).rows)
    got = loop.top1_via_search(client, days[1]["queries"])
    want_correct, want_ids = brute_force_top1(run_copy, days[1]["queries"])
    assert got["ids"] == want_ids and got["correct"] == want_correct
    assert day["r1"] == pytest.approx(np.mean(want_correct)) and any(want_correct)  # eel is found by its name
    assert day["ar1"] == pytest.approx((rows[0]["r1"] + day["r1"]) / 2)
    served.close()


def test_rows_reembedded_counts_changed_rows_by_id(loop, photo_runs):
    one, two, _ = photo_runs  # a cvs update appends a part: no stored row changes
    before, after = loop.stored_embeddings(one), loop.stored_embeddings(two)
    assert len(after) > len(before) and loop.rows_reembedded(before, after) == 0
    changed = dict(after)
    changed[1] = b"\0" * len(changed[1])
    del changed[2]
    assert loop.rows_reembedded(before, changed) == 2


@pytest.mark.slow  # three arms, two servers' sessions trained: minutes on a CPU
@pytest.mark.skipif(not os.path.isfile(ZIP), reason="the Tiny-ImageNet mini zip (shared data) is not here")
def test_the_benchmark_at_a_minimal_size(loop, tmp_path):
    import json

    out = tmp_path / "loop"
    argv = ["--zip", ZIP, "--out", str(out), "--days", "1", "--base", "2", "--new", "1", "--returning", "1"]
    assert loop.main(argv + ["--train", "12", "--more", "6", "--queries", "4"]) == 0
    result = json.loads((out / "learning_loop.json").read_text())
    arms = {a["arm"]: a["days"] for a in result["arms"]}
    assert all(d["failed_requests"] == 0 for days in arms.values() for d in days)
    learning, frozen, joint = arms["learning"][1], arms["frozen"][1], arms["joint"][1]
    assert learning["rows_reembedded"] == 0 and learning["model_session"] == 2 and learning["decision"] == "switched"
    assert frozen["rows_reembedded"] == 0 and frozen["model_session"] == 1
    # day 0 added nothing: every row stored at the start of day 1 is a session row, and joint re-embeds them all
    assert joint["model_session"] == 2 and joint["rows_reembedded"] == joint["rows_before"] > 0
    photos = out / "photos" / "day1" / "queries"
    queries = {name: sorted(str(p) for p in (photos / name).iterdir()) for name in os.listdir(photos)}
    order = [n for n in result["days"][1]["new"] + result["days"][1]["returning"]]
    queries = {n: queries[n] for n in order}
    for arm, days in arms.items():  # each arm's day-1 R@1 is numpy's over its workdir as it was left
        correct, _ = brute_force_top1(str(out / arm / "run"), queries)
        assert days[1]["r1"] == pytest.approx(np.mean(correct)), arm
    for name in ("learning_loop.md", "learning_loop.csv", "learning_loop.html", "ar1_per_day.png"):
        assert (out / name).is_file()
