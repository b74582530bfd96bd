"""Parallel decode + resize of encoded images for the fine-grained builders.

Why threads: Pillow releases the GIL while it decodes JPEGs and resamples, and
these datasets have large images (iNat, Product-10K: ~0.3-1 megapixel), so
decoding a block on all cores while TFDS writes the previous one is several
times faster than one thread. Order is kept.
"""

from __future__ import annotations

import concurrent.futures
import os
from typing import Callable, Iterator, Sequence, TypeVar

import numpy as np

from cvs_jax.data.builders import _resize

Item = TypeVar("Item")

BLOCK = 256  # Images per block: bounds the memory of encoded bytes in flight.


def decode_blocks(
    items: Sequence[Item],
    read_block: Callable[[Sequence[Item]], Sequence[bytes]],
    size: int,
    skipped: list[str],
    describe: Callable[[Item], str] = str,
) -> Iterator[tuple[Item, np.ndarray]]:
    """Yields (item, uint8 [size, size, 3]) in order; broken images are skipped.

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

    def decode(pair):
        item, data = pair
        try:
            return _resize.decode_to_square(data, size)
        except (OSError, ValueError, SyntaxError) as e:  # PIL's errors for broken files
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
                    yield item, result
