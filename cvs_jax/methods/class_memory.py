"""The replay memory of CL²R and d-Simplex-HOC: a fixed number of random images per class, kept once chosen.

Both use continuum's ``RehearsalMemory(memory_size = classes * 20, herding_method="random",
fixed_memory=True, nb_total_classes = classes)`` (NiccoBiondi/CompatibleLifelongRepresentation
``src/cl2r/main.py`` 82-86, ``config.yml`` 9: 20; miccunifi/iamcl2r ``params.py`` 37: 20).  In continuum
(Continvvm/continuum ``continuum/rehearsal/memory.py`` 77-84, 149-184; ``herding.py`` 6-29), after each
task ``add`` draws min(20, n) images of every class of the task at random without replacement, appends
them to the memory and keeps the first 20 rows of each class: a class already full keeps its images, a
class seen again with fewer than 20 (blurry sessions) is topped up.  The memory is ordered by class.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from cvs_jax.methods.seams import PolicyView, ReplayMemory

PER_CLASS = 20  # config.yml rehearsal


def add_per_class(memory_ids, memory_labels, new_ids, new_labels, per_class: int, rng: np.random.Generator):
    """``(ids, labels)`` after continuum's ``add``: random draws per class of the new images, appended,
    then the first ``per_class`` rows of each class, by class."""
    new_ids, new_labels = np.asarray(new_ids, np.int64), np.asarray(new_labels, np.int64)
    drawn = [
        rng.choice(np.flatnonzero(new_labels == c), size=min(per_class, int(np.sum(new_labels == c))), replace=False)
        for c in np.unique(new_labels)
    ]
    rows = np.concatenate(drawn) if drawn else np.zeros((0,), np.int64)
    ids = np.concatenate([np.asarray(memory_ids, np.int64), new_ids[rows]])
    labels = np.concatenate([np.asarray(memory_labels, np.int64), new_labels[rows]])
    keep = np.concatenate([np.flatnonzero(labels == c)[:per_class] for c in np.unique(labels)]) if labels.size else []
    keep = np.asarray(keep, np.int64)
    return ids[keep], labels[keep]


@dataclasses.dataclass(frozen=True)
class PerClassRandomMemory:
    """A ``seams.MemoryPolicy``: ``per_class`` random images of each class, chosen when the class is seen.

    ``budget`` > 0 (``memory.rule=budget``): CVS's count instead, ``budget // classes seen`` of each class,
    so the memory never exceeds ``budget``; a class's images beyond its shrinking quota are dropped (its
    first ones kept, as continuum keeps the first rows)."""

    per_class: int = PER_CLASS
    budget: int = 0

    keeps_memory = True

    def update(self, view: PolicyView, mem: ReplayMemory, variables, s: int) -> ReplayMemory:
        prev = view.plan.sessions[s - 1].train
        rng = np.random.default_rng([view.seed, s, 20])
        quota = self.per_class
        if self.budget:
            seen = np.union1d(mem.labels, view.train_labels[prev]).size
            quota = self.budget // max(seen, 1)
        ids, labels = add_per_class(mem.source_ids, mem.labels, prev, view.train_labels[prev], quota, rng)
        return ReplayMemory(ids, labels.astype(np.int32), s - 1, mem.seen + len(prev))


@dataclasses.dataclass(frozen=True)
class AllSeenMemory:
    """A ``seams.MemoryPolicy`` that replays every training image of the earlier sessions: with the
    session's own images (``policies.MixedBatches``) a session trains on all data seen so far, while its
    gallery part holds only its own rows (CoReS: ``src/cores/utils.py`` 173-178 train on the data of
    every step so far; the gallery is never re-extracted)."""

    keeps_memory = True

    def update(self, view: PolicyView, mem: ReplayMemory, variables, s: int) -> ReplayMemory:
        ids = view.plan.joint_train(s - 1)
        return ReplayMemory(ids, view.train_labels[ids].astype(np.int32), s - 1, len(ids))
