"""Images per second delivered by the training batch loader (``engine.batches.batch_loader``), alone.

No training step runs: the loader reads a fixed number of batches (batch 64) of a shuffled epoch and
puts each on the device, as the train loop receives them.  Per dataset, in one run:

* ``decode 1 thread``: ``split.read`` of the same batches in this thread, nothing else (the per-core
  rate of reading + decoding records);
* the loader with ``data.loader_threads`` = 1, 2, 4 (``data.loader_workers=0``);
* the loader with ``data.loader_workers`` = 1, 2 worker processes (1 thread each), plus 2 x 2;
* ``in RAM``: the split decoded into memory once (``in_memory_limit_mb`` large), 2 threads.

Streamed rows use ``data.in_memory_limit_mb=0`` (each batch decoded from its records).  Rates are
measured after ``--warmup`` batches (the workers' start-up is reported apart, as ``first batch s``).
The fine-grained recipe's random-resized crop and flip run on the device inside the jitted step,
not in the loader, so they are not part of these rates.

Datasets: Fashion-MNIST 28x28 (PNG records, Debian's /usr/share/datasets/fashion-mnist), the
Tiny-ImageNet mini zip 64x64 (source JPEG records, ../shared/data), and 256x256 JPEG records of a
generated Product-10K-layout dataset (``product_m``, as the fine-grained recipe reads them).

Usage:
  python benchmarks/input_pipeline.py                 # all three, 40 timed batches per row
  python benchmarks/input_pipeline.py --quick         # 12 timed batches
  python benchmarks/input_pipeline.py --datasets product_m --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
import types

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import _common
import numpy as np

from cvs_jax import distributed
from cvs_jax.data import sources
from cvs_jax.engine import batches as engine_batches
from cvs_jax.methods import policies

BATCH = 64
LOADERS = (  # (label, loader_threads, loader_workers)
    ("threads=1", 1, 0),
    ("threads=2", 2, 0),
    ("threads=4", 4, 0),
    ("workers=1", 1, 1),
    ("workers=2", 1, 2),
    ("workers=2 x threads=2", 2, 2),
)


def _datasets(a) -> dict[str, dict]:
    """name -> load_dataset kwargs (the 256x256 JPEGs are generated once under --data-dir)."""
    shared = os.path.join(_common.REPO, "..", "shared", "data")
    out = {
        "fashion_mnist_local": dict(manual_dir=a.fashion_dir),
        "tiny_imagenet_zip": dict(manual_dir=os.path.abspath(shared)),
    }
    p10k = os.path.join(a.data_dir, "p10k_manual")
    if "product_m" in a.datasets and not os.path.exists(os.path.join(p10k, "train.csv")):
        from cvs_jax.testing import tiny_data

        # photo-sized sources (256-400 px sides, per-pixel noise): the builder resizes them to 256x256
        # and stores one JPEG q95 each, as it does Product-10K's photos
        tiny_data._random_size = lambda rng: (int(rng.integers(256, 401)), int(rng.integers(256, 401)))
        print(f"writing {a.p10k_images} source JPEGs (Product-10K layout) to {p10k} ...", flush=True)
        tiny_data.write_fake_product10k(p10k, num_classes=a.p10k_images // 100, per_class=100)
    out["product_m"] = dict(manual_dir=p10k)
    return {k: v for k, v in out.items() if k in a.datasets}


def _ctx_view(split, threads: int, workers: int, batches: int):
    """What ``batch_loader`` reads of a run context and a session view, for one shuffled stream."""
    import ml_collections

    c = ml_collections.ConfigDict(
        {"train": {"batch_size": BATCH}, "data": {"loader_threads": threads, "loader_workers": workers}}
    )
    proto = types.SimpleNamespace(dataset=types.SimpleNamespace(train=split), train_labels=split.labels)
    ctx = types.SimpleNamespace(config=c, mesh=distributed.data_mesh(), proto=proto)
    order = policies.ShuffledEpochs(np.arange(len(split)), BATCH, seed=0, session=0)
    view = types.SimpleNamespace(batches=order, steps_per_epoch=order.steps_per_epoch, total_steps=batches)
    return ctx, view


def _loader_rate(split, threads: int, workers: int, warmup: int, timed: int) -> tuple[float, float]:
    """(images/s over the timed batches, seconds to the first batch)."""
    ctx, view = _ctx_view(split, threads, workers, warmup + timed)
    t0 = time.perf_counter()
    it = iter(engine_batches.batch_loader(ctx, view, 0))
    first = None
    for i in range(warmup + timed):
        if i == warmup:
            t1 = time.perf_counter()
        next(it)["images"].block_until_ready()
        if first is None:
            first = time.perf_counter() - t0
    rate = timed * BATCH / (time.perf_counter() - t1)
    it.close()
    return rate, first


def _decode_rate(split, timed: int) -> float:
    order = policies.ShuffledEpochs(np.arange(len(split)), BATCH, seed=0, session=0)
    split.read(order.batch(0, 0))  # opens the file
    t0 = time.perf_counter()
    for i in range(1, timed + 1):
        split.read(order.batch(0, i % order.steps_per_epoch))
    return timed * BATCH / (time.perf_counter() - t0)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="12 timed batches per row")
    p.add_argument("--datasets", default="fashion_mnist_local,tiny_imagenet_zip,product_m")
    p.add_argument("--batches", type=int, default=None, help="timed batches per row (default 40)")
    p.add_argument("--warmup", type=int, default=16, help="untimed batches first (they drain the prefetch buffers)")
    p.add_argument("--data-dir", default="/tmp/cvs_jax_bench_data", help="where the record stores are prepared")
    p.add_argument("--fashion-dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--p10k-images", type=int, default=3000, help="generated 256x256 images (100 per class)")
    p.add_argument("--json", default=None, help="also write the rows here")
    a = p.parse_args()
    a.datasets = a.datasets.split(",")
    timed = a.batches or (12 if a.quick else 40)
    print(f"# batch loader alone: batch {BATCH}, {timed} timed batches after {a.warmup}\n# {_common.environment()}\n")
    rows, records_out = [], []
    for name, kwargs in _datasets(a).items():
        streamed = sources.load_dataset(name, data_dir=a.data_dir, memory_limit_mb=0, **kwargs).train
        shape = "x".join(str(d) for d in streamed.image_shape)
        record_kb = os.path.getsize(streamed.path) / len(streamed) / 1024
        runs = [("decode 1 thread", None, None, _decode_rate(streamed, timed), 0.0)]
        for label, threads, workers in LOADERS:
            rate, first = _loader_rate(streamed, threads, workers, a.warmup, timed)
            runs.append((label, threads, workers, rate, first))
            print(f"{name} {label}: {rate:,.0f} img/s", flush=True)
        in_ram = sources.load_dataset(name, data_dir=a.data_dir, memory_limit_mb=1e9, **kwargs).train
        rate, first = _loader_rate(in_ram, 2, 0, a.warmup, timed)
        runs.append(("in RAM, threads=2", 2, 0, rate, first))
        del in_ram
        base = runs[0][3]
        for label, threads, workers, rate, first in runs:
            rows.append([name, shape, f"{record_kb:.1f}", label, rate, rate / base, first])
            records_out.append(
                dict(dataset=name, shape=shape, record_kb=record_kb, loader=label, threads=threads, workers=workers,
                     images_per_s=rate, vs_decode_1_thread=rate / base, first_batch_s=first)
            )  # fmt: skip
    headers = ["dataset", "image", "record KB", "loader", "img/s", "vs decode 1 thread", "first batch s"]
    print("\n" + _common.table(headers, rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {"environment": _common.environment(), "batch": BATCH, "timed_batches": timed, "rows": records_out},
                f,
                indent=1,
            )
        print(f"\nwrote {a.json}")


if __name__ == "__main__":
    main()
