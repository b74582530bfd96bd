"""The index alone at synthetic sizes: ``ExactIndex`` (``serve``'s default index) beside faiss ``IndexFlatIP``.

Rows are random ``[N, 128]`` f32 (what a cosine index sees after normalisation; exact search does the
same work whatever the values).  Per size: ``ExactIndex`` built from all rows at once, the median of
``--reps`` searches of 1 and of 16 queries (k=5), one added row (after a first add that compiles the
row writer), and faiss ``IndexFlatIP`` (exact inner product on the host, all its threads) on the same
normalised rows.  ``--blocks`` repeats the ``ExactIndex`` rows for other ``gallery_block`` values (rows
scored per scan step; default ``topk.default_block``: 4,096 on CPUs, 65,536 on GPUs).

Usage:
  python benchmarks/index_scale.py                                  # 10k and 1M rows
  python benchmarks/index_scale.py --sizes 1000000 10000000 --blocks 4096 65536 --json scale.json
"""

from __future__ import annotations

import argparse
import functools
import json
import time

import _common
import numpy as np


def _p50(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times)) * 1000


def index_sizes(sizes, dim: int = 128, reps: int = 20, blocks=None, faiss_too: bool = True) -> list[dict]:
    """One dict per (size, gallery_block): ExactIndex build s, 1 / 16 query ms, 1 added row ms; faiss beside."""
    from cvs_jax.index.exact import ExactIndex

    out = []
    rng = np.random.default_rng(0)
    for n in sizes:
        rows = rng.standard_normal((n, dim), dtype=np.float32)
        q1, q16 = rng.standard_normal((1, dim), np.float32), rng.standard_normal((16, dim), np.float32)
        faiss_1q = faiss_16q = None
        if faiss_too:
            import faiss

            flat = faiss.IndexFlatIP(dim)
            flat.add(rows / np.linalg.norm(rows, axis=1, keepdims=True))
            faiss_1q = _p50(lambda: flat.search(q1 / np.linalg.norm(q1), 5), reps)
            faiss_16q = _p50(lambda: flat.search(q16 / np.linalg.norm(q16, axis=1, keepdims=True), 5), reps)
            del flat
        for block in blocks or (None,):
            t0 = time.perf_counter()
            exact = ExactIndex(dim, gallery_block=block)
            exact.add(np.arange(n), rows, np.zeros(n, np.int32), np.zeros(n, np.int32))
            build = time.perf_counter() - t0
            one = np.zeros((1, dim), np.float32)
            exact.add([n], one + 1, [0], [0])  # the first add compiles the row writer
            t = time.perf_counter()
            exact.add([n + 1], one + 2, [0], [0])
            add_ms = (time.perf_counter() - t) * 1000
            one_q = _p50(functools.partial(exact.search, q1, 5), reps)
            many_q = _p50(functools.partial(exact.search, q16, 5), reps)
            row = {
                "rows": n,
                "gallery_block": exact.gallery_block,
                "exact_build_s": build,
                "exact_1q_ms": one_q,
                "exact_16q_ms": many_q,
                "exact_add_1row_ms": add_ms,
                "faiss_1q_ms": faiss_1q,
                "faiss_16q_ms": faiss_16q,
            }
            del exact
            print(json.dumps(row), flush=True)
            out.append(row)
        del rows
    return out


def _f(x, digits=2):
    return "-" if x is None else f"{x:,.{digits}f}"


def table(rows: list[dict]) -> str:
    lines = [
        "| index rows | gallery_block | ExactIndex build s | 1 query ms | 16 queries ms | add 1 row ms "
        "| faiss 1 query ms | faiss 16 queries ms |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['rows']:,} | {r.get('gallery_block', '-')} | {_f(r['exact_build_s'], 1)} | {_f(r['exact_1q_ms'])} "
            f"| {_f(r['exact_16q_ms'])} | {_f(r['exact_add_1row_ms'])} | {_f(r['faiss_1q_ms'])} "
            f"| {_f(r['faiss_16q_ms'])} |"
        )
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=(10_000, 1_000_000))
    p.add_argument("--blocks", type=int, nargs="+", default=None, help="ExactIndex gallery_block values")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--no_faiss", action="store_true", help="ExactIndex rows only")
    p.add_argument("--json", help="also write the rows here")
    a = p.parse_args()
    env = _common.environment()
    rows = index_sizes(a.sizes, reps=a.reps, blocks=a.blocks, faiss_too=not a.no_faiss)
    threads = None
    if not a.no_faiss:
        import faiss

        threads = faiss.omp_get_max_threads()
    print(f"\n{env}; faiss threads: {threads}\n")
    print(table(rows))
    if a.json:
        _common.write_json(a.json, rows, environment=[env], faiss_threads=threads)


if __name__ == "__main__":
    main()
