"""The continual visual-search protocol, session after session, for one run or a population.

``run`` checks the config, holds the workdir, builds the run's context and resumes from the newest
session checkpoint (``resume``); each session is then a short sequence of phases
(``phases.py``), and the run ends with results and pictures (``reporting.py``).  A population
(``config.population = N > 1``, ``run_population``) is the same loop over N members
(``run_sessions``), whose training phase is one vmapped step for all of them (``population.train``).
``run_comparison`` runs compare's entries, every seed x method with session 1 shared where it can be
(the entries, their records and the tables: ``comparison.py``).
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
from cvs_jax.data import folder_inventory
from cvs_jax.engine import comparison, config_checks, data_checks, phases, population, reporting
from cvs_jax.engine.context import RunContext
from cvs_jax.engine.context_builder import build_context, devices_line
from cvs_jax.engine.run_state import RunState
from cvs_jax.errors import ConfigError, NonFiniteError, WorkdirBusyError
from cvs_jax.methods.registry import get_method, head_name, head_note
from cvs_jax.retrieval import query_maps
from cvs_jax.rundir import paths
from cvs_jax.rundir import workdir as workdir_lib
from cvs_jax.rundir.run_log import RunLog


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
    """Runs (or resumes) the whole continual protocol; returns the contents of results.json (a
    population, ``config.population > 1``: ``run_population``'s summary). A photo folder is scanned once
    (``folder_inventory.scans_held``)."""
    with folder_inventory.scans_held():
        return _run(config, workdir)


def _run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
    if config.population > 1:
        return run_population(config, workdir)
    distributed.maybe_initialize(config.distributed.multihost)  # before anything touches the devices
    config_checks.check(config, num_devices=jax.device_count())  # before any data loading or compilation
    if os.path.isfile(os.path.join(workdir, paths.COMPARISON)):
        raise ConfigError(
            f"{workdir} is a compare --workdir (it holds {paths.COMPARISON}); give this run a --workdir of its own."
        )
    with recorded.open_run(config, workdir, check=lambda: data_checks.check_data(config)):
        log = RunLog(workdir)
        log.print(devices_line())
        note = head_note(config)
        if note:
            log.print(note)
        ctx = None
        try:
            ctx = build_context(config, workdir, log)
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
                ctxs.append(build_context(c, d, log, share=ctxs[0] if ctxs else None))
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


def resume(ctx: RunContext) -> RunState:
    """The state after the newest session checkpoint of ``ctx``'s run, or a fresh one."""
    embed_dim = ctx.config.model.embed_dim
    state = None
    if ctx.sessions.steps():  # read into the variables' shapes: the checkpoint replaces every value
        state = RunState.restore(ctx.sessions, RunState.initial(ctx.variables_template(), embed_dim), ctx.trunk)
    if state is None:  # none yet, or each one unreadable (moved aside)
        return RunState.initial(ctx.initial_variables(), embed_dim)
    state = state.replace(
        query_maps=query_maps.stored_maps(ctx.workdir, state.completed - 1, ctx.config.retrieval.query_map)
    )
    ctx.log.print(
        f"resumed after session {state.completed}: gallery {len(state.gallery)} rows, memory {len(state.memory)}"
    )
    return state


def _train(size: int, ctxs, states, views, consts) -> list[phases.Selection]:
    """The active members' training phase: a plain run's loop, or the population's vmapped one (also
    when a kill left one member of a population to finish the session)."""
    if not ctxs[0].method.trains:
        return [phases.untrained(c, st, v) for c, st, v in zip(ctxs, states, views)]
    if size == 1:
        return [phases.train(ctxs[0], states[0], views[0], consts[0])]
    return population.train(ctxs, states, views, consts)


@folder_inventory.scans_held()  # a photo folder scanned once for every entry's checks and runs
def run_comparison(
    config,
    workdir: str,
    methods: list[str],
    seeds: list[int],
    split_seed: int | None = None,
    population: bool = False,
    tabulate: bool = False,
):
    """Runs every (seed, method); returns one row per method (see ``rows_from_summary``).
    ``tabulate``: runs nothing, tabulates the runs already finished in ``workdir`` (``recorded_run``).

    ``split_seed``: every run uses this session plan (None: ``config.split_seed``, and if that is
    None each seed its own).  ``population``: each method's seeds (consecutive) train as one
    population, on one plan (``split_seed``, else ``config.split_seed``, else the first seed's)."""
    comparison.check_entries(config, methods, seeds, split_seed, population)
    if split_seed is None:
        split_seed = config.split_seed
    if population and split_seed is None:
        split_seed = min(seeds)  # the members of a population share one session plan
    distributed.maybe_initialize(config.distributed.multihost)  # before the lock asks JAX for the process index
    if not tabulate:  # (tabulating reads records only: it needs no dataset or weights file)
        _check_entry_configs(config, methods, seeds, split_seed, population)
    with contextlib.ExitStack() as stack:  # one comparison per DIR; each run also locks its own workdir
        try:
            stack.enter_context(workdir_lib.hold(workdir))
            live = False
        except WorkdirBusyError:
            if not tabulate:
                raise
            live = True  # tabulating a comparison that runs: its tables are printed, the files stay its own
        if os.path.isfile(paths.config_file(workdir)):  # (after the lock: a live run is named by the lock)
            raise ConfigError(
                f"{workdir} holds a run of python -m cvs_jax.main (its config.json); give the comparison a "
                "--workdir of its own."
            )
        if live:
            print(
                f"{workdir} is held by a running comparison: the tables of the runs finished so far are printed "
                "below and not written (it writes comparison.md/.csv/.json when it ends).",
                flush=True,
            )
        return _compare(config, workdir, methods, seeds, split_seed, population, tabulate, write=not live)


def _check_entry_configs(config, methods: list[str], seeds: list[int], split_seed, population: bool) -> None:
    """Every entry's config passes ``config_checks`` before the first run starts, so that a field the last
    entry cannot take (a memory budget below the classes, a method a population cannot train) is refused
    before the earlier entries have trained for hours; then every run's session plan (``data_checks.check_entries``:
    a session smaller than a batch that only some methods' memory fills)."""
    for entry in methods:
        c = comparison.entry_config(config, entry, seeds[0], split_seed)
        if population:
            c.population = len(seeds)
        config_checks.check(c, num_devices=jax.device_count())
    data_checks.check_entries([comparison.entry_config(config, e, seed, split_seed) for seed in seeds for e in methods])


def _share_session_one(c, entry: str, seed: int, run_dir: str, earlier: dict) -> None:
    """Copies session 1 into ``run_dir`` from the first earlier run of this seed and head that saved it
    (``earlier``: (seed, head) -> run dirs, updated), unless the method trains its own session 1 (it keeps
    statistics of it, or the entry overrides a field that session 1 reads)."""
    if not get_method(c).shares_first_session:  # its session 1 keeps statistics: it trains its own
        return
    groups = comparison.session_two_groups(c)
    if any(key.split(".")[0] not in groups for key in comparison.parse_entry(entry)[2]):
        return
    sharing = earlier.setdefault((seed, head_name(c)), [])
    source = next((d for d in sharing if os.path.exists(paths.session_dir(d, 0))), None)
    if source is not None:
        comparison.share_first_session(source, run_dir)
    sharing.append(run_dir)


def _run_populations(config, workdir: str, methods: list[str], seeds: list[int], split_seed: int) -> list[dict]:
    """Each method's seeds as one population, in ``DIR/seed<k>/<method>`` (session 1 shared as without)."""
    seeds = sorted(seeds)
    runs: list[dict] = []
    t0 = time.time()
    earlier: dict = {}
    for method in methods:
        c = comparison.entry_config(config, method, seeds[0], split_seed)
        c.population = len(seeds)
        dirs = [os.path.join(workdir, f"seed{seed}", method) for seed in seeds]
        for seed, run_dir in zip(seeds, dirs):
            _share_session_one(c, method, seed, run_dir, earlier)
        print(
            f"\n##### method {method}, seeds {seeds[0]}..{seeds[-1]} as a population ({time.time() - t0:.0f}s elapsed)"
        )
        try:
            out = run_population(c, os.path.join(workdir, "population", method), dirs)
            runs += [comparison.run_record(s, method, c, d, workdir, r) for s, d, r in zip(seeds, dirs, out["results"])]
        except NonFiniteError as e:  # the population stops as a whole: every seed of the method diverged
            print(f"method {method} (population) diverged: {e}", flush=True)
            runs += [comparison.run_record(s, method, c, d, workdir, None, e) for s, d in zip(seeds, dirs)]
    return sorted(runs, key=lambda r: r["seed"])  # seed-major, as without --population


def _compare(
    config,
    workdir: str,
    methods: list[str],
    seeds: list[int],
    split_seed: int | None,
    population: bool = False,
    tabulate: bool = False,
    write: bool = True,
) -> list[dict]:
    runs: list[dict] = []
    t0 = time.time()
    if tabulate:
        runs = [
            r for seed in seeds for m in methods if (r := comparison.recorded_run(config, workdir, m, seed, split_seed))
        ]
    elif population:
        assert split_seed is not None  # set above for a population
        runs = _run_populations(config, workdir, methods, seeds, split_seed)
    earlier: dict = {}  # (seed, head) -> sharing run dirs so far: session 1 comes from the first that saved it
    for seed in [] if population or tabulate else seeds:
        for method in methods:
            c = comparison.entry_config(config, method, seed, split_seed)
            run_dir = os.path.join(workdir, f"seed{seed}", method)
            _share_session_one(c, method, seed, run_dir, earlier)
            print(f"\n##### seed {seed}, method {method} ({time.time() - t0:.0f}s elapsed)", flush=True)
            try:
                runs.append(comparison.run_record(seed, method, c, run_dir, workdir, run(c, run_dir)))
            except NonFiniteError as e:  # a diverged run: recorded, the comparison goes on
                print(f"seed {seed}, method {method} diverged: {e}", flush=True)
                comparison.record_divergence(run_dir, e)
                runs.append(comparison.run_record(seed, method, c, run_dir, workdir, None, e))
    return comparison.write_outputs(config, workdir, methods, seeds, split_seed, runs, t0, write=write)
