"""The checks that need the run's data and its method: the sessions of your own images against what
the method trains on, and a fixed simplex head's rows.  Here, not in ``build_protocol``, because the
protocol is the data alone; the method comes from the registry, above it."""

from __future__ import annotations

import json

import ml_collections
import numpy as np

from cvs_jax.data import sources, splits, user_sessions
from cvs_jax.data.splits import SessionPlan
from cvs_jax.engine.protocol import Protocol
from cvs_jax.engine.protocol_builder import build_protocol
from cvs_jax.errors import ConfigError, DatasetNotFoundError
from cvs_jax.methods import policies
from cvs_jax.methods.base import Method
from cvs_jax.methods.registry import get_method, head_name
from cvs_jax.models.simplex_head import check_simplex_width


def check_plan(config: ml_collections.ConfigDict, method: Method, proto: Protocol) -> None:
    """What ``build_protocol`` leaves to the method: sessions that come from the data (``data.split=user``,
    or generated sessions continued by ``update``) must be trainable by it (``check_user_plan``); every
    other plan's sessions must each fill a batch (``check_batches``)."""
    d = config.data
    if d.split == "user" or (d.split == "generator" and d.updates):
        check_user_plan(config, method, proto.plan, proto.train_labels)
    else:
        check_batches(config, method, proto.plan)


def check_batches(config: ml_collections.ConfigDict, method: Method, plan: SessionPlan) -> None:
    """Every session of a generated (or official) plan fills one batch of ``train.batch_size``: refused
    before session 1 trains, where ``phases.session_view`` refuses it only when that session comes, after
    the earlier ones have trained.  A replay memory counts at its largest possible size (every earlier
    training image), so that no run that can train is refused here."""
    b, batches = config.train.batch_size, method.batches
    seen = 0
    for s, sess in enumerate(plan.sessions):
        own = len(method.scope.indices(plan, s))
        replay = seen if s > 0 and method.uses_memory else 0
        seen += len(sess.train)
        if isinstance(batches, policies.HalfMemoryBatches) and replay:  # its own images fill the stream rows
            rows = policies.half_memory_split(b, batches.memory_batches)[0]
            if own < rows:
                raise ConfigError(
                    f"session {s + 1} has {own} training images, fewer than the {rows} of its own that each "
                    f"half-memory batch of train.batch_size={b} takes; lower the batch size."
                )
        elif own + replay < b:
            extra = f" and at most {replay} replayed" if replay else ""
            raise ConfigError(
                f"session {s + 1} has {own} training images{extra}, fewer than train.batch_size={b}; "
                "lower the batch size."
            )


def check_entries(configs: list[ml_collections.ConfigDict]) -> None:
    """``compare``'s runs (every entry x seed) against their session plans before the first one trains, as each
    run checks its own when it starts (``check_plan``): a batch that only some methods' memory fills was
    refused at the entry it broke, after the earlier ones had trained.  Each distinct plan (data config and
    split seed) is built once, from the stores' labels (no image decoded: 0.01 s for Fashion-MNIST); data
    whose files are missing is left to the first run, which reports it before it trains."""
    protocols: dict[str, Protocol] = {}
    for config in configs:
        c = sources.streamed(config)
        key = json.dumps([c.data.to_dict(), splits.split_seed(c), c.model.head_block], sort_keys=True, default=str)
        if key not in protocols:
            try:
                protocols[key] = build_protocol(c)
            except DatasetNotFoundError:
                return
        check_plan(c, get_method(c), protocols[key])


def check_data(config: ml_collections.ConfigDict) -> None:
    """The data checks of a run of your own images (``data.name=image_folder``), made before anything in
    the workdir changes (``runner.run``): every folder readable (its store prepared), classes, sessions,
    their size against the batch, the memory budget.  No image is decoded here (the stores are read for
    their labels only); other datasets are checked when the run builds."""
    if config.data.name != "image_folder":
        return
    c = sources.streamed(config)
    proto = build_protocol(c)
    check_plan(c, get_method(c), proto)
    if head_name(config) == "simplex":
        _check_simplex_rows(c, proto.num_classes)


def _check_simplex_rows(c: ml_collections.ConfigDict, rows: int) -> None:
    """A fixed d-simplex head's rows fit ``model.embed_dim``, and an ``update`` keeps them: the simplex of
    K rows is a different one for every K, and its rows are never grown."""
    check_simplex_width(c.model.embed_dim, rows)
    if not c.data.updates:
        return
    before = ml_collections.ConfigDict(c.to_dict())
    before.data.updates = list(c.data.updates)[:-1]
    held_proto = build_protocol(before)
    check_plan(before, get_method(before), held_proto)
    held = held_proto.num_classes
    if rows != held:
        raise ConfigError(
            f"{c.data.updates[-1]} brings the run to {rows} head rows, but its fixed d-simplex head holds {held} "
            f"(every class of its first sessions, rounded up to model.head_block={c.model.head_block}) and is "
            f"never grown; add images of known classes only, or start a run with a larger model.head_block."
        )


def check_user_plan(
    config: ml_collections.ConfigDict, method: Method, plan: SessionPlan, protocol_labels: np.ndarray
) -> None:
    """``user_sessions.check_plan_feasible`` with what the run's method really trains on: its data scope
    (``joint``: every image seen), its replay memory (a lower bound of its size) and Rainbow's
    half-memory batches; the memory budget of replay methods."""
    b = config.train.batch_size
    trained = [len(method.scope.indices(plan, s)) for s in range(plan.num_sessions)]
    kind = {
        policies.HerdingMemory: "class_quota",
        policies.UncertaintyMemory: "class_quota",
        policies.ReservoirMemory: "reservoir",
    }.get(type(method.memory), "none")
    if getattr(method.memory, "per_class", 0):  # memory.rule=per_class: no budget quota to bound it by
        kind = "none"
    replayed = user_sessions.replay_sizes(plan, protocol_labels, kind, config.memory.budget)
    stream_rows = None
    if isinstance(method.batches, policies.HalfMemoryBatches):
        stream_rows = policies.half_memory_split(b, method.batches.memory_batches)[0]
    d = config.data
    user_sessions.check_plan_feasible(
        plan,
        batch_size=b,
        memory_budget=config.memory.budget if method.uses_memory else None,
        trained=trained,
        replayed=replayed,
        stream_rows=stream_rows,
        batch_size_fixed=bool(d.updates),
        val_fraction=d.val_fraction if d.val_per_class is None else None,
        test_fraction=d.test_fraction,
    )
