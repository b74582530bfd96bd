r"""Run several methods on identical splits and seeds and tabulate them like the paper's Table 1.

    python -m cvs_jax.compare --config configs/<name>.py[:<variant>] --workdir DIR \
        --methods finetune,joint,cvs,ewc@cosine --seeds 0,1,2 [--fixed_split | --split_seed=N] \
        [--config.<key>=<value> ...]

An entry of ``--methods`` is a method, trained with ``model.head`` as configured (default
"official": the method's reference head), or ``method@head`` (``cosine`` / ``linear_reset``) to
train it with that head: ``ewc,ewc@cosine`` compares the fork's EWC with its head and with CVS's.
Each (seed, entry) runs in ``DIR/seed<seed>/<entry>`` (rerunning resumes).  Session 1 is plain
L_c training for every method (as in the official launch scripts), so it is trained once per seed
and head and its checkpoint is copied into the workdirs of the other entries with that head,
which then resume from session 2; a method whose session 1 keeps statistics of its own
(``Method.shares_first_session`` False: fork EWC / RWalk) trains it.

Seeds and splits: by default each seed draws its own session plan (class order and image
split) and its own initialisation, augmentation and data order.  ``--fixed_split`` runs
every seed on one plan (that of ``config.split_seed``, else of the first seed), as the
official code does (fixed split files, only the run varies); ``--split_seed=N`` names it.

Writes, in DIR:

* ``comparison.md`` / ``comparison.csv``: AR@K and the backward-compatibility drop (BC,
  ``compatibility.mean_drop``: recall@1 newer models lose on older gallery parts, in points)
  mean ± std over seeds; per entry the paired difference to ``cvs`` (the entry minus cvs on the
  same seed): its mean and 95 % Student-t interval over the seeds both finished, "significant"
  when the interval excludes 0, "n/a" with fewer than two seeds; the same paired differences for
  each method's head effect (``m@linear_reset`` minus ``m@cosine``) and for each entry against
  cvs under the same head, when those entries were run; the per-seed AR@1 of every run;
* ``comparison.json``: all of it, per-seed values included (format in ``comparison_json``);
* ``comparison.png``: recall@1 per session per method, mean over seeds.

A run that stops with ``NonFiniteError`` (the NaN guard: a diverged baseline) does not stop
the comparison: it is recorded as diverged, with its message, its cells read "diverged",
and the other runs go on (exit status 0).  The comparison holds DIR's lock throughout, and
each run also locks its own workdir.  Any other problem to fix ends with one
``error: ...`` line and exit status 2.
"""

from __future__ import annotations

import copy
import csv
import json
import math
import os
import shutil
import sys
import time

import numpy as np
from absl import app, flags
from ml_collections import config_flags

from cvs_jax import cli, distributed
from cvs_jax.engine import determinism, runner
from cvs_jax.errors import ConfigError, NonFiniteError, UserError
from cvs_jax.methods.registry import METHODS, get_method, head_name
from cvs_jax.models.heads import HEADS
from cvs_jax.reports import plots
from cvs_jax.retrieval import compatibility
from cvs_jax.rundir import paths
from cvs_jax.rundir import workdir as workdir_lib

FLAGS = flags.FLAGS
REFERENCE = "cvs"  # paired differences are taken against this method
BC = "BC"  # the backward-compatibility summary's key beside the K of AR@K (compatibility.mean_drop, points)
CONFIDENCE = 0.95
JSON_FORMAT = "cvs_jax.comparison/1"


