"""Parallel decode + resize of encoded images for the fine-grained builders.

Why threads: Pillow releases the GIL while it decodes JPEGs and resamples, and
these datasets have large images (iNat, Product-10K: ~0.3-1 megapixel), so
decoding a block on all cores while TFDS writes the previous one is several
times faster than one thread. Order is kept.
"""

from __future__ import annotations

import concurrent.futures
import io
import os
from typing import Callable, Iterator, Sequence, TypeVar

import numpy as np

from cvs_jax.data.builders import _resize

Item = TypeVar("Item")

BLOCK = 256  # Images per block: bounds the memory of encoded bytes in flight.


def image_errors() -> tuple[type[BaseException], ...]:
    """What Pillow raises for a broken, truncated or oversized image (a decompression bomb is not an
    OSError): these files are skipped and recorded, never fatal."""
    from PIL import Image  # pylint: disable=g-import-not-at-top

    return (OSError, ValueError, SyntaxError, Image.DecompressionBombError)


def decode_keeping_source(data: bytes, size: int) -> tuple[np.ndarray, bool]:
    """(uint8 [size, size, 3], passthrough): passthrough is True when ``data`` is an RGB JPEG of
    exactly that size, whose bytes the record store then keeps instead of a re-encode."""
    from PIL import Image  # pylint: disable=g-import-not-at-top

    with Image.open(io.BytesIO(data)) as img:
        img.load()
        same = img.format == "JPEG" and img.mode == "RGB" and img.size == (size, size)
        return _resize.to_square_uint8(img, size), same


def decode_blocks(
    items: Sequence[Item],
    read_block: Callable[[Sequence[Item]], Sequence[bytes]],
    size: int,
    skipped: list[str],
    describe: Callable[[Item], str] = str,
) -> Iterator[tuple[Item, np.ndarray]]:
    """Yields (item, uint8 [size, size, 3], source bytes, passthrough) in order; broken images are
    skipped (see ``decode_keeping_source``).

    Args:
      items: what to read, in output order.
      read_block: items -> their encoded bytes (one call per block, so that the
        reader can batch, e.g. array_record random access).
      size: stored side (see `_resize`).
      skipped: receives `'<describe(item)>: <error type>'` for each image that
        does not decode (recorded by the builders in `skipped_<split>`).
      describe: name of an item in `skipped`.
    """
    workers = max(1, min(8, os.cpu_count() or 1))

    errors = image_errors()

    def decode(pair):
        item, data = pair
        try:
            return (*decode_keeping_source(data, size), data)
        except errors as e:  # PIL's errors for broken files and decompression bombs
            return f"{describe(item)}: {type(e).__name__}"

    def load(block):
        return list(decoder.map(decode, zip(block, read_block(block))))

    blocks = [items[s : s + BLOCK] for s in range(0, len(items), BLOCK)]
    with (
        concurrent.futures.ThreadPoolExecutor(max_workers=1) as reader,
        concurrent.futures.ThreadPoolExecutor(max_workers=workers) as decoder,
    ):
        pending = reader.submit(load, blocks[0]) if blocks else None
        for b, block in enumerate(blocks):
            results = pending.result()
            if b + 1 < len(blocks):
                pending = reader.submit(load, blocks[b + 1])
            for item, result in zip(block, results):
                if isinstance(result, str):
                    skipped.append(result)
                else:
                    image, passthrough, data = result
                    yield item, image, data, passthrough
