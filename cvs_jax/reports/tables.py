"""``compare``'s tables: per-method AR@K and the compatibility summaries (BC, AC, AM, NFR) over seeds,
paired differences to ``cvs``, and the
``comparison.md`` / ``.csv`` / ``.json`` they are written as.
"""

from __future__ import annotations

import csv
from typing import Sequence

import numpy as np

from cvs_jax.reports.statistics import (
    CONFIDENCE,
    format_difference,
    mean_std,
    paired_difference,
)

REFERENCE = "cvs"  # paired differences are taken against this method
BC = "BC"  # the backward-compatibility summary's key beside the K of AR@K (compatibility.mean_drop, points)
# the compatibility summaries of a run record, in %: BC; AC and AM (compatibility.average_compatibility,
# average_multimodel_accuracy); NFR, the mean negative-flip rate of the run's updates (compatibility.negative_flips)
# "AC ties pass": AC when a tie M[i, j] == M[j, j] counts as compatible (CoReS / CL2R; "AC" fails it, iamcl2r),
# shown in the tables only where it differs from AC. "mAP": the mean over sessions of the session's mAP, in %.
AC_PASS = "AC ties pass"
COMPAT = ("mAP", BC, "AC", AC_PASS, "AM", "NFR")
JSON_FORMAT = "cvs_jax.comparison/1"


def _metric(r: dict, k: str) -> float | None:
    """AR@k of a finished run record, or its compatibility summary ``k`` (None in records made before it)."""
    return r.get(k) if k in COMPAT else r["average_recall"][k]


def _paired(ok_a: dict, ok_b: dict, keys: list[str]) -> dict:
    """Paired differences a - b per key (AR@K and COMPAT) over the seeds both finished."""
    out = {}
    for k in keys:
        a = {s: v for s, r in ok_a.items() if (v := _metric(r, k)) is not None}
        b = {s: v for s, r in ok_b.items() if (v := _metric(r, k)) is not None}
        out[k] = paired_difference(a, b)
    return out


def recall_ks(runs: list[dict], configured: Sequence[int] = ()) -> list[str]:
    """The K of the AR@K columns: those of the first finished run, else the config's (``eval.ks``), so that a
    comparison in which every run diverged keeps its AR@K columns (cells "diverged") instead of losing them."""
    return next((list(r["average_recall"]) for r in runs if r["status"] == "ok"), [str(k) for k in configured])


def summarize_runs(runs: list[dict], methods: list[str], configured_ks: Sequence[int] = ()) -> list[dict]:
    """Per method (in ``methods`` order): AR@K and COMPAT mean/std/per-seed over its finished seeds, the
    seeds that diverged, the mean recall@1 per session and the paired difference to ``cvs`` (None for
    cvs itself, and when cvs is not compared).  ``configured_ks``: the config's K (``recall_ks``)."""
    ks = recall_ks(runs, configured_ks)
    by_method = {m: [r for r in runs if r["method"] == m] for m in methods}
    ok = {m: {r["seed"]: r for r in rs if r["status"] == "ok"} for m, rs in by_method.items()}
    summary = []
    for m in methods:
        entry = {
            "method": m,
            "seeds": sorted(ok[m]),
            "diverged": {str(r["seed"]): r["message"] for r in by_method[m] if r["status"] == "diverged"},
            "average_recall": {},
            **{key: None for key in COMPAT},
            "recall1_per_session": None,
            "vs_" + REFERENCE: None,
        }
        for key in COMPAT:
            values = {s: v for s, r in ok[m].items() if (v := _metric(r, key)) is not None}
            if values:
                mean, std = mean_std(list(values.values()))
                entry[key] = {"mean": mean, "std": std, "per_seed": {str(s): v for s, v in values.items()}}
        for k in ks:
            per_seed = {s: r["average_recall"][k] for s, r in ok[m].items()}
            mean, std = mean_std(list(per_seed.values()))
            entry["average_recall"][k] = {
                "mean": mean,
                "std": std,
                "per_seed": {str(s): v for s, v in per_seed.items()},
            }
        if ok[m]:
            entry["recall1_per_session"] = np.mean([r["recall1_per_session"] for r in ok[m].values()], 0).tolist()
        entry["memory_rule"] = next((r.get("memory_rule") for r in by_method[m]), None)
        rows = [r["memory_rows"] for r in ok[m].values() if r.get("memory_rows") is not None]
        entry["memory_rows"] = np.mean(rows, 0).tolist() if rows else None
        if m != REFERENCE and REFERENCE in ok:
            entry["vs_" + REFERENCE] = _paired(ok[m], ok[REFERENCE], ks + list(COMPAT))
        summary.append(entry)
    return summary