def define_flags() -> None:
    """The command's flags (defined when it runs, so that tests can import every entry point together)."""
    config_flags.DEFINE_config_file("config", None, cli.config_help(), lock_config=True)
    flags.DEFINE_string("workdir", None, "Directory for all runs and the comparison table.")
    flags.DEFINE_list(
        "methods",
        ["finetune", "joint", "cvs"],
        f"Methods to compare, from: {', '.join(METHODS)}; method@head (head: {', '.join(HEADS)}) trains the "
        "method with that head instead of model.head.",
    )
    flags.DEFINE_list(
        "seeds",
        ["0"],
        "Seeds: each drives initialisation, augmentation and data order, and also the split unless "
        "--fixed_split / --split_seed is given.",
    )
    flags.DEFINE_bool(
        "fixed_split",
        False,
        "Run every seed on one session plan (class order + image split): that of --split_seed, else of "
        "config.split_seed, else of the first seed (the official code fixes the split and varies the run).",
    )
    flags.DEFINE_integer("split_seed", None, "Seed of the one session plan every run uses (implies --fixed_split).")
    flags.DEFINE_bool(
        "population",
        False,
        "Train each method's seeds as one population (cvs_jax/engine/population.py: one vmapped step for all of "
        "them; the seeds must be consecutive, k..k+N-1); implies --fixed_split.  Same DIR/seed<k>/<method> "
        "layout; DIR/population/<method>/ holds the population's config and population.json.",
    )
    flags.mark_flags_as_required(["config", "workdir"])


# ---------------------------------------------------------------- statistics


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom (``math.inf``: the standard normal)."""
    if math.isinf(df):
        return 0.5 * (1.0 + math.erf(t / math.sqrt(2.0)))
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))  # P(T > |t|)
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t (``df`` > 0, ``math.inf``: normal), by bisection on ``t_cdf``.

    E.g. ``t_quantile(0.975, 1)`` = 12.706, ``t_quantile(0.975, 4)`` = 2.776, ``t_quantile(0.975, math.inf)`` = 1.960.
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"p={p} must lie in (0, 1)")
    if not df > 0:
        raise ValueError(f"df={df} must be > 0")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    if p == 0.5:
        return 0.0
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def mean_std(values: list[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (ddof 1; 0 for one value); (None, None) for no value."""
    if not values:
        return None, None
    a = np.asarray(values, np.float64)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0


def paired_difference(values: dict[int, float], reference: dict[int, float]) -> dict:
    """``values[seed] - reference[seed]`` over the seeds both hold: per-seed differences, their mean,
    sample std, the 95 % Student-t interval of the mean (df = n - 1) and whether it excludes 0.
    With fewer than two seeds the interval and the verdict are None ("n/a")."""
    seeds = sorted(set(values) & set(reference))
    diffs = [float(values[s] - reference[s]) for s in seeds]
    out = {
        "n": len(seeds),
        "per_seed": {str(s): d for s, d in zip(seeds, diffs)},
        "mean": None,
        "std": None,
        "ci95": None,
        "t_quantile": None,
        "significant": None,
    }
    if diffs:
        out["mean"], out["std"] = mean_std(diffs)
    if len(diffs) >= 2:
        q = t_quantile(0.5 + CONFIDENCE / 2, len(diffs) - 1)
        half = q * out["std"] / math.sqrt(len(diffs))
        out["ci95"] = [out["mean"] - half, out["mean"] + half]
        out["t_quantile"] = q
        out["significant"] = bool(out["ci95"][0] > 0 or out["ci95"][1] < 0)
    return out


def format_difference(d: dict | None) -> str:
    """``+1.23 [+0.40, +2.06] significant`` / ``... not significant`` / ``n/a``."""
    if d is None or d["significant"] is None:
        return "n/a"
    lo, hi = d["ci95"]
    verdict = "significant" if d["significant"] else "not significant"
    return f"{d['mean']:+.2f} [{lo:+.2f}, {hi:+.2f}] {verdict}"


# ---------------------------------------------------------------- runs and tables


def share_first_session(source: str, target: str) -> None:
    """Copies the session-1 checkpoint and its metrics so ``target`` resumes at session 2."""
    src = paths.session_dir(source, 0)
    dst = paths.session_dir(target, 0)
    if os.path.exists(dst) or not os.path.exists(src):
        return
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    shutil.copytree(src, dst + ".copying")
    os.rename(dst + ".copying", dst)  # atomic: a half copy is never taken for a checkpoint
    with open(paths.metrics_file(source)) as f:
        first = [line for line in f if json.loads(line)["session"] == 1]
    with open(paths.metrics_file(target), "w") as f:
        f.writelines(first)


def parse_entry(entry: str) -> tuple[str, str | None]:
    """``"ewc@cosine"`` -> ("ewc", "cosine"); ``"ewc"`` -> ("ewc", None): the configured model.head."""
    method, _, head = entry.partition("@")
    return method, (head or None)


