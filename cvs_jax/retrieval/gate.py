"""The compatibility gate: may a newly completed session's model replace the model being served?

The probe queries are the ones the run already holds and scores at the end of every session: the held-out
test queries of the last session (``engine.reporting``), with their labels, searched by each model against
each stored gallery part (``results.json``'s ``compatibility_recall1``, entry [i][j]: model i on the rows
part j's own model made) and, for NFR, against the rows before session i by models i-1 and i
(``negative_flip_rate``, entry i-1).  Reading them costs the server nothing: ``update`` computed them
beside serving, when the session completed.

For a candidate session c the gate reads, for each stored part j < c, BC_j = 100 (M[c][j] - M[j][j])
(recall@1 points the candidate loses on part j's rows against the part's own model), their mean (BC as
the run reports it) and NFR (% of the probe queries the update to c turns from right to wrong at top 1).
It passes when BC >= -``bc`` and NFR <= ``nfr``.  Defaults (``DEFAULT_BC``, ``DEFAULT_NFR``): see
docs/serve.md for the measurements they come from.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from cvs_jax.rundir import paths

# Measured on the runs of docs/serve.md's table: every cvs switch of the demo (3 seeds) and the photo runs
# passes (worst: BC -18.15, NFR 20.9 %), finetune's breaks on the demo (-34.4, -37.4) and a reported photo
# run (-34 to -55) are kept out; smaller finetune losses (the photo runs' -2 to -12.6) pass.
DEFAULT_BC = 20.0  # points of recall@1 a candidate may lose on the stored parts (mean over parts)
DEFAULT_NFR = 25.0  # % of probe queries an update may turn from right to wrong at top 1


@dataclasses.dataclass(frozen=True)
class Thresholds:
    bc: float = DEFAULT_BC
    nfr: float = DEFAULT_NFR
    off: bool = False  # --gate off: every completed session is switched to


def read_results(workdir: str) -> dict:
    try:
        with open(paths.results_file(workdir)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _num(v) -> float | None:
    return None if v is None or (isinstance(v, float) and np.isnan(v)) else float(v)


def evaluate(results: dict, candidate: int, served: int | None, thresholds: Thresholds) -> dict:
    """The verdict on switching to session ``candidate`` (0-based) from ``served``'s model: ``decision``
    "switched" | "kept" | "pending" (the run has not scored the candidate yet), ``bc`` (mean points),
    ``bc_parts`` (per stored part, 1-based session -> points), ``nfr`` (%), ``thresholds``, ``reason``;
    sessions 1-based."""
    out = {
        "candidate_session": candidate + 1,
        "served_session": None if served is None else served + 1,
        "bc": None,
        "bc_parts": {},
        "nfr": None,
        "thresholds": {"bc": -thresholds.bc, "nfr": thresholds.nfr, "off": thresholds.off},
    }
    matrix = results.get("compatibility_recall1") or []
    flips = results.get("negative_flip_rate") or []
    if len(matrix) <= candidate:
        return {**out, "decision": "pending", "reason": f"the run has not scored session {candidate + 1} yet"}
    row = matrix[candidate]
    parts = {}
    for j in range(candidate):
        mine, own = _num(row[j]) if j < len(row) else None, _num(matrix[j][j]) if j < len(matrix[j]) else None
        if mine is not None and own is not None:
            parts[j + 1] = round(100 * (mine - own), 2)
    bc = round(float(np.mean(list(parts.values()))), 2) if parts else None
    nfr = _num(flips[candidate - 1]) if 0 < candidate <= len(flips) else None
    nfr = None if nfr is None else round(100 * nfr, 2)
    out.update(bc=bc, bc_parts=parts, nfr=nfr)
    fails = []
    if bc is not None and bc < -thresholds.bc:
        fails.append(f"BC {bc:+.2f} points < -{thresholds.bc:g}")
    if nfr is not None and nfr > thresholds.nfr:
        fails.append(f"NFR {nfr:.2f} % > {thresholds.nfr:g}")
    if thresholds.off:
        return {**out, "decision": "switched", "reason": "the gate is off (--gate off)"}
    if fails:
        why = "; ".join(fails)
        return {**out, "decision": "kept", "reason": f"{why}: the served model stays (POST /model pins any session)"}
    measured = "nothing to compare (one session)" if bc is None and nfr is None else "within the thresholds"
    return {**out, "decision": "switched", "reason": measured}


def line(verdict: dict) -> str:
    """One line for a log or ``update``'s last line: ``gate: <decision> session N ...``."""
    bc = "-" if verdict["bc"] is None else f"{verdict['bc']:+.2f}"
    nfr = "-" if verdict["nfr"] is None else f"{verdict['nfr']:.2f}"
    t = verdict["thresholds"]
    return (
        f"gate: {verdict['decision']} session {verdict['candidate_session']} (BC {bc} points, NFR {nfr} %; "
        f"thresholds BC >= {t['bc']:g}, NFR <= {t['nfr']:g}{', off' if t['off'] else ''}): {verdict['reason']}"
    )


def for_workdir(workdir: str, candidate: int, served: int | None, thresholds: Thresholds) -> dict:
    return evaluate(read_results(workdir), candidate, served, thresholds)
