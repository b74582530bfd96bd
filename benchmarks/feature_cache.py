"""The feature cache: images/s of preparing it (against the trunk's own forward rate, and PyTorch + timm
where installed), of the CVS training step with it and without it, and a one-image search, old vs new.

  python benchmarks/feature_cache.py            # EfficientNet-Lite0 at 224 (image_folder_general.py:cpu_pretrained)
  python benchmarks/feature_cache.py --backbone vit_small_patch16   # the ViT-S/16 recipe before it
  python benchmarks/feature_cache.py --quick    # the fixture ViT (depth 2, width 128) at 32x32, in seconds
  python benchmarks/feature_cache.py --only prepare,search --photos 100,326   # the rows of the bucketed chunks

Rows (random weights: the speed does not depend on them; batch ``train.batch_size``):
* ``trunk``: the frozen trunk (``model.train_blocks=0``) on stored uint8 photos, a batch of 64, the
  evaluation transform included: the trunk's own forward rate.
* ``batch``: the same trunk on batches of 1, 4 and 16: what ``serve``'s dynamic batching can gain per
  image on this machine (not in the default ``--only``).
* ``torch``: PyTorch + timm's network of the same architecture (``tf_efficientnet_lite0`` with its "SAME"
  padding, or the ViT) on batches of 1, 16 and 64, beside the JAX trunk's rate on the same batches, run
  one after the other in this process (where torch and timm import).
* ``prepare N``: ``features.Trunk.compute`` on a folder of N photos, as ``main``/``update`` prepare the
  cache (chunks of ``train.eval_batch_size``, the last one padded to its bucket), and ``old``: the last
  chunk padded to the whole eval batch, as before buckets. ``first`` includes the compiles.
* ``search``: one photo through the run's network (``run_reader.Network``, as ``search`` embeds a
  query) and an exact top-10 over 1,000 gallery rows; new (a bucket of 1) and old (a chunk of 256;
  the top-10 is the same code in both).
* ``step, cached``: the CVS step (current + frozen previous model, L_c + L_m + L_d) on cached class tokens
  (``model.cache_views=1``): the top alone, what every epoch costs with the cache.
* ``step, no cache``: the same step with ``model.cache_views=0``: random-resized crops, the trunk forward
  for the current and the previous model at every step, no backward pass through it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from unittest import mock

import _common  # noqa: F401  (puts the repo root on sys.path)
import jax
import jax.numpy as jnp
import numpy as np

from cvs_jax.augment import transforms as augment
from cvs_jax.config import image_folder_general
from cvs_jax.engine import features
from cvs_jax.engine.train_step import TrainState, make_optimizer, make_train_step
from cvs_jax.methods.registry import get_head, get_method
from cvs_jax.models import networks as models
from cvs_jax.retrieval import run_reader, topk

CLASSES = 64
FIXTURE = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "backbones", "vit_patch16.safetensors")


def config(quick: bool, backbone: str = ""):
    """``:cpu_pretrained`` (random weights), or with ``quick`` the fixture ViT at 40 -> 32; ``backbone``:
    another ``model.name`` (``vit_small_patch16``: stored at 248, the ViT recipe's evaluation transform)."""
    c = image_folder_general.get_config("cpu_pretrained")
    if backbone:
        c.model.name, c.model.frozen_bn = backbone, backbone.startswith("efficientnet")
        if backbone.startswith("vit"):
            c.data.stored_size = 248
    if quick:
        c.data.stored_size, c.augment.size = 40, 32
        c.model.name, c.model.pretrained = "vit", os.path.abspath(FIXTURE)
    return c


def network(c, part: str = "full", cached: bool = True):
    c = c.copy_and_resolve_references()
    c.model.cache_views = 1 if cached else 0
    return models.from_config(c, part=part)


def time_calls(fn, n: int) -> tuple[float, float]:
    """(first call incl. compile, seconds per later call; the first call's without later calls)."""
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(n):
        jax.block_until_ready(fn())
    return first, (time.perf_counter() - t0) / n if n else first


class Photos:
    """A split of N stored photos held in memory (what ``Trunk.compute`` reads from a record store)."""

    def __init__(self, photos: np.ndarray):
        self.photos, self.image_shape = photos, photos.shape[1:]

    def __len__(self) -> int:
        return len(self.photos)

    def read(self, idx):
        return self.photos[np.asarray(idx)]


def torch_rate(c, quick: bool, batch: int, calls: int):
    """images/s of timm's network of the same architecture (PyTorch, CPU, inference mode), or None without torch."""
    try:
        import torch
    except ImportError:
        return None
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
    from make_backbone_fixtures import _stub_torchvision

    _stub_torchvision()  # timm imports torchvision for names a ViT does not use; none may be installed
    import timm

    if quick:
        spec = models.backbones.check_pretrained(c).vit
        net = timm.models.vision_transformer.VisionTransformer(
            img_size=c.augment.size,
            patch_size=spec.patch,
            embed_dim=spec.width,
            depth=spec.depth,
            num_heads=spec.width // spec.head_dim,
            mlp_ratio=spec.mlp_dim / spec.width,
            num_classes=0,
        )
    elif c.model.name.startswith("efficientnet_lite"):
        net = timm.create_model(f"tf_{c.model.name}", pretrained=False, num_classes=0)
    else:
        net = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=0)
    net.eval()
    x = torch.randn(batch, 3, c.augment.size, c.augment.size)
    with torch.inference_mode():
        net(x)
        t0 = time.perf_counter()
        for _ in range(calls):
            net(x)
    return batch * calls / (time.perf_counter() - t0), f"torch {torch.__version__}, {torch.get_num_threads()} threads"