def entry_config(config, entry: str, seed: int, split_seed):
    """The config of one (seed, entry) run."""
    c = copy.deepcopy(config)
    c.unlock()
    method, head = parse_entry(entry)
    c.method, c.seed, c.split_seed = method, seed, split_seed
    if head is not None:
        c.model.head = head
    return c


def run_record(seed: int, method: str, c, run_dir: str, workdir: str, results: dict | None, error=None) -> dict:
    """One run of the comparison (``method``: the ``--methods`` entry, ``c``: its config): what
    ``comparison.json`` lists (recalls and the BC drop in points)."""
    record = {
        "seed": seed,
        "method": method,
        "head": head_name(c),
        "workdir": os.path.relpath(run_dir, workdir),
        "status": "ok" if error is None else "diverged",
        "message": None if error is None else str(error),
        "average_recall": None,
        "recall1_per_session": None,
        BC: None,
    }
    if results is not None:
        record["average_recall"] = {k: 100 * v for k, v in results["average_recall"].items()}
        record["recall1_per_session"] = [100 * s["recall"]["1"] for s in results["per_session"]]
        drop = compatibility.mean_drop(results["compatibility_recall1"])
        record[BC] = None if drop is None else 100 * drop
    return record


def _metric(r: dict, k: str) -> float | None:
    """AR@k of a finished run record, or its BC drop for ``k == BC``."""
    return r[BC] if k == BC else r["average_recall"][k]


def _paired(ok_a: dict, ok_b: dict, keys: list[str]) -> dict:
    """Paired differences a - b per key (AR@K and BC) over the seeds both finished."""
    out = {}
    for k in keys:
        a = {s: _metric(r, k) for s, r in ok_a.items() if _metric(r, k) is not None}
        b = {s: _metric(r, k) for s, r in ok_b.items() if _metric(r, k) is not None}
        out[k] = paired_difference(a, b)
    return out


def entry_pairs(config, methods: list[str]) -> list[tuple[str, str, str]]:
    """The paired comparisons beyond "each entry minus cvs": ``(a, b, why)`` for each method run under
    both heads (``a`` linear_reset, ``b`` cosine: the head effect) and for each entry against the cvs
    entry trained with the same head (when that cvs entry is not plain ``cvs``, already the reference)."""
    heads = {}
    for entry in methods:
        method, head = parse_entry(entry)
        c = entry_config(config, entry, 0, None)
        heads[entry] = (method, head_name(c))
    pairs = []
    for method in dict.fromkeys(m for m, _ in heads.values()):
        by_head = {h: e for e, (m, h) in heads.items() if m == method}
        if "linear_reset" in by_head and "cosine" in by_head:
            pairs.append((by_head["linear_reset"], by_head["cosine"], f"head effect of {method}"))
    for entry, (method, head) in heads.items():
        ref = next((e for e, (m, h) in heads.items() if m == REFERENCE and h == head), None)
        if method != REFERENCE and ref is not None and ref != REFERENCE:
            pairs.append((entry, ref, f"against {REFERENCE} with the {head} head"))
    return pairs


def summarize_runs(runs: list[dict], methods: list[str]) -> list[dict]:
    """Per method (in ``methods`` order): AR@K and BC mean/std/per-seed over its finished seeds, the
    seeds that diverged, the mean recall@1 per session and the paired difference to ``cvs`` (None for
    cvs itself, and when cvs is not compared)."""
    ks = next((list(r["average_recall"]) for r in runs if r["status"] == "ok"), [])
    by_method = {m: [r for r in runs if r["method"] == m] for m in methods}
    ok = {m: {r["seed"]: r for r in rs if r["status"] == "ok"} for m, rs in by_method.items()}
    summary = []
    for m in methods:
        entry = {
            "method": m,
            "seeds": sorted(ok[m]),
            "diverged": {str(r["seed"]): r["message"] for r in by_method[m] if r["status"] == "diverged"},
            "average_recall": {},
            BC: None,
            "recall1_per_session": None,
            "vs_" + REFERENCE: None,
        }
        drops = {s: r[BC] for s, r in ok[m].items() if r[BC] is not None}
        if drops:
            mean, std = mean_std(list(drops.values()))
            entry[BC] = {"mean": mean, "std": std, "per_seed": {str(s): v for s, v in drops.items()}}
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
        if m != REFERENCE and REFERENCE in ok:
            entry["vs_" + REFERENCE] = _paired(ok[m], ok[REFERENCE], ks + [BC])
        summary.append(entry)
    return summary


