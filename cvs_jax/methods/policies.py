"""Host-side policies that methods compose; the engine calls them without knowing the method.

* data scope: which images a session trains on and adds to the gallery;
* replay memory: what is kept of earlier sessions (herding, reservoir, uncertainty);
* parameter importance: the EWC/RWalk penalty's importance and anchor;
* batch composition: one shuffled stream, or Rainbow's half-memory batches;
* per-session constants: values the jitted step reads (the stored gallery's class centres).

Each ``update`` runs at the start of session ``s`` with the selected model of session
``s - 1`` (``variables``) and is a pure function of the completed sessions, so a resumed
run and a run that shares session 1 with another method compute the same values.
``ctx`` is the run's ``context.RunContext`` (config, protocol, model, embedder, log).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from cvs_jax import importance, losses, memory
from cvs_jax.chunks import iter_chunks
from cvs_jax.gallery import Gallery
from cvs_jax.models import net_variables

# ------------------------------------------------------------------ data scope


@dataclasses.dataclass(frozen=True)
class SessionData:
    """Train on the session's own images; append their rows to the never-re-extracted gallery."""

    replaces_gallery = False

    def indices(self, plan, s: int) -> np.ndarray:
        return plan.sessions[s].train

    def stored(self, gallery: Gallery) -> Gallery:
        return gallery


@dataclasses.dataclass(frozen=True)
class AllSeenData:
    """The ``joint`` upper bound: train on all data seen so far and re-embed the whole gallery."""

    replaces_gallery = True

    def indices(self, plan, s: int) -> np.ndarray:
        return plan.joint_train(s)

    def stored(self, gallery: Gallery) -> Gallery:
        return Gallery.empty(gallery.embed_dim)


# ------------------------------------------------------------------ replay memory


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
class NoMemory:
    keeps_memory = False

    def update(self, ctx, mem: ReplayMemory, variables, s: int) -> ReplayMemory:
        return mem


def _pool(ctx, mem: ReplayMemory, s: int) -> np.ndarray:
    """The previous session's images followed by the current memory (the official pool order)."""
    return np.concatenate([ctx.proto.plan.sessions[s - 1].train, mem.source_ids])


@dataclasses.dataclass(frozen=True)
class HerdingMemory:
    """iCaRL herding (official CVS): re-herd the pool per class on the selected model's embeddings."""

    keeps_memory = True

    def update(self, ctx, mem: ReplayMemory, variables, s: int) -> ReplayMemory:
        pool = _pool(ctx, mem, s)
        emb = ctx.embed(variables, ctx.proto.train_images(pool))
        ids, labels = memory.rebuild_memory(emb, ctx.proto.train_labels[pool], pool, ctx.config.memory.budget)
        seen = mem.seen + len(ctx.proto.plan.sessions[s - 1].train)
        return ReplayMemory(np.asarray(ids, np.int64), np.asarray(labels, np.int32), s - 1, seen)


@dataclasses.dataclass(frozen=True)
class ReservoirMemory:
    """Reservoir sampling of the stream (the RWalk memory of the Rainbow-Memory code base)."""

    keeps_memory = True

    def update(self, ctx, mem: ReplayMemory, variables, s: int) -> ReplayMemory:
        rng = np.random.default_rng([ctx.config.seed, s, 7])
        prev = ctx.proto.plan.sessions[s - 1].train
        ids, seen = memory.reservoir_update(mem.source_ids, mem.seen, prev, ctx.config.memory.budget, rng)
        ids = ids.astype(np.int64)
        return ReplayMemory(ids, ctx.proto.train_labels[ids].astype(np.int32), s - 1, seen)


RAINBOW_PERTURBATIONS = 8


def _make_perturbed_predict(model, pipeline):
    """Labels predicted by a model on train-time perturbations of the images (Rainbow Memory)."""

    @jax.jit
    def predict(variables, images, key, valid_classes):
        x = pipeline.train(key, images)
        emb = model.apply(net_variables(variables["params"], variables["batch_stats"]), x, train=False)
        logits = losses.cosine_logits(emb, variables["params"]["head"])
        return jnp.argmax(jnp.where(jnp.arange(logits.shape[1])[None] < valid_classes, logits, -jnp.inf), axis=1)

    return predict


@dataclasses.dataclass(frozen=True)
class UncertaintyMemory:
    """Rainbow Memory: per class, candidates spread over their uncertainty under perturbations."""

    keeps_memory = True

    def update(self, ctx, mem: ReplayMemory, variables, s: int) -> ReplayMemory:
        pool = _pool(ctx, mem, s)
        images = ctx.proto.train_images(pool)
        predict = ctx.cached("perturbed_predict", lambda: _make_perturbed_predict(ctx.model, ctx.pipeline))
        valid = jnp.int32(ctx.proto.plan.sessions[s - 1].num_outputs)
        preds = np.zeros((RAINBOW_PERTURBATIONS, images.shape[0]), np.int64)
        for t in range(RAINBOW_PERTURBATIONS):
            key = jax.random.fold_in(jax.random.key(ctx.config.seed + s), t)
            for start, chunk, n in iter_chunks(images, ctx.config.train.eval_batch_size):
                out = predict(variables, jnp.asarray(chunk), jax.random.fold_in(key, start), valid)
                preds[t, start : start + n] = np.asarray(out)[:n]
        unc = memory.prediction_uncertainty(preds)
        ids, labels = memory.uncertainty_select(unc, ctx.proto.train_labels[pool], pool, ctx.config.memory.budget)
        seen = mem.seen + len(ctx.proto.plan.sessions[s - 1].train)
        return ReplayMemory(np.asarray(ids, np.int64), np.asarray(labels, np.int32), s - 1, seen)


