"""The comparison runner: every method in the table, session 1 trained once and reused exactly."""

import copy
import csv
import json
import math
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from cvs_jax.config import stored
from cvs_jax.engine import comparison, runner
from cvs_jax.engine.context_builder import build_context
from cvs_jax.errors import ConfigError, NonFiniteError, WorkdirBusyError
from cvs_jax.methods.registry import get_method
from cvs_jax.reports import statistics
from cvs_jax.rundir import workdir
from cvs_jax.rundir.run_log import RunLog
from cvs_jax.testing.tiny_data import tiny_config


def test_runner_table_and_shared_first_session(fashion_idx, tmp_path, capsys):
    manual = fashion_idx(60, 10)
    c = tiny_config(manual, tmp_path, sessions=2)
    c.train.epochs = 1
    wd = str(tmp_path / "cmp")
    # one method of each kind the runner tells apart: the first of each head (finetune, rainbow), one that shares
    # session 1 (cvs), one that re-embeds (joint), fork EWC (its own session 1) and a contrast (@linear_reset);
    # every other method's comparison run: tests/runs/test_methods_kill.py, test_methods_rerun.py (slow)
    methods = ["finetune", "cvs", "joint", "ewc", "rainbow", "finetune@linear_reset"]
    rows = runner.run_comparison(c, wd, methods, [0])
    assert [r["method"] for r in rows] == methods
    with open(os.path.join(wd, "comparison.md")) as f:
        table = f.read()
    for m in methods:
        assert f"| {m} |" in table
    assert "| finetune | 1 | n/a | n/a | n/a | n/a |" in table  # one seed: no interval (AR@1, 2, 4 and BC)
    assert "| finetune@linear_reset - finetune | head effect of finetune | 1 |" in table
    with open(os.path.join(wd, "comparison.csv")) as f:
        assert [r["method"] for r in csv.DictReader(f)] == methods
    with open(os.path.join(wd, "comparison.json")) as f:
        out = json.load(f)
    assert [(r["seed"], r["method"], r["status"]) for r in out["runs"]] == [(0, m, "ok") for m in methods]
    assert [e["method"] for e in out["summary"]] == methods
    heads = {r["method"]: r["head"] for r in out["runs"]}
    assert heads["ewc"] == heads["rainbow"] == heads["finetune@linear_reset"] == "linear_reset"
    assert heads["finetune"] == heads["cvs"] == "cosine"
    ties = any(r["AC"] != r["AC ties pass"] for r in out["runs"])  # a tie M[1][0] == M[0][0]: both AC columns
    ac = "AC | AC ties pass" if ties else "AC"
    assert f"| method | memory | AR@1 | AR@2 | AR@4 | mAP | BC | {ac} | AM | NFR |" in table
    for r in out["runs"]:  # the BC summary is compatibility.mean_drop of the run's own matrix, in points
        with open(os.path.join(wd, r["workdir"], "results.json")) as f:
            results = json.load(f)
        matrix = results["compatibility_recall1"]
        if r["method"] == "joint":  # re-embeds its gallery: no old part left to measure
            assert r["BC"] is None and r["AC"] is None and r["NFR"] is None and matrix[1][0] is None
        else:
            assert r["BC"] == pytest.approx(100 * (matrix[1][0] - matrix[0][0]))
            assert r["AC"] == (100.0 if matrix[1][0] > matrix[0][0] else 0.0)  # one update: one pair
            assert r["AC ties pass"] == (100.0 if matrix[1][0] >= matrix[0][0] else 0.0)  # CoReS: a tie passes
            assert r["NFR"] == pytest.approx(100 * results["negative_flip_rate"][0])
        assert r["AM"] == pytest.approx(100 * np.nanmean([v for row in matrix for v in row if v is not None]))
        assert r["mAP"] == pytest.approx(100 * np.mean([s["map"] for s in results["per_session"]]))
    assert os.path.getsize(os.path.join(wd, "comparison.png")) > 0
    with open(os.path.join(wd, "comparison.html")) as f:  # the same on one page (tests/runs/test_report_pages.py)
        page = f.read()
    for e in out["summary"]:
        assert f'data-ar="{e["method"]}:1">{e["average_recall"]["1"]["mean"]:.2f}' in page
    # session 1 was trained once per head: every method of a head that shares it reports the same
    # session-1 recall, and the two heads' session 1 differ ...
    shared = [m for m in methods if get_method(comparison.entry_config(c, m, 0, None)).shares_first_session]
    assert "finetune" in shared and "cvs" in shared and "rainbow" in shared
    first = {r["method"]: r["recall1_per_session"][0] for r in rows if r["method"] in shared}
    assert len({first[m] for m in shared if heads[m] == "cosine"}) == 1
    assert first["rainbow"] == first["finetune@linear_reset"]
    out = capsys.readouterr().out
    trained = {"finetune", "rainbow", "ewc"}  # first of each head, and fork EWC (its own)
    for m in methods:
        assert (f"== session 1/2 [{m.split('@')[0]}, {heads[m]} head]" in out) == (m in trained), m
    # ... and reusing it changes nothing: cvs from scratch gives the same results.
    c.method = "cvs"
    alone = runner.run(c, str(tmp_path / "cvs_alone"))
    shared = [r for r in rows if r["method"] == "cvs"][0]
    assert [100 * s["recall"]["1"] for s in alone["per_session"]] == pytest.approx(shared["recall1_per_session"])


