"""The seam between the session engine and a method's host-side policies: what crosses it, typed.

A ``base.Method`` holds one policy of each kind below; the engine calls them without knowing the
method.  To write a new policy, implement the Protocol of its kind: ``Method`` refuses an object that
does not fit (``misfit``: a missing member, or a method whose parameters differ).

* ``ScopePolicy``: which images a session trains on and adds to the gallery;
* ``MemoryPolicy``: what is kept of earlier sessions for replay (``ReplayMemory``);
* ``BatchPolicy``: how the session's images and the replayed ones make up the batches;
* ``ImportancePolicy``: the EWC/RWalk penalty's importance and anchors (``ImportanceState``);
* ``ConstantsPolicy``: per-session values the jitted step reads (e.g. L_d's class centres).

Policies read the run through a ``PolicyView``, the few things they need, never the engine's whole
run context; what a method's config fixes (the memory budget, the penalty's weight) they are given
when they are built.  This module holds the Protocols, each kind's default, the view and the two
states that cross the seam; it is apart from ``base.py`` because both ``base.py`` and the policy
modules import it.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Callable, Mapping, Protocol, runtime_checkable

import numpy as np

from cvs_jax.data.splits import SessionPlan
from cvs_jax.rundir.gallery import Gallery


@dataclasses.dataclass(frozen=True)
class PolicyView:
    """What a policy may read of the run: the plan and its labels, images, the embedder, the log, and
    the few run values a policy uses.  Built once per run by the engine (``RunContext.policy_view``)."""

    plan: SessionPlan  # sessions: .train indices, .num_outputs (classes seen so far)
    train_labels: np.ndarray  # protocol labels of the train split
    train_images: Callable[[np.ndarray], Any]  # dataset indices -> images, read chunk by chunk
    embed: Callable[[dict, Any], np.ndarray]  # (variables, images) -> embeddings [N, D], eval mode
    log: Callable[[str], None]  # a line in the run's log
    num_classes: int  # head rows (every class of the plan, rounded up to model.head_block)
    seed: int  # the run's seed: a policy's randomness derives from it and the session
    batch_size: int  # train.batch_size (Fisher passes)
    eval_batch_size: int  # train.eval_batch_size (inference passes)
    loss_weights: Mapping[str, float]  # config.loss_weights: the weights of the method's terms (EWC's Fisher pass)
    # compiled(name, build): build(model, pipeline, head) once per run, e.g. a jitted prediction
    compiled: Callable[[str, Callable[[Any, Any, Any], Any]], Any]


@dataclasses.dataclass(frozen=True)
class ReplayMemory:
    """Dataset indices and labels of the replayed images; ``built_after`` = the last session whose
    images the memory has seen (-1: none); ``seen`` = stream length (reservoir sampling)."""

    source_ids: np.ndarray
    labels: np.ndarray
    built_after: int = -1
    seen: int = 0

    @classmethod
    def empty(cls) -> "ReplayMemory":
        return cls(np.zeros((0,), np.int64), np.zeros((0,), np.int32))

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def to_meta(self) -> dict:
        return {
            "source_ids": self.source_ids.tolist(),
            "labels": self.labels.tolist(),
            "built_after": self.built_after,
            "seen": self.seen,
        }

    @classmethod
    def from_meta(cls, d: dict) -> "ReplayMemory":
        return cls(
            np.asarray(d["source_ids"], np.int64), np.asarray(d["labels"], np.int32), d["built_after"], d["seen"]
        )


@dataclasses.dataclass(frozen=True)
class ImportanceState:
    """The penalty's slots (``{"importance", "anchor"}`` each) and RWalk's running Fisher."""

    slots: tuple = ()
    running: dict | None = None
    built_after: int = -1  # the last session whose statistics the slots hold

    def to_item(self) -> dict:
        """The checkpoint item (orbax pytree; slots keyed by position)."""
        item = {}
        if self.slots:
            item["slots"] = {str(i): slot for i, slot in enumerate(self.slots)}
        if self.running is not None:
            item["running"] = self.running
        return item

    @classmethod
    def from_item(cls, item: dict, built_after: int) -> "ImportanceState":
        slots = item.get("slots") or {}
        return cls(tuple(slots[k] for k in sorted(slots, key=int)), item.get("running"), built_after)


@runtime_checkable
class ScopePolicy(Protocol):
    replaces_gallery: bool  # the session's rows replace the gallery (joint re-embeds everything)

    def indices(self, plan: SessionPlan, s: int) -> np.ndarray:
        """Dataset indices session ``s`` trains on and adds to the gallery."""
        ...

    def stored(self, gallery: Gallery) -> Gallery:
        """The stored rows that session searches besides its own."""
        ...


@runtime_checkable
class MemoryPolicy(Protocol):
    keeps_memory: bool

    def update(self, view: PolicyView, mem: ReplayMemory, variables: dict, s: int) -> ReplayMemory:
        """The memory at the start of session ``s``, from session ``s - 1``'s selected model."""
        ...


class SessionBatches(Protocol):
    """A session's batches: ``batch(epoch, i)`` is a pure function of (seed, session, epoch, i)."""

    @property
    def indices(self) -> np.ndarray: ...  # the session stream's dataset indices

    @property
    def steps_per_epoch(self) -> int: ...

    def batch(self, epoch: int, i: int) -> np.ndarray:
        """Dataset indices of step ``i`` of ``epoch``."""
        ...


