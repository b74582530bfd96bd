"""A user's own labelled images (`image_folder`): class folders or a CSV manifest, no TensorFlow.

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

import tensorflow_datasets as tfds

from cvs_jax.data import folder_inventory
from cvs_jax.data.builders import resize
from cvs_jax.data.builders._common import LocalBuilder, SourceInfo, features_of, metadata_of, normalize_json
from cvs_jax.errors import DatasetNotFoundError

MIN_SIDE = 8  # images with a shorter side are stored with a warning (sources._warn_degenerate)


def _smaller_than(data: bytes, side: int) -> bool:
    """Whether an image's shorter side is below ``side`` pixels (its header only)."""
    from PIL import Image  # pylint: disable=g-import-not-at-top

    try:
        with Image.open(io.BytesIO(data)) as im:
            return min(im.size) < side
    except Exception:  # pylint: disable=broad-except  # it decoded once already; never fail on the check
        return False


class ImageFolder(LocalBuilder, skip_registration=True):
    """A user's images; ``with_options`` fixes the stored size and the drawn test split."""

    name = "image_folder"
    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release."}
    MANUAL_FILES_HINT = "<class>/<image> folders, train/ + test/ class folders, or a manifest.csv"
    MANUAL_DOWNLOAD_INSTRUCTIONS = "Set --config.data.manual_dir to your folder of class folders or CSV manifest."
    STORE_ENCODING = "jpeg"
    STORED_SIZE: ClassVar[int] = 224
    TEST_FRACTION: ClassVar[float] = 0.2
    SEED: ClassVar[int] = 0

    @classmethod
    def with_options(cls, *, stored_size=None, test_fraction=None, test_seed=None, **_) -> type["ImageFolder"]:
        """This builder with the run's ``data.stored_size``, ``data.test_fraction``, ``data.test_seed``."""
        fields = {"STORED_SIZE": stored_size, "TEST_FRACTION": test_fraction, "SEED": test_seed}
        values = {k: type(getattr(cls, k))(v) for k, v in fields.items() if v is not None}
        return type("ImageFolder", (cls,), values, skip_registration=True)

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

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description="A user's labelled images, stored at data.stored_size (shorter side, centre crop).",
            features=tfds.features.FeaturesDict({"label": tfds.features.ClassLabel()}),
            disable_shuffling=True,
            metadata=tfds.core.MetadataDict(),
        )

    def _split_generators(self, dl_manager):
        inventory = self._scan(self._resolve_manual_dir(dl_manager))
        features_of(self.info)["label"].names = list(inventory.class_names)
        metadata_of(self.info)["ignored"] = dict(inventory.ignored)
        metadata_of(self.info)["test_given"] = inventory.test_given
        metadata_of(self.info)["root"] = inventory.root  # stores are shared by content: sources shown per run
        # photos turned upright by their EXIF orientation: in store.json, so the feature cache (keyed by it) of
        # a store prepared again after this rule never reuses the features of a sideways copy prepared before
        metadata_of(self.info)["exif_upright"] = True
        if inventory.sessions() is not None:
            metadata_of(self.info)["train_sessions"] = []
            metadata_of(self.info)["test_sessions"] = []
        return {
            "train": self._generate_examples(inventory.train, "train"),
            "test": self._generate_examples(inventory.test, "test"),
        }

    def _generate_examples(self, entries, split: str):
        skipped = metadata_of(self.info).setdefault(f"skipped_{split}", [])
        sessions = metadata_of(self.info).get(f"{split}_sessions")

        def read_block(block):
            out = []
            for e in block:
                with open(e.path, "rb") as f:
                    out.append(f.read())
            return out

        items = resize.decode_blocks(
            entries, read_block, self.STORED_SIZE, skipped, describe=lambda e: e.path, exif=True
        )  # photos upright, as viewers show them (phones store portraits sideways with an EXIF tag)
        tiny = metadata_of(self.info).setdefault("tiny", [])
        for i, (entry, image, data, passthrough) in enumerate(items):
            if _smaller_than(data, MIN_SIDE):
                tiny.append(entry.path)
            if sessions is not None:  # a test row without a session is a query from session 1 on
                sessions.append(-1 if entry.session is None else int(entry.session))
            yield (
                i,
                {
                    "image": image,
                    "label": entry.label,
                    "id": i,
                    "source": entry.path,
                    "source_bytes": data,
                    "passthrough": passthrough,
                },
            )