def summarize_pairs(
    runs: list[dict], pairs: list[tuple[str, str, str]], configured_ks: Sequence[int] = ()
) -> list[dict]:
    """``entry_pairs``' comparisons: ``{a, b, why, difference: {K or COMPAT key: paired_difference}}``."""
    ks = recall_ks(runs, configured_ks)
    ok = {}
    for r in runs:
        if r["status"] == "ok":
            ok.setdefault(r["method"], {})[r["seed"]] = r
    return [
        {"a": a, "b": b, "why": why, "difference": _paired(ok.get(a, {}), ok.get(b, {}), ks + list(COMPAT))}
        for a, b, why in pairs
    ]


def rows_from_summary(summary: list[dict]) -> list[dict]:
    """One flat row per method (what ``run_comparison`` returns and ``comparison.csv`` holds)."""
    rows = []
    for e in summary:
        row = {"method": e["method"], "seeds": len(e["seeds"]), "diverged": len(e["diverged"])}
        for k, a in e["average_recall"].items():
            row[f"AR@{k}"], row[f"AR@{k} std"] = a["mean"], a["std"]
        for key in COMPAT:
            row[key], row[f"{key} std"] = (e[key]["mean"], e[key]["std"]) if e.get(key) else (None, None)
        vs = e["vs_" + REFERENCE]
        for k in list(e["average_recall"]) + list(COMPAT):
            name = k if k in COMPAT else f"AR@{k}"
            d = vs[k] if vs else None
            ci = d["ci95"] if d and d["ci95"] else (None, None)
            row[f"{name} - {REFERENCE}"] = d["mean"] if d else None
            row[f"{name} - {REFERENCE} ci95 low"], row[f"{name} - {REFERENCE} ci95 high"] = ci
            row[f"{name} - {REFERENCE} significant"] = d["significant"] if d else None
        row["memory rule"], row["memory rows"] = e.get("memory_rule"), memory_cell(e)
        row["recall1_per_session"] = e["recall1_per_session"]
        rows.append(row)
    return rows


def memory_cell(e: dict) -> str:
    """The replay rows stored before each session, mean over seeds, e.g. "0/80/120/160" ("n/a": runs made
    before the count was recorded)."""
    rows = e.get("memory_rows")
    return "n/a" if rows is None else "/".join(f"{v:.0f}" for v in rows)


def _status(e: dict) -> str:
    if not e["diverged"]:
        return ""
    if not e["seeds"]:
        return "diverged"
    return f" (seed {', '.join(e['diverged'])} diverged)"


def _no_seed(e: dict) -> str:
    """The cell of an entry without a finished seed: every seed diverged, or none has run yet."""
    return "diverged" if e["diverged"] else "not run"


def _mean_std_cell(a: dict | None) -> str:
    """``mean ± std`` over the seeds; one seed has no spread (``± n/a``, not a measured 0.00)."""
    if a is None:
        return "n/a"
    spread = "n/a" if len(a.get("per_seed") or {}) == 1 else f"{a['std']:.2f}"
    return f"{a['mean']:.2f} ± {spread}"


def _shown(summary: list[dict]) -> list[str]:
    """The summary columns of the tables: COMPAT, without "AC ties pass" when it equals AC everywhere."""
    differ = any((e.get("AC") or {}).get("per_seed") != (e.get(AC_PASS) or {}).get("per_seed") for e in summary)
    return [c for c in COMPAT if c != AC_PASS or differ]


