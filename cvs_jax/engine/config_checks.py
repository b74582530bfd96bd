"""Refuse bad configurations before any data loading or compilation.

Each problem stops the run with one message naming the field and the fix.  Checks
that need the dataset (class counts of datasets we do not know statically, image
counts per class) happen in the splitter, still before any compilation.
"""

from __future__ import annotations

import os

import ml_collections

from cvs_jax.augment import transforms as augment
from cvs_jax.data import official_splits, splits
from cvs_jax.engine import profiling, schedules
from cvs_jax.errors import ConfigError, DataError, SplitError
from cvs_jax.methods.registry import METHODS, head_name, population_methods
from cvs_jax.models import backbones
from cvs_jax.models.simplex_head import check_simplex_width
from cvs_jax.retrieval import query_maps

# Classes of the datasets we know without opening them (for early S/C/L checks).
KNOWN_NUM_CLASSES = {
    "fashion_mnist_local": 10,
    "fashion_mnist": 10,
    "mnist": 10,
    "cifar10": 10,
    "cifar100": 100,
    "tiny_imagenet_zip": 200,
    "stanford_dogs": 120,
    "stanford_dogs_256": 120,
    "inat_m": 200,
    "product_m": 2743,
}
LOCAL_BUILDERS = ("fashion_mnist_local", "tiny_imagenet_zip", "product_m")  # read data.manual_dir (a folder)
SPLITS = ("official", "generator", "user")  # data.split


def check(config: ml_collections.ConfigDict, *, num_devices: int) -> None:
    """Raise ``ConfigError`` for the first problem found, section by section."""
    if config.method not in METHODS:
        raise ConfigError(f"method={config.method!r} is unknown; choose one of {sorted(METHODS)}.")
    total = _check_data(config.data)
    if config.data.split == "generator":  # the generator's own rules (blurry S == C, ...), before the data is read
        try:
            splits.check_config(config)
        except SplitError as e:
            raise ConfigError(str(e)) from None
    _check_train(config.train, num_devices)
    _check_augment(config.augment)
    _check_method(config, total)
    _check_model(config)
    if total:  # sessions from the data: checked when it is read (data_checks.check_data)
        check_simplex(config, total)
    _check_retrieval(config)
    profiling.parse(config.profile_steps)


def _check_retrieval(config: ml_collections.ConfigDict) -> None:
    """``retrieval.query_map``: one of the query-map kinds."""
    kind = config.retrieval.query_map
    if kind not in query_maps.KINDS:
        raise ConfigError(f"retrieval.query_map={kind!r} is unknown; choose one of {list(query_maps.KINDS)}.")


