"""The later methods compared fairly (equal memory, CL²R's lambda, LCE's boundary term), without training:

* CL²R's lambda counts classes as its code does (a transcription of ``main.py`` 115-156: classes present in
  the task's data over ``memory.seen_classes``), on a general and a blurry plan; the old count
  ("introduced") stays a switch, and where it gives lambda = 0 the run's log says so;
* ``memory.rule``: the per-class random memory at cvs's budget keeps exactly cvs's count (``replay_sizes``,
  the count cvs's herding keeps), cvs herds ``memory.per_class`` of each class, CoReS at the budget becomes
  the random per-class memory; a method without memory refuses a rule;
* ``compare``'s table shows each entry's memory rows and rule; it pairs each memory-matched entry with
  its own entry and with cvs given its memory;
* LCE's boundary term: its activity on the stored rows (the log's line) and ``info``'s per-term summary,
  which marks a term that was 0 in every epoch.
"""

import json
import types

import numpy as np
import pytest

from cvs_jax import info
from cvs_jax.config import fashion_mnist_general
from cvs_jax.data import user_sessions
from cvs_jax.data.splits import make_session_plan
from cvs_jax.engine import comparison
from cvs_jax.errors import ConfigError
from cvs_jax.methods import lce, memory_rules, policies
from cvs_jax.methods.class_memory import PerClassRandomMemory
from cvs_jax.methods.registry import get_method
from cvs_jax.methods.seams import ReplayMemory
from cvs_jax.methods.simplex import CL2R_BASE, Cl2rWeight, cl2r_class_counts
from cvs_jax.reports import tables
from cvs_jax.retrieval import run_info

LABELS = np.repeat(np.arange(10), 60)


def _plan(setup):
    if setup == "general":  # 4 classes, then 2 new a session, old classes coming back
        return make_session_plan(
            LABELS, setup=setup, num_sessions=4, first_classes=4, classes_per_session=2, old_class_percent=20.0
        )
    return make_session_plan(LABELS, setup=setup, num_sessions=4, first_classes=2, classes_per_session=2)


def _original_lambdas(plan, labels):
    """CL²R's ``main.py`` 115-156 transcribed: before task t > 0, criterion_weight = 5 * sqrt(
    train_task_set.nb_classes / len(memory.seen_classes)); after it, memory.add(task t's samples)."""
    seen, out = set(), []
    for task_id, session in enumerate(plan.sessions):
        y = labels[session.train]
        if task_id > 0:
            out.append(5 * np.sqrt(len(np.unique(y)) / len(seen)))
        seen |= set(np.unique(y).tolist())
    return out


def _view(plan, lines=None):
    labels = plan.to_protocol_labels(LABELS)
    return types.SimpleNamespace(
        plan=plan, train_labels=labels, seed=0, log=(lines if lines is not None else []).append
    )


@pytest.mark.parametrize("setup", ["general", "blurry"])
def test_cl2r_lambda_counts_the_classes_present_as_its_code(setup):
    plan = _plan(setup)
    view = _view(plan)
    got = [CL2R_BASE * float(Cl2rWeight()(view, None, s)["cl2r_scale"]) for s in range(1, 4)]
    assert got == pytest.approx(_original_lambdas(plan, LABELS), rel=1e-6)
    if setup == "blurry":
        assert got == pytest.approx([5.0] * 3)  # every class present every session: the base itself


def test_the_introduced_count_is_a_switch_and_its_zero_is_said():
    general = _plan("general")
    new, old = cl2r_class_counts(general, _view(general).train_labels, 1, "introduced")
    assert (new, old) == (2, 4)  # the head's outputs: 2 classes introduced, 4 before
    assert cl2r_class_counts(general, _view(general).train_labels, 1, "present")[0] > 2  # old classes come back
    blurry, lines = _plan("blurry"), []
    out = Cl2rWeight("introduced")(_view(blurry, lines), None, 2)
    assert float(out["cl2r_scale"]) == 0.0
    assert len(lines) == 1 and "lambda = 0: no feature distillation" in lines[0]
    c = fashion_mnist_general.get_config()
    c.method, c.cl2r.class_count = "cl2r", "new"
    with pytest.raises(ConfigError, match="cl2r.class_count='new'"):
        get_method(c)


