"""Building a run's context (``RunContext``): the data and its checks, the model, the optimizer, the
compiled steps and the checkpoints, once per run; apart from the dataclass, which the phases read
without what builds it."""

from __future__ import annotations

import functools
import time
from typing import Any

import jax
import ml_collections

from cvs_jax import distributed
from cvs_jax.augment import transforms as augment
from cvs_jax.data import sources
from cvs_jax.engine import data_checks, features
from cvs_jax.engine.context import RunContext
from cvs_jax.engine.protocol_builder import build_protocol
from cvs_jax.engine.train_step import make_optimizer, make_train_step
from cvs_jax.methods.registry import get_head, get_method
from cvs_jax.models import networks as models
from cvs_jax.models import simplex_head
from cvs_jax.models.frozen_trunk import FrozenTrunk
from cvs_jax.retrieval.embedder import Embedder
from cvs_jax.rundir import paths, run_files
from cvs_jax.rundir.checkpoint import Checkpoints
from cvs_jax.rundir.run_log import RunLog


def pretrained_warning(config: ml_collections.ConfigDict) -> str | None:
    """One line when a recipe meant for ImageNet weights (BatchNorm frozen on their statistics: the paper's
    fine-grained configs) runs without ``model.pretrained``, i.e. from random weights."""
    m = config.model
    if not m.frozen_bn or m.pretrained:
        return None
    return (
        f"warning: model.frozen_bn=True without model.pretrained: {m.name} starts from random weights with "
        "BatchNorm frozen, where the paper starts from ImageNet weights; pass --config.model.pretrained=PATH, e.g. "
        "model.safetensors of timm/resnet50.a1_in1k on Hugging Face (docs/pretrained-backbones.md)."
    )


def devices_line() -> str:
    """One line naming what the run computes on: platform, device kinds and count, processes."""
    devices = jax.devices()
    kinds = ", ".join(sorted({d.device_kind for d in devices}))
    return (
        f"devices: {devices[0].platform} {len(devices)} x {kinds} ({jax.local_device_count()} local), "
        f"{jax.process_count()} process(es)"
    )


def _data_mode(config: ml_collections.ConfigDict, proto) -> str:
    if features.cached(config):
        return "read from its records only for trunk features not cached yet (data.in_memory_limit_mb unused)"
    return sources.data_mode(proto.dataset, config.data.in_memory_limit_mb)


def build_context(
    config: ml_collections.ConfigDict, workdir: str, log: RunLog, share: RunContext | None = None
) -> RunContext:
    """``share``: another member's context of a population run, whose protocol (the dataset, read
    once), mesh, model, optimizer, pipeline and compiled functions this one reuses; only the seed
    (keys, batch order) and the workdir (log, checkpoints) are this run's own."""
    method = get_method(config)
    head = get_head(config)
    k = config.train.steps_per_call  # validated by config_checks: a positive int
    if share is None:
        mesh = distributed.data_mesh()  # one "data" axis over every device of every process
        t0 = time.time()
        # a run on cached trunk features reads only the images whose features are not cached yet, once, through
        # the trunk: decoding them all first made an update of the walkthrough's photo run (1,920 images, 360 MB
        # decoded) take 16.6 s instead of 13.5-14.5 s on a 2-core host, and grows with the run
        proto = build_protocol(sources.streamed(config) if features.cached(config) else config)
        data_checks.check_plan(config, method, proto)
        plan = proto.plan
        log.print(
            f"data: {proto.dataset.name} {len(proto.dataset.train)} train / {len(proto.dataset.test)} test "
            f"images, setup={plan.setup}, {_plural(plan.num_sessions, 'session')}, "
            f"{_plural(plan.num_classes, 'class', 'classes')} "
            f"({time.time() - t0:.1f}s), {_data_mode(config, proto)}"
        )
        if warning := pretrained_warning(config):
            log.print(warning)
    else:
        mesh, proto = share.mesh, share.proto
    if jax.process_index() == 0:
        run_files.write_json(paths.protocol_file(workdir), proto.description(), indent=1)  # never half-written
    if share is None:
        model = models.from_config(config)
        frozen = models.train_blocks(config) is not None  # a frozen trunk: its leaves get no update
        tx = make_optimizer(
            momentum=config.train.momentum,
            nesterov=config.train.nesterov,
            weight_decay=config.train.weight_decay,
            labels=functools.partial(_optimizer_labels, model, head, frozen) if frozen or not head.trainable else None,
        )
        pipeline: augment.Views = augment.Pipeline.from_config(config)  # train-time augmentation and eval preprocessing
        if features.cached(config):  # the trunk's outputs replace the images; the top trains on them
            proto = features.with_features(config, proto, log.print)
            model, pipeline = models.from_config(config, part="top"), augment.CachedViews(features.views(config))
        step_args: dict[str, Any] = dict(
            head=head, loss_weights=dict(config.loss_weights), pipeline=pipeline, mesh=mesh
        )
        step_fn = make_train_step(model, tx, method, **step_args)
        steps_fn = make_train_step(model, tx, method, steps_per_call=k, **step_args)
        embed = Embedder(
            model, pipeline, config.train.eval_batch_size, config.model.dtype, mesh, config.model.embed_dim
        )
    else:
        model, tx, pipeline, embed = share.model, share.tx, share.pipeline, share.embed
        step_fn, steps_fn = share.step_fn, share.steps_fn
    init_key, head_key, step_key = jax.random.split(jax.random.key(config.seed), 3)
    return RunContext(
        config=config,
        workdir=workdir,
        method=method,
        head=head,
        proto=proto,
        mesh=mesh,
        model=model,
        tx=tx,
        pipeline=pipeline,
        step_fn=step_fn,
        steps_fn=steps_fn,
        steps_per_call=k,
        embed=embed,
        log=log,
        sessions=Checkpoints(paths.sessions_dir(workdir), max_to_keep=None, log=log.print),
        progress=Checkpoints(paths.progress_dir(workdir), max_to_keep=2, log=log.print, asynchronous=True),
        init_key=init_key,
        head_key=head_key,
        step_key=step_key,
        ks=tuple(int(k) for k in config.eval.ks),
        trunk=share.trunk if share is not None else FrozenTrunk.of(config),
    )


def _optimizer_labels(model, head, frozen_trunk: bool, params) -> dict:
    """``"train"`` / ``"frozen"`` per parameter: a frozen trunk's leaves and a fixed head's arrays (the
    simplex) get a zero update, no weight decay either."""
    labels = models.frozen_mask(model, params) if frozen_trunk else jax.tree.map(lambda _: "train", params)
    return simplex_head.optimizer_labels(head, labels)


def _plural(n: int, one: str, many: str | None = None) -> str:
    """``1 session``, ``3 sessions``: what a person reads."""
    return f"{n} {one if n == 1 else (many or one + 's')}"