def _check_data(d: ml_collections.ConfigDict) -> int:
    """``data.*``; returns the classes the run will see (0 with sessions from the data: checked when read)."""
    if d.setup not in splits.SETUPS:
        raise ConfigError(f"data.setup={d.setup!r} is unknown; choose one of {list(splits.SETUPS)}.")
    if d.name is None:
        raise ConfigError("data.name is not set; set --config.data.name (e.g. fashion_mnist_local).")
    _check_split(d)
    if d.on_corrupt not in ("refuse", "skip"):
        raise ConfigError(f"data.on_corrupt={d.on_corrupt!r} is unknown; choose 'refuse' or 'skip'.")
    if d.general_shares not in splits.GENERAL_SHARES:
        raise ConfigError(
            f"data.general_shares={d.general_shares!r} is unknown; choose one of {list(splits.GENERAL_SHARES)}."
        )
    if d.val_per_class is not None and d.val_fraction != 0:
        raise ConfigError(
            f"data.val_fraction={d.val_fraction} and data.val_per_class={d.val_per_class} are both "
            "set; choose one (--config.data.val_fraction=0 to use val_per_class)."
        )
    if not 0 <= d.old_class_percent < 100:
        raise ConfigError(f"data.old_class_percent={d.old_class_percent} (M) must be in [0, 100).")
    if d.num_sessions < 1 or d.first_classes < 1 or (d.num_sessions > 1 and d.classes_per_session < 1):
        raise ConfigError(
            "data.num_sessions (L), data.first_classes (S) and data.classes_per_session (C) must be positive."
        )
    total = d.first_classes + (d.num_sessions - 1) * d.classes_per_session
    if d.split == "user":
        total = 0  # the sessions come from the data: checked when it is read (user_sessions.check_plan_feasible)
    if d.name in KNOWN_NUM_CLASSES and total > KNOWN_NUM_CLASSES[d.name]:
        raise ConfigError(
            f"S + (L-1)*C = {d.first_classes} + ({d.num_sessions}-1)*{d.classes_per_session} = "
            f"{total} classes, but {d.name} has {KNOWN_NUM_CLASSES[d.name]}; lower "
            f"data.num_sessions, data.first_classes or data.classes_per_session."
        )
    if not 0 <= d.test_fraction < 1:
        raise ConfigError(f"data.test_fraction={d.test_fraction} must lie in [0, 1); e.g. 0.2.")
    if d.stored_size < 8:
        raise ConfigError(f"data.stored_size={d.stored_size} is too small; e.g. 256 (photos) or 64.")
    if d.name == "image_folder" and d.manual_dir is None:
        raise ConfigError(
            "data.name=image_folder reads your images from data.manual_dir: set --config.data.manual_dir to a "
            "folder of class folders (<class>/<image>) or a CSV manifest (path,label[,split][,session])."
        )
    if d.name in LOCAL_BUILDERS and d.manual_dir is not None:
        if not os.path.isdir(os.path.expanduser(d.manual_dir)):
            raise ConfigError(
                f"data.manual_dir={d.manual_dir!r} does not exist; point it at the folder holding "
                f"the {d.name} source files (see docs/configs-and-data.md)."
            )
    return total


def _check_train(t: ml_collections.ConfigDict, num_devices: int) -> None:
    """``train.*``: the batch sizes split evenly over the devices."""
    if t.schedule not in schedules.SCHEDULES:
        raise ConfigError(f"train.schedule={t.schedule!r} is unknown; choose one of {list(schedules.SCHEDULES)}.")
    if t.batch_size < 1 or t.batch_size % num_devices:
        raise ConfigError(
            f"train.batch_size={t.batch_size} is not a positive multiple of the {num_devices} "
            f"devices; choose a multiple of {num_devices}."
        )
    if t.eval_batch_size < 1 or t.eval_batch_size % num_devices:
        raise ConfigError(
            f"train.eval_batch_size={t.eval_batch_size} is not a positive multiple of the "
            f"{num_devices} devices; choose a multiple of {num_devices}."
        )
    if t.epochs < 1:
        raise ConfigError(f"train.epochs={t.epochs} must be at least 1.")
    for s, lr in enumerate(t.session_lr):
        if lr is not None and not (isinstance(lr, (int, float)) and 0 < lr < float("inf")):
            raise ConfigError(f"train.session_lr[{s}]={lr!r} (session {s + 1}) must be a positive number.")
    for s, e in enumerate(t.session_epochs):
        if e is not None and not (isinstance(e, int) and e >= 1):
            raise ConfigError(f"train.session_epochs[{s}]={e!r} (session {s + 1}) must be an integer >= 1.")
    if t.checkpoint_every_steps < 0:
        raise ConfigError(f"train.checkpoint_every_steps={t.checkpoint_every_steps} must be >= 0 (0: epoch ends only).")
    k = t.steps_per_call
    if not isinstance(k, int) or k < 1:
        raise ConfigError(f"train.steps_per_call={k!r} must be a positive integer (1: one step per call).")


def _check_augment(a: ml_collections.ConfigDict) -> None:
    """``augment.*``."""
    if a.crop not in augment.CROPS:
        raise ConfigError(f"augment.crop={a.crop!r} is unknown; choose one of {list(augment.CROPS)}.")
    if a.crop == "resized" and (a.size is None or a.size <= 0):
        raise ConfigError(
            "augment.crop='resized' needs the crop side: set --config.augment.size (224 for the fine-grained recipe)."
        )
    if a.policy not in augment.POLICIES:
        raise ConfigError(f"augment.policy={a.policy!r} is unknown; choose one of {list(augment.POLICIES)}.")


