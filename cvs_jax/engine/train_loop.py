"""The training loop of a session, shared by a plain run (``phases.train``) and a population
(``population.py``): each member's side of the loop (``MemberSession``: its start, resumption, best
model), how its steps are called (``Driver``), and ``run_loop`` itself: calls of k steps, the NaN and
growth guards (``_Watch``), progress checkpoints, and at each epoch end validation recall@1 and
best-model selection (strict improvement: ties go to the earlier epoch, as the official code).
docs/methods.md shows the loop as ``runner`` calls it (``tests/engine/test_phases.py`` compares them).
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any, Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from cvs_jax import distributed
from cvs_jax.config import recipe
from cvs_jax.engine import batches, profiling, schedules
from cvs_jax.engine.cadence import Cadence, calls
from cvs_jax.engine.context import RunContext
from cvs_jax.engine.run_state import RunState
from cvs_jax.engine.train_step import TrainState
from cvs_jax.errors import DivergedError, NonFiniteError
from cvs_jax.methods.seams import SessionBatches
from cvs_jax.models.heads import head_params
from cvs_jax.retrieval import topk
from cvs_jax.rundir import faults, paths
from cvs_jax.rundir.gallery import Gallery, RowConcat
from cvs_jax.rundir.run_log import format_eta

_NO_BAD_STEP = np.iinfo(np.int32).max
PROGRESS_SECONDS = 30.0  # the first epoch a loop trains prints a line at least this often (a CPU's slow start)
MAX_CALLS_IN_FLIGHT = 2  # the host prepares the next call while the device runs the current one


@dataclasses.dataclass(frozen=True)
class SessionView:
    """What session ``s`` trains on and searches."""

    s: int
    batches: SessionBatches  # the method's batch policy's plan: batch(epoch, i) -> dataset indices
    gallery_idx: np.ndarray  # train images whose rows this session adds to the gallery
    stored: Gallery  # the stored rows that validation and test search besides the session's own
    val_idx: np.ndarray  # validation queries (train split, accumulated over sessions)
    test_idx: np.ndarray  # test queries (test split, classes seen so far)
    epochs: int  # the session's (train.epochs, or what an update set for it)

    @property
    def steps_per_epoch(self) -> int:
        return self.batches.steps_per_epoch

    @property
    def total_steps(self) -> int:
        return self.steps_per_epoch * self.epochs


def make_search(ctx: RunContext, view: SessionView) -> Callable[..., dict]:
    """``search(variables, query_images, query_labels, new_rows=None) -> {k: recall}``: the stored
    rows plus the session's images embedded by ``variables`` (or ``new_rows`` when already embedded),
    streamed without a joint copy.  Validation searches with it and applies no query map: the session's
    map is fitted on its selected model, after training (``fit_query_map``); ``test`` applies the maps."""
    labels = np.concatenate([view.stored.labels, ctx.proto.train_labels[view.gallery_idx]])

    def search(variables, query_images, query_labels, new_rows=None):
        if new_rows is None:
            new_rows = ctx.embed(variables, ctx.proto.train_images(view.gallery_idx))
        rows = RowConcat([p.embeddings for p in view.stored.parts] + [new_rows])
        faults.maybe_fail("validation")
        q = ctx.embed(variables, query_images)
        return topk.recall_at_k_blocked(q, query_labels, rows, labels, ctx.ks, mesh=ctx.mesh)

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
    """The previous selected model with the head set up for the session (cosine: rows for the new
    classes; linear_reset: all new), the method's per-session extras and a fresh optimizer (every
    session starts one, as the official code and the fork)."""
    plan = ctx.proto.plan
    params = dict(state.variables["params"])
    head = head_params(ctx.head, params)
    params.update(
        ctx.head.at_session_start(
            head, jax.random.fold_in(ctx.head_key, s), plan.old_classes(s), plan.sessions[s].num_outputs
        )
    )
    if s > 0:
        params.update(ctx.method.extra_params(state.variables["params"], head))
    return TrainState(
        step=jnp.int32(0),
        params=params,
        batch_stats=state.variables["batch_stats"],
        opt_state=ctx.tx.init(params),
        tracked=ctx.method.importance.tracked_init(state.importance, params["net"]),
    )


def host_variables(ts: TrainState) -> dict:
    """A host copy of the current model (the step donates the state's device buffers)."""
    return jax.device_get({"params": ts.params, "batch_stats": ts.batch_stats})


@dataclasses.dataclass
class MemberSession:
    """One model's side of a session's training loop: its run context and session, the state it
    starts from (fresh, or a progress checkpoint's) and, updated by the loop, its best model so far.
    A plain run trains one member; a population run (``population.py``) several in one step."""

    ctx: RunContext
    view: SessionView
    first: int  # global step of the session's start: progress checkpoints are numbered first + step
    ts: TrainState  # host state at ``start``
    best: Selection
    sums: dict  # the epoch's running metric sums at ``start`` (host), {} at an epoch start
    start: int = 0
    search: Callable | None = None
    val_images: Any = None
    val_labels: Any = None
    reference: tuple[float, float] | None = None  # (loss, gradient norm) at the session's first step: _Watch

    @classmethod
    def fresh(cls, ctx: RunContext, state: RunState, view: SessionView) -> "MemberSession":
        ts = initial_train_state(ctx, state, view.s)
        return cls(ctx, view, state.steps_done, ts, Selection(host_variables(ts), -1.0, -1), {})

    def progress_templates(self) -> dict:
        return self.progress_trees(self.ts, self.best.variables, None)

    def progress_trees(self, ts, best: dict, sums) -> dict:
        """A progress checkpoint's items: without a frozen trunk (``frozen_trunk``)."""
        trunk = self.ctx.trunk
        if trunk is not None:
            ts, best = ts.replace(params=trunk.params_without(ts.params)), trunk.without(best)
        return {"state": ts, "best": best, "sums": sums}

    def progress_meta(self) -> dict:
        meta = {"best_r1": self.best.val_recall1, "best_epoch": self.best.epoch, "reference": self.reference}
        return meta if self.ctx.trunk is None else {**meta, **self.ctx.trunk.meta()}

    def restored(self, items: dict) -> None:
        """Takes a progress checkpoint's items (``Checkpoints.restore``); a frozen trunk comes from the
        session's starting state (the weight file), checked against the stored digest."""
        meta = items["meta"]
        ts, best, trunk = items["state"], items["best"], self.ctx.trunk
        if trunk is not None:
            trunk.check(meta, f"{self.ctx.progress.directory} (session {self.view.s + 1})")
            ts = ts.replace(params=trunk.params_with(ts.params, self.ts.params))
            best = trunk.with_(best, self.best.variables)
        self.ts = ts
        self.best = Selection(best, meta["best_r1"], meta["best_epoch"])
        self.sums = dict(items["sums"] or {})
        stored = meta.get("reference")  # absent in a checkpoint written before the growth guard
        self.reference = None if stored is None else (float(stored[0]), float(stored[1]))
        self.start = int(self.ts.step)
        self.ctx.log.print(f"resumed session {self.view.s + 1} at step {self.start}/{self.view.total_steps}")

    def progress_steps(self) -> range:
        return range(self.first + 1, self.first + self.view.total_steps + 1)

    def open(self) -> None:
        """Before the loop: drop metrics a killed process wrote after ``start``; the validation search."""
        ctx, view = self.ctx, self.view
        # metrics a killed process wrote after the point this session resumes from are written again
        ctx.log.truncate(session=view.s + 1, step=self.start, global_step=self.first + self.start)
        self.search = make_search(ctx, view)
        self.val_images = ctx.proto.train_images(view.val_idx)
        self.val_labels = ctx.proto.train_labels[view.val_idx]
        s, spe = view.s, view.steps_per_epoch
        ctx.log.print(
            f"== session {s + 1}/{ctx.proto.plan.num_sessions} [{ctx.method.name}, {ctx.head.name} head]: "
            f"{len(view.batches.indices)} "
            f"train images ({spe} steps/epoch), {ctx.proto.plan.sessions[s].num_outputs} classes, gallery "
            f"{len(view.stored)} stored + {len(view.gallery_idx)} new, {len(view.val_idx)} val / "
            f"{len(view.test_idx)} test queries"
        )

    def selection(self, last_ts: TrainState) -> Selection:
        return Selection(
            net_and_head(self.best.variables, self.ctx.head),
            self.best.val_recall1,
            self.best.epoch,
            last=net_and_head(host_variables(last_ts), self.ctx.head),
            tracked=jax.device_get(last_ts.tracked),
        )


class Driver:
    """How the loop runs its members' steps: a plain run's one state (``SingleDriver``) or a
    population's stacked states (``population.PopulationDriver``)."""

    members: list[MemberSession]
    stacked: bool  # metrics carry a leading [n] steps axis (and [N] members before it for a population)
    k: int  # training steps per call

    def device_state(self) -> TrainState: ...
    def device_sums(self) -> dict: ...
    def batches(self, calls: list[tuple[int, int]]) -> Iterable: ...
    def call(self, ts: TrainState, batch, lr: float, n: int) -> tuple[TrainState, dict]: ...
    def member(self, tree, m: int):
        return tree

    def per_member(self, values: np.ndarray):
        """One value per member (host) as the driver's metrics hold them: a plain run's scalar."""
        return values[0]


class SingleDriver(Driver):
    """One member: ``ctx.step_fn`` per step (k = 1, the plain step) or ``ctx.steps_fn`` per call of k."""

    def __init__(self, member: MemberSession, state: RunState, consts: dict):
        ctx, s = member.ctx, member.view.s
        self.members, self.ctx, self.consts = [member], ctx, consts
        self.k = ctx.steps_per_call
        self.stacked = self.k > 1
        self.frozen = distributed.replicate(state.variables, ctx.mesh) if s > 0 else None
        self.key = jax.random.fold_in(ctx.step_key, s)

    def device_state(self) -> TrainState:
        return distributed.replicate(self.members[0].ts, self.ctx.mesh)

    def device_sums(self) -> dict:
        return {k: jnp.asarray(v) for k, v in self.members[0].sums.items()}

    def batches(self, calls):
        m = self.members[0]
        if not self.stacked:
            return batches.batch_loader(self.ctx, m.view, calls[0][0] if calls else m.view.total_steps)
        return batches.call_loader(self.ctx, [batches.batch_reader(self.ctx, m.view)], calls, members_axis=False)

    def call(self, ts, batch, lr, n):
        if not self.stacked:
            return self.ctx.step_fn(
                ts, self.frozen, distributed.global_batch(batch, self.ctx.mesh), self.consts, jnp.float32(lr), self.key
            )
        lrs = jnp.full((n,), lr, jnp.float32)
        return self.ctx.steps_fn(
            ts, self.frozen, batches.global_stacked(batch, self.ctx.mesh, 1), self.consts, lrs, self.key
        )


@jax.jit
def _accumulate(sums, metrics):
    """``sums`` plus each step's metrics in step order (the leading-axis rows of ``metrics``; axis -1 in
    a population's ``[N, n]``), one add at a time as single steps add them: the same float sums."""
    n = jax.tree.leaves(metrics)[0].shape[-1]
    out = sums
    for i in range(n):
        row = {k: v[..., i] for k, v in metrics.items()}
        out = row if out is None else {k: out[k] + row[k] for k in row}
    return out


def run_loop(driver: Driver) -> TrainState:
    """The training loop shared by a plain run and a population: calls of ``driver.k`` steps (never
    across an epoch end, ``cadence``), the NaN guard, the epoch's metric sums, progress checkpoints, and
    at each epoch end every member's validation recall@1, best-model selection and metrics.  Returns
    the device state after the last step."""
    lead = driver.members[0]
    ts, sums = driver.device_state(), driver.device_sums()
    plan = calls(lead.start, lead.view.total_steps, lead.view.steps_per_epoch, driver.k)
    batches = iter(driver.batches(plan))
    profiler = profiling.StepProfiler(lead.ctx.config.profile_steps, paths.profile_dir(lead.ctx.workdir))
    try:
        return _loop(driver, batches, plan, ts, sums, lead.start, profiler)
    finally:
        profiler.stop()
        # the reading threads stop before an error leaves the loop: a daemon thread still inside the
        # runtime when the interpreter exits aborts it ("terminate called", "Fatal Python error")
        close = getattr(batches, "close", None)
        if close is not None:
            close()


def _loop(driver: Driver, batches, plan, ts, sums, step: int, profiler: profiling.StepProfiler) -> TrainState:
    """``run_loop``'s calls over ``plan``, reading ``batches``."""
    lead = driver.members[0]
    c, view = lead.ctx.config, lead.view
    s, spe, total = view.s, view.steps_per_epoch, view.total_steps
    cadence = Cadence(spe, c.log_every_steps, c.train.checkpoint_every_steps)
    base_lr = recipe.session_lr(c, s)
    watch = _Watch.start()
    steps_at_start = step
    t_session = t_epoch = t_line = time.time()
    in_flight: collections.deque = collections.deque()
    for first_step, n in plan:
        epoch = first_step // spe
        lr = schedules.epoch_lr(c.train.schedule, epoch, base_lr, view.epochs)
        batch = next(batches)
        t_call = time.time()
        if step == steps_at_start:  # the first call compiles the step: minutes for a large model on a CPU
            lead.ctx.log.print(f"  session {s + 1}: compiling the training step (or reading it from the cache)")
        profiler.before(lead.first + first_step, n)
        ts, metrics = driver.call(ts, batch, lr, n)
        if step == steps_at_start:
            lead.ctx.log.print(f"  session {s + 1}: training step ready in {time.time() - t_call:.1f} s")
        # at most MAX_CALLS_IN_FLIGHT dispatched calls: each holds its batch, so an unbounded queue of
        # asynchronous calls would make host (CPU) or device memory grow with the epoch's length
        in_flight.append(metrics["loss"])
        if len(in_flight) > MAX_CALLS_IN_FLIGHT:
            jax.block_until_ready(in_flight.popleft())
        sums = _accumulate_call(driver, sums, metrics)
        watch = watch.after_call(driver, metrics, first_step)
        step = first_step + n
        profiler.after(lead.first + step, metrics)
        for _ in range(n):
            faults.maybe_fail("step")
        events = cadence.between(first_step, step)
        # without log_every_steps, the first epoch still shows it moves (minutes per epoch on a CPU)
        slow = epoch == steps_at_start // spe and not events.epoch_end and time.time() - t_line > PROGRESS_SECONDS
        if events.log or events.epoch_end or slow:
            done = (step - steps_at_start) / max(total - steps_at_start, 1)
            eta = format_eta((time.time() - t_session) / done * (1 - done))
        if events.log or slow:
            t_line = time.time()
            for member in driver.members:
                member.ctx.log.print(f"  session {s + 1} epoch {epoch + 1} step {step}/{total} ETA {eta}")
        if events.checkpoint:
            watch.check(driver, base_lr)
            _save_progress(driver, ts, sums, step)
        if not events.epoch_end:
            continue
        watch.check(driver, base_lr)
        ips = spe * c.train.batch_size / max(time.time() - t_epoch, 1e-9)  # images trained per second, per member
        _end_epoch(driver, ts, sums, step=step, epoch=epoch, lr=lr, ips=ips, eta=eta)
        sums = {}
        _save_progress(driver, ts, sums, step)
        t_epoch = time.time()
    return ts


def _accumulate_call(driver: Driver, sums, metrics):
    """The epoch's metric sums after one call, kept on device (no sync)."""
    if driver.stacked:
        return _accumulate(sums or None, metrics)
    return {k: sums[k] + v if k in sums else v for k, v in metrics.items()}


GROWTH_LIMIT = 1e3  # a loss or gradient norm this many times its value at the session's first step: diverged
# the reference's floors: a first step that is already near zero does not make ordinary values "growth"
LOSS_FLOOR, GRAD_FLOOR = 1.0, 0.1


@dataclasses.dataclass(frozen=True)
class _Watch:
    """The loop's two guards, kept on device between checks: the first step whose loss is not finite
    (NaN/inf), and the first whose loss or gradient norm passed ``GROWTH_LIMIT`` times its value at the
    session's first step (``MemberSession.reference``, floored): a run that explodes while its values
    stay finite (a loss of 1e20) stops there too, with what to change."""

    bad: Any
    blown: Any
    peak: Any  # (loss, grad_norm): the largest finite values so far, per member
    reference: Any = None  # (loss, grad_norm) per member on device: () for a plain run, [N] for a population

    @classmethod
    def start(cls) -> "_Watch":
        none = jnp.int32(_NO_BAD_STEP)
        return cls(none, none, (jnp.float32(-jnp.inf), jnp.float32(-jnp.inf)))

    def after_call(self, driver: Driver, metrics, first_step: int) -> "_Watch":
        reference = self.reference if self.reference is not None else _reference(driver, metrics)
        loss, grad = metrics["loss"], metrics["grad_norm"]
        if not driver.stacked:  # one step: the steps axis of a call of one
            loss, grad = loss[..., None], grad[..., None]
        bad, blown, peak = _watch_update(self.bad, self.blown, self.peak, reference, loss, grad, first_step)
        return _Watch(bad, blown, peak, reference)

    def check(self, driver: Driver, base_lr: float) -> None:
        """Stop at a member's first non-finite or exploded step; its checkpoints before it stay."""
        members = driver.members
        for m, member in enumerate(members):
            bad, blown = int(driver.member(self.bad, m)), int(driver.member(self.blown, m))
            where = f" in {member.ctx.workdir}" if len(members) > 1 else ""
            what = f"session {member.view.s + 1} ({member.ctx.method.name}){where}"
            if bad != _NO_BAD_STEP and bad <= blown:
                raise NonFiniteError(
                    f"the loss became NaN/inf at step {bad + 1} of {what}; "
                    f"lower train.lr or check the data. Checkpoints up to the last good step are intact."
                )
            if blown != _NO_BAD_STEP:
                assert member.reference is not None  # set at the session's first step, before any growth
                (loss0, grad0), (loss, grad) = member.reference, [float(driver.member(p, m)) for p in self.peak]
                head = "" if member.ctx.head.name == "cosine" else ", or use model.head=cosine"
                raise DivergedError(
                    f"{what} diverged at step {blown + 1}: its loss went from {loss0:.3g} to {loss:.3g} and its "
                    f"gradient norm from {grad0:.3g} to {grad:.3g} (more than {GROWTH_LIMIT:g} times the first "
                    f"step's stops a run); lower train.lr (now {base_lr:g}; update takes --config.train.lr for "
                    f"the session it adds){head}. Checkpoints before that step are intact."
                )


@jax.jit
def _watch_update(bad, blown, peak, reference, loss, grad, first_step):
    """The guards after one call, in one program: one dispatch per call where the dozen small ops run one by
    one were a dozen (``_Watch.after_call``)."""
    idx = first_step + jnp.arange(loss.shape[-1], dtype=jnp.int32)  # first_step: a traced int, one program
    new_bad = jnp.min(jnp.where(jnp.isfinite(loss), _NO_BAD_STEP, idx), axis=-1)
    grown = (loss > GROWTH_LIMIT * reference[0][..., None]) | (grad > GROWTH_LIMIT * reference[1][..., None])
    new_blown = jnp.min(jnp.where(grown, idx, _NO_BAD_STEP), axis=-1)
    new_peak = tuple(
        jnp.maximum(p, jnp.max(jnp.where(jnp.isfinite(v), v, -jnp.inf), axis=-1)) for p, v in zip(peak, (loss, grad))
    )
    return jnp.minimum(bad, new_bad), jnp.minimum(blown, new_blown), new_peak


def _reference(driver: Driver, metrics) -> tuple:
    """Each member's (loss, gradient norm) at the session's first step (floored), kept on its
    ``MemberSession`` (and in its progress checkpoints); a resumed member keeps the one it had."""
    first = jax.device_get({k: metrics[k][..., 0] if driver.stacked else metrics[k] for k in ("loss", "grad_norm")})
    for m, member in enumerate(driver.members):
        if member.reference is None:
            got = driver.member(first, m)
            member.reference = (max(float(got["loss"]), LOSS_FLOOR), max(float(got["grad_norm"]), GRAD_FLOOR))
    values = np.asarray([member.reference for member in driver.members], np.float32)  # [members, 2]
    return tuple(jnp.asarray(driver.per_member(values[:, i])) for i in range(2))


def _save_progress(driver: Driver, ts: TrainState, sums: dict, step: int) -> None:
    """Every member's progress checkpoint at ``step`` of the session: state, best model, metric sums."""
    for m, member in enumerate(driver.members):
        ctx = member.ctx
        faults.fail_while_writing("progress_write", ctx.progress.directory)
        trees = member.progress_trees(driver.member(ts, m), member.best.variables, driver.member(sums, m))
        ctx.progress.save(member.first + step, trees, member.progress_meta())


def _end_epoch(driver: Driver, ts: TrainState, epoch_sums: dict, *, step: int, epoch: int, lr, ips, eta) -> None:
    """End of an epoch: each member's validation recall@1, best model (strict improvement, as the
    official code) and metrics line."""
    lead = driver.members[0]
    s, spe, n_sessions = lead.view.s, lead.view.steps_per_epoch, lead.ctx.proto.plan.num_sessions
    epochs = lead.view.epochs
    for m, member in enumerate(driver.members):
        epoch_metrics = {k: float(driver.member(v, m)) / spe for k, v in epoch_sums.items()}
        mts = driver.member(ts, m)
        assert member.search is not None  # set by member.open(), before the loop
        val_r1 = member.search({"params": mts.params, "batch_stats": mts.batch_stats}, member.val_images,
                               member.val_labels)[1]  # fmt: skip
        if val_r1 > member.best.val_recall1:
            member.best = Selection(host_variables(mts), val_r1, epoch)
        member.ctx.log.write(
            global_step=member.first + step,
            session=s + 1,
            epoch=epoch + 1,
            step=step,
            val_recall1=val_r1,
            images_per_s=ips,
            **epoch_metrics,
        )
        terms = " ".join(f"{k}={v:.4f}" for k, v in epoch_metrics.items() if k.startswith("L_"))
        member.ctx.log.print(
            f"session {s + 1}/{n_sessions} epoch {epoch + 1}/{epochs} step {step} lr={lr:.5f} "
            f"loss={epoch_metrics['loss']:.4f} {terms} val R@1={100 * val_r1:.2f} {ips:.0f} img/s ETA {eta}"
        )


def net_and_head(variables: dict, head) -> dict:
    """Host variables without the method's per-session extras (they end with the session)."""
    out = jax.device_get(variables)
    out["params"] = {"net": out["params"]["net"], **head_params(head, out["params"])}
    return out
