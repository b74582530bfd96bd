"""The end of a run: ``results.json``, the results table, the compatibility matrix and the plots; and
``report.html``, rewritten after every session and at the end (``write_report``)."""

from __future__ import annotations

import json
import os

import jax
import numpy as np

from cvs_jax.engine import compat_counts, features
from cvs_jax.engine.context import RunContext
from cvs_jax.engine.run_state import RunState, restore_variables
from cvs_jax.reports import plots, run_page
from cvs_jax.retrieval import topk
from cvs_jax.retrieval.compatibility import (
    BC_KEY,
    average_compatibility,
    average_compatibility_rules,
    average_multimodel_accuracy,
    format_matrix,
    mean_drop,
)
from cvs_jax.retrieval.run_rows import Rows
from cvs_jax.rundir import paths


def results_table(per_session: list[dict], ks) -> str:
    """Recall@K per session and AR@K, with an mAP column when every session has one."""
    mean_ap = average_map(per_session)
    with_map = mean_ap is not None
    head = "| session | " + " | ".join(f"R@{k}" for k in ks) + (" | mAP" if with_map else "") + " |"
    rows = [head, "|" + "---|" * (len(ks) + 1 + with_map)]
    for r in per_session:
        cells = [f"{100 * r['recall'][str(k)]:.2f}" for k in ks] + ([f"{100 * r['map']:.2f}"] if with_map else [])
        rows.append(f"| {r['session'] + 1} | " + " | ".join(cells) + " |")
    ar = topk.average_recall([{k: r["recall"][str(k)] for k in ks} for r in per_session])
    cells = [f"**{100 * ar[k]:.2f}**" for k in ks] + ([f"**{100 * mean_ap:.2f}**"] if with_map else [])
    rows.append("| **AR** | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def average_map(per_session: list[dict]) -> float | None:
    """The mean of the sessions' mAP (as AR@K averages their recall); None when a session has none."""
    values = [r["map"] for r in per_session if "map" in r]
    if not values or len(values) != len(per_session) or any(v is None for v in values):
        return None
    return float(np.mean(values))


def _stored_rows(ctx: RunContext, state: RunState) -> tuple[int, Rows]:
    """The gallery's columns from memory (no checkpoint read again); a row arrived in the first
    session of the plan whose train images hold it (``joint`` re-embeds every row each session)."""
    g, plan = state.gallery, ctx.proto.plan
    first = np.full(len(ctx.proto.dataset.train), -1, np.int32)
    for s in reversed(range(plan.num_sessions)):
        first[np.asarray(plan.sessions[s].train, np.int64)] = s
    arrival = g.sessions.copy()
    known = (g.source_ids >= 0) & (g.source_ids < len(first))
    arrival[known] = np.where(first[g.source_ids[known]] >= 0, first[g.source_ids[known]], arrival[known])
    rows = Rows(embeddings=g.embeddings, labels=g.labels, arrival=arrival, model=g.sessions, source_ids=g.source_ids)
    return state.completed - 1, rows


def write_report(ctx: RunContext, state: RunState, results: dict | None = None) -> None:
    """``report.html`` of the run so far (process 0); a failure is a warning, never the run's end."""
    if jax.process_index() != 0 or state.completed == 0 or not ctx.config.pictures:
        return
    try:
        stored = _stored_rows(ctx, state)
        if results is None:
            results = run_page.partial_results(list(state.records), ctx.ks)
    except Exception as e:  # noqa: BLE001 -- the page is a view; a run never fails for it
        ctx.log.print(f"warning: {paths.report_file(ctx.workdir)} not written ({type(e).__name__}: {e})")
        return
    # a run on cached trunk features holds features in its split: the page reads the photos from the
    # run's stores, as ``python -m cvs_jax.report`` does
    read_train = None if features.cached(ctx.config) else ctx.proto.dataset.train.read
    run_page.write_or_warn(ctx.workdir, ctx.log.print, results=results, stored=stored, read_train=read_train)


def finish(ctx: RunContext, state: RunState) -> dict:
    """Writes results.json and (with ``config.pictures``) the pictures and the page (process 0) and returns
    the results."""
    c, plan, ks = ctx.config, ctx.proto.plan, ctx.ks
    per_session = list(state.records)
    ar = topk.average_recall([{k: r["recall"][str(k)] for k in ks} for r in per_session])
    results = {
        "method": ctx.method.name,
        "head": ctx.head.name,
        "dataset": c.data.name,
        "setup": plan.setup,
        "seed": c.seed,
        # sessions numbered from 1, as everything printed (the checkpoints' records count from 0)
        "per_session": [dict(r, session=r["session"] + 1) for r in per_session],
        "average_recall": {str(k): v for k, v in ar.items()},
        "average_map": average_map(per_session),
        "query_map": c.retrieval.query_map,
    }
    # with query maps, model i's queries reach part j's rows through the chain i -> ... -> j
    compat, flips, counted = compat_counts.count(
        ctx, state, lambda i: restore_variables(ctx.sessions, i, state.variables, ctx.trunk)
    )
    ctx.log.print(counted)
    results["compatibility_recall1"] = [[None if np.isnan(v) else float(v) for v in row] for row in compat]
    drop = mean_drop(results["compatibility_recall1"])
    results[BC_KEY] = None if drop is None else 100 * drop  # points, as shown
    results["compatibility_ac"] = average_compatibility(results["compatibility_recall1"])  # a tie fails (iamcl2r)
    results["compatibility_ac_ties_pass"] = average_compatibility_rules(results["compatibility_recall1"])["ties_pass"]
    results["compatibility_am"] = average_multimodel_accuracy(results["compatibility_recall1"])
    # entry i-1: the update from model i-1 to model i (top-1 of the same queries on the rows before session i)
    results["negative_flip_rate"] = flips
    # where forgetting shows
    ctx.log.print(format_matrix(results["compatibility_recall1"], results["negative_flip_rate"]))
    flips = [f"{100 * v:.1f}" if v is not None else "-" for v in results["negative_flip_rate"]]
    if flips:
        ctx.log.print(f"negative flips (% of queries right before an update and wrong after): {', '.join(flips)}")
    if jax.process_index() == 0:
        tmp = paths.results_file(ctx.workdir) + ".tmp"
        with open(tmp, "w") as f:
            json.dump(results, f, indent=2)
        os.replace(tmp, paths.results_file(ctx.workdir))
        if c.pictures:
            title = f"{c.data.name} / {plan.setup} / {ctx.method.name}"
            plots.recall_per_session([results], os.path.join(ctx.workdir, "recall_per_session.png"))
            plots.class_distribution(
                ctx.proto.session_class_counts(ctx.method),
                os.path.join(ctx.workdir, "class_distribution.png"),
                f"{c.data.name} / {plan.setup}: training images per session",
            )
            plots.compatibility(compat, os.path.join(ctx.workdir, "compatibility.png"), title)
            write_report(ctx, state, results)
    ctx.log.print(
        f"\nresults ({ctx.method.name}, {c.data.name}, {plan.setup}; recall in %):\n" + results_table(per_session, ks)
    )
    return results
