"""Throughput of the CVS training step: steps/s and images/s, f32 vs bf16, batch 16 vs 256.

The step is the trainer's own (``cvs_jax.engine.train_step.make_train_step``) with the
CVS method: the current model in train mode, the frozen previous model in eval
mode on the same augmented batch, and all three losses (L_c + 10 L_m + L_d),
i.e. a session >= 2 step.  The batch is sharded over all local devices
(``cvs_jax.distributed``), the state replicated, exactly as in the trainer.
Every configuration runs in the same process, so the printed ratios compare
like with like.

Usage:
  python benchmarks/train_step.py                 # ResNet-18 (CIFAR stem, width 64), batch 16 and 256, f32 and bf16
  python benchmarks/train_step.py --quick         # tiny CPU run: width 8, batch 16 and 64, few steps
  python benchmarks/train_step.py --batches 16,128,256 --dtypes bfloat16 --steps 100
"""

from __future__ import annotations

import argparse
import time

import _common  # noqa: F401  (puts the repo root on sys.path)
import jax
import jax.numpy as jnp
import numpy as np

from cvs_jax import distributed
from cvs_jax.augment import transforms as augment
from cvs_jax.config import cifar100_general, dogs_general
from cvs_jax.engine.train_step import TrainState, make_optimizer, make_train_step
from cvs_jax.methods.registry import get_head, get_method
from cvs_jax.models import networks as models

NUM_CLASSES, OLD_CLASSES, VALID_CLASSES = 100, 20, 40


def build(config, dtype: str, mesh, side: int):
    config = config.copy_and_resolve_references()
    config.model.dtype, config.model.pretrained = dtype, None  # random weights: speed does not depend on them
    model = models.from_config(config)
    tx = make_optimizer(
        momentum=config.train.momentum, nesterov=config.train.nesterov, weight_decay=config.train.weight_decay
    )
    step = make_train_step(
        model,
        tx,
        get_method(config),
        head=get_head(config),
        loss_weights=dict(config.loss_weights),
        pipeline=augment.Pipeline.from_config(config),
    )
    k_init, k_head, k_c = jax.random.split(jax.random.key(0), 3)
    # host copies: the step donates the state's buffers, so the frozen model must not share them
    variables = jax.device_get(models.init_variables(model, config, (side, side, 3), NUM_CLASSES, k_init, k_head))
    params = variables["params"]
    centers = jax.random.normal(k_c, (NUM_CLASSES, config.model.embed_dim))
    centers = centers / jnp.linalg.norm(centers, axis=1, keepdims=True)
    consts = {
        "valid_classes": jnp.int32(VALID_CLASSES),
        "old_classes": jnp.int32(OLD_CLASSES),
        "centers": centers,
        "center_mask": jnp.arange(NUM_CLASSES) < OLD_CLASSES,
    }
    state = TrainState(
        step=jnp.int32(0), params=params, batch_stats=variables["batch_stats"], opt_state=tx.init(params), tracked={}
    )
    return (
        step,
        distributed.replicate(state, mesh),
        distributed.replicate(variables, mesh),
        distributed.replicate(consts, mesh),
    )


def bench(config, dtype: str, batch: int, steps: int, mesh, side: int) -> dict:
    step, state, frozen, consts = build(config, dtype, mesh, side)
    rng = np.random.default_rng(0)
    lo, hi = distributed.process_slice(batch, mesh)
    images = rng.integers(0, 256, size=(batch, side, side, 3), dtype=np.uint8)
    labels = rng.integers(0, VALID_CLASSES, size=(batch,)).astype(np.int32)  # old and new classes
    data = distributed.global_batch({"images": images[lo:hi], "labels": labels[lo:hi]}, mesh)
    lr, key = jnp.float32(0.03), jax.random.key(1)
    t0 = time.perf_counter()
    state, m = step(state, frozen, data, consts, lr, key)  # compile + first step
    jax.block_until_ready(state)
    compile_s = time.perf_counter() - t0
    state, m = step(state, frozen, data, consts, lr, key)  # one more warm-up step
    jax.block_until_ready(state)
    t0 = time.perf_counter()
    for _ in range(steps):
        state, m = step(state, frozen, data, consts, lr, key)
    jax.block_until_ready((state, m))
    dt = time.perf_counter() - t0
    assert np.isfinite(float(m["loss"])) and float(m["L_m"]) >= 0 and float(m["L_d"]) >= 0
    return {
        "dtype": dtype,
        "batch": batch,
        "steps_per_s": steps / dt,
        "images_per_s": steps * batch / dt,
        "ms_per_step": 1000 * dt / steps,
        "compile_s": compile_s,
        "loss": float(m["loss"]),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny CPU run: width 8, batch 16 and 64, 5 steps")
    p.add_argument(
        "--recipe",
        default="cifar",
        choices=["cifar", "finegrained"],
        help="cifar: ResNet-18 CIFAR stem on 32x32 (default); finegrained: the Dogs/iNat/Product "
        "recipe, ResNet-50 (frozen BN) on stored 256x256 images, RandomResizedCrop 224 on device",
    )
    p.add_argument("--model", default="resnet18")
    p.add_argument("--width", type=int, default=None, help="base width (default 64; 8 with --quick)")
    p.add_argument("--batches", default=None, help="comma-separated global batch sizes (default 16,256)")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--steps", type=int, default=None, help="timed steps per configuration (default 50)")
    a = p.parse_args()
    width = a.width or (8 if a.quick else 64)
    batches = [int(b) for b in (a.batches or ("16,64" if a.quick else "16,256")).split(",")]
    steps = a.steps or (5 if a.quick else 50)
    dtypes = a.dtypes.split(",")

    if a.recipe == "cifar":
        config, side = cifar100_general.get_config(), 32  # method cvs, ResNet-18 CIFAR stem, embed 128
        config.model.name = a.model
    else:
        config, side = dogs_general.get_config(), 256  # method cvs, ResNet-50 torchvision, frozen BN
    config.model.width = width
    mesh = distributed.data_mesh()
    crop = f", {config.augment.crop} crop {config.augment.size}" if a.recipe == "finegrained" else ""
    print(
        f"# CVS train step (current + frozen old model, L_c + L_m + L_d): {config.model.name} width {width}, "
        f"{side}x{side}x3{crop}, {steps} timed steps\n# {_common.environment()}\n"
    )
    rows = [bench(config, dt, b, steps, mesh, side) for b in batches for dt in dtypes]
    print(
        _common.table(
            ["batch", "dtype", "steps/s", "images/s", "ms/step", "compile s"],
            [
                [r["batch"], r["dtype"], r["steps_per_s"], r["images_per_s"], r["ms_per_step"], r["compile_s"]]
                for r in rows
            ],
        )
    )
    by = {(r["batch"], r["dtype"]): r for r in rows}
    ratios = []
    if "float32" in dtypes and "bfloat16" in dtypes:
        ratios += [
            f"bf16 / f32 images/s at batch {b}: "
            f"{by[(b, 'bfloat16')]['images_per_s'] / by[(b, 'float32')]['images_per_s']:.2f}x"
            for b in batches
        ]
    if len(batches) > 1:
        ratios += [
            f"batch {batches[-1]} / batch {batches[0]} images/s ({dt}): "
            f"{by[(batches[-1], dt)]['images_per_s'] / by[(batches[0], dt)]['images_per_s']:.2f}x"
            for dt in dtypes
        ]
    print("\n" + "\n".join(ratios))


if __name__ == "__main__":
    main()
