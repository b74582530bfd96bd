"""Loading a run's data (``Protocol``): the dataset, read or prepared by the data layer, and its
session plan (``data.split``: the data's own sessions, the official CVS files or the generator, with
``update``'s folders after it)."""

from __future__ import annotations

import dataclasses
import os

import ml_collections
import numpy as np

from cvs_jax.data import official_splits, parts, records, sources, splits, user_sessions
from cvs_jax.engine.protocol import Protocol
from cvs_jax.errors import ConfigError, SplitError


def build_protocol(config: ml_collections.ConfigDict) -> Protocol:
    """The run's dataset (read or prepared, ``data.parts``) and its session plan, by ``data.split``."""
    d = config.data
    dataset = sources.load_run_dataset(d)
    if d.split == "user":  # the sessions the data gives (image_folder manifest; updates append one each)
        sessions = dataset.train_sessions
        plan = user_sessions.plan_from_sessions(
            dataset.train.labels,
            np.zeros(len(dataset.train), np.int64) if sessions is None else sessions,
            val_fraction=d.val_fraction,
            val_per_class=d.val_per_class,
            seed=splits.split_seed(config),
            class_names=dataset.class_names,
        )
    elif d.split == "official":  # official CVS CIFAR-100 sessions: the JSON files if given, else the packaged copy
        split_dir = None if d.official_split_dir is None else os.path.expanduser(d.official_split_dir)
        plan = official_splits.official_plan_for_dataset(split_dir, d.setup, dataset)
    elif d.split == "generator" and d.updates:  # generated sessions, then one per update folder
        dataset, plan = generator_plan_with_updates(config, dataset)
    elif d.split == "generator":
        plan = splits.plan_from_config(dataset.train.labels, config, num_classes=dataset.num_classes)
    else:
        raise ConfigError(f"data.split={d.split!r} is unknown; choose 'official' or 'generator'.")
    return Protocol(
        dataset,
        plan,
        plan.to_protocol_labels(dataset.train.labels),
        plan.to_protocol_labels(dataset.test.labels),
        int(config.model.head_block),
        d.max_per_class,
    )


def generator_plan_with_updates(
    config: ml_collections.ConfigDict, dataset: sources.ImageDataset
) -> tuple[sources.ImageDataset, splits.SessionPlan]:
    """An image-folder run whose first folder was cut into sessions by the generator
    (``data.split=generator``), continued by ``update``: the generated plan of the first folder's rows
    (exactly the plan of its earlier sessions), then one session per update folder, whose classes not
    seen yet get the next protocol labels (order of first appearance, then label) and whose
    validation queries are drawn as ``user_sessions`` draws them (a stream per session).  The
    dataset's test rows of update k are queries from session L + k on."""
    d = config.data
    if d.setup == "blurry":
        raise ConfigError(
            "data.setup=blurry spreads every class over all of the first folder's sessions (each session's "
            "validation queries include every session's); update cannot add sessions after them. Use "
            "data.setup=general or disjoint, or data.split=user."
        )
    seed = splits.split_seed(config)
    info = records.read_info(dataset.stores[0])
    train, test = dataset.train, dataset.test
    # the folders joined by parts.concat (this runs only with data.updates set), the first one a complete store
    assert info is not None and isinstance(train, parts.ConcatSplit) and isinstance(test, parts.ConcatSplit)
    first_classes = len(info["class_names"])
    train_offsets, test_offsets = train.offsets, test.offsets
    labels = np.asarray(dataset.train.labels, np.int64)
    base = splits.plan_from_config(labels[: train_offsets[1]], config, num_classes=first_classes)
    order = [int(c) for c in base.class_order]
    sessions = list(base.sessions)
    frac = splits.exact_fraction(d.val_fraction)
    for k in range(len(train_offsets) - 2):
        s = base.num_sessions + k
        pool = np.arange(train_offsets[k + 1], train_offsets[k + 2], dtype=np.int64)
        new = sorted(set(labels[pool].tolist()) - set(order), key=lambda c: (int(np.argmax(labels[pool] == c)), c))
        first_new = len(order)
        order += new
        lut = np.full(int(labels.max()) + 1, -1, np.int64)
        lut[order] = np.arange(len(order))
        rng = np.random.default_rng(np.random.SeedSequence([seed, 23, s]))
        if d.val_per_class is None:
            train, val = splits.stratified_split(pool, lut[labels], frac, rng)
        else:
            train, val = splits.per_class_split(pool, lut[labels], d.val_per_class, rng)
        trained = set(lut[labels[train]].tolist())
        starved = [order[c] for c in range(first_new, len(order)) if c not in trained]
        if starved:
            raise SplitError(
                f"class {dataset.class_names[starved[0]]!r} first appears in session {s + 1} with images that are "
                f"all drawn as validation queries (data.val_fraction={d.val_fraction}), so nothing trains it; "
                f"add images of it to that folder."
            )
        sessions.append(
            splits.Session(
                index=s,
                train=splits.read_only(train),
                val=splits.read_only(val),
                new_classes=splits.read_only(np.arange(first_new, len(order))),
                num_outputs=len(order),
            )
        )
    arrival = np.full(len(dataset.test), -1, np.int64)
    for k in range(len(test_offsets) - 2):
        arrival[test_offsets[k + 1] : test_offsets[k + 2]] = base.num_sessions + k
    plan = splits.SessionPlan(
        setup=base.setup,
        class_order=splits.read_only(np.asarray(order, np.int64)),
        sessions=tuple(sessions),
    )
    return dataclasses.replace(dataset, test_sessions=arrival), plan
