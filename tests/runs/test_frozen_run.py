"""A whole run of the frozen method: every compatibility metric at its no-change value."""

import os

import numpy as np


def test_frozen_method_trains_nothing_and_loses_nothing(fashion_idx, tmp_path):
    """``frozen``: every session keeps the initial network, so each update flips no query and model i
    searches part j's rows exactly as part j's own model did (BC 0, NFR 0; AC 0: never strictly better)."""
    import jax

    from cvs_jax.engine import runner
    from cvs_jax.rundir.checkpoint import Checkpoints
    from cvs_jax.testing.tiny_data import tiny_config

    manual = fashion_idx(60, 10)
    c = tiny_config(manual, tmp_path, sessions=2)
    c.method = "frozen"
    wd = str(tmp_path / "frozen")
    res = runner.run(c, wd)
    m = res["compatibility_recall1"]
    assert m[1][0] == m[0][0] and res["compatibility_bc_points"] == 0.0
    assert res["negative_flip_rate"] == [0.0] and res["compatibility_ac"] == 0.0
    ck = Checkpoints(os.path.join(wd, "checkpoints", "sessions"), max_to_keep=None)
    nets = [ck.restore(s, {"variables": None})["variables"]["params"]["net"] for s in (0, 1)]
    jax.tree.map(np.testing.assert_array_equal, nets[0], nets[1])
