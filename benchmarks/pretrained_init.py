"""A fresh pretrained network's initial weights: the whole network drawn and then overwritten by the weight file
(what ``init_variables`` did before), against drawing only the leaves the file lacks (``networks._pretrained_init``).

  python benchmarks/pretrained_init.py              # EfficientNet-Lite0 (image_folder_general.py:cpu_pretrained)
  python benchmarks/pretrained_init.py --cold       # also on an empty XLA compile cache (a first run's cost)

Each way runs in a fresh process (CPU seconds of ``init_variables`` alone, ``time.process_time``), alternated,
``--repeats`` times; with ``--cold`` each cold process gets a new empty cache folder. Prints the seconds and the
whole/partial ratio measured in this run, and checks that both give the same bits.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import _common  # noqa: F401  (puts the repo root on sys.path)

CHILD = r"""
import json, sys, time
import jax, numpy as np
from cvs_jax.config import image_folder_general
from cvs_jax.methods.registry import get_head
from cvs_jax.models import networks
from cvs_jax.models.pretrained import merge_pretrained
from cvs_jax.models.weight_packages import resolve

config = image_folder_general.get_config("cpu_pretrained")
model, head = networks.from_config(config), get_head(config)
keys = tuple(jax.random.split(jax.random.key(0)))
shape = (int(config.augment.size), int(config.augment.size), 3)
t = time.process_time()
if sys.argv[1] == "whole":
    net, arrays = networks._fresh(model, head, shape, 15, int(config.model.embed_dim), *keys)
    net = merge_pretrained(net, networks.load_pretrained(model, resolve(config.model.pretrained), shape))
    v = {"params": {"net": net["params"], **arrays}, "batch_stats": net.get("batch_stats", {})}
else:
    v = networks.init_variables(model, config, shape, 15, *keys, head=head)
jax.block_until_ready(v)
seconds = time.process_time() - t
digest = sum(float(np.asarray(x, np.float64).sum()) for x in jax.tree.leaves(v))
print(json.dumps({"seconds": seconds, "digest": digest}))
"""


def run(way: str, cache: str) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=cache)
    env.update(JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", CHILD, way], cwd=root, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{way}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--cold", action="store_true", help="also time each way on an empty compile cache")
    args = p.parse_args()
    warm_cache = tempfile.mkdtemp(prefix="init-cache-")
    for way in ("whole", "partial"):  # fill the warm cache first
        run(way, warm_cache)
    rows = {("whole", "warm"): [], ("partial", "warm"): [], ("whole", "cold"): [], ("partial", "cold"): []}
    digests = set()
    for _ in range(args.repeats):
        for way in ("whole", "partial"):
            out = run(way, warm_cache)
            rows[(way, "warm")].append(out["seconds"])
            digests.add(round(out["digest"], 6))
            if args.cold:
                rows[(way, "cold")].append(run(way, tempfile.mkdtemp(prefix="init-cold-"))["seconds"])
    print("| cache | whole draw, CPU s | partial draw, CPU s | whole / partial |")
    print("|---|---|---|---|")
    for cache in ("warm", "cold"):
        whole, part = rows[("whole", cache)], rows[("partial", cache)]
        if whole:
            ratio = (sum(whole) / len(whole)) / (sum(part) / len(part))
            print(
                f"| {cache} | {', '.join(f'{s:.2f}' for s in whole)} | {', '.join(f'{s:.2f}' for s in part)} | "
                f"{ratio:.1f}x |"
            )
    print("same weights (sum of every leaf):", "yes" if len(digests) == 1 else f"NO {digests}")


if __name__ == "__main__":
    main()
