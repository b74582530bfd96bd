"""Paired differences across two `compare` DIRs run with different schedules (RESULTS.md, "Does the
ordering move with the schedule?"):

    python scripts/schedule_difference.py BASE_DIR NEW_DIR --methods rainbow,cvs@linear_reset --seeds 0,1,2

prints, as a markdown table with 95 % Student-t intervals over the seeds: each method's NEW − BASE
(the same seed pairs with itself: same initialisation and class order), the first method minus the
second in each DIR, and the interaction (first − second in NEW) − (first − second in BASE), the number
that says whether the schedule moves the ordering.  `compare --tabulate` pairs entries inside one DIR
only; a schedule is a global override, so it needs two.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from cvs_jax.reports.statistics import format_difference, paired_difference
from cvs_jax.retrieval import compatibility

KEYS = ("AR@1", "AR@2", "AR@4", "BC")


def fail(message: str) -> None:
    """One line and exit 2, as every cvs-jax command refuses."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def load(workdir: str, method: str, seeds: list[int]) -> dict[int, dict[str, float]]:
    """``{seed: {metric: points}}`` from ``DIR/seed<k>/<method>/results.json``."""
    out = {}
    for seed in seeds:
        path = os.path.join(workdir, f"seed{seed}", method, "results.json")
        if not os.path.isfile(path):
            fail(f"{path} does not exist; finish that run (python -m cvs_jax.compare ...) first.")
        with open(path) as f:
            r = json.load(f)
        out[seed] = {f"AR@{k}": 100 * r["average_recall"][k] for k in ("1", "2", "4")}
        out[seed]["BC"] = compatibility.bc_points(r)
    return out


def row(label: str, a: dict[int, dict], b: dict[int, dict]) -> str:
    cells = []
    for key in KEYS:
        seeds = [s for s in a if a[s][key] is not None and b[s][key] is not None]
        cells.append(format_difference(paired_difference({s: a[s][key] for s in seeds}, {s: b[s][key] for s in seeds})))
    return f"| {label} | " + " | ".join(cells) + " |"


def minus(a: dict[int, dict], b: dict[int, dict]) -> dict[int, dict]:
    return {s: {k: None if a[s][k] is None or b[s][k] is None else a[s][k] - b[s][k] for k in KEYS} for s in a}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("base", help="the compare DIR of the reference schedule")
    p.add_argument("new", help="the compare DIR of the changed schedule")
    p.add_argument("--methods", default="rainbow,cvs@linear_reset", help="two entries, first minus second")
    p.add_argument("--seeds", default="0,1,2")
    args = p.parse_args()
    methods, seeds = args.methods.split(","), [int(s) for s in args.seeds.split(",")]
    if len(methods) != 2:
        fail(f"--methods takes two entries (first minus second), got {args.methods!r}.")
    base = {m: load(args.base, m, seeds) for m in methods}
    new = {m: load(args.new, m, seeds) for m in methods}
    first, second = methods
    print("| a - b (same seed) | " + " | ".join(KEYS) + " |")
    print("|---|" + "---|" * len(KEYS))
    for m in methods:
        print(row(f"{m}: new - base", new[m], base[m]))
    print(row(f"{first} - {second}, new", new[first], new[second]))
    print(row(f"{first} - {second}, base", base[first], base[second]))
    print(row(f"({first} - {second}): new - base", minus(new[first], new[second]), minus(base[first], base[second])))


if __name__ == "__main__":
    main()
