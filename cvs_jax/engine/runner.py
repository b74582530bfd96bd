"""The continual visual-search protocol, session after session.

``run`` checks the config, holds the workdir, builds the run's context and resumes
from the newest session checkpoint; each session is then a short sequence of phases
(``phases.py``), and the run ends with results and pictures (``reporting.py``).
"""

from __future__ import annotations

import time
from typing import Any

import jax
import ml_collections

from cvs_jax import distributed
from cvs_jax.engine import config_checks, phases, reporting
from cvs_jax.engine.context import RunContext, devices_line
from cvs_jax.engine.run_state import RunState
from cvs_jax.rundir import workdir as workdir_lib
from cvs_jax.rundir.run_log import RunLog


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
    """Runs (or resumes) the whole continual protocol; returns the contents of results.json (a
    population, ``config.population > 1``: ``population.run_population``'s summary)."""
    if config.get("population", 1) > 1:
        from cvs_jax.engine import population  # it builds on this module

        return population.run_population(config, workdir)
    distributed.maybe_initialize(config.distributed.multihost)  # before anything touches the devices
    config_checks.check(config, num_devices=jax.device_count())  # before any data loading or compilation
    with workdir_lib.open_run(config, workdir):
        log = RunLog(workdir)
        log.print(devices_line())
        ctx = None
        try:
            ctx = RunContext.build(config, workdir, log)
            return run_sessions(ctx)
        finally:  # also after an error: files closed, no writer thread outlives the run
            if ctx is not None:
                ctx.close()
            log.close()


def resume(ctx: RunContext) -> RunState:
    """The state after the newest session checkpoint, or a fresh one."""
    fresh = RunState.initial(ctx.initial_variables(), ctx.config.model.embed_dim)
    state = RunState.restore(ctx.sessions, fresh)
    if state is None:
        return fresh
    ctx.log.print(
        f"resumed after session {state.completed}: gallery {len(state.gallery)} rows, memory {len(state.memory)}"
    )
    return state


def run_sessions(ctx: RunContext) -> dict[str, Any]:
    state = resume(ctx)
    for s in range(state.completed, ctx.proto.plan.num_sessions):
        t0 = time.time()
        state = phases.carry_over(ctx, state, s)
        view = phases.session_view(ctx, state, s)
        consts = phases.session_constants(ctx, state, view)
        selection = phases.train(ctx, state, view, consts)
        recall, new_rows = phases.test(ctx, view, selection)
        state = phases.append_and_save(ctx, state, view, selection, recall, new_rows, time.time() - t0)
    return reporting.finish(ctx, state)
