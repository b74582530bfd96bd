"""Issue 26's feature cache: images/s of preparing it, and of the CVS training step with it and without it.

  python benchmarks/feature_cache.py            # ViT-S/16 at 224 (configs/image_folder_general.py:cpu_pretrained)
  python benchmarks/feature_cache.py --quick    # a depth-2, width-128 ViT at 32x32, for a check in seconds

Rows (random weights: the speed does not depend on them; batch ``train.batch_size``):
* ``cache``: the frozen trunk (``model.train_blocks=0``) on stored uint8 photos, eval chunks of 64, the
  evaluation transform included: what preparing the cache costs per image, once.
* ``step, cached``: the CVS step (current + frozen previous model, L_c + L_m + L_d) on cached class tokens
  (``model.cache_views=1``): the top alone, what every epoch costs with the cache.
* ``step, no cache``: the same step with ``model.cache_views=0``: random-resized crops, the trunk forward
  for the current and the previous model at every step, no backward pass through it.
"""

from __future__ import annotations

import argparse
import time

import _common  # noqa: F401  (puts the repo root on sys.path)
import jax
import jax.numpy as jnp
import numpy as np

from configs import image_folder_general
from cvs_jax.augment import transforms as augment
from cvs_jax.engine.train_step import TrainState, make_optimizer, make_train_step
from cvs_jax.methods.registry import get_head, get_method
from cvs_jax.models import networks as models
from cvs_jax.models.vit import VisionTransformer, ViTSpec

CLASSES = 64


def config(quick: bool):
    c = image_folder_general.get_config("cpu_pretrained")
    if quick:
        c.data.stored_size, c.augment.size = 40, 32
    return c


def network(c, quick: bool, part: str = "full", cached: bool = True):
    spec = ViTSpec(width=128, depth=2, patch=16, mlp_dim=512) if quick else None
    if spec is None:
        c = c.copy_and_resolve_references()
        c.model.cache_views = 1 if cached else 0
        return models.from_config(c, part=part)
    return VisionTransformer(spec, c.model.embed_dim, train_blocks=0, part=part)


def time_calls(fn, n: int) -> tuple[float, float]:
    """(first call incl. compile, seconds per later call)."""
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(n):
        jax.block_until_ready(fn())
    return first, (time.perf_counter() - t0) / n


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--calls", type=int, default=3, help="timed calls per row after the first")
    a = p.parse_args()
    c = config(a.quick)
    side, crop, batch = c.data.stored_size, c.augment.size, c.train.batch_size
    full = network(c, a.quick)
    k0, k1 = jax.random.split(jax.random.key(0))
    c.model.pretrained = None
    variables = jax.device_get(models.init_variables(full, c, (side, side, 3), CLASSES, k0, k1))
    rng = np.random.default_rng(0)
    photos = rng.integers(0, 256, (64, side, side, 3), np.uint8)
    pipeline = augment.Pipeline.from_config(c)
    trunk = network(c, a.quick, "trunk")
    cache_fn = jax.jit(lambda v, x: trunk.apply(v, pipeline.eval(x)))
    net = {"params": variables["params"]["net"]}
    first, per = time_calls(lambda: cache_fn(net, photos), a.calls)
    rows = [("cache (trunk, eval transform)", 64 / per, first)]
    feats = np.asarray(cache_fn(net, photos))[:batch]
    labels = rng.integers(0, CLASSES, batch).astype(np.int32)
    for name, model, pipe, x in (
        ("step, cached (top only)", network(c, a.quick, "top"), augment.CachedViews(1), feats),
        ("step, no cache (trunk every step)", full, pipeline, photos[:batch]),
    ):
        rows.append((name, *step_speed(c, model, pipe, variables, x, labels, a.calls)))
    print(f"ViT {'depth 2 width 128 (quick)' if a.quick else 'S/16'} at {crop}, batch {batch}, {jax.devices()[0]}")
    print("| row | images/s | first call (s, with compile) |\n|---|---|---|")
    for name, ips, first in rows:
        print(f"| {name} | {ips:.1f} | {first:.1f} |")


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
