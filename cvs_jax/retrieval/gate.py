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

``served_model`` applies it to a whole run: the model a server of the run serves, which ``serve`` starts
with and ``search``, ``export`` and ``info`` use unless told a session (``--session``, ``model_for``).
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from cvs_jax.errors import SearchError
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


def lines(verdicts) -> list[str]:
    """``line`` for each verdict, except that consecutive switches for the same reason become one line naming
    their sessions and the worst BC and NFR among them: a server's first start on a run never served logged
    one line per session (20 at a 21-session photo run), each "switched ... within the thresholds"."""
    out, group = [], []

    def flush() -> None:
        if len(group) == 1:
            out.append(line(group[0]))
        elif group:
            first, last, t = group[0], group[-1], group[0]["thresholds"]
            worst = []
            bcs = [v for v in group if v["bc"] is not None]
            if bcs:
                v = min(bcs, key=lambda v: v["bc"])
                worst.append(f"lowest BC {v['bc']:+.2f} points (session {v['candidate_session']})")
            nfrs = [v for v in group if v["nfr"] is not None]
            if nfrs:
                v = max(nfrs, key=lambda v: v["nfr"])
                worst.append(f"highest NFR {v['nfr']:.2f} % (session {v['candidate_session']})")
            out.append(
                f"gate: switched sessions {first['candidate_session']}-{last['candidate_session']} "
                f"({len(group)} sessions; thresholds BC >= {t['bc']:g}, NFR <= {t['nfr']:g}"
                f"{', off' if t['off'] else ''}): {last['reason']}" + (f"; {', '.join(worst)}" if worst else "")
            )
        group.clear()

    for verdict in verdicts:
        if verdict["decision"] != "switched" or (group and verdict["reason"] != group[-1]["reason"]):
            flush()
        if verdict["decision"] == "switched":
            group.append(verdict)
        else:
            out.append(line(verdict))
    flush()
    return out


def for_workdir(workdir: str, candidate: int, served: int | None, thresholds: Thresholds) -> dict:
    return evaluate(read_results(workdir), candidate, served, thresholds)


def newest_session(workdir: str) -> int | None:
    """The newest completed session (0-based), from a directory listing alone (orbax names a step's
    folder by its number only once it is complete)."""
    try:
        names = os.listdir(paths.sessions_dir(workdir))
    except FileNotFoundError:
        return None
    steps = [int(n) for n in names if n.isdigit()]
    return max(steps) if steps else None


@dataclasses.dataclass(frozen=True)
class Choice:
    """The model that serves a run: ``model`` (0-based session), ``pin`` (0-based, None: none), the gate's
    ``verdicts`` on the sessions taken through it (in order) and ``notes`` for a log."""

    model: int
    pin: int | None = None
    verdicts: tuple[dict, ...] = ()
    notes: tuple[str, ...] = ()


def _served_record(workdir: str) -> tuple[int, int, int | None] | None:
    """``served.json``'s (model, gallery, pin) sessions, 0-based; None when no server recorded them."""
    try:
        with open(paths.served_file(workdir)) as f:
            record = json.load(f)
        pin = record.get("pinned_session")  # absent in a record written before pins were kept
        return int(record["model_session"]), int(record["gallery_session"]), None if pin is None else int(pin)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def served_model(workdir: str, newest: int, thresholds: Thresholds = Thresholds()) -> Choice:
    """The model that serves ``workdir`` once its ``newest`` (0-based) session completed: what ``serve`` starts
    with and what ``search`` and ``export`` use unless told a session.

    A server that served the run before recorded its model, the sessions it had seen and its pin
    (``served.json``): a pin holds; otherwise each session completed since goes through the gate from its
    model.  A run never served goes through the gate from session 1, as a server running since then would
    have: a session the gate kept out is never served (``update`` prints that verdict).  A session whose
    scores are not written yet (being scored) does not move the model.  A run without any scores
    (``results.json`` without the compatibility matrix: a ``main`` run not finished) serves the newest model."""
    results = read_results(workdir)
    record = _served_record(workdir)
    notes: tuple[str, ...] = ()
    if record is not None:
        model, seen, pin = record
        if 0 <= model <= seen <= newest and (pin is None or 0 <= pin <= newest):
            if pin is not None:
                note = (
                    f"the pin to the model of session {pin + 1} is kept (checkpoints/served.json): sessions "
                    "completed since do not go through the gate; lift it with POST /model?session=newest"
                )
                return Choice(pin, pin, (), (note,))
            return _through_gate(results, model, seen, newest, thresholds, notes)
        if pin is not None:
            notes = (f"served.json pins session {pin + 1}, which this run lacks: not pinned",)
    if not results.get("compatibility_recall1"):
        return Choice(newest, None, (), notes)
    return _through_gate(results, 0, 0, newest, thresholds, notes)


def _through_gate(results: dict, model: int, seen: int, newest: int, thresholds: Thresholds, notes) -> Choice:
    verdicts = []
    for candidate in range(seen + 1, newest + 1):
        verdict = evaluate(results, candidate, model, thresholds)
        if verdict["decision"] == "pending":
            continue  # its scores are not written yet: the model stays
        verdicts.append(verdict)
        model = candidate if verdict["decision"] == "switched" else model
    return Choice(model, None, tuple(verdicts), tuple(notes))


def note(choice: Choice, newest: int, subject: str = "queries are embedded by") -> str | None:
    """The line a command prints when the model it uses is not the newest session's (None when it is):
    ``note: <subject> the model of session N, not the newest ...``."""
    if choice.model == newest:
        return None
    if choice.pin is not None:
        why = "a server pinned it (checkpoints/served.json; POST /model?session=newest lifts the pin)"
    else:
        kept = [v for v in choice.verdicts if v["decision"] == "kept" and v["candidate_session"] > choice.model + 1]
        if kept:
            names = ", ".join(str(v["candidate_session"]) for v in kept)
            last = kept[-1]
            why = (
                f"the compatibility gate kept session{'s' if len(kept) > 1 else ''} {names} out (session "
                f"{last['candidate_session']}: {last['reason'].split(':')[0]})"
            )
        else:
            why = "the sessions after it have not been scored"
        why += ", as a server of this run would"
    return (
        f"note: {subject} the model of session {choice.model + 1}, not the newest ({newest + 1}): "
        f"{why}; --session {newest + 1} uses the newest."
    )


SESSION_HELP = (
    "The session (1-based) whose model {what}, or newest; default: the model a server of this run serves "
    "(the compatibility gate's choice from session 1 on, or a server's pin)."
)


def model_for(
    workdir: str, session: str | None, subject: str = "queries are embedded by"
) -> tuple[int | None, str | None]:
    """A command's ``--session``: the model's session (0-based; None: the run has no completed session, which
    the run reader refuses) and the note to print when it is not the newest by default (``note``)."""
    newest = newest_session(workdir)
    if session is not None:
        text = session.strip()
        if text == "newest":
            return newest, None
        if not (text.isascii() and text.isdigit()) or int(text) < 1:
            raise SearchError(f"--session {session!r}: pass a session number (1 is the first) or newest.")
        return int(text) - 1, None
    if newest is None:
        return None, None
    choice = served_model(workdir, newest)
    return choice.model, note(choice, newest, subject)
