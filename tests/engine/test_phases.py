"""Each session phase on its own, with the tiny model, and the protocol rules they enforce.

The rules that the resume tests cannot see (both of their runs would share the bug):
* the selected model (tested, embeds the gallery, saved) is the best-validation epoch's, ties to
  the earlier epoch, not the last epoch's;
* stored gallery rows are never re-embedded (``joint`` alone replaces them);
* each epoch's sample order differs from the previous epoch's and across sessions, and the same
  arguments give the same order.
"""

import os
import types

import jax
import numpy as np
import pytest

from cvs_jax.engine import cadence, phases, train_loop
from cvs_jax.engine.run_state import RunState
from cvs_jax.methods import losses, policies
from cvs_jax.methods.policies import ImportanceState, ReplayMemory
from cvs_jax.methods.registry import get_method
from cvs_jax.retrieval import topk
from cvs_jax.retrieval.average_precision import mean_average_precision
from cvs_jax.rundir.checkpoint import Checkpoints
from cvs_jax.rundir.gallery import Gallery, GalleryPart
from cvs_jax.testing.run_contexts import build_ctx, tree_equal

# ---------------------------------------------------------------- cadence


def test_cadence_events():
    c = cadence.Cadence(steps_per_epoch=5, log_every=2, checkpoint_every=3)
    ev = {s: c.between(s - 1, s) for s in range(1, 11)}  # one step per call
    assert [s for s, e in ev.items() if e.epoch_end] == [5, 10]
    assert [s for s, e in ev.items() if e.checkpoint] == [3, 6, 9]
    assert [s for s, e in ev.items() if e.log] == [2, 4, 6, 8]  # never on an epoch end (it has its own line)
    quiet = cadence.Cadence(steps_per_epoch=4)
    assert not any(quiet.between(s - 1, s).checkpoint or quiet.between(s - 1, s).log for s in range(1, 9))


# ---------------------------------------------------------------- the session's batches


def test_epoch_order_is_fresh_each_epoch_and_session_and_reproducible():
    idx = np.arange(100, 164)
    a = policies.ShuffledEpochs(idx, batch_size=8, seed=0, session=1)
    epoch = lambda b, e: np.concatenate([b.batch(e, i) for i in range(b.steps_per_epoch)])  # noqa: E731
    e0, e1 = epoch(a, 0), epoch(a, 1)
    assert sorted(e0) == sorted(e1) == list(idx)  # every image once per epoch
    assert not np.array_equal(e0, e1)  # a new order each epoch
    other_session = policies.ShuffledEpochs(idx, batch_size=8, seed=0, session=2)
    assert not np.array_equal(e0, epoch(other_session, 0))
    other_seed = policies.ShuffledEpochs(idx, batch_size=8, seed=1, session=1)
    assert not np.array_equal(e0, epoch(other_seed, 0))
    again = policies.ShuffledEpochs(idx.copy(), batch_size=8, seed=0, session=1)
    assert np.array_equal(e0, epoch(again, 0)) and np.array_equal(e1, epoch(again, 1))


def test_half_memory_batches():
    stream, mem = np.arange(0, 40), np.arange(1000, 1008)  # 48 images: whole batches of 8
    memory = ReplayMemory(mem, np.zeros(8, np.int32), built_after=0)
    b = policies.HalfMemoryBatches().plan(stream, memory, batch_size=8, seed=0, session=1)
    assert b.steps_per_epoch == 10  # the stream fills half of every batch
    for e in (0, 1):
        batches = [b.batch(e, i) for i in range(b.steps_per_epoch)]
        assert all(len(x) == 8 and set(x[:4]) <= set(stream) and set(x[4:]) <= set(mem) for x in batches)
        assert sorted(np.concatenate([x[:4] for x in batches])) == list(stream)
    assert not np.array_equal(b.batch(0, 0), b.batch(1, 0))
    # no memory yet (session 1): a plain shuffled stream
    first = policies.HalfMemoryBatches().plan(stream, ReplayMemory.empty(), batch_size=8, seed=0, session=0)
    assert isinstance(first, policies.ShuffledEpochs) and first.steps_per_epoch == 5
    mixed = policies.MixedBatches().plan(stream, memory, batch_size=8, seed=0, session=1)
    assert sorted(np.concatenate([mixed.batch(0, i) for i in range(mixed.steps_per_epoch)])) == sorted(
        np.concatenate([stream, mem])
    )


