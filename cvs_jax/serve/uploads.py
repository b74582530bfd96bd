"""Uploaded images: decoded under limits, and kept on disk when they become gallery rows.

An upload is checked before it is decoded: the header's pixel count against ``max_pixels`` (Pillow
reads only the header on ``open``; a decompression bomb is refused before any pixel is inflated), and
Pillow's own bomb warning is an error too.  A bad image is a ``BadUpload`` naming it (a 4xx answer).

An added image is written to ``<workdir>/uploads/<sha256>.<ext>`` (temporary file, fsync, rename,
fsync of the folder) before its row is written: the row's source is that file, stored relative to the
workdir (``uploads/<sha256>.<ext>``), and its thumbnail is read from it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import os
import tempfile
import warnings

import numpy as np
from PIL import Image

from cvs_jax.data.builders import resize
from cvs_jax.data.builders.resize import image_errors
from cvs_jax.retrieval.additions import fsync_dir
from cvs_jax.rundir import paths


class BadUpload(ValueError):
    """An upload that cannot be a query or a row; ``status``: the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclasses.dataclass(frozen=True)
class Upload:
    name: str  # the client's file name (or "image-<i>")
    data: bytes
    ext: str  # the file name extension of its format ("png", "jpeg", ...)
    image: np.ndarray  # uint8, prepared as the gallery images were stored

    @functools.cached_property
    def digest(self) -> str:
        """SHA-256 (hex) of ``data``: only an add needs it (43 us for a 40 kB photo, per query saved)."""
        return hashlib.sha256(self.data).hexdigest()


def decode(name: str, data: bytes, shape: tuple[int, int, int], max_pixels: int) -> Upload:
    """The upload prepared for the model (``resize.to_stored``), or ``BadUpload``."""
    if not data:
        raise BadUpload(f"{name}: the upload is empty; send the image's bytes.")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as im:
                w, h = im.size
                if w * h > max_pixels:
                    raise BadUpload(
                        f"{name}: {w}x{h} pixels is over the limit of {max_pixels} (--max_pixels); send a "
                        f"smaller image.",
                        413,
                    )
                fmt = (im.format or "png").lower()
                image = resize.to_stored(im, shape)
    except BadUpload:
        raise
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as e:  # Pillow's own pixel limit
        raise BadUpload(
            f"{name}: too many pixels to decode safely ({e}); the server takes at most {max_pixels:,} per image "
            f"(--max_pixels): send a smaller image.",
            413,
        ) from e
    except image_errors() as e:
        why = "not an image file" if isinstance(e, Image.UnidentifiedImageError) else str(e)
        raise BadUpload(f"{name}: not a readable image ({why}); send PNG, JPEG, WebP or BMP files.") from e
    return Upload(name, data, fmt, image)


def save(workdir: str, upload: Upload) -> str:
    """Writes the upload durably under ``uploads/`` (once per content); returns its path relative to the
    workdir (what the row stores: a moved or copied workdir still finds it)."""
    folder = paths.uploads_dir(workdir)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{upload.digest}.{upload.ext}")
    stored = os.path.relpath(path, workdir)
    if os.path.exists(path):
        return stored
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".upload-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(upload.data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(folder)
    return stored