def make_trunk(c, shape) -> features.Trunk:
    """``features.Trunk`` of ``c``; without a weight file (random weights: the speed does
    not depend on them) its cache key names none and its network is initialised at random."""
    if c.model.pretrained is not None:
        return features.Trunk(c, shape)
    named = c.copy_and_resolve_references()
    named.model.pretrained = "random weights"
    with mock.patch.object(features, "_file_digest", lambda path: path):
        trunk = features.Trunk(named, shape)
    trunk.config = c  # what the network is built from
    return trunk


def prepare_rows(c, side: int, sizes, rng, calls: int) -> list:
    """images/s of preparing the cache of a folder: of a second call (compiled) when ``calls`` > 0,
    else of the first (compiles included, what a user waits for)."""
    rows = []
    for n in sizes:
        split = Photos(rng.integers(0, 256, (n, side, side, 3), np.uint8))
        for name, bucketed in (("new", True), ("old", False)):
            trunk = make_trunk(c, (side, side, 3))
            trunk.bucketed = bucketed
            before = sum(features.TRUNK_ROWS.values())
            t0 = time.perf_counter()
            trunk.compute(split)
            first = took = time.perf_counter() - t0
            ran = sum(features.TRUNK_ROWS.values()) - before
            if calls:
                t0 = time.perf_counter()
                trunk.compute(split)
                took = time.perf_counter() - t0
            how = "compiled" if calls else "first call"
            rows.append((f"prepare {n} photos, {name} ({ran} forward rows; {how})", n / took, first))
    return rows