def _sizes(policy, plan, embed=None):
    view = _view(plan)
    view.embed = embed
    view.train_images = lambda idx: idx
    mem, sizes = ReplayMemory.empty(), []
    for s in range(1, plan.num_sessions):
        mem = policy.update(view, mem, None, s)
        sizes.append(np.bincount(mem.labels, minlength=10))
    return sizes


@pytest.mark.parametrize("setup", ["general", "blurry"])
def test_the_random_memory_at_the_budget_keeps_cvss_count(setup):
    plan = _plan(setup)
    sizes = _sizes(PerClassRandomMemory(budget=30), plan)
    cvs = user_sessions.replay_sizes(plan, _view(plan).train_labels, "class_quota", 30)[1:]
    assert [int(s.sum()) for s in sizes] == cvs
    assert all(s.sum() <= 30 for s in sizes)


def test_cvs_herds_per_class_without_a_budget():
    plan = _plan("general")
    rng = np.random.default_rng(0)
    emb = rng.normal(size=(LABELS.size, 4)).astype(np.float32)
    sizes = _sizes(policies.HerdingMemory(30, per_class=7), plan, embed=lambda v, idx: emb[idx])
    seen = [np.unique(_view(plan).train_labels[plan.joint_train(s - 1)]).size for s in range(1, 4)]
    assert [int(s.sum()) for s in sizes] == [7 * n for n in seen]  # 7 of every class, 28 > 30 // 4 at once


def test_memory_rule_swaps_the_size_rule_and_refuses_where_no_memory():
    c = fashion_mnist_general.get_config()
    got = {}
    for method, rule in [("cl2r", "budget"), ("cores", "budget"), ("cvs", "per_class"), ("hoc", "all")]:
        c.method, c.memory.rule = method, rule
        got[method] = get_method(c).memory
    assert got["cl2r"] == got["cores"] == PerClassRandomMemory(budget=c.memory.budget)
    assert got["cvs"] == policies.HerdingMemory(c.memory.budget, per_class=20)
    assert memory_rules.rule_of(got["hoc"]) == "all"
    c.method, c.memory.rule = "finetune", "budget"
    with pytest.raises(ConfigError, match="finetune keeps none"):
        get_method(c)
    c.method, c.memory.rule = "cvs", "half"
    with pytest.raises(ConfigError, match="memory.rule='half' is unknown"):
        get_method(c)


def test_compare_pairs_memory_matched_entries():
    c = fashion_mnist_general.get_config()
    hb = "+model.head_block=16"
    methods = ["cvs", "cl2r" + hb, "cores" + hb, "cl2r" + hb + "+memory.rule=budget", "cvs+memory.rule=per_class"]
    methods += ["cvs+memory.rule=all"]
    pairs = {(a, b) for a, b, _ in comparison.entry_pairs(c, methods)}
    assert pairs == {
        ("cl2r" + hb + "+memory.rule=budget", "cl2r" + hb),  # the memory's effect on cl2r
        ("cvs+memory.rule=per_class", "cvs"),
        ("cvs+memory.rule=all", "cvs"),
        ("cl2r" + hb, "cvs+memory.rule=per_class"),  # at equal memory: cvs given cl2r's
        ("cores" + hb, "cvs+memory.rule=all"),
    }


def test_lce_boundary_activity_on_the_stored_rows():
    """Raw rows with a large norm saturate the clamp (0 active); rows of norm < 1 fall inside the hinge;
    the normalised feature is never inside it on the rows that made theta."""
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(3), 20)
    rows = rng.normal(size=(60, 8)) + 3 * np.eye(8)[labels]
    centres, bounds, _ = lce.centres_and_boundaries(rows, labels, 3)
    for scale, normalize in [(10.0, False), (1.0, True)]:
        share, _ = lce.boundary_activity(scale * rows, labels, centres, bounds, normalize)
        assert share == 0.0
    small = 0.1 * rows / np.linalg.norm(rows, axis=1, keepdims=True)  # |f| = 0.1: cos <= 0.1 < theta
    want = np.mean(bounds[labels] - np.clip(np.sum(small * centres[labels], 1), -1, 1) > 1e-6)
    share, norm = lce.boundary_activity(small, labels, centres, bounds, False)
    assert share == pytest.approx(want) and want > 0.5 and norm == pytest.approx(0.1)
    assert "saturates" in lce.boundary_line(10 * rows, labels, centres, bounds, False)


