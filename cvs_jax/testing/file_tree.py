"""A folder's files by content: what a refused command must leave exactly as it was."""

from __future__ import annotations

import hashlib
import os


def checksums(root: str) -> dict[str, str]:
    """SHA-256 of every file below ``root``, keyed by its path relative to ``root``."""
    out = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return out