def _with_method(config, method):
    c = copy.deepcopy(config)
    c.method = method
    return c


def test_unknown_method_refused(tmp_path):
    c = tiny_config(str(tmp_path), tmp_path, sessions=2)
    with pytest.raises(ConfigError, match="unknown methods"):
        runner.run_comparison(c, str(tmp_path / "cmp"), ["finetune", "lwf2"], [0])


@pytest.mark.parametrize(
    "methods, population, field, message",
    [
        (["finetune", "cvs"], False, ("memory", "budget", 1), "memory.budget=1 is smaller than the 6 classes"),
        (["finetune", "rainbow"], True, None, "population=2 is not supported for method='rainbow'"),
    ],
)
def test_every_entry_is_checked_before_the_first_run(tmp_path, monkeypatch, methods, population, field, message):
    """A field the last entry cannot take stops compare before the first entry trains (it used to be
    refused only when that entry's turn came, after the earlier ones had run)."""

    def no_run(*args, **kwargs):
        raise AssertionError("a run started before every entry was checked")

    monkeypatch.setattr(runner, "run", no_run)
    monkeypatch.setattr(runner, "run_population", no_run)
    c = tiny_config(str(tmp_path), tmp_path, sessions=2)
    if field is not None:
        c[field[0]][field[1]] = field[2]
    wd = tmp_path / "cmp"
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        runner.run_comparison(c, str(wd), methods, [0, 1], population=population)
    assert not wd.exists()


def test_tabulate_reads_a_running_comparison_and_writes_nothing(tmp_path, capsys):
    """``--tabulate`` on a DIR a running comparison holds (here: this process, through a second lock of the
    file) prints the tables of the runs finished so far and leaves DIR's files to that comparison; it was
    refused naming the holder, although ``compare --help`` says a long comparison can be read while it runs."""
    c = tiny_config(str(tmp_path), tmp_path, sessions=2)
    wd = tmp_path / "cmp"
    with workdir.hold(str(wd)):
        before = sorted(os.listdir(wd))
        rows = runner.run_comparison(c, str(wd), ["finetune", "cvs"], [0, 1], tabulate=True)
        assert sorted(os.listdir(wd)) == before  # no comparison.md/.csv/.json/.html/.png
    assert [r["method"] for r in rows] == ["finetune", "cvs"]
    out = capsys.readouterr().out
    assert f"{wd} is held by a running comparison: the tables of the runs finished so far are printed" in out
    assert "| method | memory |" in out and "| finetune |" in out
    with pytest.raises(WorkdirBusyError):  # a comparison that would run is still refused
        with workdir.hold(str(wd)):
            runner.run_comparison(c, str(wd), ["finetune"], [0])