def markdown(summary: list[dict], runs: list[dict], title: str, split_note: str, pairs: Sequence[dict] = ()) -> str:
    ks = next((list(e["average_recall"]) for e in summary if e["average_recall"]), [])
    n_seeds = len({r["seed"] for r in runs})
    heads = {r["method"]: r["head"] for r in runs}
    compat = _shown(summary)
    cols = [f"AR@{k}" for k in ks] + compat
    lines = [f"### {title}", "", "| method | memory | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    for e in summary:
        if not e["seeds"]:
            cells = [_no_seed(e)] * (len(cols) + 1)
        else:
            cells = [_mean_std_cell(e["average_recall"][k]) for k in ks] + [_mean_std_cell(e.get(c)) for c in compat]
            cells = [memory_cell(e), cells[0] + _status(e)] + cells[1:]
        lines.append(f"| {e['method']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"AR@K in %, mean ± std over the finished seeds ({n_seeds} seed(s) run); {split_note}. {BC}: the "
        "backward-compatibility drop, mean over old gallery parts j of (recall@1 of the newer models on "
        "part j) − (recall@1 of part j's own model), in points (0: compatible; more negative: more of the "
        "old rows lost). AC: % of (later model, earlier gallery part) pairs where the later model beats the "
        "part's own model (a tie fails, iamcl2r's rule; AC ties pass, shown where it differs: a tie passes, "
        "CoReS's); mAP: mean over sessions of the test queries' mean average precision on the whole gallery, in "
        "%; AM: mean recall@1 of every model on every part it searches; NFR: % of queries "
        "an update turns from right to wrong at top-1, mean over updates (docs/comparisons.md, Compatibility metrics). "
        "Heads: " + ", ".join(f"{m} {h}" for m, h in heads.items() if h) + ". "
        "Memory: the replay rows stored before each session (mean over seeds); rules (memory.rule): "
        + "; ".join(f"{e['method']} {e.get('memory_rule') or 'n/a'}" for e in summary)
        + ".",
    ]
    if any(e["vs_" + REFERENCE] for e in summary):
        lines += [
            "",
            f"Paired difference to {REFERENCE} (AR@K of the method minus AR@K of {REFERENCE} on the same seed, in "
            f"points): mean [95 % Student-t interval, df = n - 1]; significant when the interval excludes 0.",
            "",
            "| method | n | " + " | ".join(f"{c} - {REFERENCE}" for c in cols) + " |",
            "|---|---|" + "---|" * len(cols),
        ]
        for e in summary:
            vs = e["vs_" + REFERENCE]
            if e["method"] == REFERENCE:
                continue
            if not e["seeds"]:
                lines.append(f"| {e['method']} | 0 | " + " | ".join([_no_seed(e)] * len(cols)) + " |")
                continue
            n = vs[ks[0]]["n"] if vs else 0
            cells = [format_difference(vs and vs[k]) for k in ks + compat]
            lines.append(f"| {e['method']} | {n} | " + " | ".join(cells) + " |")
    if pairs:
        lines += [
            "",
            "Further paired differences (a minus b on the same seed, in points; same interval and verdict):",
            "",
            "| a - b | why | n | " + " | ".join(cols) + " |",
            "|---|---|---|" + "---|" * len(cols),
        ]
        for p in pairs:
            d = p["difference"]
            cells = [format_difference(d[k]) for k in ks + compat]
            n = d[ks[0]]["n"] if ks else 0
            lines.append(f"| {p['a']} - {p['b']} | {p['why']} | {n} | " + " | ".join(cells) + " |")
    seeds = sorted({r["seed"] for r in runs})
    lines += ["", "AR@1 per seed (%):", "", "| method | " + " | ".join(f"seed {s}" for s in seeds) + " |"]
    lines.append("|---|" + "---|" * len(seeds))
    for e in summary:
        cells = []
        for s in seeds:
            if str(s) in e["diverged"]:
                cells.append("diverged")
            elif ks and str(s) in e["average_recall"][ks[0]]["per_seed"]:
                cells.append(f"{e['average_recall'][ks[0]]['per_seed'][str(s)]:.2f}")
            else:
                cells.append("")
        lines.append(f"| {e['method']} | " + " | ".join(cells) + " |")
    diverged = [r for r in runs if r["status"] == "diverged"]
    if diverged:
        lines += ["", "Diverged runs (stopped by the NaN guard; not in the means):"]
        lines += [f"- seed {r['seed']}, {r['method']}: {r['message']}" for r in diverged]
    return "\n".join(lines)


def comparison_json(config, methods: list[str], seeds: list[int], split_seed, runs, summary, pairs=()) -> dict:
    """``comparison.json``: every number of the tables, per seed.  Recalls in %.

    ``runs``: one entry per (seed, method) with ``status`` "ok" or "diverged" (then ``message``),
    ``workdir`` (relative to DIR; each holds config.json, and results.json when finished),
    ``average_recall`` {K: AR@K}, ``recall1_per_session`` and BC, AC, AM, NFR.  ``summary``: per method, ``seeds``
    (finished), ``diverged`` {seed: message}, ``average_recall`` {K: {mean, std, per_seed}},
    ``recall1_per_session`` (mean), ``BC``/``AC``/``AM``/``NFR`` {mean, std, per_seed} and ``vs_cvs``
    {K or a COMPAT key: {n, per_seed, mean, std, ci95, t_quantile, significant}} (paired differences,
    method minus cvs, same seed).
    ``pairs``: ``summarize_pairs`` (head effects, entries against cvs under the same head).
    """
    return {
        "format": JSON_FORMAT,
        "dataset": config.data.name,
        "setup": config.data.setup,
        "methods": list(methods),
        "seeds": list(seeds),
        "split_seed": split_seed,
        "units": "percent",
        "confidence": CONFIDENCE,
        "reference": REFERENCE,
        "runs": runs,
        "summary": summary,
        "pairs": list(pairs),
    }


def write_csv(path: str, rows: list[dict]) -> None:
    n_sessions = max((len(r["recall1_per_session"] or []) for r in rows), default=0)
    fields = [k for k in rows[0] if k != "recall1_per_session"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields + [f"S{i + 1} R@1" for i in range(n_sessions)])
        w.writeheader()
        for r in rows:
            out = {k: r[k] for k in fields}
            out.update({f"S{i + 1} R@1": v for i, v in enumerate(r["recall1_per_session"] or [])})
            w.writerow(out)
