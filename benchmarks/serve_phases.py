"""Searches' p99 while the served index grows past a power of two, during a gate evaluation and during a
switch, each as a ratio to the p99 at rest measured in the same run (goal: <= 3x).

In-process (``Served``, the server's state, searched through its batcher by client threads): what a
request waits for is the batcher's lock, which these phases used to hold for compiles (57 s on a photo
run passing 512 rows).

* rest: the clients alone;
* growth: ``/add``-ed rows (16 per add, as ``Served.add``) take the index from its size past 512 rows
  (``index.exact.SMALL_BLOCK``: a new segment shape);
* gate: the next session completes and is scored by the gate (the tiny run's session 2 is kept: it
  loses 33 points of recall@1 on the old rows), its rows taken in under the served model;
* switch: ``POST /model``'s pin to session 2 (its model warmed, then the switch between two batches).

    python benchmarks/serve_phases.py [--clients 4] [--rest_s 5] [--built DIR] [--out phases.json]

builds a tiny photo run and its update in a temp folder (a few minutes on a CPU), or copies ``DIR``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import _common  # noqa: F401  (puts the repo root on sys.path)
import numpy as np
from PIL import Image

from cvs_jax import update
from cvs_jax.rundir import paths
from cvs_jax.serve import uploads
from cvs_jax.serve.state import Served
from cvs_jax.testing.image_folders import photo_run


def _p99(latencies: list[float]) -> float | None:
    return float(np.percentile(latencies, 99) * 1000) if latencies else None


def _during(served: Served, images: np.ndarray, clients: int, action, tail_s: float = 0.5) -> dict:
    """Runs ``action()`` while ``clients`` threads search; latencies of the searches that started before
    it returned (plus ``tail_s``)."""
    latencies, stop = [], threading.Event()
    lock = threading.Lock()

    def client(i):
        while not stop.is_set():
            t = time.perf_counter()
            served.search(images[i % len(images)][None], 5)
            with lock:
                latencies.append(time.perf_counter() - t)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    action()
    acted = time.perf_counter() - t0
    time.sleep(tail_s)
    stop.set()
    for t in threads:
        t.join()
    return {"searches": len(latencies), "p99_ms": _p99(latencies), "max_ms": max(latencies) * 1000, "action_s": acted}


def _png(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (40, 40, 3), np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--rest_s", type=float, default=5.0)
    p.add_argument("--grow_to", type=int, default=520, help="rows the adds take the index to (past 512)")
    p.add_argument("--built", help="a folder where this script (or the serve tests' fixture) built run, run2, s1")
    p.add_argument("--out")
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-phases-"))
    if a.built:  # a copy: the benchmark adds rows and completes a session in it
        shutil.copytree(a.built, tmp, dirs_exist_ok=True, symlinks=True)
        one, two = str(tmp / "run"), str(tmp / "run2")
    else:
        one, folder = photo_run(tmp)
        two = str(tmp / "run2")
        shutil.copytree(one, two)
        assert update.update(two, folder) == 0
    served = Served(one, poll_s=0, max_wait_s=0.002)
    shape = served.run.image_shape
    photos = sorted(str(f) for f in (tmp / "s1" / "train").rglob("*.*"))[:16]
    images = np.stack([uploads.decode(os.path.basename(f), Path(f).read_bytes(), shape, 10**8).image for f in photos])
    _during(served, images, a.clients, lambda: time.sleep(1.0))  # every batch bucket compiled once
    out = {"clients": a.clients, "rows_at_start": len(served.index)}
    out["rest"] = _during(served, images, a.clients, lambda: time.sleep(a.rest_s))

    def grow():
        seed = 0
        while len(served.index) < a.grow_to:
            batch = [uploads.decode(f"r{seed + i}.png", _png(seed + i), shape, 10**8) for i in range(16)]
            served.add(batch, "0", force=True)
            seed += 16

    out["growth"] = _during(served, images, a.clients, grow)
    out["rows_after_growth"] = len(served.index)

    def completes():
        for name in (paths.CONFIG, paths.PROTOCOL, paths.RESULTS):
            shutil.copy(os.path.join(two, name), os.path.join(one, name))
        shutil.copytree(paths.session_dir(two, 1), paths.session_dir(one, 1))
        served.poll()

    out["gate"] = _during(served, images, a.clients, completes)
    out["gate_verdict"] = served.gate
    out["switch"] = _during(served, images, a.clients, lambda: served.pin(1))
    out["model_session_after"] = served.model_session
    served.close()
    rest = out["rest"]["p99_ms"]
    for phase in ("growth", "gate", "switch"):
        out[phase]["ratio_to_rest"] = out[phase]["p99_ms"] / rest
        print(
            f"{phase}: p99 {out[phase]['p99_ms']:.1f} ms = {out[phase]['ratio_to_rest']:.2f}x rest ({rest:.1f} ms), "
            f"max {out[phase]['max_ms']:.0f} ms, {out[phase]['searches']} searches over {out[phase]['action_s']:.1f} s"
        )
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))
    shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
