"""What the end-of-session scores cost as a run's sessions grow: the compatibility matrix and the negative
flips, each part searched with a scan block fitted to its rows (``compatibility.part_block``) against the
default block (4,096 rows on a CPU), in the same process, interleaved.

A run extended by ``update`` (or by the server's sessions from adds) scores every earlier model against
every stored part at the end of each session: (T + 1) T / 2 searches of one part for T sessions, and
T - 1 of the rows before each update.  The gallery here is synthetic (T sessions of ``--rows`` rows of
``--dim`` dims, ``--queries`` queries per session's classes); the two timings must give the same matrix
and flips, which the script checks.

    python benchmarks/compat_matrix.py --sessions 13 26 52 [--rows 40 --dim 64 --queries 6 --json out.json]
    python benchmarks/compat_matrix.py --figures --sessions 25 60 120

``--figures`` times, instead, drawing the matrix's two figures for T sessions (``compatibility.png``,
``plots.compatibility``; the run page's heatmap, ``run_page.heatmap``, as a PNG data URI) on a random matrix.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from unittest import mock

import _common
import numpy as np

from cvs_jax.retrieval import compatibility, topk
from cvs_jax.rundir.gallery import Gallery, GalleryPart


def synthetic(sessions: int, rows: int, dim: int, queries: int, seed: int = 0):
    """T parts of ``rows`` rows over 2T classes; ``queries`` x T query labels; each model's queries at random."""
    rng = np.random.default_rng(seed)
    classes = 2 * sessions
    parts = [
        GalleryPart(
            rng.normal(size=(rows, dim)).astype(np.float32),
            rng.integers(0, classes, rows).astype(np.int32),
            np.full(rows, -1, np.int64),
            s,
        )
        for s in range(sessions)
    ]
    labels = rng.integers(0, classes, queries * sessions).astype(np.int32)
    embedded = [rng.normal(size=(len(labels), dim)).astype(np.float32) for _ in range(sessions)]
    return Gallery(parts, dim), embedded, labels


def score(sessions, gallery, embedded, labels):
    matrix = compatibility.compatibility_matrix(sessions, gallery, embedded.__getitem__, labels)
    flips = compatibility.negative_flips(sessions, gallery, embedded.__getitem__, labels)
    return matrix, flips


def timed(fn, repeats: int):
    best, out = float("inf"), None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, nargs="+", default=[13, 26, 52])
    ap.add_argument("--rows", type=int, default=40, help="gallery rows each session adds")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--queries", type=int, default=6, help="test queries per session (x sessions in all)")
    ap.add_argument("--repeats", type=int, default=3, help="best of this many timings of each")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--figures", action="store_true", help="time the matrix's two figures instead")
    args = ap.parse_args()
    print(_common.environment())
    if args.figures:
        figures(args.sessions)
        return
    rows = []
    for t in args.sessions:
        gallery, embedded, labels = synthetic(t, args.rows, args.dim, args.queries)
        run = lambda: score(t, gallery, embedded, labels)  # noqa: E731
        with mock.patch.object(compatibility, "part_block", lambda _rows: topk.default_block()):
            run()  # compiles
            default_s, (m0, f0) = timed(run, args.repeats)
        run()
        fitted_s, (m1, f1) = timed(run, args.repeats)
        same = np.array_equal(m0, m1, equal_nan=True) and f0 == f1
        if not same:
            raise SystemExit(f"T={t}: the fitted blocks changed the matrix or the flips")
        searches = t * (t + 1) // 2 + t - 1
        rows.append(
            {
                "sessions": t,
                "searches": searches,
                "default_block_s": round(default_s, 3),
                "fitted_block_s": round(fitted_s, 3),
                "speedup": round(default_s / fitted_s, 2),
                "same_results": same,
            }
        )
        print(
            f"T={t}: default block {default_s:.2f} s, fitted {fitted_s:.2f} s ({default_s / fitted_s:.1f}x)", flush=True
        )
    print(
        _common.table(
            ["sessions", "part searches", "default block (s)", "fitted block (s)", "speedup", "same results"],
            [
                [
                    r["sessions"],
                    r["searches"],
                    r["default_block_s"],
                    r["fitted_block_s"],
                    r["speedup"],
                    r["same_results"],
                ]
                for r in rows
            ],
        )
    )
    if args.json:
        _common.write_json(args.json, rows, rows_per_session=args.rows, dim=args.dim, queries=args.queries)


def figures(sessions) -> None:
    from cvs_jax.reports import html, plots, run_page  # matplotlib, for this arm only

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for t in sessions:
            m = np.random.default_rng(t).uniform(0, 1, (t, t))
            m[np.triu_indices(t, 1)] = np.nan
            start = time.perf_counter()
            plots.compatibility(m, os.path.join(tmp, "m.png"), "t")
            png = time.perf_counter() - start
            start = time.perf_counter()
            html.figure_uri(run_page.heatmap([[None if np.isnan(v) else v for v in row] for row in m], set()))
            page = time.perf_counter() - start
            out.append([t, round(png, 2), round(page, 2)])
            print(f"T={t}: compatibility.png {png:.2f} s, page heatmap {page:.2f} s", flush=True)
    print(_common.table(["sessions", "compatibility.png (s)", "page heatmap (s)"], out))


if __name__ == "__main__":
    main()