def test_no_entry_or_no_seed_is_refused_leaving_the_tables(tmp_path):
    """``--methods ""`` or ``--seeds ""`` is one error (it was an IndexError, after the empty method list
    had overwritten a finished comparison's comparison.md with an empty table); so is a seed named twice
    (``--seeds 0,0`` ran seed 0 once while an entry named twice was refused)."""
    c = tiny_config(str(tmp_path), tmp_path, sessions=2)
    wd = tmp_path / "cmp"
    wd.mkdir()
    (wd / "comparison.md").write_text("the finished comparison\n")
    cases = (
        ([], [0], "--methods names no entry"),
        (["finetune"], [], "--seeds names no seed"),
        (["finetune"], [0, 1, 0], "--seeds 0,1,0 names a seed twice"),
    )
    for methods, seeds, what in cases:
        for tabulate in (False, True):
            with pytest.raises(ConfigError, match=what):
                runner.run_comparison(c, str(wd), methods, seeds, tabulate=tabulate)
    assert sorted(os.listdir(wd)) == ["comparison.md"]
    assert (wd / "comparison.md").read_text() == "the finished comparison\n"


# ---------------------------------------------------------------- statistics


@pytest.mark.parametrize(
    "df, expected",
    [(1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (5, 2.571), (10, 2.228), (20, 2.086), (30, 2.042), (120, 1.980)],
)
def test_t_quantile_matches_the_tables(df, expected):
    assert statistics.t_quantile(0.975, df) == pytest.approx(expected, abs=6e-4)


def test_t_quantile_closed_forms_normal_limit_and_symmetry():
    for p in (0.6, 0.9, 0.975, 0.995, 0.9995):
        assert statistics.t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-9)  # Cauchy
        assert statistics.t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-9)
        assert statistics.t_quantile(1 - p, 7) == pytest.approx(-statistics.t_quantile(p, 7), rel=1e-12)
    assert statistics.t_quantile(0.975, math.inf) == pytest.approx(1.959964, abs=1e-6)
    assert statistics.t_quantile(0.975, 10_000) == pytest.approx(1.960201, abs=1e-5)
    for p in (0.0, 1.0):
        with pytest.raises(ValueError):
            statistics.t_quantile(p, 3)


def test_paired_difference_and_interval_on_three_seeds():
    cvs = {0: 70.0, 1: 72.0, 2: 71.0}
    d = statistics.paired_difference({0: 60.0, 1: 63.0, 2: 60.5}, cvs)  # differences -10, -9, -10.5
    diffs = [-10.0, -9.0, -10.5]
    mean = sum(diffs) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in diffs) / 2)
    half = 4.302653 * sd / math.sqrt(3)
    assert d["n"] == 3 and d["per_seed"] == {"0": -10.0, "1": -9.0, "2": -10.5}
    assert d["mean"] == pytest.approx(mean) and d["std"] == pytest.approx(sd)
    assert d["ci95"] == pytest.approx([mean - half, mean + half], abs=1e-5)
    assert d["significant"] is True
    assert statistics.format_difference(d) == f"{mean:+.2f} [{mean - half:+.2f}, {mean + half:+.2f}] significant"
    # differences of both signs: the interval holds 0
    d = statistics.paired_difference({0: 71.0, 1: 71.0, 2: 71.5}, cvs)  # +1, -1, +0.5
    assert d["ci95"][0] < 0 < d["ci95"][1] and d["significant"] is False
    assert statistics.format_difference(d).endswith("not significant")
    # one seed (or one seed in common): no interval
    d = statistics.paired_difference({0: 60.0, 5: 1.0}, cvs)
    assert d["n"] == 1 and d["mean"] == -10.0 and d["ci95"] is None and d["significant"] is None
    assert statistics.format_difference(d) == "n/a"


# ---------------------------------------------------------------- diverged runs, fixed splits


def _fake_results(method, seed, ar1):
    per = [{"session": i, "recall": {"1": ar1 / 100, "2": ar1 / 100 + 0.05, "4": ar1 / 100 + 0.1}} for i in range(2)]
    return {
        "method": method,
        "dataset": "fashion_mnist_local",
        "setup": "general",
        "seed": seed,
        "per_session": per,
        "average_recall": {"1": ar1 / 100, "2": ar1 / 100 + 0.05, "4": ar1 / 100 + 0.1},
        "compatibility_recall1": [[ar1 / 100, None], [ar1 / 100 - 0.1, ar1 / 100]],  # BC: -10 points
    }


