"""A user's own labelled images (`image_folder`): class folders or a CSV manifest, no TensorFlow.

This module is their files (no TFDS): what a folder holds and its store's name; the TFDS half that
prepares the store is ``tfds_builders.ImageFolder``.

The manual dir (``data.manual_dir``) is what ``folder_inventory.scan`` reads: ``<class>/*`` image
files, ``train/<class>`` + ``test/<class>`` folders, or a ``manifest.csv`` with
``path,label[,split][,session]`` (the layouts, what is ignored and counted, and every refusal are in
``folder_inventory``'s docstring).  Without a given test split, ``data.test_fraction`` of each class
is drawn as test queries with ``data.test_seed`` (fixed per folder, as Product-M's split).

Images of any size and format (jpg/png/webp/bmp, any mode) are stored at ``data.stored_size``:
RGB, shorter side resized, centre crop (``resize``, torchvision's Resize + CenterCrop), the source
JPEG's bytes when it is already exactly that, else one JPEG re-encode (``records.py``).  The store
is named by the inventory's fingerprint and options, so two folders (or one folder before and after
new files) never share a store.  Metadata: ``train_sessions`` (the manifest's 0-based session of
each stored train row, absent without a session column), ``test_sessions`` (the same for test rows,
-1 where the manifest leaves it empty: a query from session 1 on) and the ``ignored`` counts.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from typing import ClassVar

from cvs_jax.data import folder_inventory
from cvs_jax.data.builders._common import LocalSource, SourceInfo, normalize_json
from cvs_jax.errors import DatasetNotFoundError

MIN_SIDE = 8  # images with a shorter side are stored with a warning (sources._warn_degenerate)


def smaller_than(data: bytes, side: int) -> bool:
    """Whether an image's shorter side is below ``side`` pixels (its header only)."""
    from PIL import Image  # pylint: disable=g-import-not-at-top

    try:
        with Image.open(io.BytesIO(data)) as im:
            return min(im.size) < side
    except Exception:  # pylint: disable=broad-except  # it decoded once already; never fail on the check
        return False


class ImageFolderSource(LocalSource):
    """A user's images; ``with_options`` fixes the stored size and the drawn test split."""

    name = "image_folder"
    MANUAL_FILES_HINT = "<class>/<image> folders, train/ + test/ class folders, or a manifest.csv"
    STORE_ENCODING = "jpeg"
    STORED_SIZE: ClassVar[int] = 224
    TEST_FRACTION: ClassVar[float] = 0.2
    SEED: ClassVar[int] = 0

    @classmethod
    def with_options(cls, *, stored_size=None, test_fraction=None, test_seed=None, **_) -> type["ImageFolderSource"]:
        """This builder with the run's ``data.stored_size``, ``data.test_fraction``, ``data.test_seed``."""
        fields = {"STORED_SIZE": stored_size, "TEST_FRACTION": test_fraction, "SEED": test_seed}
        return cls._subclass({k: type(getattr(cls, k))(v) for k, v in fields.items() if v is not None})

    @classmethod
    def _scan(cls, manual_dir: str) -> folder_inventory.Inventory:
        if not os.path.exists(manual_dir):
            raise DatasetNotFoundError(
                f"image_folder: {manual_dir!r} does not exist; set --config.data.manual_dir to a folder of class "
                f"folders or a CSV manifest."
            )
        return folder_inventory.scan(manual_dir, test_fraction=cls.TEST_FRACTION, seed=cls.SEED)

    @classmethod
    def _fingerprint(cls, inventory: folder_inventory.Inventory) -> dict:
        return {**inventory.fingerprint(), "stored_size": cls.STORED_SIZE}

    @classmethod
    def inspect_source(cls, manual_dir: str, config_name: str | None = None) -> SourceInfo:
        inventory = cls._scan(manual_dir)
        return SourceInfo(
            config_name=None, fingerprint=cls._fingerprint(inventory), description=inventory.description()
        )

    @classmethod
    def store_name(cls, full_name: str, source: SourceInfo | None) -> str:
        """One store per (files, options): ``image_folder-<digest>``; without the source (a moved or
        deleted folder) no name can be made: ``<full_name>-?`` (``sources`` then looks up the index of
        the stores prepared from that folder)."""
        if source is None:
            return f"{full_name}-?"
        digest = hashlib.sha256(json.dumps(normalize_json(source.fingerprint), sort_keys=True).encode()).hexdigest()
        return f"{full_name}-{digest[:16]}"
