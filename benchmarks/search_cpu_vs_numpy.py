"""On the CPU: the JAX evaluator vs a numpy brute-force search (and faiss-cpu when importable).

All searches are exact top-k cosine over the same random f32 data in one run;
the script checks that they return the same neighbours (up to exact score
ties), then prints one table.  Times:

* ``jax topk``: ``ShardedGallery.topk`` with the gallery already placed and normalised;
* ``jax recall_at_k``: the whole public call (placement + normalisation + search);
* ``numpy``: normalise, chunked BLAS matmul, ``argpartition`` + sort of the k best;
* ``faiss``: ``IndexFlatIP`` on normalised vectors (index build excluded), if ``faiss`` imports.

Usage:
  python benchmarks/search_cpu_vs_numpy.py            # 100k and 1M rows x 128, 10k queries
  python benchmarks/search_cpu_vs_numpy.py --quick    # 20k and 100k rows x 128, 1k queries
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # this benchmark is about the CPU

import _common
import numpy as np

from cvs_jax.retrieval import topk


def numpy_topk(q: np.ndarray, g: np.ndarray, k: int, chunk: int = 1024):
    qn = q / np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-12)
    gn = g / np.maximum(np.linalg.norm(g, axis=1, keepdims=True), 1e-12)
    out = np.empty((len(q), k), np.int64)
    for s in range(0, len(q), chunk):
        scores = qn[s : s + chunk] @ gn.T
        part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        vals = np.take_along_axis(scores, part, 1)
        order = np.lexsort((part, -vals), axis=1)  # score desc, then index asc
        out[s : s + chunk] = np.take_along_axis(part, order, 1)
    return out


def faiss_topk(q: np.ndarray, g: np.ndarray, k: int):
    import faiss

    qn = q / np.linalg.norm(q, axis=1, keepdims=True)
    gn = g / np.linalg.norm(g, axis=1, keepdims=True)
    index = faiss.IndexFlatIP(g.shape[1])
    index.add(gn.astype(np.float32))
    return lambda: index.search(qn.astype(np.float32), k)[1]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rows", default=None, help="comma-separated gallery sizes")
    p.add_argument("--queries", type=int, default=None)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    rows = [int(r) for r in (a.rows or ("20000,100000" if a.quick else "100000,1000000")).split(",")]
    nq = a.queries or (1000 if a.quick else 10000)
    try:
        import faiss  # noqa: F401

        have_faiss = True
    except ImportError:
        have_faiss = False
    print(
        f"# exact cosine top-{a.k}, D={a.dim}, {nq} queries; faiss {'found' if have_faiss else 'not installed'}\n"
        f"# {_common.environment()}\n"
    )
    rng = np.random.default_rng(0)
    q = rng.standard_normal((nq, a.dim), dtype=np.float32)
    body = []
    for n in rows:
        g = rng.standard_normal((n, a.dim), dtype=np.float32)
        sg = topk.ShardedGallery(g)
        t_jax = _common.time_fn(lambda: sg.topk(q, a.k)[1], repeats=a.repeats)
        t_full = _common.time_fn(
            lambda: topk.recall_at_k(q, np.zeros(nq), g, np.zeros(n), (1, 2, 4)), repeats=a.repeats
        )
        t_np = _common.time_fn(lambda: numpy_topk(q, g, a.k), repeats=a.repeats)
        got, want = sg.topk(q, a.k)[1], numpy_topk(q, g, a.k)
        agree = float(np.mean(got == want))  # < 1 only where float32 scores tie or differ by an ulp
        row = [n, t_jax, t_full, t_np, t_np / t_jax, agree]
        if have_faiss:
            search = faiss_topk(q, g, a.k)
            t_f = _common.time_fn(search, repeats=a.repeats)
            row += [t_f, t_f / t_jax, float(np.mean(search() == got))]
        body.append(row)
        print(f"rows {n} done", flush=True)
    headers = ["gallery rows", "jax topk s", "jax recall_at_k s", "numpy s", "numpy / jax", "same top-k"]
    if have_faiss:
        headers += ["faiss s", "faiss / jax", "same as faiss"]
    print("\n" + _common.table(headers, body))


if __name__ == "__main__":
    main()