def test_diverged_run_is_marked_and_the_comparison_goes_on(tmp_path, monkeypatch):
    calls = []
    ar1 = {("cvs", 0): 70.0, ("cvs", 1): 72.0, ("cvs", 2): 71.0, ("finetune", 0): 60.0, ("finetune", 1): 63.0}
    ar1[("finetune", 2)] = 60.5

    def fake_run(config, workdir):
        calls.append((config.method, config.seed, config.split_seed))
        if config.method == "ewc":
            raise NonFiniteError(f"loss is NaN at session 2 of {workdir}")
        if config.method == "lwf" and config.seed == 2:
            raise NonFiniteError("embedding is inf at session 2")
        out = _fake_results(config.method, config.seed, ar1.get((config.method, config.seed), 50.0 + config.seed))
        if config.method != "lwf" or config.seed != 1:  # lwf seed 1: as if still running (no results.json yet)
            os.makedirs(workdir, exist_ok=True)
            with open(os.path.join(workdir, "results.json"), "w") as f:
                json.dump(out, f)
        return out

    monkeypatch.setattr(runner, "run", fake_run)
    c = tiny_config(str(tmp_path), tmp_path, sessions=2)
    wd = str(tmp_path / "cmp")
    rows = runner.run_comparison(c, wd, ["finetune", "ewc", "lwf", "cvs"], [0, 1, 2], split_seed=7)
    assert len(calls) == 12 and {s for _, _, s in calls} == {7}  # every run, all on split 7
    by = {r["method"]: r for r in rows}
    assert by["ewc"]["seeds"] == 0 and by["ewc"]["diverged"] == 3 and by["ewc"]["AR@1"] is None
    assert by["lwf"]["seeds"] == 2 and by["lwf"]["diverged"] == 1
    assert by["finetune"]["AR@1 - cvs significant"] is True
    assert by["cvs"]["AR@1 - cvs"] is None
    with open(os.path.join(wd, "comparison.md")) as f:
        table = f.read()
    assert "| ewc | diverged | diverged | diverged |" in table
    assert "(seed 2 diverged)" in table  # lwf: mean of the other two seeds, marked
    assert "split_seed=7" in table
    assert "- seed 2, lwf: embedding is inf at session 2" in table
    assert "| lwf | 2 | " in table  # paired with cvs on its two finished seeds
    with open(os.path.join(wd, "comparison.json")) as f:
        out = json.load(f)
    assert out["split_seed"] == 7 and out["seeds"] == [0, 1, 2]
    status = {(r["method"], r["seed"]): r["status"] for r in out["runs"]}
    assert status[("ewc", 0)] == "diverged" and status[("lwf", 2)] == "diverged" and status[("cvs", 2)] == "ok"
    assert [r["message"] for r in out["runs"] if r["method"] == "ewc"][0].startswith("loss is NaN")
    summary = {e["method"]: e for e in out["summary"]}
    assert summary["finetune"]["average_recall"]["1"]["per_seed"] == {"0": 60.0, "1": 63.0, "2": 60.5}
    assert summary["finetune"]["vs_cvs"]["1"]["per_seed"] == {"0": -10.0, "1": -9.0, "2": -10.5}
    assert summary["lwf"]["diverged"] == {"2": "embedding is inf at session 2"}
    with open(os.path.join(wd, "comparison.csv")) as f:
        csv_rows = {r["method"]: r for r in csv.DictReader(f)}
    assert csv_rows["ewc"]["diverged"] == "3" and csv_rows["ewc"]["AR@1"] == ""
    assert csv_rows["finetune"]["AR@1 - cvs significant"] == "True"

    # --tabulate runs nothing and reads the same numbers back from the run dirs (lwf seed 1 not finished)
    calls.clear()
    rows2 = runner.run_comparison(c, wd, ["finetune", "ewc", "lwf", "cvs"], [0, 1, 2], split_seed=7, tabulate=True)
    assert calls == []
    by2 = {r["method"]: r for r in rows2}
    assert by2["finetune"] == by["finetune"] and by2["ewc"]["diverged"] == 3
    assert by2["lwf"]["seeds"] == 1 and by2["lwf"]["diverged"] == 1
    runner.run_comparison(c, wd, ["finetune", "cvs", "bct"], [0, 1], split_seed=7, tabulate=True)
    with open(os.path.join(wd, "comparison.md")) as f:
        assert "| bct | not run | not run | not run | not run |" in f.read()  # never run is not "diverged"
    with open(os.path.join(wd, "seed0", "ewc", "diverged.json")) as f:
        assert json.load(f)["message"].startswith("loss is NaN")

    # any other error still stops the comparison
    def broken(config, workdir):
        raise RuntimeError("a bug")

    monkeypatch.setattr(runner, "run", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        runner.run_comparison(c, str(tmp_path / "cmp2"), ["finetune"], [0])


def test_a_comparison_whose_every_run_diverged_keeps_its_ar_columns(tmp_path, monkeypatch):
    """Every run stopped by the NaN guard (``--config.train.lr=1e12``): the tables keep the config's AR@K columns
    with "diverged" cells, as written and as ``--tabulate`` reads the diverged.json records back (the K came
    from the first finished run only, and the AR@K columns vanished)."""

    def diverging(config, workdir):
        raise NonFiniteError(f"loss is NaN at session 1 step 3 of {workdir}")

    monkeypatch.setattr(runner, "run", diverging)
    c = tiny_config(str(tmp_path), tmp_path, sessions=2)
    c.eval.ks = (1, 5)
    wd = str(tmp_path / "cmp")
    for tabulate in (False, True):
        rows = runner.run_comparison(c, wd, ["finetune", "cvs"], [0, 1], tabulate=tabulate)
        assert [(r["method"], r["seeds"], r["diverged"], r["AR@1"], r["AR@5"]) for r in rows] == [
            ("finetune", 0, 2, None, None),
            ("cvs", 0, 2, None, None),
        ]
        with open(os.path.join(wd, "comparison.md")) as f:
            lines = f.read().splitlines()
        header = next(line for line in lines if line.startswith("| method | memory |"))
        assert header.startswith("| method | memory | AR@1 | AR@5 | mAP | BC | AC | AM | NFR |"), header
        assert "| finetune | " + " | ".join(["diverged"] * 8) + " |" in lines
        assert "| finetune | 0 | " + " | ".join(["diverged"] * 7) + " |" in lines  # the paired table to cvs
        with open(os.path.join(wd, "comparison.csv")) as f:
            assert {r["method"]: (r["AR@1"], r["AR@5"]) for r in csv.DictReader(f)} == {
                "finetune": ("", ""),
                "cvs": ("", ""),
            }
        with open(os.path.join(wd, "comparison.json")) as f:
            assert list(json.load(f)["summary"][0]["average_recall"]) == ["1", "5"]
        with open(os.path.join(wd, "comparison.html")) as f:
            page = f.read()
        assert "AR@5 (%)" in page and 'data-ar="cvs:1">diverged<' in page


def test_split_seed_fixes_the_plan_while_seed_changes_the_initialisation(fashion_idx, tmp_path):
    manual = fashion_idx(60, 10)
    c = tiny_config(manual, tmp_path, sessions=2)
    assert c.split_seed is None  # default: the split follows the seed, as before
    assert "split_seed" in stored.comparable(c.to_dict())  # a result-changing field of config.json

    def build(seed, split_seed):
        cc = copy.deepcopy(c)
        cc.seed, cc.split_seed = seed, split_seed
        wd = str(tmp_path / f"run_{seed}_{split_seed}")
        os.makedirs(wd)
        log = RunLog(wd)
        ctx = build_context(cc, wd, log)
        try:
            return ctx.proto.plan, ctx.initial_variables()
        finally:
            ctx.close()
            log.close()

    def same_plan(a, b):
        return np.array_equal(a.class_order, b.class_order) and all(
            np.array_equal(x.train, y.train) and np.array_equal(x.val, y.val) for x, y in zip(a.sessions, b.sessions)
        )

    plan0, vars0 = build(0, 5)
    plan1, vars1 = build(1, 5)
    assert same_plan(plan0, plan1)  # one split ...
    leaves0, leaves1 = jax.tree_util.tree_leaves(vars0["params"]), jax.tree_util.tree_leaves(vars1["params"])
    assert any(not np.array_equal(a, b) for a, b in zip(leaves0, leaves1))  # ... two initialisations
    free0, _ = build(0, None)
    assert not same_plan(free0, plan0)  # without split_seed each seed draws its own split
    assert same_plan(build(5, None)[0], plan0)  # split_seed=5 is the plan seed 5 draws by default


def test_entries_heads_overrides_and_their_pairs(tmp_path):
    c = tiny_config(str(tmp_path), tmp_path, sessions=2)
    assert comparison.parse_entry("ewc@cosine+importance.mode=online+loss_weights.L_reg=10") == (
        "ewc",
        "cosine",
        {"importance.mode": "online", "loss_weights.L_reg": "10"},
    )
    e = comparison.entry_config(c, "cvs@linear_reset+cvs.use_lm=False+memory.budget=50+cvs.margin=0.2", 3, 0)
    assert (e.method, e.seed, e.split_seed, e.model.head) == ("cvs", 3, 0, "linear_reset")
    assert e.cvs.use_lm is False and e.memory.budget == 50 and e.cvs.margin == 0.2
    assert c.cvs.use_lm is True and c.model.head == "official"  # the base config is left alone
    for bad, why in (
        ("cvs+cvs.use_lm=maybe", "is a bool"),
        ("cvs+cvs.nope=1", "no field"),
        ("cvs+x", r"\+field=value"),
    ):
        with pytest.raises(ConfigError, match=why):
            comparison.entry_config(c, bad, 0, None)
    methods = ["finetune", "cvs", "ewc", "ewc@cosine", "cvs@linear_reset", "rainbow", "rainbow+rainbow.memory=herding"]
    assert comparison.entry_pairs(c, methods) == [
        ("rainbow+rainbow.memory=herding", "rainbow", "ablation of rainbow"),
        ("cvs@linear_reset", "cvs", "head effect of cvs"),
        ("ewc", "ewc@cosine", "head effect of ewc"),
        ("ewc", "cvs@linear_reset", "against cvs with the linear_reset head"),
        ("rainbow", "cvs@linear_reset", "against cvs with the linear_reset head"),
    ]
    with pytest.raises(ConfigError, match="after '@' name a head"):
        runner.run_comparison(c, str(tmp_path / "cmp"), ["ewc@linear"], [0])
    with pytest.raises(ConfigError, match="no field"):
        runner.run_comparison(c, str(tmp_path / "cmp"), ["cvs", "cvs+cvs.lm=1"], [0])


def test_ablation_entries_share_session_one_only_when_it_is_unchanged(tmp_path):
    c = tiny_config(str(tmp_path), tmp_path, sessions=2)
    source = tmp_path / "source"
    (source / "checkpoints" / "sessions" / "0").mkdir(parents=True)
    (source / "metrics.jsonl").write_text(json.dumps({"session": 1, "loss": 1.0}) + "\n")
    for entry, shared in (("cvs+cvs.use_lm=False", True), ("cvs+train.lr=0.1", False), ("ewc@cosine", False)):
        earlier = {(0, "cosine"): [str(source)]}
        target = tmp_path / entry
        runner._share_session_one(comparison.entry_config(c, entry, 0, 0), entry, 0, str(target), earlier)
        assert (target / "checkpoints" / "sessions" / "0").exists() == shared, entry


def test_compare_on_a_held_directory_is_refused_naming_the_holder(tmp_path, monkeypatch):
    """Another process (here: this one, through a second lock of the file) holds DIR: compare starts
    nothing and names the holder, from the library call and from the command line."""
    from configs import fashion_mnist_general

    def no_run(*args, **kwargs):
        raise AssertionError("a run started although DIR is held")

    monkeypatch.setattr(runner, "run", no_run)
    monkeypatch.setattr(runner, "run_population", no_run)
    wd = str(tmp_path / "cmp")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    config = fashion_mnist_general.get_config()
    config.data.manual_dir = str(tmp_path)  # a folder that exists: the entries' config checks pass
    with workdir.hold(wd):
        with pytest.raises(WorkdirBusyError, match=f"in use by pid {os.getpid()} on "):
            runner.run_comparison(config, wd, ["finetune"], [0])
        cmd = [sys.executable, "-m", "cvs_jax.compare", "--config", "configs/fashion_mnist_general.py"]
        cmd += ["--workdir", wd, "--methods", "finetune", "--seeds", "0", f"--config.data.manual_dir={tmp_path}"]
        out = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert f"in use by pid {os.getpid()} on " in out.stderr + out.stdout, out.stderr[-2000:]
    assert not os.path.exists(os.path.join(wd, "seed0")), "compare wrote a run while DIR was held"
