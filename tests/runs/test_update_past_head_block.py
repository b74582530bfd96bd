"""An ``update`` whose new classes grow the head past a ``model.head_block`` boundary: the older
sessions' checkpoints (a shorter head) are restored for the compatibility matrix and the run ends."""

from __future__ import annotations

import json
import os

from cvs_jax import update
from cvs_jax.engine import runner
from cvs_jax.testing import photo_folders


def test_update_past_a_head_block_completes(tmp_path):
    first = photo_folders.write_folder(tmp_path / "s1", {"ant": 16, "bee": 16, "cat": 16}, 3, seed=0)
    second = photo_folders.write_folder(tmp_path / "s2", {"dog": 16, "ant": 8}, 3, seed=1)
    c = photo_folders.tiny_config(tmp_path, first)
    c.model.head_block = 3  # 3 classes fill the block: the fourth grows the head to 6 rows
    workdir = str(tmp_path / "run")
    runner.run(c, workdir)
    assert update.update(workdir, second) == 0
    with open(os.path.join(workdir, "results.json")) as f:
        results = json.load(f)
    assert len(results["per_session"]) == 2
    matrix = results["compatibility_recall1"]
    # row i: the queries of model i on the rows up to session i (upper triangle: not measured)
    assert matrix[0][0] is not None and matrix[1][0] is not None and matrix[1][1] is not None