def test_session_view_and_constants(manual_dir, tmp_path):
    ctx = build_ctx(manual_dir, tmp_path)
    plan = ctx.proto.plan
    state = RunState.initial(ctx.initial_variables(), 8)
    view = phases.session_view(ctx, state, 0)
    np.testing.assert_array_equal(view.gallery_idx, plan.sessions[0].train)
    assert view.total_steps == view.steps_per_epoch * 2 and len(view.stored) == 0
    np.testing.assert_array_equal(view.val_idx, plan.val_queries(0))
    # constants of session 2 with a stored gallery: classes and L_d's class centres
    rng = np.random.default_rng(0)
    rows = plan.sessions[0].train[:20]
    emb = rng.normal(size=(20, 8)).astype(np.float32)
    part = GalleryPart(emb, ctx.proto.train_labels[rows], rows.astype(np.int64), 0)
    state = state.replace(gallery=state.gallery.with_part(part))
    consts = jax.device_get(phases.session_constants(ctx, state, phases.session_view(ctx, state, 1)))
    assert int(consts["valid_classes"]) == plan.sessions[1].num_outputs
    assert int(consts["old_classes"]) == plan.sessions[0].num_outputs
    unit = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    for c in np.unique(part.labels):
        np.testing.assert_allclose(consts["centers"][c], unit[part.labels == c].mean(0), rtol=1e-5, atol=1e-6)
    assert consts["center_mask"].sum() == len(np.unique(part.labels))
    ctx.close()


# ---------------------------------------------------------------- carry-over


def test_carry_over_builds_memory_once(manual_dir, tmp_path):
    ctx = build_ctx(manual_dir, tmp_path)
    state = RunState.initial(ctx.initial_variables(), 8)
    assert phases.carry_over(ctx, state, 0) is state  # nothing carries into session 1
    after = phases.carry_over(ctx, state, 1)
    mem = after.memory
    prev = ctx.proto.plan.sessions[0].train
    assert mem.built_after == 0 and 0 < len(mem) <= ctx.config.memory.budget
    assert set(mem.source_ids) <= set(prev)
    np.testing.assert_array_equal(mem.labels, ctx.proto.train_labels[mem.source_ids])
    classes = np.unique(ctx.proto.train_labels[prev])
    quota = ctx.config.memory.budget // len(classes)
    assert all(np.sum(mem.labels == c) == quota for c in classes)  # herding: equal shares per class
    assert phases.carry_over(ctx, after, 1).memory is mem  # already built after session 1: kept
    ctx.close()


def test_carry_over_importance(manual_dir, tmp_path):
    """The online importance is computed at carry-over from the previous selected model (the fork's
    slots are made at the end of each session: tests/methods/test_importance.py)."""
    ctx = build_ctx(manual_dir, tmp_path, method="ewc")
    ctx.config.unlock()
    ctx.config.importance.mode, ctx.config.importance.normalize = "online", True
    ctx.method = get_method(ctx.config)
    state = phases.carry_over(ctx, RunState.initial(ctx.initial_variables(), 8), 1)
    imp = state.importance
    assert imp.built_after == 0 and len(state.memory) == 0  # EWC keeps no memory
    (slot,) = imp.slots
    assert tree_equal(slot["anchor"], state.variables["params"]["net"])
    assert jax.tree.structure(slot["importance"]) == jax.tree.structure(state.variables["params"]["net"])
    consts = ctx.method.importance.constants(ctx.policy_view, imp)
    used = consts["reg_slots"][0]["importance"]
    assert max(float(np.max(x)) for x in jax.tree.leaves(used)) == pytest.approx(1.0)
    ctx.close()


# ---------------------------------------------------------------- training and model selection


@pytest.mark.parametrize("scores,best", [((0.5, 0.7, 0.6), 1), ((0.4, 0.6, 0.6), 1), ((0.3, 0.3, 0.3), 0)])
def test_train_selects_best_validation_epoch_ties_to_earlier(manual_dir, tmp_path, monkeypatch, scores, best):
    ctx = build_ctx(manual_dir, tmp_path, method="finetune", epochs=3)
    seen = []

    def scripted_search(ctx_, view):
        def search(variables, query_images, query_labels, new_rows=None):
            seen.append(jax.device_get(variables))
            return {1: scores[len(seen) - 1]}

        return search

    monkeypatch.setattr(train_loop, "make_search", scripted_search)
    state = RunState.initial(ctx.initial_variables(), 8)
    view = phases.session_view(ctx, state, 0)
    sel = phases.train(ctx, state, view, phases.session_constants(ctx, state, view))
    assert len(seen) == 3 and sel.epoch == best and sel.val_recall1 == scores[best]
    assert tree_equal(sel.variables, seen[best])
    if best != 2:
        assert not tree_equal(sel.variables, seen[2])  # the last epoch's model differs: selection matters
    ctx.close()


