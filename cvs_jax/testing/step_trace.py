"""What each training step is fed and what it returns, recorded per (seed, session): a spy on the loop's drivers.

While ``recording()`` is open, both drivers of ``train_loop.run_loop`` (``train_loop.SingleDriver``, a
plain run; ``population.PopulationDriver``, a population's members) append one ``Step`` per training step
to their run's list, keyed by (seed, session index).  A population member and its separate run then
compare step by step: the same inputs exactly (batch rows, augmentation key, lr, session constants,
starting state) and outputs within float tolerance (tests/runs/test_population.py,
benchmarks/population_drift.py ``--trace``).  The recording reads each call's inputs to the host before
the call (the step donates its state) and its metrics after: the steps compute what they would unrecorded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
from typing import Iterator
from unittest import mock

import jax
import numpy as np

from cvs_jax.engine import population, train_loop


@dataclasses.dataclass(frozen=True)
class Step:
    step: int  # within the session
    lr: float
    key: str  # digest of the session's augmentation key (the step folds its index in)
    labels: np.ndarray  # the batch's labels, in row order
    images: str  # digest of the batch's images (before augmentation)
    consts: str  # digest of the session constants
    frozen: str  # digest of the frozen previous model ("" in session 1)
    state: np.ndarray | None  # params + batch statistics before the step, flat float64 (the call's first step only)
    loss: float
    grad_norm: float


def digest(tree) -> str:
    h = hashlib.sha1()
    for leaf in jax.tree.leaves(tree):
        h.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
    return h.hexdigest()


def flat(tree) -> np.ndarray:
    return np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(tree)])


def _recorder(original, steps: dict, keep_state: bool):
    def call(driver, ts, batch, lr, n):
        pop = isinstance(driver, population.PopulationDriver)
        host = jax.device_get({"batch": batch, "ts": ts})
        new_ts, metrics = original(driver, ts, batch, lr, n)
        out = jax.device_get({k: metrics[k] for k in ("loss", "grad_norm")})
        for i, member in enumerate(driver.members):
            ts_i = driver.member(host["ts"], i)
            b = jax.tree.map(lambda x: x[i], host["batch"]) if pop else host["batch"]
            met = jax.tree.map(lambda x: np.reshape(x[i] if pop else x, (-1,)), out)
            if not driver.stacked:  # one unstacked step: the steps axis of a call of one
                b = jax.tree.map(lambda x: x[None], b)
            key = driver.keys[i] if pop else driver.key
            key = digest(jax.random.key_data(key))
            consts = digest(driver.member(driver.consts, i))
            frozen = "" if driver.frozen is None else digest(driver.member(driver.frozen, i))
            run = steps.setdefault((int(member.ctx.config.seed), member.view.s), [])
            for j in range(n):
                state = flat({"p": ts_i.params, "b": ts_i.batch_stats}) if keep_state and j == 0 else None
                run.append(
                    Step(
                        step=int(ts_i.step) + j,
                        labels=np.asarray(b["labels"][j]),
                        images=digest(b["images"][j]),
                        state=state,
                        loss=float(met["loss"][j]),
                        grad_norm=float(met["grad_norm"][j]),
                        lr=float(lr),
                        key=key,
                        consts=consts,
                        frozen=frozen,
                    )
                )
        return new_ts, metrics

    return call


@contextlib.contextmanager
def recording(keep_state: bool = False) -> Iterator[dict[tuple[int, int], list[Step]]]:
    """``{(seed, session): [Step, ...]}``, filled as runs train inside the block (one process's runs)."""
    steps: dict[tuple[int, int], list[Step]] = {}
    with (
        mock.patch.object(train_loop.SingleDriver, "call", _recorder(train_loop.SingleDriver.call, steps, keep_state)),
        mock.patch.object(
            population.PopulationDriver, "call", _recorder(population.PopulationDriver.call, steps, keep_state)
        ),
    ):
        yield steps


def first_difference(member: list[Step], separate: list[Step], *, exact_rows: bool) -> str | None:
    """The first input in which ``member``'s steps differ from ``separate``'s (None: none): the step, lr,
    key and labels always; with ``exact_rows`` also the images and constants (after a session trained
    in float32, the next one's replay rows and constants come from a model that drifted in the last bits)."""
    if len(member) != len(separate):
        return f"{len(member)} steps against {len(separate)}"
    for a, b in zip(member, separate):
        fields = ["step", "lr", "key"] + (["images", "consts"] if exact_rows else [])
        for f in fields:
            if getattr(a, f) != getattr(b, f):
                return f"step {a.step}: {f}"
        if not np.array_equal(a.labels, b.labels):
            return f"step {a.step}: labels"
    return None
