"""TFDS builders that leave no stray temporary folder: a builder made for a dataset not prepared in its
``data_dir`` makes an empty ``tempfile.mkdtemp("tfds")`` folder and never removes it.  Imports
tensorflow_datasets only when a builder is made."""

from __future__ import annotations

import contextlib
import tempfile
from typing import Iterator


@contextlib.contextmanager
def no_stray_tempdirs() -> Iterator[None]:
    """Temporary folders made inside go to one that is removed after.  A TFDS builder made for a dataset
    not prepared in its ``data_dir`` makes an empty ``tempfile.mkdtemp("tfds")`` folder to copy GCS
    metadata into (``DatasetInfo.initialize_from_bucket``; GCS is off, so it stays empty) and never
    removes it: each look for an unprepared source left a ``/tmp/tmp*tfds`` folder (tests/data/test_data_mode.py).
    ``tfds.testing.mock_data``'s builders still leave theirs (about 8 a suite run; tests only)."""
    with tempfile.TemporaryDirectory(prefix="cvs-tfds-") as scratch:
        before, tempfile.tempdir = tempfile.tempdir, scratch
        try:
            yield
        finally:
            tempfile.tempdir = before


def tfds_builder(name: str, data_dir: str):
    """``tfds.builder(name, data_dir=data_dir)``, leaving no stray temporary folder (``no_stray_tempdirs``)."""
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top  # the source is a TFDS dataset

    with no_stray_tempdirs():
        return tfds.builder(name, data_dir=data_dir)
