"""The frozen trunk's outputs, computed once per image and kept in the run's data directory.

With ``model.train_blocks`` = k (not ``"all"``) and ``model.cache_views`` = V >= 1, the frozen trunk
(``part="trunk"`` of ``models.vit.VisionTransformer`` or ``models.resnet.TorchvisionResNet``) sees
every train and test image once per view. Its outputs replace the images of the run's splits
(``FeatureSplit``), the network becomes the trained ``top`` and the pipeline ``augment.CachedViews``:
every epoch, session, validation, gallery embedding and ``update`` reads them.

Where augmentation still applies (docs/pretrained-backbones.md): V = 1 caches the evaluation view
(``augment.Pipeline.eval``: normalisation, centre crop) only, so training sees no crops, flips or
``augment.policy``. V > 1 caches V - 1 training-augmented views of each train image beside it (drawn
once, the same on every run) and each step picks one per image; test images keep the evaluation view.
``model.cache_views=0`` keeps the full augmentation and runs the frozen trunk at every step instead
(no backward pass through it).

A cache file holds one split of one record store (an ``update`` adds a file for its folder; the earlier
ones are read as they are) under ``<data.data_dir>/cvs_features/<key>.npy``. ``key`` is a digest of
the weight file's bytes, the trunk (architecture, k, dtype), the preprocessing (stored image shape,
crop, size, mean, std; with V > 1 the training augmentation too), V and the store's ``store.json``
(its source fingerprint and counts), so a changed file, store or preprocessing never reads a stale
cache. Files are written whole, then renamed.

Computing a file says so first (images, views) and then every ``PROGRESS_SECONDS`` how far it got:
on a CPU a ViT-S/16 takes minutes for a few hundred photos.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
import time

import jax
import numpy as np

from cvs_jax.augment import transforms as augment
from cvs_jax.data import parts, records
from cvs_jax.data.chunks import iter_chunks
from cvs_jax.engine.protocol import LazyRows, Protocol
from cvs_jax.models import networks as models
from cvs_jax.models.frozen_trunk import file_digest
from cvs_jax.models.weight_packages import resolve

FORMAT = 1
SUBDIR = "cvs_features"
PROGRESS_SECONDS = 10.0  # at most one progress line this often while a cache file is computed
# Images this process passed through a trunk, by split key: what tests count to see the cache used;
# and the rows the trunk ran for them (the last chunk's padding included): what padding costs.
TRUNK_IMAGES: collections.Counter = collections.Counter()
TRUNK_ROWS: collections.Counter = collections.Counter()


def views(config) -> int:
    """``model.cache_views``: the views cached per image (0: no cache)."""
    return int(config.model.cache_views)


def cached(config) -> bool:
    """Whether the run trains on cached trunk features (``model.train_blocks`` set, ``cache_views`` >= 1)."""
    return models.train_blocks(config) is not None and views(config) >= 1


@dataclasses.dataclass(frozen=True)
class FeatureSplit:
    """A split whose rows are trunk features: ``read`` gives float32 ``[n, *row_shape]``; ``image_shape``
    stays the images' (``protocol.json``, the network's init), ``labels`` the split's."""

    images: np.ndarray  # the features; named as ``sources.Split``'s rows, so no loader worker copies them
    labels: np.ndarray
    image_shape: tuple

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def row_shape(self) -> tuple:
        return tuple(self.images.shape[1:])

    @property
    def dtype(self):
        return self.images.dtype

    def read(self, idx: np.ndarray) -> np.ndarray:
        return self.images[np.asarray(idx, np.int64)]


def with_features(config, proto: Protocol, log=print) -> Protocol:
    """``proto`` with its train and test splits replaced by their trunk features (read or computed)."""
    trunk = Trunk(config, proto.image_shape, log)
    t0, before = time.time(), sum(TRUNK_IMAGES.values())
    ds = proto.dataset
    ds = dataclasses.replace(ds, train=trunk.split(ds.train, "train"), test=trunk.split(ds.test, "test"))
    computed = sum(TRUNK_IMAGES.values()) - before
    log(f"features: {trunk.cache_dir} ({computed} images through the frozen trunk, {time.time() - t0:.1f}s)")
    return dataclasses.replace(proto, dataset=ds)


