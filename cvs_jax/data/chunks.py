"""The one way to map a jitted function over host arrays in chunks of a few fixed shapes.

Every chunk but the last holds ``size`` rows. The last, short one is zero-padded (the caller keeps only
its first ``n`` outputs) to ``size`` rows by default; with ``bucketed=True`` only to ``bucket(n, size)``
rows, one of at most four shapes per power of two, so a lone query runs one row, not ``size``, and the
number of compiles stays bounded (28 shapes up to 256). With ``drop_remainder`` it is dropped (a
computation that must see full batches only: the Fisher estimate).

The embedder and the frozen trunk's feature cache are bucketed; consumers that draw random numbers per
chunk (Rainbow's perturbations) keep full chunks, so their draws do not change.

What bucketing costs in exactness (measured on XLA CPU, jax 0.10.2, 2 cores, one row embedded at batch
sizes 1 to 256 against the same row in a batch of 256, in ``Embedder``'s eval mode): a row's output
depends on the batch shape, not on its position or on the other rows. For the tiny test ResNet (width 4,
D=8) batches of 1 to 4 differ by up to 7.2e-7 (2.1e-7 of the largest component), batches of 8 or more
are bitwise equal; for the fixture ViT (depth 2, width 128, D=64) batches of 1 to 64 differ by up to
1.3e-6 (4.1e-7 relative), 100 or more are bitwise equal. Every cosine to the stored row was
>= 1 - 2.4e-7. So the guarantee is: an image embedded again on the machine that stored it, in any
bucket, gets an embedding within ``EXACTNESS`` (relative, per component) of its stored row, hence its
own row as the top hit with cosine score >= 1 - ``EXACTNESS`` unless another row is as close
(tests/retrieval/test_buckets.py).
"""

from __future__ import annotations

from typing import Any, Iterator

import jax
import numpy as np

EXACTNESS = 1e-5  # guaranteed (and tested) bound on the relative change of a row between two buckets
PER_OCTAVE = 4  # bucket shapes per power of two: padding wastes at most a quarter of a short chunk's rows


def _rows(tree: Any) -> int:
    return int(np.shape(jax.tree.leaves(tree)[0])[0])


def bucket(n: int, size: int, multiple: int = 1) -> int:
    """The rows a chunk of ``n`` (1 <= n <= size) real rows is padded to: a multiple of ``multiple``
    (the devices that share a batch; ``size`` is one), of the form ``multiple * j * 2^e`` with
    ``j`` in 5..8 (or any ``j`` below 8), at most ``size``."""
    if not 1 <= n <= size or size % multiple:
        raise ValueError(f"bucket({n}, {size}, {multiple}): need 1 <= n <= size and size a multiple of {multiple}")
    units = -(-n // multiple)
    step = max(1, (1 << (units - 1).bit_length()) // (2 * PER_OCTAVE))
    return min(size, -(-units // step) * step * multiple)


def iter_chunks(
    tree: Any, size: int, *, drop_remainder: bool = False, bucketed: bool = False, multiple: int = 1
) -> Iterator[tuple[int, Any, int]]:
    """Yields ``(start, chunk, n)``: rows ``start:start + n`` of every leaf of ``tree``, each chunk
    ``size`` rows long, the last one zero-padded to ``size`` (or to ``bucket(n, size, multiple)`` rows
    with ``bucketed``), or only the full chunks with ``drop_remainder``."""
    if drop_remainder and bucketed:
        raise ValueError("iter_chunks: drop_remainder and bucketed exclude each other")
    total = _rows(tree)
    stop = total - size + 1 if drop_remainder else total
    for start in range(0, max(stop, 0), size):
        n = min(size, total - start)
        rows = bucket(n, size, multiple) if bucketed and n < size else size

        def take(x, start=start, n=n, rows=rows):
            part = np.asarray(x[start : start + n])
            if n == rows:
                return part
            return np.concatenate([part, np.zeros((rows - n,) + part.shape[1:], part.dtype)])

        yield start, jax.tree.map(take, tree), n
