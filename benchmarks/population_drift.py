"""How far a population member drifts from its separate run: the numbers behind tests/runs/test_population.py.

Trains the tiny CVS test setup (cvs_jax/testing/tiny_data.py: width-4 ResNet, 8-d embedding, batch 16) as a
2-member population (``population=2``, seeds s and s+1 on the plan of s) and as the two separate runs,
then prints the largest relative difference of any float in metrics.jsonl (losses, grad norm) and
every recall that differs (per-epoch validation/test recalls, results.json).  The vmapped program's
float code differs from a single run's in the last bits; whether training amplifies that is what this
measures (``--lr 0.03``, the recipe's: chaotic; ``--lr 0.003``, the test's: not).

    python benchmarks/population_drift.py --lr 0.003 --seeds 0,1 [--epochs 2 --sessions 2]

Set ``XLA_FLAGS=--xla_backend_optimization_level=0`` to see the same runs under other float code.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import pathlib
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cvs_jax.engine import runner  # noqa: E402
from cvs_jax.testing import methods_runs as mr  # noqa: E402
from cvs_jax.testing.tiny_data import tiny_config, write_fashion_idx  # noqa: E402


def drift(lr: float, epochs: int, sessions: int, seed: int, root: str) -> dict:
    manual = write_fashion_idx(os.path.join(root, "idx"), train_per_class=40, test_per_class=6)

    def config(member_seed: int, population: int = 1):
        c = tiny_config(manual, pathlib.Path(root), method="cvs", sessions=sessions)
        c.data.samples_per_new_class, c.memory.budget, c.train.checkpoint_every_steps = 30, 20, 3
        c.train.epochs, c.train.lr, c.seed, c.split_seed, c.population = epochs, lr, member_seed, seed, population
        return c

    with contextlib.redirect_stdout(io.StringIO()):
        runner.run(config(seed, population=2), os.path.join(root, "pop"))
        for m in range(2):
            runner.run(config(seed + m), os.path.join(root, f"separate{m}"))
    worst, flips = 0.0, []
    for m in range(2):
        member = mr.outcome(os.path.join(root, "pop", f"member{m}"))
        separate = mr.outcome(os.path.join(root, f"separate{m}"))
        for a, b in zip(member[1], separate[1]):
            for k, v in a.items():
                if k.startswith("test_") or k == "val_recall1":
                    if v != b[k]:
                        flips.append(f"member {m} session {a.get('session')} epoch {a.get('epoch')} {k}: {v} vs {b[k]}")
                elif isinstance(v, float) and k != "lr":
                    worst = max(worst, abs(v - b[k]) / max(abs(b[k]), 1e-12))
        for a, b in zip(member[0]["per_session"], separate[0]["per_session"]):
            if (a["recall"], a["best_epoch"]) != (b["recall"], b["best_epoch"]):
                flips.append(f"member {m} results session {a['session'] + 1}: {a['recall']} vs {b['recall']}")
    return {"lr": lr, "epochs": epochs, "sessions": sessions, "seed": seed, "worst_rel": worst, "recall_flips": flips}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lr", type=float, default=0.003)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--sessions", type=int, default=2)
    p.add_argument("--seeds", default="0,1")
    args = p.parse_args()
    rows = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        with tempfile.TemporaryDirectory() as root:
            rows.append(drift(args.lr, args.epochs, args.sessions, seed, root))
        r = rows[-1]
        print(
            f"lr={r['lr']} epochs={r['epochs']} sessions={r['sessions']} seed={r['seed']}: largest relative "
            f"difference {r['worst_rel']:.2e}, recalls differing: {len(r['recall_flips'])}",
            flush=True,
        )
        for f in r["recall_flips"]:
            print("   ", f)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
