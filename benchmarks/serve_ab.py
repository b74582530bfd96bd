"""Two checkouts' ``serve`` side by side on one run: does a change to the server move its queries/s?

``benchmarks/serve.py`` compares serve with a baseline; between two of its runs this host's figures
move by 10-40 %.  Here both servers (``--a`` and ``--b``: repository roots, e.g. a ``git worktree`` of
the revision before) are up at once on the same tiny photo run and measured in turn, the first of each
pair alternating, so drift falls on both alike.  Prints each round and the medians.

Usage:
  git worktree add /tmp/before HEAD~1
  python benchmarks/serve_ab.py --a /tmp/before --b . --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import _common  # noqa: F401  (puts the repository on sys.path)
import numpy as np
import serve as serve_bench

from cvs_jax.testing import serve_process
from cvs_jax.testing.image_folders import photo_run


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a", required=True, help="repository root of the first server")
    p.add_argument("--b", required=True, help="repository root of the second server")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--clients", type=int, nargs="+", default=(1, 16))
    a = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="serve-ab-")
    workdir, _ = photo_run(Path(tmp), "tiny")
    _, payloads = serve_bench.photo_payloads(workdir)
    log = open(os.path.join(tmp, "servers.log"), "wb")
    servers = {}
    try:
        for name in ("a", "b"):
            repo = os.path.abspath(getattr(a, name))
            port = serve_process.free_port()
            env = dict(os.environ, PYTHONPATH=repo)
            proc = serve_process.start(workdir, port, log, "--poll_s", "0", cwd=repo, env=env)
            servers[name] = (proc, port)
            serve_bench.http_loop(f"http://127.0.0.1:{port}/search", payloads, 4, 32)  # every bucket warm
        qps = {n: {c: [] for c in a.clients} for n in servers}
        for r in range(a.rounds):
            for c in a.clients:
                for n in list(servers) if r % 2 == 0 else list(servers)[::-1]:
                    url = f"http://127.0.0.1:{servers[n][1]}/search"
                    qps[n][c].append(round(serve_bench.http_loop(url, payloads, c, a.requests)["qps"], 1))
    finally:
        for proc, _ in servers.values():
            serve_process.stop(proc)
    print(json.dumps(qps))
    for c in a.clients:
        ma, mb = np.median(qps["a"][c]), np.median(qps["b"][c])
        print(f"{c:2d} clients: a {ma:.1f} queries/s (median of {a.rounds}), b {mb:.1f}: b/a {mb / ma:.2f}x")


if __name__ == "__main__":
    main()