def summarize_pairs(runs: list[dict], pairs: list[tuple[str, str, str]]) -> list[dict]:
    """``entry_pairs``' comparisons: ``{a, b, why, difference: {K or BC: paired_difference}}``."""
    ks = next((list(r["average_recall"]) for r in runs if r["status"] == "ok"), [])
    ok = {}
    for r in runs:
        if r["status"] == "ok":
            ok.setdefault(r["method"], {})[r["seed"]] = r
    return [
        {"a": a, "b": b, "why": why, "difference": _paired(ok.get(a, {}), ok.get(b, {}), ks + [BC])}
        for a, b, why in pairs
    ]


def rows_from_summary(summary: list[dict]) -> list[dict]:
    """One flat row per method (what ``run_comparison`` returns and ``comparison.csv`` holds)."""
    rows = []
    for e in summary:
        row = {"method": e["method"], "seeds": len(e["seeds"]), "diverged": len(e["diverged"])}
        for k, a in e["average_recall"].items():
            row[f"AR@{k}"], row[f"AR@{k} std"] = a["mean"], a["std"]
        row[BC], row[f"{BC} std"] = (e[BC]["mean"], e[BC]["std"]) if e[BC] else (None, None)
        vs = e["vs_" + REFERENCE]
        for k in list(e["average_recall"]) + [BC]:
            name = BC if k == BC else f"AR@{k}"
            d = vs[k] if vs else None
            ci = d["ci95"] if d and d["ci95"] else (None, None)
            row[f"{name} - {REFERENCE}"] = d["mean"] if d else None
            row[f"{name} - {REFERENCE} ci95 low"], row[f"{name} - {REFERENCE} ci95 high"] = ci
            row[f"{name} - {REFERENCE} significant"] = d["significant"] if d else None
        row["recall1_per_session"] = e["recall1_per_session"]
        rows.append(row)
    return rows


def _status(e: dict) -> str:
    if not e["diverged"]:
        return ""
    if not e["seeds"]:
        return "diverged"
    return f" (seed {', '.join(e['diverged'])} diverged)"


def _mean_std_cell(a: dict | None) -> str:
    return "n/a" if a is None else f"{a['mean']:.2f} ± {a['std']:.2f}"