@runtime_checkable
class BatchPolicy(Protocol):
    def plan(
        self, indices: np.ndarray, mem: ReplayMemory, *, batch_size: int, seed: int, session: int
    ) -> SessionBatches:
        """The batches of a session that trains on ``indices`` with the replay memory ``mem``."""
        ...


class TrainedSession(Protocol):
    """What ``ImportancePolicy.after_session`` reads of a finished session (``phases.Selection``)."""

    @property
    def last(self) -> dict | None: ...  # the last epoch's model (host)

    @property
    def tracked(self) -> dict | None: ...  # what the policy tracked over the steps, at the last step (host)


@runtime_checkable
class ImportancePolicy(Protocol):
    shares_first_session: bool  # False: session 1 carries the policy's statistics (fork EWC/RWalk)

    def update(self, view: PolicyView, state: ImportanceState, variables: dict, s: int) -> ImportanceState:
        """The state at the start of session ``s``, from session ``s - 1``'s selected model."""
        ...

    def after_session(
        self, view: PolicyView, state: ImportanceState, trained: TrainedSession, s: int
    ) -> ImportanceState:
        """The state after session ``s``'s training."""
        ...

    def constants(self, view: PolicyView, state: ImportanceState) -> dict:
        """The step's per-session constants of the penalty."""
        ...

    def tracked_init(self, state: ImportanceState, net_params: Any) -> Any:
        """What the step tracks from the session's first step (RWalk's running Fisher)."""
        ...

    def track(self, tracked: Any, net_grads: Any) -> Any:
        """``tracked`` after one step's gradients (inside the jitted step)."""
        ...


@runtime_checkable
class ConstantsPolicy(Protocol):
    def __call__(self, view: PolicyView, gallery: Gallery, s: int = 0) -> dict:
        """Per-session constants for the step of session ``s``, from the plan and the stored gallery."""
        ...


# ------------------------------------------------------------------ each kind's default: what a Method gets
# that does not set it (here, beside the Protocols, so that ``base.Method`` needs no policy module)


@dataclasses.dataclass(frozen=True)
class SessionData:
    """Train on the session's own images; append their rows to the never-re-extracted gallery."""

    replaces_gallery = False

    def indices(self, plan, s: int) -> np.ndarray:
        return plan.sessions[s].train

    def stored(self, gallery: Gallery) -> Gallery:
        return gallery


@dataclasses.dataclass(frozen=True)
class NoMemory:
    keeps_memory = False

    def update(self, view: PolicyView, mem: ReplayMemory, variables, s: int) -> ReplayMemory:
        return mem


@functools.lru_cache(maxsize=2)  # called every step; the permutation is drawn once per epoch
def epoch_order(seed: int, session: int, epoch: int, n: int) -> np.ndarray:
    """The sample order of an epoch, a pure function of (seed, session, epoch): resumable."""
    return np.random.default_rng([seed, session, epoch]).permutation(n)


@dataclasses.dataclass(frozen=True)
class ShuffledEpochs:
    """One stream (session images, then replayed ones) in a fresh order every epoch."""

    indices: np.ndarray
    batch_size: int
    seed: int
    session: int

    @property
    def steps_per_epoch(self) -> int:
        return len(self.indices) // self.batch_size

    def batch(self, epoch: int, i: int) -> np.ndarray:
        """Dataset indices of step i of an epoch: a pure function of (seed, session, epoch, i)."""
        order = epoch_order(self.seed, self.session, epoch, len(self.indices))
        return self.indices[order[i * self.batch_size : (i + 1) * self.batch_size]]


@dataclasses.dataclass(frozen=True)
class MixedBatches:
    """Replayed images join the session's images in one shuffled stream (iCaRL, reservoir)."""

    def plan(self, indices, mem: ReplayMemory, *, batch_size: int, seed: int, session: int):
        return ShuffledEpochs(np.concatenate([indices, mem.source_ids]), batch_size, seed, session)


@dataclasses.dataclass(frozen=True)
class NoImportance:
    shares_first_session = True

    def update(self, view: PolicyView, state: ImportanceState, variables, s: int) -> ImportanceState:
        return state

    def after_session(
        self, view: PolicyView, state: ImportanceState, trained: TrainedSession, s: int
    ) -> ImportanceState:
        return state

    def constants(self, view: PolicyView, state: ImportanceState) -> dict:
        return {}

    def tracked_init(self, state: ImportanceState, net_params) -> dict:
        return {}

    def track(self, tracked, net_grads):
        return tracked


def misfit(policy: Any, kind: type) -> str | None:
    """Why ``policy`` does not fit the Protocol ``kind``: a missing member, or a method whose parameters
    differ from the Protocol's (``isinstance`` alone sees only the names); None when it fits."""
    if not isinstance(policy, kind):
        return f"{policy!r} is not a {kind.__name__}: it lacks one of its members"
    for name, member in vars(kind).items():
        if callable(member) and (name == "__call__" or not name.startswith("_")):
            want, got = _parameters(member)[1:], _parameters(getattr(policy, name))  # less self
            if got != want:
                return (
                    f"{type(policy).__name__}.{name}({', '.join(got)}) is not {kind.__name__}.{name}({', '.join(want)})"
                )
    return None


def _parameters(fn: Callable) -> list[str]:
    return [("*" if p.kind is p.KEYWORD_ONLY else "") + p.name for p in inspect.signature(fn).parameters.values()]
