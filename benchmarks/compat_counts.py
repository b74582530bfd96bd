"""What scoring the compatibility matrix and the flips costs at the end of an ``update``: from scratch as before
(every probe query embedded by every model), and from the stored counts (``engine.compat_counts``: the
earlier models embed only the queries of the newest arrival).

Works on a copy of the run in ``--workdir`` (left as it was).  Each round, interleaved:

* **before**: ``compatibility.compatibility_matrix`` and ``negative_flips`` with every model's embeddings of
  all probe queries (restored and embedded once per model), as ``reporting.finish`` did;
* **an update**: the counts stored as the finish before the newest session wrote them (the run's newest
  arrival left out, the newest model's row and update dropped; the model before it's embeddings of the other
  arrivals), then ``compat_counts.count``: what an ``update`` that brought the newest session does;
* **nothing new**: ``count`` again, as a finished run's ``main`` does.

The three must give the same matrix and flips, which the script checks.

    python benchmarks/compat_counts.py --workdir W
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import tempfile
import time
from unittest import mock

import _common  # noqa: F401  (the repository on sys.path)
import numpy as np

from cvs_jax import update
from cvs_jax.engine import compat_counts, runner
from cvs_jax.engine.context_builder import build_context
from cvs_jax.engine.run_state import restore_variables
from cvs_jax.retrieval import compatibility
from cvs_jax.rundir import paths
from cvs_jax.rundir.run_log import RunLog


def before(ctx, state, restore):
    last = ctx.proto.plan.num_sessions - 1
    queries = ctx.proto.test_queries(last)

    @functools.cache
    def embed_queries(i):
        return ctx.embed(restore(i), ctx.proto.test_images(queries))

    labels, maps = ctx.proto.test_labels[queries], state.query_maps or None
    matrix = compatibility.compatibility_matrix(last + 1, state.gallery, embed_queries, labels, maps)
    flips = compatibility.negative_flips(last + 1, state.gallery, embed_queries, labels, maps)
    return matrix, flips


def stored_before_the_newest_session(ctx, state, restore) -> None:
    """The counts file as the finish of the session before the newest wrote it."""
    path = paths.compat_counts_file(ctx.workdir)
    if os.path.exists(path):
        os.remove(path)
    real = compat_counts.arrivals
    with mock.patch.object(compat_counts, "arrivals", lambda proto, last: real(proto, last)[:-1]):
        compat_counts.count(ctx, state, restore)
    with open(path) as f:
        stored = json.load(f)
    newest = str(ctx.proto.plan.num_sessions - 1)
    stored["rows"].pop(newest, None)
    stored["flips"].pop(newest, None)
    compat_counts.write(path, stored)
    # and the embeddings that finish's newest model (the one before the newest now) stored
    last = ctx.proto.plan.num_sessions - 1
    chunks = compat_counts.arrivals(ctx.proto, last)[:-1]
    model = compat_counts.ModelQueries(ctx, state.query_maps or None, last - 1, restore)
    model.embed(chunks)
    compat_counts.write_embeddings(paths.compat_queries_file(ctx.workdir), model.digest, model.embedded, chunks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", required=True, help="a run of at least two sessions")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        wd = shutil.copytree(args.workdir, os.path.join(tmp, "run"))
        log = RunLog(wd)
        ctx = build_context(update.run_config(wd), wd, log)
        state = runner.resume(ctx)
        restore = functools.partial(restore_variables, ctx.sessions, variables=state.variables, trunk=ctx.trunk)

        chunks = compat_counts.arrivals(ctx.proto, ctx.proto.plan.num_sessions - 1)
        print(
            f"{ctx.proto.plan.num_sessions} sessions, {sum(len(c.idx) for c in chunks)} probe queries "
            f"({len(chunks[-1].idx)} in the newest arrival)"
        )
        times: dict[str, list[float]] = {"before": [], "an update": [], "nothing new": []}
        results = {}
        for _ in range(args.rounds):
            for way in times:
                if way == "an update":
                    stored_before_the_newest_session(ctx, state, restore)
                rows = ctx.embed.rows_run
                t0 = time.perf_counter()
                got = before(ctx, state, restore) if way == "before" else compat_counts.count(ctx, state, restore)[:2]
                times[way].append(time.perf_counter() - t0)
                print(f"  {way}: {times[way][-1]:.2f} s, {ctx.embed.rows_run - rows} rows through the network")
                results[way] = got
        ctx.close()
        log.close()
    ref = results["before"]
    for way, got in results.items():
        np.testing.assert_array_equal(got[0], ref[0], err_msg=way)
        assert list(got[1]) == list(ref[1]), way
    best = {way: min(t) for way, t in times.items()}
    print("| the matrix and the flips | s (best of rounds) | before / this |\n|---|---|---|")
    for way, t in best.items():
        print(f"| {way} | {t:.2f} | {best['before'] / t:.2f}x |")
    print("same matrix and flips all three ways")


if __name__ == "__main__":
    main()
