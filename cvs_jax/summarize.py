"""Prints one table comparing finished runs: ``python -m cvs_jax.summarize WORKDIR...``.

Reads each run's ``results.json``: per-session recall@1 and AR@K (in %).
"""

from __future__ import annotations

import json
import os
import sys


def summary_table(results: list[dict]) -> str:
    ks = list(results[0]["average_recall"])
    n_sessions = max(len(r["per_session"]) for r in results)
    head = (
        "| method | "
        + " | ".join(f"S{i + 1} R@1" for i in range(n_sessions))
        + " | "
        + " | ".join(f"AR@{k}" for k in ks)
        + " |"
    )
    rows = [head, "|" + "---|" * (1 + n_sessions + len(ks))]
    for r in results:
        per = [f"{100 * s['recall']['1']:.2f}" for s in r["per_session"]]
        per += [""] * (n_sessions - len(per))
        ar = [f"{100 * r['average_recall'][k]:.2f}" for k in ks]
        rows.append(f"| {r['method']} | " + " | ".join(per + ar) + " |")
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m cvs_jax.summarize WORKDIR [WORKDIR ...]", file=sys.stderr)
        return 2
    results = []
    for d in argv:
        path = os.path.join(d, "results.json")
        if not os.path.exists(path):
            print(f"error: {path} does not exist; run the experiment first.", file=sys.stderr)
            return 2
        with open(path) as f:
            results.append(json.load(f))
    print(f"{results[0]['dataset']} / {results[0]['setup']} (recall in %)")
    print(summary_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
