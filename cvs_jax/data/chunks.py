"""The one way to map a jitted function over host arrays in fixed-size chunks.

A fixed chunk size means one compile for every call; the last, short chunk is padded
with zero rows (and the caller keeps only its first ``n`` outputs), or dropped when a
computation must see full batches only (the Fisher estimate).
"""

from __future__ import annotations

from typing import Any, Iterator

import jax
import numpy as np


def _rows(tree: Any) -> int:
    return int(np.shape(jax.tree.leaves(tree)[0])[0])


def iter_chunks(tree: Any, size: int, *, drop_remainder: bool = False) -> Iterator[tuple[int, Any, int]]:
    """Yields ``(start, chunk, n)``: rows ``start:start + n`` of every leaf of ``tree``, each chunk
    ``size`` rows long (zero-padded at the end), or only the full chunks with ``drop_remainder``."""
    total = _rows(tree)
    stop = total - size + 1 if drop_remainder else total
    for start in range(0, max(stop, 0), size):
        n = min(size, total - start)

        def take(x, start=start, n=n):
            part = np.asarray(x[start : start + n])
            if n == size:
                return part
            return np.concatenate([part, np.zeros((size - n,) + part.shape[1:], part.dtype)])

        yield start, jax.tree.map(take, tree), n
