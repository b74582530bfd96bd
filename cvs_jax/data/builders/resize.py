"""The one resize rule of the photo builders (and of search queries): shorter side -> 256, centre crop.

Why: Stanford Dogs, iNat-M, Product-M and users' photos vary in size, while a
split's images share one shape (batches, the record store). Storing the
torchvision `Resize(256)` + `CenterCrop(256)` result keeps everything the
training pipeline needs: `RandomResizedCrop(224)` for training works on it, and
its centre 224x224 equals torchvision `Resize(256)` + `CenterCrop(224)` of the
original image exactly (the 256 crop's offset plus 16 is the 224 crop's offset,
rounding included), which is how the CVS code evaluates.

Interpolation: PIL BILINEAR, which antialiases when shrinking; it is what
torchvision's `Resize` does on PIL images by default.

`STORED_SIZE` is read when a builder defines its features (not at import), so
tests can `monkeypatch.setattr(resize, 'STORED_SIZE', 32)` for quick smoke
runs; the size is part of each prepared copy's source fingerprint, so a copy
prepared at one size is refused (SourceMismatchError) when asked at another.

Decoding (``decode_blocks``) runs in threads: Pillow releases the GIL while it decodes JPEGs and
resamples, and the fine-grained datasets have large images (iNat, Product-10K: ~0.3-1 megapixel), so
decoding a block on all cores while TFDS writes the previous one is several times faster than one
thread.  Order is kept.
"""

from __future__ import annotations

import concurrent.futures
import io
import os
from typing import Callable, Iterator, Sequence, TypeVar

import numpy as np

STORED_SIZE = 256


def stored_size() -> int:
    """The current `STORED_SIZE` (looked up at call time, so tests can patch it)."""
    return int(STORED_SIZE)


def resized_shape(width: int, height: int, size: int) -> tuple[int, int]:
    """(width, height) with the shorter side = `size`, as torchvision's Resize(size).

    The longer side is truncated (`int(size * long / short)`), as in torchvision.
    """
    if width <= height:
        return size, int(size * height / width)
    return int(size * width / height), size


def to_square_uint8(pil_image, size: int | None = None, exif: bool = True) -> np.ndarray:
    """PIL image -> uint8 [size, size, 3]: RGB, shorter side resized, centre crop.

    Args:
      pil_image: any PIL image (greyscale, palette, CMYK, RGBA... converted to
        RGB first, as torchvision's ImageFolder loader does).
      size: output side; default `STORED_SIZE` (read now).
      exif: turn it upright by its EXIF orientation first (``upright``; see `to_stored`).
    """
    size = stored_size() if size is None else int(size)
    return to_stored(pil_image, (size, size, 3), exif=exif)


EXIF_ORIENTATION = 0x0112  # the EXIF tag saying how a viewer turns the stored pixels (1: as stored)


def upright(pil_image):
    """The image as photo viewers and browsers show it: its EXIF orientation applied (the same image when it
    has none).  Why: phones store a portrait photo's pixels sideways with a tag saying so; read as stored,
    such photos went into the gallery, the queries and every thumbnail sideways, and the network saw
    them turned."""
    from PIL import ImageOps  # pylint: disable=g-import-not-at-top

    try:
        orientation = pil_image.getexif().get(EXIF_ORIENTATION, 1)
    except Exception:  # pylint: disable=broad-except  # a damaged EXIF block: the pixels as stored
        return pil_image
    if orientation not in range(2, 9):
        return pil_image
    return ImageOps.exif_transpose(pil_image)


