"""Population runs: N members of one method trained together, one vmapped step for all of them.

``--config.population=N`` (N > 1) runs members m = 0..N-1 with ``seed = config.seed + m``: each its own
initialisation, augmentation and data order.  All share the session plan (class order + image split)
of ``config.split_seed``, or of ``config.seed`` when that is unset, and the dataset, read once.  Each
member keeps its own replay memory, gallery, best-validation model selection and checkpoints, and
writes a complete ordinary run directory, ``<workdir>/member<m>/`` by default (its config.json is the
member's: ``population=1``, its seed, the shared ``split_seed``), so ``search``, ``summarize`` and the
reports read it as any run; ``<workdir>/population.json`` lists the members, their seeds and folders.
A member is fed exactly what a plain run with its config is, step by step; its results equal that
run's up to the float differences of the batched program, which a stable training regime keeps small; a
near-tie query can still flip, and chaotic training amplifies them (in float64 they vanish:
docs/many-devices.md has the measurement, tests/runs/test_population.py what it asserts).

Per session the phases run per member as in ``runner.run_sessions`` (carry-over, session view and
constants, test, append-and-save); training is one loop (``train_loop.run_loop``, shared with plain runs)
over the members' states, frozen models, constants, keys and batches stacked on a leading member
axis, advanced by ``jax.vmap`` of the step (jitted once, state donated).  Every epoch end validates
and selects each member's model; progress checkpoints are written per member.

Resume: each member restores its newest session checkpoint; a session that some members finished
before the kill (the session checkpoints are written member after member) is run on by the others
alone (their training ended before any member's session checkpoint: their last progress checkpoint
holds it, no step is rerun).  Mid-session, the members resume from their newest common progress
checkpoint (written member after member as well), so all restart at the same step.

Methods: those whose per-session state is per member and whose step terms are functional
(``Method.population``); the others are refused before anything runs.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from cvs_jax import distributed
from cvs_jax.data import splits
from cvs_jax.engine import batches, train_loop
from cvs_jax.engine.context import RunContext
from cvs_jax.engine.run_state import RunState
from cvs_jax.engine.train_step import TrainState, make_train_step
from cvs_jax.errors import CheckpointError

FORMAT = "cvs_jax.population/1"


def member_config(config: ml_collections.ConfigDict, m: int) -> ml_collections.ConfigDict:
    """Member ``m``'s config: seed + m, the population's session plan, population=1 (an ordinary run)."""
    c = copy.deepcopy(config)
    c.unlock()
    c.split_seed = splits.split_seed(config)
    c.seed = int(config.seed) + m
    c.population = 1
    return c


def member_dirs(workdir: str, n: int) -> list[str]:
    return [os.path.join(workdir, f"member{m}") for m in range(n)]


def _stack(trees: list) -> Any:
    return jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *trees)


def make_population_step(ctx: RunContext, n: int):
    """The members' step: ``ctx.steps_per_call`` steps per call, vmapped over ``n`` members (jitted)."""
    return make_train_step(
        ctx.model,
        ctx.tx,
        ctx.method,
        head=ctx.head,
        loss_weights=dict(ctx.config.loss_weights),
        pipeline=ctx.pipeline,
        steps_per_call=ctx.steps_per_call,
        population=n,
        mesh=ctx.mesh,
    )


class PopulationDriver(train_loop.Driver):
    """The members' states, frozen models, constants, keys and batches stacked on a member axis."""

    stacked = True

    def __init__(self, members: list[train_loop.MemberSession], states: list[RunState], consts: list[dict]):
        lead = members[0].ctx
        s, n = members[0].view.s, len(members)
        self.members, self.ctx = members, lead
        self.k = lead.steps_per_call
        self.step = lead.cached(f"population_step_{n}", lambda: make_population_step(lead, n))
        self.frozen = distributed.replicate(_stack([st.variables for st in states]), lead.mesh) if s > 0 else None
        self.consts = distributed.replicate(_stack([jax.device_get(c) for c in consts]), lead.mesh)
        self.keys = jnp.stack([jax.random.fold_in(m.ctx.step_key, s) for m in members])

    def device_state(self) -> TrainState:
        return distributed.replicate(_stack([jax.device_get(m.ts) for m in self.members]), self.ctx.mesh)

    def device_sums(self) -> dict:
        if not self.members[0].sums:
            return {}
        return {k: jnp.asarray(np.stack([np.asarray(m.sums[k]) for m in self.members])) for k in self.members[0].sums}

    def batches(self, calls):
        readers = [batches.batch_reader(m.ctx, m.view) for m in self.members]
        return batches.call_loader(self.ctx, readers, calls, members_axis=True)

    def call(self, ts, batch, lr, n):
        batch = batches.global_stacked(batch, self.ctx.mesh, 2)
        return self.step(ts, self.frozen, batch, self.consts, jnp.full((n,), lr, jnp.float32), self.keys)

    def member(self, tree, m: int):
        return jax.tree.map(lambda x: x[m], tree)

    def per_member(self, values: np.ndarray):
        return values


def train(
    ctxs: list[RunContext], states: list[RunState], views: list[train_loop.SessionView], consts: list[dict]
) -> list[train_loop.Selection]:
    """All epochs of the session for the members, from their newest common progress checkpoint."""
    members = [train_loop.MemberSession.fresh(ctx, st, view) for ctx, st, view in zip(ctxs, states, views)]
    spe = {m.view.steps_per_epoch for m in members}
    if len(spe) != 1:
        raise CheckpointError(  # cannot happen with one plan and equal memory sizes; a clear stop if it does
            f"the population's members have different steps per epoch {sorted(spe)} in session "
            f"{views[0].s + 1}; run them with population=1."
        )
    _restore_common(members)
    for m in members:
        m.open()
    driver = PopulationDriver(members, states, consts)
    ts = train_loop.run_loop(driver)
    return [m.selection(driver.member(ts, i)) for i, m in enumerate(members)]


def _restore_common(members: list[train_loop.MemberSession]) -> None:
    """Every member at the newest session step for which all members hold a readable progress
    checkpoint (a kill between the members' writes leaves the newer step to some of them only).  The
    newer steps those members hold are deleted: every member writes them again from the common step
    (orbax refuses to write a step that exists), with the same contents (one program, one machine)."""
    while True:
        steps = None
        for m in members:
            own = {st - m.first for st in m.ctx.progress.steps() if st in m.progress_steps()}
            steps = own if steps is None else steps & own
        if not steps:
            _drop_newer(members, None)
            return
        common = max(steps)
        got = [m.ctx.progress.restore_latest(m.progress_templates(), steps=[m.first + common]) for m in members]
        if all(g is not None for g in got):  # else one was unreadable and moved aside: look again
            for m, g in zip(members, got):
                assert g is not None
                m.restored(g[1])
            _drop_newer(members, common)
            return


def _drop_newer(members: list[train_loop.MemberSession], common: int | None) -> None:
    """Deletes each member's progress checkpoints of this session after step ``common`` (None: all)."""
    for m in members:
        for st in m.ctx.progress.steps():
            if st in m.progress_steps() and (common is None or st - m.first > common):
                m.ctx.progress.delete(st)