def test_train_resumes_from_progress_checkpoint(manual_dir, tmp_path):
    """Mid-session progress checkpoints (global step numbers) restore the exact selection."""
    ctx = build_ctx(manual_dir, tmp_path, method="finetune", epochs=2)
    state = RunState.initial(ctx.initial_variables(), 8)
    view = phases.session_view(ctx, state, 0)
    consts = phases.session_constants(ctx, state, view)
    full = phases.train(ctx, state, view, consts)
    steps = ctx.progress.steps()
    assert steps[-1] == view.total_steps  # numbered by the run's global step
    # drop the last progress checkpoint: the rerun resumes after epoch 1 and must end identically
    ctx.progress.close()
    import shutil

    shutil.rmtree(os.path.join(ctx.progress.directory, str(steps[-1])))
    ctx.progress = Checkpoints(ctx.progress.directory, max_to_keep=2, log=ctx.log.print)
    again = phases.train(ctx, state, view, consts)
    assert again.epoch == full.epoch and again.val_recall1 == full.val_recall1
    assert tree_equal(again.variables, full.variables)
    ctx.close()


# ---------------------------------------------------------------- test, gallery, checkpoint


def test_run_state_round_trip(tmp_path):
    """The session checkpoint is exactly the run state: memory, importance, records, gallery part."""
    rng = np.random.default_rng(0)
    variables = {
        "params": {"net": {"w": rng.normal(size=(3, 2)).astype(np.float32)}, "head": np.ones((4, 2))},
        "batch_stats": {"m": np.zeros(2, np.float32)},
    }
    part0 = GalleryPart(
        rng.normal(size=(5, 2)).astype(np.float32), np.arange(5, dtype=np.int32) % 2, np.arange(5, dtype=np.int64), 0
    )
    part1 = GalleryPart(
        rng.normal(size=(3, 2)).astype(np.float32), np.ones(3, np.int32), np.arange(10, 13, dtype=np.int64), 1
    )
    raw = {"w": rng.random((3, 2)).astype(np.float32)}
    state = RunState(
        variables=variables,
        gallery=Gallery([part0], 2),
        memory=ReplayMemory(np.array([4, 1], np.int64), np.array([0, 1], np.int32), built_after=0, seen=5),
        importance=ImportanceState(
            ({"importance": raw, "anchor": {"w": np.zeros((3, 2), np.float32)}},), running=raw, built_after=0
        ),
        records=({"session": 0, "steps": 7},),
    )
    ck = Checkpoints(str(tmp_path / "sessions"), max_to_keep=None)
    state.save(ck, part0)
    state = state.replace(gallery=state.gallery.with_part(part1), records=state.records + ({"session": 1, "steps": 3},))
    state.save(ck, part1)
    template = RunState.initial(variables, 2)
    back = RunState.restore(ck, template)
    assert back.completed == 2 and back.steps_done == 10 and back.records == state.records
    assert tree_equal(back.variables, variables)
    np.testing.assert_array_equal(np.asarray(back.gallery.embeddings), np.asarray(state.gallery.embeddings))
    np.testing.assert_array_equal(back.gallery.sessions, [0] * 5 + [1] * 3)
    np.testing.assert_array_equal(back.memory.source_ids, [4, 1])
    assert back.memory.seen == 5 and back.memory.built_after == 0
    assert tree_equal(back.importance.slots[0]["importance"], raw) and back.importance.built_after == 0
    assert tree_equal(back.importance.running, raw)
    ck.close()


def test_class_centres_match_losses_reference():
    """The constants provider hands L_d the pooled centres of ``losses.class_centers``."""
    rng = np.random.default_rng(1)
    emb, labels = rng.normal(size=(12, 4)).astype(np.float32), rng.integers(0, 3, 12).astype(np.int32)
    gallery = Gallery([GalleryPart(emb, labels, np.arange(12, dtype=np.int64), 0)], 4)

    out = policies.ClassCenters(per_session_mean=False)(types.SimpleNamespace(num_classes=5), gallery)
    centers, mask = losses.class_centers(emb, labels, 5)
    np.testing.assert_array_equal(np.asarray(out["centers"]), centers)
    np.testing.assert_array_equal(np.asarray(out["center_mask"]), mask)