def eight_bit(pil_image):
    """A 16-bit greyscale image (a PNG or TIFF scan: mode "I;16", or "I" with values past 255) as 8-bit "L",
    v -> round(v / 257); any other image as it is.  Why: Pillow's ``convert`` clips such values at 255, so
    these photos went into the gallery and the queries as white squares."""
    from PIL import Image  # pylint: disable=g-import-not-at-top

    if not (pil_image.mode.startswith("I;16") or pil_image.mode == "I"):
        return pil_image
    values = np.asarray(pil_image).astype(np.int64)
    if pil_image.mode == "I" and values.max(initial=0) <= 255 and values.min(initial=0) >= 0:
        return Image.fromarray(values.astype(np.uint8), "L")  # 8-bit values held as 32-bit integers
    return Image.fromarray(((np.clip(values, 0, 65535) + 128) // 257).astype(np.uint8), "L")


def to_stored(pil_image, shape, exif: bool = True) -> np.ndarray:
    """PIL image -> uint8 `shape` = (size, size, C): a query prepared as the gallery was stored.

    Why: search and export embed user images with the network that embedded the stored gallery
    images, so a query must reach it in the same form: turned upright by its EXIF orientation
    (`upright`), 16-bit greyscale brought to 8 bits (`eight_bit`), converted to "L" (C == 1) or "RGB"
    (C == 3), shorter side resized to `size` (PIL BILINEAR, as torchvision's Resize), torchvision's
    CenterCrop offsets.  For C == 3 this is exactly `to_square_uint8(pil_image, size)`; an upright
    image already of the stored size is returned unchanged.  ``exif=False`` reads the pixels as stored,
    as torchvision's loader does: the benchmark datasets' builders (``decode_blocks``), which follow the
    reference code; users' photos, queries and uploads are read upright.
    """
    from PIL import Image  # pylint: disable=g-import-not-at-top

    size, other, channels = (int(d) for d in shape)
    if size != other or channels not in (1, 3):
        raise ValueError(f"stored shape {tuple(shape)}: expected (size, size, 1) or (size, size, 3)")
    mode = "L" if channels == 1 else "RGB"
    img = eight_bit(upright(pil_image) if exif else pil_image)
    img = img if img.mode == mode else img.convert(mode)
    width, height = resized_shape(img.width, img.height, size)
    if (width, height) != img.size:
        img = img.resize((width, height), Image.Resampling.BILINEAR)
    left = int(round((width - size) / 2.0))  # torchvision's CenterCrop offsets
    top = int(round((height - size) / 2.0))
    img = img.crop((left, top, left + size, top + size))
    return np.asarray(img, dtype=np.uint8).reshape(size, size, channels)


Item = TypeVar("Item")

BLOCK = 256  # Images per block: bounds the memory of encoded bytes in flight.


def read_ahead(chunks: list, load):
    """Yields ``(chunk, load(chunk))`` in order, loading the next chunk in a thread while the caller works on
    this one (reading overlaps decoding and writing; one place for the builders that stream their source)."""
    if not chunks:
        return
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as reader:
        pending = reader.submit(load, chunks[0])
        for c, chunk in enumerate(chunks):
            result = pending.result()
            if c + 1 < len(chunks):
                pending = reader.submit(load, chunks[c + 1])
            yield chunk, result


def image_errors() -> tuple[type[BaseException], ...]:
    """What Pillow raises for a broken, truncated or oversized image (a decompression bomb is not an
    OSError): these files are skipped and recorded, never fatal."""
    from PIL import Image  # pylint: disable=g-import-not-at-top

    return (OSError, ValueError, SyntaxError, Image.DecompressionBombError)


def decode_keeping_source(data: bytes, size: int, exif: bool = False) -> tuple[np.ndarray, bool]:
    """(uint8 [size, size, 3], passthrough): passthrough is True when ``data`` is an RGB JPEG of exactly
    that size that needs no turning, whose bytes the record store then keeps instead of a re-encode.
    ``exif``: turned upright by its EXIF orientation (users' photos; a turned one is re-encoded upright,
    as the store's reader does not turn it); else read as stored, as torchvision does (benchmarks)."""
    from PIL import Image  # pylint: disable=g-import-not-at-top

    with Image.open(io.BytesIO(data)) as img:
        img.load()
        up = upright(img) if exif else img
        same = up is img and img.format == "JPEG" and img.mode == "RGB" and img.size == (size, size)
        return to_square_uint8(up, size, exif=False), same


def decode_blocks(
    items: Sequence[Item],
    read_block: Callable[[Sequence[Item]], Sequence[bytes]],
    size: int,
    skipped: list[str],
    describe: Callable[[Item], str] = str,
    exif: bool = False,
) -> Iterator[tuple[Item, np.ndarray, bytes, bool]]:
    """Yields (item, uint8 [size, size, 3], source bytes, passthrough) in order; broken images are
    skipped (see ``decode_keeping_source``).

    Args:
      items: what to read, in output order.
      read_block: items -> their encoded bytes (one call per block, so that the
        reader can batch, e.g. array_record random access).
      size: stored side (see `resize`).
      skipped: receives `'<describe(item)>: <error type>'` for each image that
        does not decode (recorded by the builders in `skipped_<split>`).
      describe: name of an item in `skipped`.
      exif: turn each image upright by its EXIF orientation (``image_folder``: users' photos); the
        benchmark builders read the pixels as stored, as the reference code's torchvision loader does.
    """
    workers = max(1, min(8, os.cpu_count() or 1))

    errors = image_errors()

    def decode(pair):
        item, data = pair
        try:
            return (*decode_keeping_source(data, size, exif), data)
        except errors as e:  # PIL's errors for broken files and decompression bombs
            return f"{describe(item)}: {type(e).__name__}"

    def load(block):
        return list(decoder.map(decode, zip(block, read_block(block))))

    blocks = [items[s : s + BLOCK] for s in range(0, len(items), BLOCK)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as decoder:
        for block, results in read_ahead(blocks, load):
            for item, result in zip(block, results):
                if isinstance(result, str):
                    skipped.append(result)
                else:
                    image, passthrough, data = result
                    yield item, image, data, passthrough
