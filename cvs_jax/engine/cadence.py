"""When a training call ends an epoch, writes a mid-epoch checkpoint or prints a progress line; how the
session's steps are grouped into calls (``train.steps_per_call``) and read for them.

Calls (``train.steps_per_call = k``): from each epoch's first step on, k steps per call; the last call
of an epoch runs the steps left (``steps_per_epoch % k`` of them, one more compiled shape), so no call
crosses an epoch end and validation, model selection and the epoch's checkpoint see the same model as
with single steps.  Mid-epoch events (``checkpoint_every_steps``, ``log_every_steps``) happen after the
call that reaches or passes a multiple of their period: at the multiples themselves when k divides the
period, else at the next call boundary.  Every checkpoint is thus at a call boundary, and the calls of a
rerun start at the same boundaries, so a resumed run makes the same calls as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Events:
    epoch_end: bool  # validation, model selection, metrics line and a progress checkpoint
    checkpoint: bool  # a mid-epoch progress checkpoint (``train.checkpoint_every_steps``)
    log: bool  # a mid-epoch progress line with the ETA (``log_every_steps``)


@dataclasses.dataclass(frozen=True)
class Cadence:
    steps_per_epoch: int
    log_every: int = 0  # 0: never mid-epoch
    checkpoint_every: int = 0  # 0: at epoch ends only

    def between(self, start: int, stop: int) -> Events:
        """The events after a call that ran steps ``start + 1 .. stop`` (counts of steps done): an
        epoch end when ``stop`` ends one (a call never crosses one), a mid-epoch event when the call
        reached or passed a multiple of its period (never at an epoch end, which has its own line and
        checkpoint)."""
        end = stop % self.steps_per_epoch == 0

        def passed(every: int) -> bool:
            return not end and bool(every) and stop // every > start // every

        return Events(epoch_end=end, checkpoint=passed(self.checkpoint_every), log=passed(self.log_every))


def calls(start: int, total: int, steps_per_epoch: int, k: int) -> list[tuple[int, int]]:
    """``(first step, steps)`` of every call from step ``start`` to ``total``: k steps at a time from
    each epoch's start, the epoch's remaining steps in its last call."""
    out, step = [], int(start)
    while step < total:
        n = min(int(k), steps_per_epoch - step % steps_per_epoch, total - step)
        out.append((step, n))
        step += n
    return out


class CallReader:
    """``call index -> batch``: the batches a call trains on, read by ``readers`` (one
    ``prefetch.BatchReader`` per member, each ``step -> {"images", "labels"}``).  ``steps_axis``: the
    call's steps stacked on a leading axis ``[n, ...]``; ``members_axis``: the members' stacked before
    it ``[N, (n,) ...]``.  Picklable (no JAX object), so loader worker processes can run it."""

    def __init__(self, readers, calls_: list[tuple[int, int]], *, steps_axis: bool, members_axis: bool):
        self.readers, self.calls = list(readers), list(calls_)
        self.steps_axis, self.members_axis = bool(steps_axis), bool(members_axis)

    def __len__(self) -> int:
        return len(self.calls)

    def _member(self, reader, i: int) -> dict:
        first, n = self.calls[i]
        if not self.steps_axis:
            return reader(first)
        return _stack([reader(step) for step in range(first, first + n)])

    def __call__(self, i: int) -> dict:
        parts = [self._member(r, int(i)) for r in self.readers]
        return _stack(parts) if self.members_axis else parts[0]


def _stack(batches: list[dict]) -> dict:
    return {k: np.stack([b[k] for b in batches]) for k in batches[0]}
