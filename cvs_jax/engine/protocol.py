"""The data of a run: the dataset, its session plan and the protocol labels."""

from __future__ import annotations

import dataclasses
import os

import ml_collections
import numpy as np

from cvs_jax.data import official_splits, parts, records, sources, splits, user_sessions
from cvs_jax.errors import ConfigError, SplitError
from cvs_jax.methods.base import Method


@dataclasses.dataclass
class Protocol:
    """The data of a run: images, protocol labels and the session plan."""

    dataset: sources.ImageDataset
    plan: splits.SessionPlan
    train_labels: np.ndarray  # protocol labels of the train split (-1: class not used)
    test_labels: np.ndarray
    head_block: int = 0  # head rows: the classes rounded up to a multiple of this (0: exactly the classes)

    @classmethod
    def build(cls, config: ml_collections.ConfigDict) -> "Protocol":
        d = config.data
        dataset = parts.load_run_dataset(d)
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
        return cls(
            dataset,
            plan,
            plan.to_protocol_labels(dataset.train.labels),
            plan.to_protocol_labels(dataset.test.labels),
            int(config.model.head_block),
        )

    def test_queries(self, s: int) -> np.ndarray:
        """Session s's test queries: the plan's (classes seen so far), less the test images that
        arrive later (an image folder's manifest or update gives each test image a session)."""
        idx = self.plan.test_queries(s, self.test_labels)
        arrival = self.dataset.test_sessions
        return idx if arrival is None else idx[arrival[idx] <= s]

    def train_images(self, idx: np.ndarray) -> "LazyRows":
        """Train images by index, read only when sliced: embedding, Fisher and memory passes read them
        chunk by chunk, so no phase copies a whole session (``dataset.train`` may be in RAM or streamed)."""
        return LazyRows(self.dataset.train, idx)

    def test_images(self, idx: np.ndarray) -> "LazyRows":
        return LazyRows(self.dataset.test, idx)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.dataset.image_shape)

    @property
    def num_classes(self) -> int:
        """Rows of the cosine head: every class of the plan, rounded up to ``model.head_block``."""
        classes = self.plan.num_classes
        return -(-classes // self.head_block) * self.head_block if self.head_block else classes

    def training_indices(self, method: Method, s: int) -> np.ndarray:
        """The images session s trains on and adds to the gallery (the method's data scope)."""
        return method.scope.indices(self.plan, s)

    def session_class_counts(self, method: Method) -> np.ndarray:
        """``[session, class]`` counts of the images each session trains on (without replay)."""
        return np.stack(
            [
                np.bincount(self.train_labels[self.training_indices(method, s)], minlength=self.num_classes)
                for s in range(self.plan.num_sessions)
            ]
        )

    def description(self) -> dict:
        """What ``protocol.json`` records: class names in protocol order and the session sizes."""
        names = self.dataset.class_names
        return {
            "dataset": self.dataset.name,
            "setup": self.plan.setup,
            "image_shape": list(self.dataset.image_shape),
            "class_names": [names[int(c)] for c in self.plan.class_order],
            "sessions": [
                {
                    "train": int(len(s.train)),
                    "val": int(len(s.val)),
                    "num_outputs": s.num_outputs,
                    "new_classes": s.new_classes.tolist(),
                }
                for s in self.plan.sessions
            ],
        }


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
    first_classes = len(records.read_info(dataset.stores[0])["class_names"])
    train_offsets, test_offsets = dataset.train.offsets, dataset.test.offsets
    labels = np.asarray(dataset.train.labels, np.int64)
    base = splits.plan_from_config(labels[: train_offsets[1]], config, num_classes=first_classes)
    order = [int(c) for c in base.class_order]
    sessions = list(base.sessions)
    frac = splits._exact(d.val_fraction)  # pylint: disable=protected-access
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
            train, val = splits._stratified_split(pool, lut[labels], frac, rng)  # pylint: disable=protected-access
        else:
            train, val = splits._per_class_split(pool, lut[labels], d.val_per_class, rng)  # pylint: disable=protected-access
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
                train=splits._frozen(train),  # pylint: disable=protected-access
                val=splits._frozen(val),  # pylint: disable=protected-access
                new_classes=splits._frozen(np.arange(first_new, len(order))),  # pylint: disable=protected-access
                num_outputs=len(order),
            )
        )
    arrival = np.full(len(dataset.test), -1, np.int64)
    for k in range(len(test_offsets) - 2):
        arrival[test_offsets[k + 1] : test_offsets[k + 2]] = base.num_sessions + k
    plan = splits.SessionPlan(
        setup=base.setup,
        class_order=splits._frozen(np.asarray(order, np.int64)),  # pylint: disable=protected-access
        sessions=tuple(sessions),
    )
    return dataclasses.replace(dataset, test_sessions=arrival), plan


class LazyRows:
    """Rows ``idx`` of a split, read when sliced (``rows[a:b]`` is a uint8 array, or features): what the chunked
    consumers (``chunks.iter_chunks``) take instead of a copied array."""

    def __init__(self, split, idx: np.ndarray):
        self._split = split
        self._idx = np.asarray(idx, np.int64)
        self.shape = (len(self._idx), *getattr(split, "row_shape", split.image_shape))
        self.dtype = np.dtype(getattr(split, "dtype", np.uint8))  # float32 for cached trunk features

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, item) -> np.ndarray:
        if not isinstance(item, slice):
            raise TypeError("LazyRows supports row slices only")
        return self._split.read(self._idx[item])

    def __array__(self, dtype=None, copy=None):
        out = self[:]
        return out if dtype is None else out.astype(dtype)
