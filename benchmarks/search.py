"""Throughput of the exact gallery search (``cvs_jax.retrieval.topk``) against the device's floors.

For galleries of 50k, 1M and 10M rows x 128 dims and 10k queries (top-4), it
prints the measured time of ``ShardedGallery.topk`` (gallery already on the
devices, queries from the host, results back to the host) beside three floors
of the device (peaks from ``_common.GPU_PEAKS``; on a CPU measured in this run):

* FLOP floor: 2 Q N D flops at the f32 peak (the search runs f32 matmuls at
  ``Precision.HIGHEST``: no TF32), and at the TF32 peak for reference;
* memory floor: the gallery read once (N D 4 bytes) at the memory bandwidth;
* score floor: each of the Q N scores written and read once (XLA materialises the
  ``chunk x gallery_block`` score tile before ``top_k``; an assumption to check
  in a profile), 8 Q N bytes.

The gallery is generated on the device (no host copy of 10M rows).  ``--disk``
also times ``topk_indices_blocked`` on the same gallery written to a ``.npy`` file
(memory-mapped, streamed in blocks), which includes the disk reads.

Usage:
  python benchmarks/search.py                        # 50k, 1M, 10M rows; 10k queries
  python benchmarks/search.py --quick                # CPU-sized: 50k and 200k rows, 1k queries
  python benchmarks/search.py --rows 1000000 --chunk 4096 --gallery_block 131072 --disk /scratch
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import _common
import jax
import jax.numpy as jnp
import numpy as np

from cvs_jax.retrieval import topk

_PRECISIONS = {"highest": jax.lax.Precision.HIGHEST, "default": jax.lax.Precision.DEFAULT}


def make_gallery(n: int, d: int, seed: int = 0) -> jax.Array:
    """A random ``[n, d]`` f32 gallery generated on the devices, in pieces to bound peak memory."""
    parts, piece = [], 1 << 20
    for i, start in enumerate(range(0, n, piece)):
        parts.append(jax.random.normal(jax.random.key(seed * 1000 + i), (min(piece, n - start), d), jnp.float32))
    return jnp.concatenate(parts) if len(parts) > 1 else parts[0]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="CPU-sized: 50k and 200k rows, 1k queries")
    p.add_argument("--rows", default=None, help="comma-separated gallery sizes (default 50000,1000000,10000000)")
    p.add_argument("--queries", type=int, default=None, help="default 10000 (1000 with --quick)")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--chunk", type=int, default=None, help="queries per step (default 1024; 2048 on GPU)")
    p.add_argument(
        "--gallery_block",
        type=int,
        default=None,
        help="gallery rows per device per step (default 4096 on CPU, 65536 on GPU)",
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--precisions",
        default="highest",
        help="comma-separated matmul precisions: highest (exact f32, the default evaluator), default "
        "(TF32 on NVIDIA GPUs); others are compared with the first for top-k agreement",
    )
    p.add_argument("--disk", default=None, help="directory for the .npy gallery of the streamed (disk) variant")
    a = p.parse_args()
    on_gpu = jax.devices()[0].platform == "gpu"
    rows = [int(r) for r in (a.rows or ("50000,200000" if a.quick else "50000,1000000,10000000")).split(",")]
    nq = a.queries or (1000 if a.quick else 10000)
    chunk = a.chunk or (2048 if on_gpu else 1024)
    gblock = a.gallery_block or (65536 if on_gpu else 4096)
    peaks = _common.device_peaks()
    sheet = _common.datasheet_peaks()
    precisions = a.precisions.split(",")
    print(
        f"# exact cosine top-{a.k} search, D={a.dim}, {nq} queries, chunk {chunk}, gallery_block {gblock}\n"
        f"# {_common.environment()}\n# floors use {_common.describe(peaks)}"
        + (f"\n# datasheet: {_common.describe(sheet)}" if sheet else "")
        + "\n"
    )
    queries = np.asarray(jax.random.normal(jax.random.key(99), (nq, a.dim), jnp.float32))
    out = []
    for n in rows:
        g = make_gallery(n, a.dim)
        t0 = time.perf_counter()
        sg = topk.ShardedGallery(g, gallery_block=gblock, precision=_PRECISIONS[precisions[0]])
        jax.block_until_ready(sg.embeddings)
        place_s = time.perf_counter() - t0
        del g
        t = _common.time_fn(lambda: sg.topk(queries, a.k, chunk=chunk), repeats=a.repeats)
        flops = 2.0 * nq * n * a.dim
        row = {
            "rows": n,
            "measured_s": t,
            "tflops": flops / t / 1e12,
            "flop_floor_s": flops / peaks.f32,
            "tf32_floor_s": flops / peaks.tf32,
            "mem_floor_s": n * a.dim * 4 / peaks.hbm,
            "score_floor_s": 8.0 * nq * n / peaks.hbm,
            "place_s": place_s,
            "qps": nq / t,
        }
        ref_idx = sg.topk(queries, a.k, chunk=chunk)[1]
        for name in precisions[1:]:
            sg.precision = _PRECISIONS[name]
            row[f"{name}_s"] = _common.time_fn(lambda: sg.topk(queries, a.k, chunk=chunk), repeats=a.repeats)
            row[f"{name}_same"] = float(np.mean(sg.topk(queries, a.k, chunk=chunk)[1] == ref_idx))
        sg.precision = _PRECISIONS[precisions[0]]
        if a.disk:
            path = os.path.join(tempfile.mkdtemp(dir=a.disk), "gallery.npy")
            mm = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, a.dim))
            for s in range(0, n, 1 << 20):  # write from the device piece by piece
                mm[s : s + (1 << 20)] = np.asarray(sg.embeddings[s : min(s + (1 << 20), n)])
            mm.flush()
            del mm
            row["disk_s"] = _common.time_fn(
                lambda: topk.topk_indices_blocked(
                    queries, path, a.k, chunk=chunk, gallery_block=gblock, block_rows=1 << 21
                ),
                repeats=1,
            )
            os.remove(path)
        sg = None  # frees the device copy before the next size
        out.append(row)
        print(f"rows {n}: {t:.4f} s", flush=True)
    headers = [
        "gallery rows",
        "measured s",
        "queries/s",
        "achieved TFLOP/s",
        "f32 FLOP floor s",
        "TF32 FLOP floor s",
        "memory floor s",
        "score floor s",
        "measured / max floor",
        "placement s",
    ]
    body = [
        [
            r["rows"],
            r["measured_s"],
            r["qps"],
            r["tflops"],
            r["flop_floor_s"],
            r["tf32_floor_s"],
            r["mem_floor_s"],
            r["score_floor_s"],
            r["measured_s"] / max(r["flop_floor_s"], r["mem_floor_s"], r["score_floor_s"]),
            r["place_s"],
        ]
        for r in out
    ]
    for name in precisions[1:]:
        headers += [f"{name} s", f"{name} same top-k"]
        for b, r in zip(body, out):
            b += [r[f"{name}_s"], r[f"{name}_same"]]
    if a.disk:
        headers.append("streamed from disk s")
        for b, r in zip(body, out):
            b.append(r["disk_s"])
    print("\n" + _common.table(headers, body))


if __name__ == "__main__":
    main()
