"""Where a served query's time goes, in one process: the stages of ``serve``'s batch beside the baseline's.

``benchmarks/serve.py`` measures over HTTP; this measures what the server's worker runs for a batch
of 1, 4 and 16 images, with no HTTP: ``Run.embed``, ``index.search``, the hits (``Run.hits``), and
``Served._answer`` whole; beside it the baseline's ``export.load(...).embed`` and faiss
``IndexFlatIP.search``.  With ``--profile DIR``, 20 batches of each size are traced
(``benchmarks/profile_summary.py`` reads the trace: the host's Python lines and the device's kernels).

Usage:
  python benchmarks/serve_stages.py                         # builds the tiny photo run in a temp folder
  python benchmarks/serve_stages.py --workdir W --profile /tmp/prof_serve --json stages.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common  # noqa: F401  (puts the repository on sys.path)
import numpy as np

SIZES = (1, 4, 16)


def timed(fn, reps: int) -> float:
    """Median ms of ``reps`` calls after two warm-up calls."""
    fn(), fn()
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return 1000 * float(np.median(out))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir")
    p.add_argument("--reps", type=int, default=100)
    p.add_argument("--network", choices=("tiny", "walkthrough"), default="tiny")
    p.add_argument("--profile", default=None)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    import jax
    from serve import baseline_index

    from cvs_jax.serve.state import Query, Served
    from cvs_jax.testing.image_folders import photo_run

    tmp = tempfile.mkdtemp(prefix="serve-stages-")
    if a.workdir is None:
        a.workdir, _ = photo_run(Path(tmp), a.network)
    served = Served(a.workdir, poll_s=0)
    run = served.run
    rng = np.random.default_rng(0)
    h, w, c = run.image_shape
    images = rng.integers(0, 256, size=(max(SIZES), h, w, c), dtype=np.uint8)

    export_dir = os.path.join(tmp, "export")
    subprocess.run([sys.executable, "-m", "cvs_jax.export", "--workdir", a.workdir, "--out", export_dir], check=True)
    exported, flat = baseline_index(export_dir)

    out = {"device": str(jax.devices()[0]), "gallery_rows": len(run.rows), "sizes": {}}
    for n in SIZES:
        x = images[:n]
        emb = run.embed(x)
        scores, keys = served.index.search(emb, 5)
        queries = [Query(x[i : i + 1], 5, None) for i in range(n)]

        def baseline_query(x=x):
            q = exported.embed(x)
            q /= np.linalg.norm(q, axis=1, keepdims=True)
            return flat.search(q, 5)

        r = {
            "embed_ms": timed(lambda x=x: run.embed(x), a.reps),
            "index_search_ms": timed(lambda emb=emb: served.index.search(emb, 5), a.reps),
            "hits_ms": timed(lambda s=scores, k=keys: run.hits(s, served._rows(k, run)), a.reps),
            "answer_ms": timed(lambda q=queries: served._answer(q), a.reps),
            "baseline_embed_ms": timed(lambda x=x: exported.embed(x), a.reps),
            "baseline_query_ms": timed(baseline_query, a.reps),
        }
        out["sizes"][n] = r
        print(f"batch {n:2d}: " + ", ".join(f"{k} {v:.3f}" for k, v in r.items()), flush=True)
        if a.profile:
            with jax.profiler.trace(os.path.join(a.profile, f"answer_{n}"), create_perfetto_trace=True):
                for _ in range(20):
                    served._answer(queries)
    served.close()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
