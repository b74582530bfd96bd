"""Result directories as main and compare leave them (config.json, results.json, comparison.json), written
without training: what ``reproduce`` reads, for its report tests."""

import json
import os

from cvs_jax.config import cifar100_general
from cvs_jax.rundir import paths


def write_run_dir(run_dir, config, ar=None, seed=0, new_images=None):
    """A run directory as trainer.run leaves it: config.json, and results.json when ``ar`` (AR@K in %) is given
    (``new_images``: the training images each session brought, one session entry each)."""
    os.makedirs(run_dir, exist_ok=True)
    config.seed = seed
    with open(paths.config_file(run_dir), "w") as f:
        json.dump(config.to_dict(), f)
    if ar is not None:
        results = {
            "method": config.method,
            "dataset": config.data.name,
            "setup": config.data.setup,
            "seed": seed,
            "per_session": [{"session": 0, "recall": {k: v / 100 for k, v in ar.items()}}]
            if new_images is None
            else [
                {"session": s + 1, "recall": {k: v / 100 for k, v in ar.items()}, "new_images": n}
                for s, n in enumerate(new_images)
            ],
            "average_recall": {k: v / 100 for k, v in ar.items()},
        }
        with open(paths.results_file(run_dir), "w") as f:
            json.dump(results, f)


def fake_results(tmp_path):
    """A compare directory (CIFAR-100 general: cvs on two seeds, bct diverged) and a lone lc_lm run with 1 epoch."""
    top = tmp_path / "cmp"
    runs = []
    for seed, ar in ((0, {"1": 70.0, "2": 75.0, "4": 78.0}), (1, {"1": 72.0, "2": 76.0, "4": 79.0})):
        c = cifar100_general.get_config()
        write_run_dir(str(top / f"seed{seed}" / "cvs"), c, ar, seed)
        runs.append({"seed": seed, "method": "cvs", "workdir": f"seed{seed}/cvs", "status": "ok", "average_recall": ar})
    c = cifar100_general.get_config()
    c.method = "bct"
    write_run_dir(str(top / "seed0" / "bct"), c)
    runs.append(
        {
            "seed": 0,
            "method": "bct",
            "workdir": "seed0/bct",
            "status": "diverged",
            "message": "loss is NaN at session 3",
        }
    )
    with open(top / paths.COMPARISON, "w") as f:
        json.dump({"dataset": "cifar100", "setup": "general", "runs": runs}, f)
    c = cifar100_general.get_config("lc_lm")
    c.train.epochs = 1
    write_run_dir(str(tmp_path / "lone"), c, {"1": 60.0, "2": 65.0, "4": 70.0})
    return [str(top), str(tmp_path / "lone")]
