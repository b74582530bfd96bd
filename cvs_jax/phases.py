"""The phases of one session, each a function a test can call on its own.

    carry_over        replay memory and importance from the previous session's selected model
    session_view      the session's batches, gallery images, validation and test queries
    session_constants per-session values the jitted step reads (classes, L_d centres, importance)
    train             epochs with validation recall@1 and best-model selection (resumes mid-session)
    test              recall@K of the test queries against the accumulated gallery
    append_and_save   the session's gallery part, its result record and the session checkpoint

Protocol rules (official code, spec §1.4, §2.5, §4, §5): the model that is tested, embeds the
gallery and is saved is the best-validation epoch's (strict improvement: ties go to the earlier
epoch); validation searches the stored gallery plus the session's images embedded by the current
model; test queries are embedded by the newest model and search a gallery whose older rows were
made by older models and are never re-embedded (``joint`` alone re-embeds everything).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Iterable

import grain
import jax
import jax.numpy as jnp
import numpy as np

from cvs_jax import distributed, evaluate, faults, prefetch, schedules
from cvs_jax.cadence import Cadence
from cvs_jax.context import RunContext
from cvs_jax.errors import ConfigError, NonFiniteError
from cvs_jax.gallery import Gallery, GalleryPart, RowConcat
from cvs_jax.models import grow_head
from cvs_jax.run_log import format_eta
from cvs_jax.run_state import RunState
from cvs_jax.train_step import TrainState

_NO_BAD_STEP = np.iinfo(np.int32).max


def carry_over(ctx: RunContext, state: RunState, s: int) -> RunState:
    """Replay memory and parameter importance after session s-1, computed with its selected model at
    the start of session s (the official code builds session 1's exemplars this way).  A run that
    resumes, or that shares session 1 with another method, computes them here too."""
    if s == 0:
        return state
    mem, imp = state.memory, state.importance
    if mem.built_after != s - 1:
        mem = ctx.method.memory.update(ctx, mem, state.variables, s)
    if imp.built_after != s - 1:
        imp = ctx.method.importance.update(ctx, imp, state.variables, s)
    return state.replace(memory=mem, importance=imp)


@dataclasses.dataclass(frozen=True)
class SessionView:
    """What session ``s`` trains on and searches."""

    s: int
    batches: Any  # policies.ShuffledEpochs | HalfMemoryEpochs: batch(epoch, i) -> dataset indices
    gallery_idx: np.ndarray  # train images whose rows this session adds to the gallery
    stored: Gallery  # the stored rows that validation and test search besides the session's own
    val_idx: np.ndarray  # validation queries (train split, accumulated over sessions)
    test_idx: np.ndarray  # test queries (test split, classes seen so far)
    epochs: int

    @property
    def steps_per_epoch(self) -> int:
        return self.batches.steps_per_epoch

    @property
    def total_steps(self) -> int:
        return self.steps_per_epoch * self.epochs


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
        epochs=c.train.epochs,
    )


def session_constants(ctx: RunContext, state: RunState, view: SessionView) -> dict:
    """The step's per-session constants, replicated over the mesh."""
    plan = ctx.proto.plan
    consts = {
        "valid_classes": jnp.int32(plan.sessions[view.s].num_outputs),
        "old_classes": jnp.int32(plan.sessions[view.s - 1].num_outputs if view.s > 0 else 0),
    }
    for provider in ctx.method.constants:
        consts.update(provider(ctx, state.gallery))
    consts.update(ctx.method.importance.constants(ctx, state.importance))
    return distributed.replicate(consts, ctx.mesh)


def make_search(ctx: RunContext, view: SessionView) -> Callable[..., dict]:
    """``search(variables, query_images, query_labels, new_rows=None) -> {k: recall}``: the stored
    rows plus the session's images embedded by ``variables`` (or ``new_rows`` when already embedded),
    streamed without a joint copy."""
    labels = np.concatenate([view.stored.labels, ctx.proto.train_labels[view.gallery_idx]])

    def search(variables, query_images, query_labels, new_rows=None):
        if new_rows is None:
            new_rows = ctx.embed(variables, ctx.proto.train_images(view.gallery_idx))
        rows = RowConcat([p.embeddings for p in view.stored.parts] + [new_rows])
        faults.maybe_fail("validation")
        q = ctx.embed(variables, query_images)
        return evaluate.recall_at_k_blocked(q, query_labels, rows, labels, ctx.ks, mesh=ctx.mesh)

    return search


@dataclasses.dataclass(frozen=True)
class Selection:
    """The best-validation epoch's model (host arrays, net + head) and its validation recall@1."""

    variables: dict
    val_recall1: float
    epoch: int  # 0-based; -1 before the first validation
    last: dict | None = None  # the last epoch's model (host; EWC/RWalk anchors in the fork's mode)
    tracked: dict | None = None  # what the method tracked over the steps, at the last step (host)


def initial_train_state(ctx: RunContext, state: RunState, s: int) -> TrainState:
    """The previous selected model with the head grown to the session's classes, the method's
    per-session extras and a fresh optimizer (every session starts one, as the official code)."""
    plan = ctx.proto.plan
    params = dict(state.variables["params"])
    prev_outputs = plan.sessions[s - 1].num_outputs if s > 0 else 0
    params["head"] = grow_head(
        params["head"], jax.random.fold_in(ctx.head_key, s), prev_outputs, plan.sessions[s].num_outputs
    )
    if s > 0:
        params.update(ctx.method.extra_params(state.variables["params"]))
    return TrainState(
        step=jnp.int32(0),
        params=params,
        batch_stats=state.variables["batch_stats"],
        opt_state=ctx.tx.init(params),
        tracked=ctx.method.importance.tracked_init(state.importance, params["net"]),
    )


def batch_loader(ctx: RunContext, view: SessionView, start: int) -> Iterable[dict]:
    """This process's rows of the session's batches from step ``start`` on, read ahead of the step by
    ``data.loader_threads`` threads, or, for a split streamed from its records, decoded by
    ``data.loader_workers`` processes when > 0 (grain keeps their order either way).  Each batch is a pure
    function of (seed, session, epoch, step), so a resumed run starts here with no iterator state, and
    the batches are the same for any thread or worker count.  With one process the next batches are
    already on the devices (``distributed.global_batch`` of them is a no-op)."""
    c = ctx.config
    split = ctx.proto.dataset.train
    lo, hi = distributed.process_slice(c.train.batch_size, ctx.mesh)  # each process loads only its rows
    read = prefetch.BatchReader(split, ctx.proto.train_labels, view.batches, view.steps_per_epoch, lo, hi)
    threads = c.data.loader_threads
    workers = prefetch.worker_count(split, c.data.get("loader_workers", 0))
    options = grain.ReadOptions(num_threads=threads, prefetch_buffer_size=2 * threads)
    ds = prefetch.in_workers(
        grain.MapDataset.range(start, view.total_steps).map(read).to_iter_dataset(options), workers
    )
    if jax.process_count() > 1:  # global_batch assembles the global arrays from host rows
        return ds
    return prefetch.DevicePrefetch(ds, distributed.batch_sharding(ctx.mesh), depth=2)


def _host_variables(ts: TrainState) -> dict:
    """A host copy of the current model (the step donates the state's device buffers)."""
    return jax.device_get({"params": ts.params, "batch_stats": ts.batch_stats})


def train(ctx: RunContext, state: RunState, view: SessionView, consts: dict) -> Selection:
    """All epochs of session ``view.s``, resuming from its newest progress checkpoint."""
    c, s, log = ctx.config, view.s, ctx.log
    n_sessions = ctx.proto.plan.num_sessions
    spe, total = view.steps_per_epoch, view.total_steps
    first = state.steps_done  # progress checkpoints are numbered by the run's global step
    frozen = distributed.replicate(state.variables, ctx.mesh) if s > 0 else None
    ts = initial_train_state(ctx, state, s)
    best = Selection(_host_variables(ts), -1.0, -1)
    sums: dict[str, jax.Array] = {}
    progress = ctx.progress.restore_latest(
        {"state": ts, "best": best.variables, "sums": None}, steps=range(first + 1, first + total + 1)
    )
    if progress is not None:
        items = progress[1]
        ts, meta = items["state"], items["meta"]
        best = Selection(items["best"], meta["best_r1"], meta["best_epoch"])
        sums = {k: jnp.asarray(v) for k, v in (items["sums"] or {}).items()}
        log.print(f"resumed session {s + 1} at step {int(ts.step)}/{total}")
    # metrics a killed process wrote after the point this session resumes from are written again
    log.truncate(session=s + 1, step=int(ts.step))
    ts = distributed.replicate(ts, ctx.mesh)
    search = make_search(ctx, view)
    val_images = ctx.proto.train_images(view.val_idx)
    val_labels = ctx.proto.train_labels[view.val_idx]
    log.print(
        f"== session {s + 1}/{n_sessions} [{ctx.method.name}]: {len(view.batches.indices)} train images "
        f"({spe} steps/epoch), {ctx.proto.plan.sessions[s].num_outputs} classes, gallery {len(view.stored)} "
        f"stored + {len(view.gallery_idx)} new, {len(view.val_idx)} val / {len(view.test_idx)} test queries"
    )

    def check_finite(bad_step):
        bad = int(bad_step)
        if bad != _NO_BAD_STEP:
            raise NonFiniteError(
                f"the loss became NaN/inf at step {bad + 1} of session {s + 1} ({ctx.method.name}); lower "
                f"train.lr or check the data. Checkpoints up to the last good step are intact."
            )

    def save_progress(step):
        faults.fail_while_writing("progress_write", ctx.progress.directory)
        meta = {"best_r1": best.val_recall1, "best_epoch": best.epoch}
        ctx.progress.save(first + step, {"state": ts, "best": best.variables, "sums": sums}, meta)

    cadence = Cadence(spe, c.log_every_steps, c.train.checkpoint_every_steps)
    session_key = jax.random.fold_in(ctx.step_key, s)
    bad_step = jnp.int32(_NO_BAD_STEP)
    step = steps_at_start = int(ts.step)
    t_session = t_epoch = time.time()
    batches = iter(batch_loader(ctx, view, step))
    while step < total:
        epoch = step // spe
        lr = schedules.epoch_lr(c.train.schedule, epoch, c.train.lr, c.train.epochs)
        batch = next(batches)
        ts, metrics = ctx.step_fn(
            ts, frozen, distributed.global_batch(batch, ctx.mesh), consts, jnp.float32(lr), session_key
        )
        bad_step = jnp.minimum(bad_step, jnp.where(jnp.isfinite(metrics["loss"]), _NO_BAD_STEP, step))
        sums = {k: sums[k] + v if k in sums else v for k, v in metrics.items()}  # on device, no sync
        step += 1
        faults.maybe_fail("step")
        events = cadence.after(step)
        if events.log or events.epoch_end:
            done = (step - steps_at_start) / max(total - steps_at_start, 1)
            eta = format_eta((time.time() - t_session) / done * (1 - done))
        if events.log:
            log.print(f"  session {s + 1} epoch {epoch + 1} step {step}/{total} ETA {eta}")
        if events.checkpoint:
            check_finite(bad_step)
            save_progress(step)
        if not events.epoch_end:
            continue
        # end of an epoch: validation recall@1, best model, metrics, checkpoint.
        check_finite(bad_step)
        epoch_metrics = {k: float(v) / spe for k, v in sums.items()}
        sums = {}
        ips = spe * c.train.batch_size / max(time.time() - t_epoch, 1e-9)  # images trained per second
        val_r1 = search({"params": ts.params, "batch_stats": ts.batch_stats}, val_images, val_labels)[1]
        if val_r1 > best.val_recall1:  # strict improvement, as the official code
            best = Selection(_host_variables(ts), val_r1, epoch)
        log.write(
            global_step=first + step,
            session=s + 1,
            epoch=epoch + 1,
            step=step,
            val_recall1=val_r1,
            images_per_s=ips,
            **epoch_metrics,
        )
        terms = " ".join(f"{k}={v:.4f}" for k, v in epoch_metrics.items() if k.startswith("L_"))
        log.print(
            f"session {s + 1}/{n_sessions} epoch {epoch + 1}/{c.train.epochs} step {step} lr={lr:.5f} "
            f"loss={epoch_metrics['loss']:.4f} {terms} val R@1={100 * val_r1:.2f} {ips:.0f} img/s ETA {eta}"
        )
        save_progress(step)
        t_epoch = time.time()
    return Selection(
        _net_and_head(best.variables),
        best.val_recall1,
        best.epoch,
        last=_net_and_head(_host_variables(ts)),
        tracked=jax.device_get(ts.tracked),
    )


def _net_and_head(variables: dict) -> dict:
    """Host variables without the method's per-session extras (they end with the session)."""
    out = jax.device_get(variables)
    out["params"] = {k: out["params"][k] for k in ("net", "head")}
    return out


def test(ctx: RunContext, view: SessionView, selection: Selection) -> tuple[dict, np.ndarray]:
    """Recall@K of the session's test queries (selected model) against the stored gallery plus the
    session's images embedded by the selected model; returns ``(recall, new_rows)``."""
    new_rows = ctx.embed(selection.variables, ctx.proto.train_images(view.gallery_idx))
    q_labels = ctx.proto.test_labels[view.test_idx]
    recall = make_search(ctx, view)(
        selection.variables, ctx.proto.test_images(view.test_idx), q_labels, new_rows=new_rows
    )
    return recall, new_rows


def append_and_save(
    ctx: RunContext,
    state: RunState,
    view: SessionView,
    selection: Selection,
    recall: dict,
    new_rows: np.ndarray,
    seconds: float,
) -> RunState:
    """Adds the session's gallery part (stored rows are not copied), records the results and writes
    the session checkpoint."""
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
        "best_epoch": selection.epoch + 1,
        "val_recall1": selection.val_recall1,
        "train_images": int(len(view.batches.indices)),
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
        + f" (best epoch {selection.epoch + 1}, val R@1 {100 * selection.val_recall1:.2f})"
    )
    new_state = state.replace(
        variables=selection.variables,
        gallery=gallery,
        importance=ctx.method.importance.after_session(ctx, state.importance, selection, s),
        records=state.records + (record,),
    )
    faults.fail_while_writing("session_write", ctx.sessions.directory)
    new_state.save(ctx.sessions, part)
    return new_state
