"""The continual visual-search protocol, session after session, for one run or a population.

``run`` checks the config, holds the workdir, builds the run's context and resumes from the newest
session checkpoint (``run_state.resume``); each session is then a short sequence of phases
(``phases.py``), and the run ends with results and pictures (``reporting.py``).  A population
(``config.population = N > 1``, ``run_population``) is the same loop over N members
(``run_sessions``), whose training phase is one vmapped step for all of them (``population.train``).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any

import jax
import ml_collections

from cvs_jax import distributed
from cvs_jax.config import recorded
from cvs_jax.engine import config_checks, data_checks, phases, population, reporting
from cvs_jax.engine.context import RunContext, devices_line
from cvs_jax.engine.run_state import resume
from cvs_jax.rundir import paths
from cvs_jax.rundir.run_log import RunLog


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
    """Runs (or resumes) the whole continual protocol; returns the contents of results.json (a
    population, ``config.population > 1``: ``run_population``'s summary)."""
    if config.population > 1:
        return run_population(config, workdir)
    distributed.maybe_initialize(config.distributed.multihost)  # before anything touches the devices
    config_checks.check(config, num_devices=jax.device_count())  # before any data loading or compilation
    with recorded.open_run(config, workdir, check=lambda: data_checks.check_data(config)):
        log = RunLog(workdir)
        log.print(devices_line())
        ctx = None
        try:
            ctx = RunContext.build(config, workdir, log)
            return run_sessions([ctx])[0]
        finally:  # also after an error: files closed, no writer thread outlives the run
            if ctx is not None:
                ctx.close()
            log.close()


def run_population(config: ml_collections.ConfigDict, workdir: str, dirs: list[str] | None = None) -> dict[str, Any]:
    """Runs (or resumes) a population; returns ``population.json``'s contents plus each member's
    results (``"results"``, in member order).  ``dirs``: the members' run directories (default
    ``<workdir>/member<m>``; ``compare --population`` passes its ``seed<k>/<method>`` folders)."""
    distributed.maybe_initialize(config.distributed.multihost)
    config_checks.check(config, num_devices=jax.device_count())
    n = int(config.population)
    dirs = dirs or population.member_dirs(workdir, n)
    configs = [population.member_config(config, m) for m in range(n)]
    with contextlib.ExitStack() as stack:
        stack.enter_context(recorded.open_run(config, workdir))
        for c, d in zip(configs, dirs):
            stack.enter_context(recorded.open_run(c, d))
        description = {
            "format": population.FORMAT,
            "method": config.method,
            "population": n,
            "split_seed": configs[0].split_seed,
            "members": [
                {"member": m, "seed": c.seed, "workdir": os.path.relpath(d, workdir)}
                for m, (c, d) in enumerate(zip(configs, dirs))
            ],
        }
        if jax.process_index() == 0:
            with open(paths.population_file(workdir), "w") as f:
                json.dump(description, f, indent=1)
        logs = [stack.enter_context(contextlib.closing(RunLog(d))) for d in dirs]
        ctxs: list[RunContext] = []
        try:
            logs[0].print(devices_line())
            for c, d, log in zip(configs, dirs, logs):
                ctxs.append(RunContext.build(c, d, log, share=ctxs[0] if ctxs else None))
            logs[0].print(
                f"population of {n} {config.method} members, seeds {configs[0].seed}..{configs[-1].seed}, "
                f"split seed {configs[0].split_seed}: {', '.join(dirs)}"
            )
            results = run_sessions(ctxs)
        finally:
            for ctx in ctxs:
                ctx.close()
    return dict(description, results=results)


def run_sessions(ctxs: list[RunContext]) -> list[dict]:
    """Every remaining session of N >= 1 members (one: a plain run); returns each member's results.

    Per session the phases run per member (carry-over, session view and constants, test,
    append-and-save); training is ``phases.train`` for a plain run and ``population.train``, one
    vmapped step for all active members, for a population."""
    states = [resume(ctx) for ctx in ctxs]
    num_sessions = ctxs[0].proto.plan.num_sessions
    for s in range(min(st.completed for st in states), num_sessions):
        t0 = time.time()
        active = [m for m, st in enumerate(states) if st.completed == s]  # the others finished s before a kill
        views, consts = {}, {}
        for m in active:
            states[m] = phases.carry_over(ctxs[m], states[m], s)
            views[m] = phases.session_view(ctxs[m], states[m], s)
            consts[m] = phases.session_constants(ctxs[m], states[m], views[m])
        selections = _train(
            len(ctxs),
            [ctxs[m] for m in active], [states[m] for m in active], [views[m] for m in active],
            [consts[m] for m in active],
        )  # fmt: skip
        for m, selection in zip(active, selections):
            states[m] = phases.fit_query_map(ctxs[m], states[m], views[m], selection)
            recall, mean_ap, new_rows = phases.test(ctxs[m], states[m], views[m], selection)
            states[m] = phases.append_and_save(
                ctxs[m], states[m], views[m], selection, recall, mean_ap, new_rows, time.time() - t0
            )
            if s + 1 < num_sessions:  # the last session's report is written with its results (finish)
                reporting.write_report(ctxs[m], states[m])
    return [reporting.finish(ctx, st) for ctx, st in zip(ctxs, states)]


def _train(size: int, ctxs, states, views, consts) -> list[phases.Selection]:
    """The active members' training phase: a plain run's loop, or the population's vmapped one (also
    when a kill left one member of a population to finish the session)."""
    if not ctxs[0].method.trains:
        return [phases.untrained(c, st, v) for c, st, v in zip(ctxs, states, views)]
    if size == 1:
        return [phases.train(ctxs[0], states[0], views[0], consts[0])]
    return population.train(ctxs, states, views, consts)