def search_rows(c, variables, side: int, calls: int, rng) -> list:
    net = run_reader.Network(c, variables, (side, side, 3))
    gallery = rng.normal(size=(1000, c.model.embed_dim)).astype(np.float32)
    photo = rng.integers(0, 256, (1, side, side, 3), np.uint8)
    rows = []
    for name, bucketed in (("new", True), ("old", False)):
        net._embedder.bucketed = bucketed
        first, per = time_calls(lambda: topk.topk_indices(net.embed(photo), gallery, 10)[0], calls)
        rows.append((f"search 1 photo, {name}", per, first))
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--calls", type=int, default=3, help="timed calls per row after the first")
    p.add_argument("--photos", default="100,326,1000", help="folder sizes for the prepare rows")
    p.add_argument("--only", default="trunk,torch,prepare,search,step", help="the row groups to run")
    p.add_argument("--backbone", default="", help="model.name instead of :cpu_pretrained's (efficientnet_lite0)")
    a = p.parse_args()
    only = set(a.only.split(","))
    c = config(a.quick, a.backbone)
    side, crop, batch = c.data.stored_size, c.augment.size, c.train.batch_size
    full = network(c)
    k0, k1 = jax.random.split(jax.random.key(0))
    init_config = c.copy_and_resolve_references()
    if not a.quick:
        c.model.pretrained = None  # random weights (no file needed; the speed does not depend on them)
        init_config.model.pretrained = None
    variables = jax.device_get(models.init_variables(full, init_config, (side, side, 3), CLASSES, k0, k1))
    rng = np.random.default_rng(0)
    photos = rng.integers(0, 256, (64, side, side, 3), np.uint8)
    pipeline = augment.Pipeline.from_config(c)
    trunk = network(c, "trunk")
    cache_fn = jax.jit(lambda v, x: trunk.apply(v, pipeline.eval(x)))
    net = {"params": variables["params"]["net"], "batch_stats": variables["batch_stats"]}
    rows, speeds = [], []  # speeds: (row, seconds per call, first call) for the search rows
    first, per = time_calls(lambda: cache_fn(net, photos), a.calls)
    trunk_rate = 64 / per
    if "trunk" in only:
        rows.append(("trunk forward, batch 64 (eval transform)", trunk_rate, first))
    for n in (1, 4, 16) if "batch" in only else ():  # what batching concurrent queries can gain (serve)
        first_n, per_n = time_calls(lambda n=n: cache_fn(net, photos[:n]), max(a.calls, 16 // n))
        rows.append((f"trunk forward, batch {n} (eval transform)", n / per_n, first_n))
    for n in (1, 16, 64) if "torch" in only else ():  # the same batches through JAX and PyTorch, in turn
        got = torch_rate(c, a.quick, n, max(a.calls, 16 // n))
        if got is None:
            print("torch: not installed (pip install torch timm): no PyTorch row")
            break
        if n != 64:
            first_n, per_n = time_calls(lambda n=n: cache_fn(net, photos[:n]), max(a.calls, 16 // n))
            rows.append((f"trunk forward, batch {n} (eval transform)", n / per_n, first_n))
        rows.append((f"PyTorch + timm forward, batch {n} ({got[1]})", got[0], float("nan")))
    if "prepare" in only:
        rows += prepare_rows(c, side, [int(n) for n in a.photos.split(",")], rng, a.calls)
    if "search" in only:
        speeds = search_rows(c, variables, side, a.calls, rng)
    feats = np.asarray(cache_fn(net, photos))[:batch]
    labels = rng.integers(0, CLASSES, batch).astype(np.int32)
    steps = (
        ("step, cached (top only)", network(c, "top"), augment.CachedViews(1), feats),
        ("step, no cache (trunk every step)", full, pipeline, photos[:batch]),
    )
    for name, model, pipe, x in steps if "step" in only else ():
        rows.append((name, *step_speed(c, model, pipe, variables, x, labels, a.calls)))
    model = "fixture ViT depth 2 width 128 (quick)" if a.quick else c.model.name
    print(f"{model} at {crop}, batch {batch}, eval batch {c.train.eval_batch_size}, {jax.devices()[0]}")
    print("| row | images/s | x trunk | first call (s, with compile) |\n|---|---|---|---|")
    for name, ips, first in rows:
        print(f"| {name} | {ips:.1f} | {ips / trunk_rate:.2f} | {first:.1f} |")
    if speeds:
        print("\n| search | seconds per call | first call (s, with compile) |\n|---|---|---|")
        for name, per, first in speeds:
            print(f"| {name} | {per:.3f} | {first:.2f} |")
        (_, new, new_first), (_, old, old_first) = speeds
        print(f"one-photo search: new is {old / new:.1f}x faster warm, {old_first / new_first:.1f}x on the first call")


def step_speed(c, model, pipe, variables, x, labels, calls: int) -> tuple[float, float]:
    labels_fn = lambda params: models.frozen_mask(model, params)  # noqa: E731
    tx = make_optimizer(momentum=0.9, nesterov=True, weight_decay=c.train.weight_decay, labels=labels_fn)
    step = make_train_step(model, tx, get_method(c), head=get_head(c), loss_weights=dict(c.loss_weights), pipeline=pipe)
    centers = jax.random.normal(jax.random.key(2), (CLASSES, c.model.embed_dim))
    consts = {
        "valid_classes": jnp.int32(CLASSES),
        "old_classes": jnp.int32(CLASSES // 2),
        "centers": centers / jnp.linalg.norm(centers, axis=1, keepdims=True),
        "center_mask": jnp.arange(CLASSES) < CLASSES // 2,
    }
    params = variables["params"]
    box = {"state": TrainState(jnp.int32(0), params, variables["batch_stats"], tx.init(params), {})}
    data = {"images": jnp.asarray(x), "labels": jnp.asarray(labels)}

    def call():
        box["state"], m = step(box["state"], variables, data, consts, jnp.float32(0.01), jax.random.key(1))
        return m["loss"]

    first, per = time_calls(call, calls)
    return len(labels) / per, first


if __name__ == "__main__":
    main()
