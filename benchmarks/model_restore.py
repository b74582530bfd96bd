"""What restoring each earlier session's model costs: the end of every session (``main``, each ``update``, a
server's session from adds) restores the model of every earlier session to score it on the stored parts (the
compatibility matrix), so a run of T sessions restores T models per session.

Times ``run_state.restore_variables`` (the head's stored rows, then the checkpoint) over every session checkpoint
of a run, two ways in the same process, interleaved: as now (the tree metadata read once per checkpoint and kept
while its file is unchanged; host arrays given to orbax as the arrays to fill) and as before (the metadata read by
``stored_shape``, again by the structure check and a third time by orbax, looking for a sharding of each
``jax.ShapeDtypeStruct``). The two must restore the same bytes, which the script checks.

    python benchmarks/model_restore.py                    # synthetic: 20 checkpoints of a photo model's tree
    python benchmarks/model_restore.py --workdir W        # every session checkpoint of the run in W

The synthetic tree is what a ``:cpu_pretrained`` session checkpoint stores (EfficientNet-Lite0's 49 batch-norm
mean/var pairs, the 1280 x 128 embedding and a 64-row head; the frozen trunk's weights are not stored).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from unittest import mock

import _common  # noqa: F401  (the repository on sys.path)
import jax
import numpy as np
import orbax.checkpoint as ocp

from cvs_jax.engine.run_state import restore_variables
from cvs_jax.rundir import checkpoint
from cvs_jax.rundir.checkpoint import Checkpoints

LITE0_BN = [32, 32, 16] + [96, 96, 24, 144, 144, 24] + [144, 144, 40, 240, 240, 40] + [240, 240, 80] * 3
LITE0_BN += [480, 480, 112] * 3 + [672, 672, 192] + [1152, 1152, 192] * 3 + [1152, 1152, 320, 1280]


def photo_model(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    stats = {f"bn{i}": {"mean": rng.normal(size=c).astype(np.float32), "var": rng.random(c).astype(np.float32)}
             for i, c in enumerate(LITE0_BN)}  # fmt: skip
    embedding = {"kernel": rng.normal(size=(1280, 128)).astype(np.float32), "bias": np.zeros(128, np.float32)}
    params = {"head": rng.normal(size=(64, 128)).astype(np.float32), "net": {"embedding": embedding}}
    return {"params": params, "batch_stats": stats}


class _Forgetful(dict):
    """A metadata memo that keeps nothing: every read goes to the files, as before the memo."""

    def __setitem__(self, key, value) -> None:
        pass


def restore_all(ck: Checkpoints, steps: list[int], template: dict, before: bool) -> tuple[float, list]:
    ck._metadata = _Forgetful() if before else {}  # each pass starts as a new process does
    target = ocp.utils.to_shape_dtype_struct if before else checkpoint._host_target
    with mock.patch.object(checkpoint, "_host_target", target):
        t0 = time.perf_counter()
        out = [restore_variables(ck, s, template) for s in steps]
        return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", help="a run's workdir (default: synthetic checkpoints)")
    ap.add_argument("--sessions", type=int, default=20, help="synthetic checkpoints")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.workdir:
            ck = Checkpoints(os.path.join(args.workdir, "checkpoints", "sessions"), max_to_keep=None)
        else:
            ck = Checkpoints(os.path.join(tmp, "sessions"), max_to_keep=None)
            for s in range(args.sessions):
                ck.save(s, {"variables": photo_model(s)}, {"session": s})
        steps = ck.steps()
        template = ck.restore(steps[-1], {"variables": None})["variables"]
        leaves = jax.tree.leaves(template)
        print(
            f"{len(steps)} checkpoints; a model of {len(leaves)} arrays, {sum(x.nbytes for x in leaves) / 1e6:.2f} MB"
        )
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.rounds):
            for before in (True, False):
                seconds, out = restore_all(ck, steps, template, before)
                times[before].append(seconds)
                digest = [[np.asarray(x).tobytes() for x in jax.tree.leaves(v)] for v in out]
                if before:
                    reference = digest
                assert digest == reference, "the two ways restored different bytes"
        ck.close()
    old, new = min(times[True]) / len(steps), min(times[False]) / len(steps)
    print("| restore_variables | ms per model (best of rounds) |\n|---|---|")
    print(f"| before (metadata read 3 times) | {1e3 * old:.1f} |\n| now (read once) | {1e3 * new:.1f} |")
    print(f"before / now: {old / new:.2f}x; same bytes restored")


if __name__ == "__main__":
    main()