def test_test_and_append_and_save_on_their_own(manual_dir, tmp_path):
    """test(): the selected model's queries against stored rows + its own session rows; append_and_save():
    the part holds exactly those rows, the record the recall, and the checkpoint restores the state."""
    ctx = build_ctx(manual_dir, tmp_path, method="finetune")
    proto = ctx.proto
    state = RunState.initial(ctx.initial_variables(), 8)
    rng = np.random.default_rng(2)
    stored_idx = proto.plan.sessions[0].train[:10]  # pretend rows of an earlier model
    stored = GalleryPart(
        rng.normal(size=(10, 8)).astype(np.float32),
        proto.train_labels[stored_idx],
        np.arange(10**6, 10**6 + 10, dtype=np.int64),
        0,
    )
    state = state.replace(gallery=state.gallery.with_part(stored), records=({"session": 0, "steps": 4},))
    view = phases.session_view(ctx, state, 1)
    sel = phases.Selection(state.variables, 0.5, 0)
    recall, mean_ap, new_rows = phases.test(ctx, state, view, sel)
    np.testing.assert_array_equal(new_rows, ctx.embed(state.variables, proto.train_images(view.gallery_idx)))
    q = ctx.embed(state.variables, proto.test_images(view.test_idx))
    gallery = np.concatenate([stored.embeddings, new_rows])
    labels = np.concatenate([stored.labels, proto.train_labels[view.gallery_idx]])
    assert recall == topk.recall_at_k(q, proto.test_labels[view.test_idx], gallery, labels, ctx.ks)
    assert mean_ap == mean_average_precision(q, proto.test_labels[view.test_idx], gallery, labels)
    after = phases.append_and_save(ctx, state, view, sel, recall, mean_ap, new_rows, seconds=1.0)
    assert after.records[-1]["map"] == mean_ap
    assert after.completed == 2 and after.records[-1]["recall"] == {str(k): v for k, v in recall.items()}
    assert after.records[-1]["gallery_rows"] == 10 + len(view.gallery_idx)
    np.testing.assert_array_equal(after.gallery.parts[0].embeddings, stored.embeddings)  # not re-embedded
    assert ctx.sessions.steps() == [1]
    saved = ctx.sessions.restore(1, {"gallery": None})
    np.testing.assert_array_equal(saved["gallery"]["embeddings"], new_rows)  # only this session's rows
    assert saved["meta"]["per_session"] == list(after.records)
    ctx.close()


# ---------------------------------------------------------------- the loop docs/methods.md shows


def _phase_calls(tree) -> list[tuple[str, int, int]]:
    """``(phase, arguments, assigned names)`` of each ``phases.<name>(...)`` call, in source order;
    the runner's ``_train(...)`` (train or untrained per method) counts as ``phases.train``."""
    import ast

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.Expr) and isinstance(node.value, ast.Call):
            call, targets = node.value, getattr(node, "targets", [])
            fn = call.func
            name = fn.attr if isinstance(fn, ast.Attribute) and ast.unparse(fn.value) == "phases" else None
            if isinstance(fn, ast.Name) and fn.id == "_train":
                name, args = (
                    "train",
                    4,
                )  # _train(size, ctxs, states, views, consts): per member (ctx, state, view, consts)
            elif name is None:
                continue
            else:
                args = len(call.args)
            names = len(targets[0].elts) if targets and isinstance(targets[0], ast.Tuple) else len(targets)
            found.append((node.lineno, name, args, names))
    return [f[1:] for f in sorted(found)]


def test_methods_doc_shows_the_runners_loop():
    """docs/methods.md's session loop calls the phases ``runner.run_sessions`` calls, in its order, with
    as many arguments and results (a phase added, dropped or re-signed in one and not the other fails)."""
    import ast
    import inspect
    import re

    from cvs_jax.engine import runner

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "docs", "methods.md")) as f:
        doc = f.read()
    block = re.search(r"```python\n(state = resume\(ctx\).*?)```", doc, re.S).group(1)
    code = _phase_calls(ast.parse(inspect.getsource(runner.run_sessions)))
    assert [c[0] for c in code] == [
        "carry_over", "session_view", "session_constants", "train", "fit_query_map", "test", "append_and_save",
    ]  # fmt: skip
    assert _phase_calls(ast.parse(block)) == code
