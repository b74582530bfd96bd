"""Tiny photo-folder runs (``data.name=image_folder``) for tests that train, update, serve and search.

The folders and the tiny config are ``image_folders``'; this module adds a finished run to start from.
"""

from __future__ import annotations

import numpy as np

from cvs_jax.testing.image_folders import folder_config, write_folder
from cvs_jax.testing.image_folders import folder_image as class_image

SESSIONS = ({"ant": 16, "bee": 16, "cat": 16}, {"dog": 16, "ant": 4})


def photo_run(root) -> tuple[str, str]:
    """A finished one-session photo run under ``root/run`` and the folder of its next session
    (``python -m cvs_jax.update --workdir root/run --data <folder>``)."""
    from cvs_jax.engine import runner  # pylint: disable=g-import-not-at-top

    first, second = (write_folder(root / f"s{i + 1}", classes, 3, seed=i) for i, classes in enumerate(SESSIONS))
    runner.run(folder_config(root, first), str(root / "run"))
    return str(root / "run"), second


def new_photo(path, name: str = "ant", seed: int = 1000) -> str:
    """A photo of class ``name``'s pattern whose bytes are in no run (for adds); returns ``path``."""
    class_image(sum(map(ord, name)) % 97, np.random.default_rng(seed)).save(path)
    return str(path)