def test_info_marks_a_term_that_was_zero_in_every_epoch(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [{"session": 1, "epoch": 1, "L_c": 2.0}, {"session": 2, "step": 5, "test_recall1": 0.5}]
    lines += [{"session": 2, "epoch": e, "L_c": 1.0 + e, "L_bound": 0.0, "L_align": 0.5 * (e - 1)} for e in (1, 2)]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    terms = run_info.term_summary(str(path))
    assert terms[2]["L_c"] == {"mean": 2.5, "epochs": 2, "zero_epochs": 0}
    assert terms[1] == {"L_c": {"mean": 2.0, "epochs": 1, "zero_epochs": 0}}
    text = info.format_terms(terms[2])
    assert "L_bound 0 (0 in all 2 epochs: inactive)" in text and "L_align 0.25 (0 in 1 of 2 epochs)" in text


def test_the_compare_table_shows_each_entrys_memory_rows_and_rule():
    c = fashion_mnist_general.get_config()
    matrix = [[0.8, None], [0.6, 0.7]]
    records = []
    for seed, rows in [(0, [0, 80]), (1, [0, 90])]:
        results = {
            "average_recall": {"1": 0.7},
            "per_session": [
                {"recall": {"1": 0.8}, "memory_rows": rows[0]},
                {"recall": {"1": 0.7}, "memory_rows": rows[1]},
            ],
            "compatibility_recall1": matrix,
            "negative_flip_rate": [0.1],
        }
        for entry in ("cvs", "cl2r+memory.rule=budget"):
            ec = comparison.entry_config(c, entry, seed, 0)
            records.append(comparison.run_record(seed, entry, ec, f"/w/seed{seed}/{entry}", "/w", results))
    assert records[0]["memory_rows"] == [0, 80] and records[0]["memory_rule"].endswith("herding")
    assert records[1]["memory_rule"] == f"budget {c.memory.budget} (budget // classes each), random"
    summary = tables.summarize_runs(records, ["cvs", "cl2r+memory.rule=budget"])
    table = tables.markdown(summary, records, "t", "s")
    assert "| cvs | 0/85 | 70.00 ± 0.00 |" in table  # the mean over the seeds of the rows before each session
    assert "cl2r+memory.rule=budget budget 200 (budget // classes each), random" in table


def test_compare_pairs_each_entry_with_the_cvs_entry_of_the_same_settings():
    """The Tiny-ImageNet mini study at 200-d: without these pairs every entry met only plain (128-d) cvs."""
    c = fashion_mnist_general.get_config()
    w, budget = "+model.embed_dim=200", "+memory.rule=budget"
    methods = ["cvs", "cvs" + w, "cl2r" + w, "cl2r" + w + budget, "cores" + w + budget, "cvs" + w + "+memory.rule=all"]
    methods += ["ewc@linear_reset", "cvs@linear_reset", "cl2r+memory.rule=budget"]
    pairs = comparison.entry_pairs(c, methods)
    same = {(a, b, why) for a, b, why in pairs if why.endswith("the same settings")}
    assert same == {
        ("cl2r" + w, "cvs" + w, "against cvs" + w + ", the same settings"),  # per_class against cvs's budget
        ("cl2r" + w + budget, "cvs" + w, "at equal memory (budget): against cvs" + w + ", the same settings"),
        ("cores" + w + budget, "cvs" + w, "at equal memory (budget): against cvs" + w + ", the same settings"),
    }
    assert ("ewc@linear_reset", "cvs@linear_reset", "against cvs with the linear_reset head") in pairs
    assert [(a, b) for a, b, _ in pairs].count(("ewc@linear_reset", "cvs@linear_reset")) == 1  # not named twice
    assert not any(a == "cl2r+memory.rule=budget" and b != "cl2r" for a, b, _ in pairs)  # plain cvs: vs_cvs has it