# ------------------------------------------------------------------ parameter importance


@dataclasses.dataclass(frozen=True)
class ImportanceState:
    """EWC/RWalk: the raw importance carried across sessions and the anchor θ* of the penalty."""

    raw: dict | None = None
    anchor: dict | None = None
    built_after: int = -1

    def to_item(self) -> dict:
        return {} if self.raw is None else {"raw": self.raw, "anchor": self.anchor}

    @classmethod
    def from_item(cls, item: dict, built_after: int) -> "ImportanceState":
        if not item:
            return cls(built_after=built_after)
        return cls(item["raw"], item["anchor"], built_after)


@dataclasses.dataclass(frozen=True)
class NoImportance:
    def update(self, ctx, state: ImportanceState, variables, s: int) -> ImportanceState:
        return state

    def constants(self, ctx, state: ImportanceState) -> dict:
        return {}


@dataclasses.dataclass(frozen=True)
class FisherImportance:
    """``ewc``: online EWC (summed per-session Fisher); ``rwalk``: the EWC++ running Fisher.
    The penalty uses raw / max(raw) when ``importance.normalize``."""

    kind: str

    def update(self, ctx, state: ImportanceState, variables, s: int) -> ImportanceState:
        c = ctx.config
        prev = ctx.proto.plan.sessions[s - 1]
        grad_fn = ctx.cached(
            "fisher_grad",
            lambda: importance.make_batch_grad_fn(ctx.model, ctx.pipeline, temperature=c.train.temperature),
        )
        fisher = importance.session_fisher(
            self.kind,
            grad_fn,
            variables,
            ctx.proto.train_images(prev.train),
            ctx.proto.train_labels[prev.train],
            prev.num_outputs,
            c.train.batch_size,
            running=state.raw if self.kind == "rwalk" else None,
        )
        raw = importance.accumulate(self.kind, state.raw, fisher)
        ctx.log.print(
            f"importance ({self.kind}) after session {s}: {importance.describe(raw)}"
            + (", normalised to max 1" if c.importance.normalize else "")
        )
        return ImportanceState(raw, jax.device_get(variables["params"]["net"]), s - 1)

    def constants(self, ctx, state: ImportanceState) -> dict:
        if state.raw is None:
            return {}
        used = importance.for_penalty(state.raw, normalize=ctx.config.importance.normalize)
        return {"reg_importance": used, "reg_anchor": state.anchor}


# ------------------------------------------------------------------ batch composition


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
class HalfMemoryEpochs:
    """Rainbow Memory: half of each batch from the session stream, half drawn from the memory."""

    indices: np.ndarray
    memory: np.ndarray
    batch_size: int
    seed: int
    session: int

    @property
    def steps_per_epoch(self) -> int:
        return len(self.indices) // (self.batch_size // 2)

    def batch(self, epoch: int, i: int) -> np.ndarray:
        h = self.batch_size // 2
        order = epoch_order(self.seed, self.session, epoch, len(self.indices))
        stream = self.indices[order[i * h : (i + 1) * h]]
        rng = np.random.default_rng([self.seed, self.session, epoch, i, 1])
        return np.concatenate([stream, self.memory[rng.integers(0, len(self.memory), self.batch_size - h)]])


@dataclasses.dataclass(frozen=True)
class MixedBatches:
    """Replayed images join the session's images in one shuffled stream (iCaRL, reservoir)."""

    def plan(self, indices, mem: ReplayMemory, *, batch_size: int, seed: int, session: int):
        return ShuffledEpochs(np.concatenate([indices, mem.source_ids]), batch_size, seed, session)


@dataclasses.dataclass(frozen=True)
class HalfMemoryBatches:
    """Rainbow Memory's batches; plain shuffling while the memory is empty (session 1)."""

    def plan(self, indices, mem: ReplayMemory, *, batch_size: int, seed: int, session: int):
        if len(mem) == 0:
            return ShuffledEpochs(indices, batch_size, seed, session)
        return HalfMemoryEpochs(indices, mem.source_ids, batch_size, seed, session)


# ------------------------------------------------------------------ per-session constants


@dataclasses.dataclass(frozen=True)
class ClassCenters:
    """L_d's targets: per-class means of the L2-normalised stored gallery rows."""

    per_session_mean: bool

    def __call__(self, ctx, gallery: Gallery) -> dict:
        centers, mask = losses.class_centers(
            gallery.embeddings,
            gallery.labels,
            ctx.proto.num_classes,
            gallery_sessions=gallery.sessions,
            per_session_mean=self.per_session_mean,
        )
        return {"centers": jnp.asarray(centers), "center_mask": jnp.asarray(mask)}
