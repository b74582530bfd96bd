"""The phases of one session, each a function a test can call on its own.

    carry_over        replay memory and importance from the previous session's selected model
    session_view      the session's batches, gallery images, validation and test queries
    session_constants per-session values the jitted step reads (classes, L_d centres, importance)
    train             epochs with validation recall@1 and best-model selection (resumes mid-session;
                      the loop itself is ``train_loop.py``)
    fit_query_map     (``retrieval.query_map``) the map from the selected model's space to the previous one's
    test              recall@K and mAP of the test queries against the accumulated gallery
    append_and_save   the session's gallery part, its result record, its query map and the session checkpoint

Protocol rules (as the official ivclab/CVS code does them): the model that is tested, embeds the
gallery and is saved is the best-validation epoch's (strict improvement: ties go to the earlier
epoch); validation searches the stored gallery plus the session's images embedded by the current
model; test queries are embedded by the newest model and search a gallery whose older rows were
made by older models and are never re-embedded (``joint`` alone re-embeds everything).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from cvs_jax import distributed
from cvs_jax.config import recipe
from cvs_jax.engine import train_loop
from cvs_jax.engine.context import RunContext
from cvs_jax.engine.run_state import RunState

# what a session trains on and searches, and the selected model: what the loop reads and makes
from cvs_jax.engine.train_loop import Selection, SessionView
from cvs_jax.errors import ConfigError
from cvs_jax.retrieval import average_precision, query_maps, topk
from cvs_jax.rundir import faults, paths
from cvs_jax.rundir.gallery import Gallery, GalleryPart, RowConcat


def carry_over(ctx: RunContext, state: RunState, s: int) -> RunState:
    """Replay memory and parameter importance after session s-1, computed with its selected model at
    the start of session s (the official code builds session 1's exemplars this way).  A run that
    resumes, or that shares session 1 with another method, computes them here too."""
    if s == 0:
        return state
    mem, imp = state.memory, state.importance
    if mem.built_after != s - 1:
        mem = ctx.method.memory.update(ctx.policy_view, mem, state.variables, s)
    if imp.built_after != s - 1:
        imp = ctx.method.importance.update(ctx.policy_view, imp, state.variables, s)
    return state.replace(memory=mem, importance=imp)


def session_view(ctx: RunContext, state: RunState, s: int) -> SessionView:
    c, method, plan = ctx.config, ctx.method, ctx.proto.plan
    idx = ctx.proto.training_indices(method, s)
    batches = method.batches.plan(idx, state.memory, batch_size=c.train.batch_size, seed=c.seed, session=s)
    if batches.steps_per_epoch == 0:
        raise ConfigError(
            f"session {s + 1} has {len(batches.indices)} training images, fewer than "
            f"train.batch_size={c.train.batch_size}; lower the batch size."
        )
    return SessionView(
        s=s,
        batches=batches,
        gallery_idx=idx,
        stored=method.scope.stored(state.gallery),
        val_idx=plan.val_queries(s),
        test_idx=ctx.proto.test_queries(s),
        epochs=recipe.session_epochs(c, s),
    )


def session_constants(ctx: RunContext, state: RunState, view: SessionView) -> dict:
    """The step's per-session constants, replicated over the mesh."""
    plan = ctx.proto.plan
    consts = {
        "valid_classes": jnp.int32(plan.sessions[view.s].num_outputs),
        "old_classes": jnp.int32(plan.old_classes(view.s)),
    }
    for provider in ctx.method.constants:
        consts.update(provider(ctx.policy_view, state.gallery, view.s))
    consts.update(ctx.method.importance.constants(ctx.policy_view, state.importance))
    return distributed.replicate(consts, ctx.mesh)


def _with_session_part(ctx: RunContext, view: SessionView, new_rows: np.ndarray) -> Gallery:
    """The stored parts plus the session's rows (a view: no row is copied)."""
    part = GalleryPart(
        new_rows, ctx.proto.train_labels[view.gallery_idx], np.asarray(view.gallery_idx, np.int64), view.s
    )
    return Gallery(list(view.stored.parts) + [part], new_rows.shape[1])


def mapped_scores(ctx: RunContext, view: SessionView, maps: dict, q: np.ndarray, q_labels, new_rows) -> tuple:
    """``(recall@K, mAP)`` of the session's model's queries ``q`` against the stored rows plus its own:
    with ``maps`` (``RunState.query_maps``, non-empty) each older part j is scored with the queries mapped
    through the chain s -> ... -> j, the session's own part with the queries as they are; without, the
    plain search (``train_loop.make_search``'s)."""
    gallery = _with_session_part(ctx, view, new_rows)
    if maps:
        recall = query_maps.mapped_recall_at_k(q, q_labels, gallery, maps, view.s, ctx.ks)
        parts = [(p.session, p.embeddings, p.labels) for p in gallery.parts]
        return recall, average_precision.mapped_mean_average_precision(q, q_labels, parts, maps, view.s)
    rows = RowConcat([p.embeddings for p in gallery.parts])
    recall = topk.recall_at_k_blocked(q, q_labels, rows, gallery.labels, ctx.ks, mesh=ctx.mesh)
    return recall, average_precision.mean_average_precision(q, q_labels, np.asarray(rows), gallery.labels)


def fit_query_map(ctx: RunContext, state: RunState, view: SessionView, selection: Selection) -> RunState:
    """Session s >= 1 with ``retrieval.query_map`` set: the map from the selected model's space to the
    previous session's selected model's (``state.variables``), fitted on images both embed: the replay
    memory the session trained with, or the session's new training images when the method keeps none."""
    kind, s = ctx.config.retrieval.query_map, view.s
    if kind == "none" or s == 0:
        return state
    mem = state.memory
    idx = mem.source_ids if len(mem) else np.asarray(ctx.proto.plan.sessions[s].train, np.int64)
    images = ctx.proto.train_images(idx)
    qmap = query_maps.fit_query_map(kind, ctx.embed(selection.variables, images), ctx.embed(state.variables, images))
    ctx.log.print(f"  session {s + 1}: {kind} query map fitted on {len(idx)} images (model {s + 1} -> model {s})")
    return state.replace(query_maps={**state.query_maps, s: qmap})


def train(ctx: RunContext, state: RunState, view: SessionView, consts: dict) -> Selection:
    """All epochs of session ``view.s``, resuming from its newest progress checkpoint."""
    member = train_loop.MemberSession.fresh(ctx, state, view)
    progress = ctx.progress.restore_latest(member.progress_templates(), steps=member.progress_steps())
    if progress is not None:
        member.restored(progress[1])
    member.open()
    driver = train_loop.SingleDriver(member, state, consts)
    ts = train_loop.run_loop(driver)
    return member.selection(ts)


def untrained(ctx: RunContext, state: RunState, view: SessionView) -> Selection:
    """A method that does not train (``frozen``): the session's model is the one it starts from (the
    head still gains the session's rows); its validation recall@1 is measured and reported."""
    member = train_loop.MemberSession.fresh(ctx, state, view)
    member.open()
    assert member.search is not None  # member.open() sets it
    variables = train_loop.net_and_head(train_loop.host_variables(member.ts), ctx.head)
    r1 = member.search(variables, member.val_images, member.val_labels)[1] if len(view.val_idx) else -1.0
    ctx.log.print(f"session {view.s + 1}: method {ctx.method.name} trains nothing (val R@1={100 * r1:.2f})")
    return Selection(variables, float(r1), -1, last=variables, tracked=jax.device_get(member.ts.tracked))


def test(
    ctx: RunContext, state: RunState, view: SessionView, selection: Selection
) -> tuple[dict, float | None, np.ndarray]:
    """Recall@K and mAP of the session's test queries (selected model) against the stored gallery plus the
    session's images embedded by the selected model, older parts through ``state.query_maps`` when the run
    fits them; returns ``(recall, mAP, new_rows)``."""
    ctx.log.print(
        f"  session {view.s + 1}: embedding {len(view.gallery_idx)} new gallery rows and "
        f"{len(view.test_idx)} test queries with the selected model"
    )
    new_rows = ctx.embed(selection.variables, ctx.proto.train_images(view.gallery_idx))
    q_labels = ctx.proto.test_labels[view.test_idx]
    q = ctx.embed(selection.variables, ctx.proto.test_images(view.test_idx))
    recall, mean_ap = mapped_scores(ctx, view, state.query_maps, q, q_labels, new_rows)
    return recall, mean_ap, new_rows


def append_and_save(
    ctx: RunContext,
    state: RunState,
    view: SessionView,
    selection: Selection,
    recall: dict,
    mean_ap: float | None,
    new_rows: np.ndarray,
    seconds: float,
) -> RunState:
    """Adds the session's gallery part (stored rows are not copied), records the results and writes
    the session's query map (when fitted; before the checkpoint, so a completed session always has it)
    and the session checkpoint."""
    s = view.s
    part = GalleryPart(
        new_rows,
        ctx.proto.train_labels[view.gallery_idx],
        np.asarray(view.gallery_idx, np.int64),
        s,
        replaces=ctx.method.scope.replaces_gallery,
    )
    gallery = state.gallery.with_part(part)
    record = {
        "session": s,
        "recall": {str(k): v for k, v in recall.items()},
        "map": mean_ap,  # mAP of the test queries over the whole gallery (None: no query has a relevant row)
        "best_epoch": selection.epoch + 1,
        "val_recall1": selection.val_recall1,
        "new_images": int(len(ctx.proto.plan.sessions[s].train)),  # protocol.json's "train" of the session
        "trained_on_images": int(len(view.batches.indices)),  # the new images plus replay (joint: all so far)
        "memory_rows": len(state.memory),  # replay rows stored before the session (memory.rule)
        "gallery_rows": len(gallery),
        "test_queries": int(len(view.test_idx)),
        "steps": view.total_steps,
        "seconds": round(seconds, 1),
    }
    ctx.log.write(
        global_step=state.steps_done + view.total_steps,
        session=s + 1,
        step=view.total_steps + 1,
        **{f"test_recall{k}": v for k, v in recall.items()},
    )
    ctx.log.print(
        f"session {s + 1} test: "
        + " ".join(f"R@{k}={100 * v:.2f}" for k, v in recall.items())
        + ("" if mean_ap is None else f" mAP={100 * mean_ap:.2f}")
        + f" (best epoch {selection.epoch + 1}, val R@1 {100 * selection.val_recall1:.2f})"
    )
    new_state = state.replace(
        variables=selection.variables,
        gallery=gallery,
        importance=ctx.method.importance.after_session(ctx.policy_view, state.importance, selection, s),
        records=state.records + (record,),
    )
    if s in state.query_maps and jax.process_index() == 0:
        state.query_maps[s].save(paths.query_map_file(ctx.workdir, s))
    faults.fail_while_writing("session_write", ctx.sessions.directory)
    new_state.save(ctx.sessions, part, ctx.trunk)
    return new_state