class Trunk:
    """The frozen trunk of ``config``'s network with its pretrained weights, and its cache files."""

    def __init__(self, config, image_shape, log=print):
        self.config, self.image_shape, self.log = config, tuple(image_shape), log
        self._started = self._shown = 0.0
        self.cache_dir = os.path.join(os.path.expanduser(config.data.data_dir), SUBDIR)
        self.pipeline = augment.Pipeline.from_config(config)
        self._what = _trunk_identity(config, self.image_shape, self.pipeline)
        self._variables = None
        self._fn = None
        self.bucketed = True  # False: the last chunk padded to the whole eval batch (what benchmarks compare)

    def split(self, split, name: str) -> FeatureSplit:
        """``split``'s features: one cache file per part (record store) of it."""
        leaves = split.parts if isinstance(split, parts.ConcatSplit) else [split]
        feats = [self._features(leaf, name) for leaf in leaves]
        return FeatureSplit(np.concatenate(feats), np.asarray(split.labels), self.image_shape)

    def _features(self, leaf, name: str) -> np.ndarray:
        key = _digest({"trunk": self._what, "split": _split_identity(leaf, name)})
        path = os.path.join(self.cache_dir, f"{key}.npy")
        if os.path.exists(path):
            return np.load(path)
        v = views(self.config) if name == "train" else 1
        self.log(
            f"features: {len(leaf)} {name} images through the frozen trunk"
            + (f" ({v} views each)" if v > 1 else "")
            + f", once; cached in {self.cache_dir}"
        )
        feats = self.compute(leaf, key, v)
        os.makedirs(self.cache_dir, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            np.save(f, feats)
        os.replace(tmp, path)
        with open(os.path.join(self.cache_dir, f"{key}.json"), "w") as f:
            json.dump({"trunk": self._what, "split": name, "rows": len(feats)}, f, indent=1)
        return feats

    def compute(self, leaf, key: str = "", v: int = 1) -> np.ndarray:
        """The trunk's outputs for every row of ``leaf`` (in eval-batch chunks, the last one padded to its
        bucket only: ``chunks.iter_chunks``; a compile per chunk shape): ``[N, ...]``
        of the evaluation view, or, when the run caches several views, ``[N, v, ...]`` (view 0 the
        evaluation view; view i >= 1 the training augmentation drawn with key (0, chunk start, i))."""
        if self._fn is None:
            self._variables, self._fn = self._build()
        fn = self._fn
        rows = LazyRows(leaf, np.arange(len(leaf)))
        self._started = self._shown = time.time()  # progress lines count from here
        stacked, out = views(self.config) > 1, []
        for start, chunk, n in iter_chunks(rows, int(self.config.train.eval_batch_size), bucketed=self.bucketed):
            keys = jax.random.split(jax.random.fold_in(jax.random.key(0), start), v)
            feats = np.stack([np.asarray(fn(self._variables, chunk, keys[i], i > 0)) for i in range(v)], 1)
            out.append(feats[:n] if stacked else feats[:n, 0])
            TRUNK_IMAGES[key] += n * v
            TRUNK_ROWS[key] += len(chunk) * v
            self.progress(start + n, len(rows))
        if not out:
            struct = jax.ShapeDtypeStruct((1, *self.image_shape), np.uint8)
            shape = jax.eval_shape(lambda x: fn(self._variables, x, jax.random.key(0), False), struct).shape
            return np.zeros((0, *([v] if stacked else []), *shape[1:]), np.float32)
        return np.concatenate(out).astype(np.float32)

    def progress(self, done: int, total: int) -> None:
        """One line every ``PROGRESS_SECONDS`` while a cache file is computed (images done, rate, time left)."""
        now = time.time()
        if done >= total or now - self._shown < PROGRESS_SECONDS:
            return
        self._shown = now
        rate = done / max(now - self._started, 1e-9)
        self.log(f"features: {done} of {total} images ({rate:.1f}/s, about {(total - done) / rate:.0f} s left)")

    def _build(self):
        """The trunk's weights (the weight file's; nothing drawn: the new ``embedding``, the one leaf the file
        lacks, is left out, as the trunk does not use it) and its jitted function.  Drawing the whole network
        first took 2.6-2.7 s of an ``update`` of the walkthrough's photo run, 0.9-1.0 s without."""
        full = models.from_config(self.config)
        k0, k1 = jax.random.split(jax.random.key(0))
        init = models.init_variables(full, self.config, self.image_shape, 1, k0, k1, abstract=True)
        trunk = models.from_config(self.config, part="trunk")
        pipeline = self.pipeline

        def fn(variables, images, key, augmented: bool):
            return trunk.apply(variables, pipeline.train(key, images) if augmented else pipeline.eval(images))

        variables = {"params": init["params"]["net"], "batch_stats": init["batch_stats"]}
        return _file_leaves(variables), jax.jit(fn, static_argnums=3)


def _file_leaves(tree):
    """``tree`` without its abstract leaves (``jax.ShapeDtypeStruct``: shapes no weight file filled), and
    without the folders left empty."""
    if not isinstance(tree, dict):
        return None if isinstance(tree, jax.ShapeDtypeStruct) else tree
    kept = {k: _file_leaves(v) for k, v in tree.items()}
    return {k: v for k, v in kept.items() if v is not None and not (isinstance(v, dict) and not v)}


def _trunk_identity(config, image_shape, pipeline) -> dict:
    """What the trunk's outputs depend on, besides the images."""
    m = config.model
    what = {
        "format": FORMAT,
        "weights": _file_digest(resolve(m.pretrained)),
        "name": m.name,
        "train_blocks": models.train_blocks(config),
        "dtype": m.dtype,
        "image_shape": list(image_shape),
        "preprocessing": {"crop": pipeline.crop, "size": pipeline.size, "mean": pipeline.mean, "std": pipeline.std},
        "views": views(config),
    }
    if views(config) > 1:  # the augmented views: the training transform, drawn chunk by chunk
        what["augmentation"] = dataclasses.asdict(pipeline)
        what["chunk"] = int(config.train.eval_batch_size)
        what["last_chunk"] = "bucketed"  # the last chunk's draws depend on its padded shape
    return what


_file_digest = file_digest  # the weight file's bytes: also what checkpoints of a frozen trunk record


def _split_identity(leaf, name: str) -> str:
    """A record store's split by its ``store.json`` (source fingerprint, counts, shape); a split held
    only in memory (a TFDS dataset) by its pixels."""
    store = leaf if isinstance(leaf, records.StoreSplit) else getattr(leaf, "store", None)
    if store is not None:
        with open(os.path.join(store.directory, records.STORE_FILE), "rb") as f:
            return hashlib.sha256(f.read() + f"|{store.split}".encode()).hexdigest()
    images = np.ascontiguousarray(leaf.read(np.arange(len(leaf))))
    return hashlib.sha256(images.tobytes() + f"|{name}|{images.shape}".encode()).hexdigest()


def _digest(what: dict) -> str:
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:24]
