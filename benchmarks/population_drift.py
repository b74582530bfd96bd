"""How far a population member drifts from its separate run, and why: the numbers behind tests/runs/test_population.py.

Trains a 2-member population (``population=2``, seeds s and s+1 on the plan of s) and the two separate
runs, then prints the largest relative difference of any float in metrics.jsonl (losses, grad norm) and
every recall that differs (per-epoch validation/test recalls, results.json).  The setup is the tiny CVS
test setup (cvs_jax/testing/tiny_data.py: width-4 ResNet, 8-d embedding, batch 16) at ``--lr`` (0.03, the
recipe's: chaotic; 0.003, the test's: not), or with ``--smoke`` the real Fashion-MNIST ``:smoke`` run
(configs/fashion_mnist_general.py:smoke, cvs, lr 0.03; needs /usr/share/datasets/fashion-mnist).

``--trace`` records every step (cvs_jax/testing/step_trace.py) and prints, per member and session, the
first input in which it differs from its separate run (batch rows, augmentation key, lr, constants) and
how the difference grows: the loss's and the state's (params + batch statistics) relative difference.
``--float64`` runs the whole training program in float64, a measurement only (``promote_to_float64``):
if the member/separate differences are the float code's, they shrink to ~1e-15 and the results match.

    python benchmarks/population_drift.py --lr 0.003 --seeds 0,1 [--epochs 2 --sessions 2]
    python benchmarks/population_drift.py --smoke --seeds 0 --trace [--float64]

Set ``XLA_FLAGS=--xla_backend_optimization_level=0`` to see the same runs under other float code.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import pathlib
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from cvs_jax.config import fashion_mnist_general  # noqa: E402
from cvs_jax.engine import runner, train_loop  # noqa: E402
from cvs_jax.testing import methods_runs as mr  # noqa: E402
from cvs_jax.testing import step_trace  # noqa: E402
from cvs_jax.testing.tiny_data import tiny_config, write_fashion_idx  # noqa: E402


def promote_to_float64() -> None:
    """Every float of the training program in float64, for this process (a measurement, not a mode of
    the package): x64 on, ``jnp.float32`` read as float64 by the code that names it at run time
    (augmentation, lr, losses, the pooling cast), and each session's starting state cast to float64
    (parameters are initialised in float32).  Runs pass ``model.dtype=float64``."""
    jax.config.update("jax_enable_x64", True)
    jnp.float32 = jnp.float64  # type: ignore[misc]
    initial = train_loop.initial_train_state

    def up(tree):
        return jax.tree.map(lambda x: x.astype(jnp.float64) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)

    def initial64(ctx, state, s):
        ts = initial(ctx, state, s)
        params = up(ts.params)
        return dataclasses.replace(
            ts, params=params, batch_stats=up(ts.batch_stats), opt_state=ctx.tx.init(params), tracked=up(ts.tracked)
        )

    train_loop.initial_train_state = initial64


def _config(args, root: str, member_seed: int, seed: int, population: int = 1):
    if args.smoke:
        c = fashion_mnist_general.get_config("smoke")
        c.method = "cvs"
    else:
        manual = write_fashion_idx(os.path.join(root, "idx"), train_per_class=40, test_per_class=6)
        c = tiny_config(manual, pathlib.Path(root), method="cvs", sessions=args.sessions)
        c.data.samples_per_new_class, c.memory.budget, c.train.checkpoint_every_steps = 30, 20, 3
        c.train.epochs, c.train.lr = args.epochs, args.lr
    c.seed, c.split_seed, c.population = member_seed, seed, population
    if args.float64:
        c.model.dtype = "float64"
    return c


def drift(args, seed: int, root: str) -> dict:
    with contextlib.redirect_stdout(io.StringIO()), step_trace.recording(keep_state=args.trace) as fed:
        runner.run(_config(args, root, seed, seed, population=2), os.path.join(root, "pop"))
    worst, flips, traces = 0.0, [], []
    for m in range(2):
        with contextlib.redirect_stdout(io.StringIO()), step_trace.recording(keep_state=args.trace) as separate:
            runner.run(_config(args, root, seed + m, seed), os.path.join(root, f"separate{m}"))
        if args.trace:
            traces += _trace_lines(m, {k[1]: v for k, v in fed.items() if k[0] == seed + m}, separate)
        member = mr.outcome(os.path.join(root, "pop", f"member{m}"))
        sep = mr.outcome(os.path.join(root, f"separate{m}"))
        for a, b in zip(member[1], sep[1]):
            for k, v in a.items():
                if k.startswith("test_") or k == "val_recall1":
                    if v != b[k]:
                        flips.append(f"member {m} session {a.get('session')} epoch {a.get('epoch')} {k}: {v} vs {b[k]}")
                elif isinstance(v, float) and k not in ("lr", "images_per_s"):
                    worst = max(worst, abs(v - b[k]) / max(abs(b[k]), 1e-12))
        for a, b in zip(member[0]["per_session"], sep[0]["per_session"]):
            if (a["recall"], a["best_epoch"]) != (b["recall"], b["best_epoch"]):
                flips.append(f"member {m} results session {a['session']}: {a['recall']} vs {b['recall']}")
    return {
        "setup": "smoke" if args.smoke else f"tiny lr={args.lr} epochs={args.epochs} sessions={args.sessions}",
        "float64": args.float64,
        "seed": seed,
        "worst_rel": worst,
        "recall_flips": flips,
        "trace": traces,
    }


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-30)


def _trace_lines(m: int, member: dict, separate: dict) -> list[str]:
    """Per session: the first input that differs, then the loss's and the state's relative difference at
    steps 0, 1, 2, 4, 8, ... and the last."""
    lines = []
    for (_, s), sep in sorted(separate.items()):
        mem = member[s]
        differs = step_trace.first_difference(mem, sep, exact_rows=True)
        inputs = "equal" if differs is None else f"differ at {differs}"
        states = [_state_rel(a, b) for a, b in zip(mem, sep)]
        losses = [_rel(a.loss, b.loss) for a, b in zip(mem, sep)]
        lines.append(
            f"member {m} session {s + 1}: {len(mem)} steps, inputs {inputs}; largest relative difference of a "
            f"step's loss {max(losses):.1e}, of the state before a step {max(states):.1e}"
        )
        for t in sorted({0, len(mem) - 1} | {2**i for i in range(12) if 2**i < len(mem)}):
            a, b = mem[t], sep[t]
            lines.append(
                f"  step {t:3d}: loss {a.loss:.8g} vs {b.loss:.8g} (rel {losses[t]:.1e}), grad norm rel "
                f"{_rel(a.grad_norm, b.grad_norm):.1e}, state before the step rel {states[t]:.1e}"
            )
    return lines


def _state_rel(a: step_trace.Step, b: step_trace.Step) -> float:
    """Largest difference of the states (params + batch statistics) before the step, over their largest value."""
    if a.state is None or b.state is None:
        return float("nan")
    return float(np.max(np.abs(a.state - b.state)) / np.max(np.abs(b.state)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lr", type=float, default=0.003)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--sessions", type=int, default=2)
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--smoke", action="store_true", help="the real Fashion-MNIST :smoke run instead of the tiny setup")
    p.add_argument("--trace", action="store_true", help="compare every step's inputs and outputs")
    p.add_argument("--float64", action="store_true", help="the whole training program in float64 (measurement only)")
    args = p.parse_args()
    if args.float64:
        promote_to_float64()
    rows = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        with tempfile.TemporaryDirectory() as root:
            rows.append(drift(args, seed, root))
        r = rows[-1]
        print(
            f"{r['setup']} float64={r['float64']} seed={r['seed']}: largest relative difference "
            f"{r['worst_rel']:.2e}, recalls differing: {len(r['recall_flips'])}",
            flush=True,
        )
        for line in r["recall_flips"] + r["trace"]:
            print("   ", line)
    print(json.dumps([{k: v for k, v in r.items() if k != "trace"} for r in rows]))


if __name__ == "__main__":
    main()