def _check_method(config: ml_collections.ConfigDict, classes: int) -> None:
    """``method``, ``population`` and ``memory.*``: what the method needs of the run (``classes`` seen)."""
    population = config.population
    if not isinstance(population, int) or population < 1:
        raise ConfigError(f"population={population!r} must be a positive integer (1: one run).")
    method = METHODS[config.method](config)
    if population > 1 and not method.population:
        raise ConfigError(
            f"population={population} is not supported for method={config.method!r} (its per-session state, "
            f"e.g. parameter importance or uncertainty memory, is not stacked over members); use one of "
            f"{population_methods(config)}, or population=1 and one run per seed."
        )
    if config.data.name == "image_folder" and config.data.manual_dir is not None:
        _check_image_folders(config, method.uses_memory)
    # every setup uses the first S + (L-1)C classes of the class order
    if method.uses_memory and config.memory.budget < classes:
        raise ConfigError(
            f"memory.budget={config.memory.budget} is smaller than the {classes} classes the "
            f"run will have seen; raise memory.budget to at least {classes}."
        )


def head_rows(config: ml_collections.ConfigDict, classes: int) -> int:
    """The head's rows for ``classes``: rounded up to ``model.head_block`` (``Protocol.num_classes``)."""
    block = config.model.head_block
    return -(-classes // block) * block if block else classes


def check_simplex(config: ml_collections.ConfigDict, classes: int) -> None:
    """A fixed d-simplex head holds its K rows (every class of the run, rounded up to ``model.head_block``)
    in ``model.embed_dim`` >= K - 1 dimensions: refused before anything loads."""
    if head_name(config) == "simplex":
        check_simplex_width(config.model.embed_dim, head_rows(config, classes))


def _check_model(config: ml_collections.ConfigDict) -> None:
    """``model.*``."""
    head_name(config)  # model.head: one of HEAD_CHOICES
    if config.model.head_block < 0:
        raise ConfigError(f"model.head_block={config.model.head_block} must be >= 0 (0: one head row per class).")
    found = backbones.check_pretrained(config)  # the file exists and holds the backbone model.name names
    _check_train_blocks(config, found)


def _check_train_blocks(config: ml_collections.ConfigDict, found) -> None:
    """``model.train_blocks`` ("all", or 0..depth blocks of a pretrained ViT or EfficientNet-Lite, 0..4 stages
    of a pretrained ResNet) and ``model.cache_views`` (>= 0)."""
    m = config.model
    k = str(m.train_blocks)
    if k == "all":
        return
    if found is None:
        raise ConfigError(
            f"model.train_blocks={k} freezes part of a pretrained backbone: set model.pretrained to a weight file "
            "(docs/pretrained-backbones.md), or use model.train_blocks=all."
        )
    if found.family == "efficientnet_lite":  # MBConv blocks
        from cvs_jax.models.efficientnet import LITE_ARCHITECTURES  # pylint: disable=g-import-not-at-top

        depth, what = len(LITE_ARCHITECTURES[found.lite].blocks()), "MBConv blocks"
    else:
        depth, what = (found.vit.depth, "blocks") if found.family == "vit" else (len(found.resnet[0]), "stages")
    if not k.isdigit() or int(k) > depth:
        raise ConfigError(f"model.train_blocks={k!r}: use 'all' or a number of {what} from 0 to {depth}.")
    if int(m.cache_views) < 0:
        raise ConfigError(
            f"model.cache_views={m.cache_views}: use 1 (cache the evaluation view, no augmentation), V > 1 (V - 1 "
            "augmented views beside it) or 0 (no cache: the frozen trunk runs at every step, augmentation kept)."
        )
    if config.method == "rainbow" and int(m.cache_views) >= 1:
        raise ConfigError(
            "method rainbow draws its memory by perturbing images, which cached trunk features no longer are; "
            "set model.cache_views=0 (the frozen trunk runs at every step)."
        )


def _check_image_folders(config: ml_collections.ConfigDict, uses_memory: bool) -> None:
    """Your own images: every folder of the run (``data.manual_dir``, ``data.updates``) exists or was
    prepared into a record store of ``data.data_dir`` (a run stays usable after its folder moved); with
    sessions from the data (``data.split=user``) and a replay method, ``memory.budget`` covers the
    classes the folders hold (their listing only: no image is read)."""
    from cvs_jax.data import folder_inventory, stores, user_sessions  # pylint: disable=g-import-not-at-top

    d = config.data
    folders = [("data.manual_dir", d.manual_dir)] + [("data.updates", u) for u in d.updates]
    classes: set[str] = set()
    listed = True
    for field, folder in folders:
        path = os.path.expanduser(folder)
        if os.path.exists(path):
            if uses_memory and d.split == "user":
                try:
                    inventory = folder_inventory.scan(path, test_fraction=d.test_fraction, seed=d.test_seed)
                    classes.update(inventory.class_names)
                except DataError:  # what is wrong with the folder is reported when it is read
                    listed = False
            continue
        if stores.indexed_store(d.data_dir, path, stores.builder_options(d)) is None:
            raise ConfigError(
                f"{field}: {folder!r} does not exist, and no record store in data.data_dir={d.data_dir!r} was "
                "prepared from it; pass a folder of class folders (<class>/<image>) or a CSV manifest "
                "(path,label[,split][,session])."
            )
        listed = False  # a moved folder: its classes are counted from its store (data_checks.check_data)
    if uses_memory and d.split == "user" and listed and config.memory.budget < len(classes):
        raise ConfigError(user_sessions.budget_message(config.memory.budget, len(classes), fixed=bool(folders[1:])))


def _check_split(d: ml_collections.ConfigDict) -> None:
    """``data.split``: "generator" or "official" (only where official files exist, with the fields they fix)."""
    if d.split not in SPLITS:
        raise ConfigError(
            f"data.split={d.split!r} is unknown; choose 'official' (the official CVS sessions, CIFAR-100), "
            "'generator' (our seeded generator) or 'user' (image_folder: your manifest's sessions)."
        )
    if d.official_split_dir is not None and not os.path.isdir(os.path.expanduser(d.official_split_dir)):
        raise ConfigError(
            f"data.official_split_dir={d.official_split_dir!r} does not exist; point it at the "
            f"official cifar100_*.json session files (e.g. ../shared/data/cvs-official-splits/cifar100)."
        )
    if d.split == "user":
        if d.name != "image_folder":
            raise ConfigError(
                f"data.split='user' takes the sessions from an image_folder manifest's session column; {d.name} "
                "has none: set --config.data.split=generator."
            )
        return
    if d.split == "generator":
        if d.official_split_dir is not None:
            raise ConfigError(
                f"data.official_split_dir={d.official_split_dir!r} is only read with data.split='official'; "
                "set --config.data.split=official (CIFAR-100) or unset data.official_split_dir."
            )
        return
    base = d.name.split("/", 1)[0].split(":", 1)[0]
    if base not in official_splits.OFFICIAL_DATASETS:
        raise ConfigError(
            f"data.split='official': the official CVS session files exist only for "
            f"{', '.join(official_splits.OFFICIAL_DATASETS)}, not {d.name}; set --config.data.split=generator."
        )
    for field, want in official_splits.OFFICIAL_FIELDS[d.setup].items():
        if d[field] != want:
            raise ConfigError(
                f"data.{field}={d[field]!r}, but the official CIFAR-100 {official_splits.FILE_SETUPS[d.setup]} "
                f"sessions fix {want!r}; set --config.data.split=generator to split with data.{field}={d[field]!r} "
                f"(or leave it at {want!r})."
            )