def markdown(summary: list[dict], runs: list[dict], title: str, split_note: str, pairs: list[dict] = ()) -> str:
    ks = next((list(e["average_recall"]) for e in summary if e["average_recall"]), [])
    n_seeds = len({r["seed"] for r in runs})
    heads = {r["method"]: r["head"] for r in runs}
    cols = [f"AR@{k}" for k in ks] + [BC]
    lines = [f"### {title}", "", "| method | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for e in summary:
        if not e["seeds"]:
            cells = ["diverged"] * len(cols)
        else:
            cells = [_mean_std_cell(e["average_recall"][k]) for k in ks] + [_mean_std_cell(e[BC])]
            cells[0] += _status(e)
        lines.append(f"| {e['method']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"AR@K in %, mean ± std over the finished seeds ({n_seeds} seed(s) run); {split_note}. {BC}: the "
        "backward-compatibility drop, mean over old gallery parts j of (recall@1 of the newer models on "
        "part j) − (recall@1 of part j's own model), in points (0: compatible; more negative: more of the "
        "old rows lost). Heads: " + ", ".join(f"{m} {h}" for m, h in heads.items() if h) + ".",
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
                lines.append(f"| {e['method']} | 0 | " + " | ".join(["diverged"] * len(cols)) + " |")
                continue
            n = vs[ks[0]]["n"] if vs else 0
            cells = [format_difference(vs and vs[k]) for k in ks + [BC]]
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
            cells = [format_difference(d[k]) for k in ks + [BC]]
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
    ``average_recall`` {K: AR@K} and ``recall1_per_session``.  ``summary``: per method, ``seeds``
    (finished), ``diverged`` {seed: message}, ``average_recall`` {K: {mean, std, per_seed}},
    ``recall1_per_session`` (mean), ``BC`` {mean, std, per_seed} and ``vs_cvs`` {K or "BC": {n, per_seed,
    mean, std, ci95, t_quantile, significant}} (paired differences, method minus cvs, same seed).
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


def run_comparison(
    config,
    workdir: str,
    methods: list[str],
    seeds: list[int],
    split_seed: int | None = None,
    population: bool = False,
):
    """Runs every (seed, method); returns one row per method (see ``rows_from_summary``).

    ``split_seed``: every run uses this session plan (None: ``config.split_seed``, and if that is
    None each seed its own).  ``population``: each method's seeds (consecutive) train as one
    population, on one plan (``split_seed``, else ``config.split_seed``, else the first seed's)."""
    if population and sorted(seeds) != list(range(min(seeds), min(seeds) + len(seeds))):
        raise ConfigError(
            f"--population trains seeds k..k+N-1 as one population; --seeds {','.join(map(str, seeds))} are "
            f"not consecutive (e.g. --seeds {','.join(str(min(seeds) + i) for i in range(len(seeds)))})."
        )
    unknown = [m for m in methods if parse_entry(m)[0] not in METHODS]
    if unknown:
        raise ConfigError(f"--methods names unknown methods {unknown}; choose from {sorted(METHODS)}.")
    bad_heads = [m for m in methods if parse_entry(m)[1] not in (None,) + HEADS]
    if bad_heads:
        raise ConfigError(f"--methods {bad_heads}: after '@' name a head, one of {list(HEADS)} (e.g. ewc@cosine).")
    if len(set(methods)) < len(methods):
        raise ConfigError(f"--methods {','.join(methods)} names an entry twice; name each once.")
    distributed.maybe_initialize(config.distributed.multihost)  # before the lock asks JAX for the process index
    with workdir_lib.hold(workdir):  # one comparison per DIR; each run also locks its own workdir
        return _compare(config, workdir, methods, seeds, split_seed, population)


def _share_session_one(c, seed: int, run_dir: str, earlier: dict) -> None:
    """Copies session 1 into ``run_dir`` from the first earlier run of this seed and head that saved it
    (``earlier``: (seed, head) -> run dirs, updated), unless the method trains its own session 1."""
    if not get_method(c).shares_first_session:  # its session 1 keeps statistics: it trains its own
        return
    sharing = earlier.setdefault((seed, head_name(c)), [])
    source = next((d for d in sharing if os.path.exists(paths.session_dir(d, 0))), None)
    if source is not None:
        share_first_session(source, run_dir)
    sharing.append(run_dir)


def _run_populations(config, workdir: str, methods: list[str], seeds: list[int], split_seed: int) -> list[dict]:
    """Each method's seeds as one population, in ``DIR/seed<k>/<method>`` (session 1 shared as without)."""
    seeds = sorted(seeds)
    runs: list[dict] = []
    t0 = time.time()
    earlier: dict = {}
    for method in methods:
        c = entry_config(config, method, seeds[0], split_seed)
        c.population = len(seeds)
        dirs = [os.path.join(workdir, f"seed{seed}", method) for seed in seeds]
        for seed, run_dir in zip(seeds, dirs):
            _share_session_one(c, seed, run_dir, earlier)
        print(
            f"\n##### method {method}, seeds {seeds[0]}..{seeds[-1]} as a population ({time.time() - t0:.0f}s elapsed)"
        )
        try:
            out = runner.run_population(c, os.path.join(workdir, "population", method), dirs)
            runs += [run_record(s, method, c, d, workdir, r) for s, d, r in zip(seeds, dirs, out["results"])]
        except NonFiniteError as e:  # the population stops as a whole: every seed of the method diverged
            print(f"method {method} (population) diverged: {e}", flush=True)
            runs += [run_record(s, method, c, d, workdir, None, e) for s, d in zip(seeds, dirs)]
    return sorted(runs, key=lambda r: r["seed"])  # seed-major, as without --population


def _compare(
    config, workdir: str, methods: list[str], seeds: list[int], split_seed: int | None, population: bool = False
) -> list[dict]:
    if split_seed is None:
        split_seed = config.split_seed
    if population and split_seed is None:
        split_seed = min(seeds)  # the members of a population share one session plan
    runs: list[dict] = []
    t0 = time.time()
    if population:
        runs = _run_populations(config, workdir, methods, seeds, split_seed)
    earlier: dict = {}  # (seed, head) -> sharing run dirs so far: session 1 comes from the first that saved it
    for seed in [] if population else seeds:
        for method in methods:
            c = entry_config(config, method, seed, split_seed)
            run_dir = os.path.join(workdir, f"seed{seed}", method)
            _share_session_one(c, seed, run_dir, earlier)
            print(f"\n##### seed {seed}, method {method} ({time.time() - t0:.0f}s elapsed)", flush=True)
            try:
                runs.append(run_record(seed, method, c, run_dir, workdir, runner.run(c, run_dir)))
            except NonFiniteError as e:  # a diverged run: recorded, the comparison goes on
                print(f"seed {seed}, method {method} diverged: {e}", flush=True)
                runs.append(run_record(seed, method, c, run_dir, workdir, None, e))
    summary = summarize_runs(runs, methods)
    pairs = summarize_pairs(runs, entry_pairs(config, methods))
    rows = rows_from_summary(summary)
    title = f"{config.data.name} / {config.data.setup}"
    if split_seed is None:
        split_note = "each seed has its own class order and split"
    else:
        split_note = f"every seed runs on the split of split_seed={split_seed} (seeds vary initialisation and order)"
    table = markdown(summary, runs, title, split_note, pairs)
    with open(os.path.join(workdir, "comparison.md"), "w") as f:
        f.write(table + "\n")
    _write_csv(os.path.join(workdir, "comparison.csv"), rows)
    tmp = os.path.join(workdir, "comparison.json.tmp")
    with open(tmp, "w") as f:
        json.dump(comparison_json(config, methods, seeds, split_seed, runs, summary, pairs), f, indent=1)
    os.replace(tmp, os.path.join(workdir, "comparison.json"))
    mean_runs = [
        {
            "method": e["method"],
            "dataset": config.data.name,
            "setup": config.data.setup,
            "average_recall": {"1": e["average_recall"]["1"]["mean"] / 100},
            "per_session": [{"session": i, "recall": {"1": v / 100}} for i, v in enumerate(e["recall1_per_session"])],
        }
        for e in summary
        if e["seeds"]
    ]
    if mean_runs:
        plots.recall_per_session(mean_runs, os.path.join(workdir, "comparison.png"))
    print(f"\n{table}\n\ntotal time {time.time() - t0:.0f}s; tables in {workdir}/comparison.md/.csv/.json")
    return rows


def _write_csv(path: str, rows: list[dict]) -> None:
    n_sessions = max((len(r["recall1_per_session"] or []) for r in rows), default=0)
    fields = [k for k in rows[0] if k != "recall1_per_session"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields + [f"S{i + 1} R@1" for i in range(n_sessions)])
        w.writeheader()
        for r in rows:
            out = {k: r[k] for k in fields}
            out.update({f"S{i + 1} R@1": v for i, v in enumerate(r["recall1_per_session"] or [])})
            w.writerow(out)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not all(s.strip().lstrip("-").isdigit() for s in FLAGS.seeds):
        raise app.UsageError(f"--seeds={','.join(FLAGS.seeds)}: give integers, e.g. --seeds 0,1,2")
    seeds = [int(s) for s in FLAGS.seeds]
    split_seed = FLAGS.split_seed
    if split_seed is None and FLAGS.fixed_split:
        split_seed = FLAGS.config.split_seed if FLAGS.config.split_seed is not None else seeds[0]
    cli.quiet_logging()
    determinism.apply(FLAGS.config.deterministic)  # before the first JAX computation
    try:
        run_comparison(FLAGS.config, FLAGS.workdir, FLAGS.methods, seeds, split_seed, FLAGS.population)
    except UserError as e:  # a problem the user must fix: one line, no traceback; anything else is a bug
        sys.exit(cli.report(e))


if __name__ == "__main__":
    define_flags()
    cli.run(main)
