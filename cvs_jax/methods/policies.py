"""Host-side policies that methods compose; the engine calls them without knowing the method.

* data scope: which images a session trains on and adds to the gallery;
* replay memory: what is kept of earlier sessions (herding, reservoir, uncertainty);
* parameter importance: the EWC/RWalk penalty's importance and anchor;
* batch composition: one shuffled stream, or Rainbow's half-memory batches;
* per-session constants: values the jitted step reads (the stored gallery's class centres).

Each ``update`` runs at the start of session ``s`` with the selected model of session
``s - 1`` (``variables``) and is a pure function of the completed sessions, so a resumed
run and a run that shares session 1 with another method compute the same values.
The Protocol each kind implements, its default (``SessionData``, ``NoMemory``, ``MixedBatches``, with
``ShuffledEpochs``), and the ``view`` (``seams.PolicyView``) they read the run through, are in
``methods.seams``; the memory budget is given when a policy is built.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from cvs_jax.augment import transforms as augment
from cvs_jax.data.chunks import iter_chunks
from cvs_jax.errors import ConfigError
from cvs_jax.methods import losses, replay
from cvs_jax.methods.seams import ImportanceState as ImportanceState
from cvs_jax.methods.seams import MixedBatches as MixedBatches
from cvs_jax.methods.seams import NoMemory as NoMemory
from cvs_jax.methods.seams import PolicyView
from cvs_jax.methods.seams import ReplayMemory as ReplayMemory
from cvs_jax.methods.seams import SessionData as SessionData
from cvs_jax.methods.seams import ShuffledEpochs as ShuffledEpochs
from cvs_jax.methods.seams import epoch_order as epoch_order
from cvs_jax.models.heads import head_params, net_variables
from cvs_jax.rundir.gallery import Gallery

# ------------------------------------------------------------------ data scope


@dataclasses.dataclass(frozen=True)
class AllSeenData:
    """The ``joint`` upper bound: train on all data seen so far and re-embed the whole gallery."""

    replaces_gallery = True

    def indices(self, plan, s: int) -> np.ndarray:
        return plan.joint_train(s)

    def stored(self, gallery: Gallery) -> Gallery:
        return Gallery.empty(gallery.embed_dim)


# ------------------------------------------------------------------ replay memory


def _pool(view: PolicyView, mem: ReplayMemory, s: int) -> np.ndarray:
    """The previous session's images followed by the current memory (the official pool order)."""
    return np.concatenate([view.plan.sessions[s - 1].train, mem.source_ids])


@dataclasses.dataclass(frozen=True)
class HerdingMemory:
    """iCaRL herding (official CVS): re-herd the pool per class on the selected model's embeddings."""

    budget: int  # memory.budget: images kept
    per_class: int = 0  # > 0: keep this many of every class seen instead (memory.rule=per_class), no budget

    keeps_memory = True

    def update(self, view: PolicyView, mem: ReplayMemory, variables, s: int) -> ReplayMemory:
        pool = _pool(view, mem, s)
        emb = view.embed(variables, view.train_images(pool))
        labels = view.train_labels[pool]
        budget = self.per_class * np.unique(labels).size if self.per_class else self.budget
        ids, labels = replay.rebuild_memory(emb, labels, pool, budget)
        seen = mem.seen + len(view.plan.sessions[s - 1].train)
        return ReplayMemory(np.asarray(ids, np.int64), np.asarray(labels, np.int32), s - 1, seen)


@dataclasses.dataclass(frozen=True)
class ReservoirMemory:
    """Reservoir sampling of the stream (the RWalk memory of the Rainbow-Memory code base)."""

    budget: int  # memory.budget: images kept

    keeps_memory = True

    def update(self, view: PolicyView, mem: ReplayMemory, variables, s: int) -> ReplayMemory:
        rng = np.random.default_rng([view.seed, s, 7])
        prev = view.plan.sessions[s - 1].train
        ids, seen = replay.reservoir_update(mem.source_ids, mem.seen, prev, self.budget, rng)
        ids = ids.astype(np.int64)
        return ReplayMemory(ids, view.train_labels[ids].astype(np.int32), s - 1, seen)


# Rainbow Memory (the author's Rainbow-Memory fork); config.rainbow picks the rules, defaults = the fork.
RAINBOW_PERTURBATIONS = 12  # the fork's uncert_metric "vr_randaug": 12 RandAugment draws
RAINBOW_PERTURBATION_KINDS = ("randaugment", "train_pipeline")
RAINBOW_SELECTIONS = replay.UNCERTAINTY_SELECTIONS  # ("stride", "spread")
RAINBOW_FIRST_SESSION = ("random", "uncertainty")
RAINBOW_MEMORY_BATCHES = ("cycle", "with_replacement")


def _check_choice(field: str, value, choices) -> None:
    if value not in choices:
        raise ConfigError(f"rainbow.{field}={value!r} is unknown; choose one of {list(choices)}.")


def perturb_images(pipeline, perturbation: str, key, images_u8):
    """One perturbation of a uint8 batch, as the model's input. ``"randaugment"`` (the fork): RandAugment,
    then the eval transform (``pipeline.eval``: normalise; centre crop for the fine-grained recipe).
    ``"train_pipeline"``: the training augmentation (crop / flip / ``augment.policy``)."""
    if perturbation == "randaugment":
        return pipeline.eval(augment.apply_policy(key, images_u8, "randaugment"))
    return pipeline.train(key, images_u8)


def _make_perturbed_predict(model, pipeline, perturbation: str, head):
    """Labels predicted by the model (with the head it trains with) in eval mode on perturbed images
    (Rainbow Memory's votes)."""

    @jax.jit
    def predict(variables, images, key, valid_classes):
        x = perturb_images(pipeline, perturbation, key, images)
        emb = model.apply(net_variables(variables["params"], variables["batch_stats"]), x, train=False)
        logits = head.logits(head_params(head, variables["params"]), emb)
        return jnp.argmax(jnp.where(jnp.arange(logits.shape[1])[None] < valid_classes, logits, -jnp.inf), axis=1)

    return predict


def perturbation_key(seed: int, s: int, t: int, perturbation: str) -> jax.Array:
    """The key of perturbation ``t`` at the start of session ``s``: from (seed, session, t).
    ``"train_pipeline"`` keeps the earlier derivation ``key(seed + s)`` so that it reproduces earlier runs."""
    if perturbation == "train_pipeline":
        return jax.random.fold_in(jax.random.key(seed + s), t)
    return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), s), t)


@dataclasses.dataclass(frozen=True)
class UncertaintyMemory:
    """Rainbow Memory's memory over the candidates = the previous session's images + the memory.

    Defaults = the author's fork (``finetune.py update_memory / uncertainty_sampling / montecarlo /
    variance_ratio / equal_class_sampling``):

    * ``first_session="random"``: the memory after the first session is drawn at random, equal shares
      per class (``replay.random_class_rows``); ``"uncertainty"``: the uncertainty rule from the start.
    * ``perturbations`` / ``perturbation``: uncertainty = 1 - (votes of the most-voted class) / T over
      T = 12 RandAugment draws, each followed by the eval transform, model in eval mode
      (``"train_pipeline"``: the training augmentation instead).
    * ``selection="stride"``: per class, ascending uncertainty, every ``(len // quota)``-th, the first
      ``quota`` (``replay.stride_rows``); ``"spread"``: evenly spaced along the ranking.
    * ``refill``: slots left unused are refilled at random from the remaining candidates.

    With ``selection="stride"`` the candidates are in the fork's order, the previous session's images
    shuffled (its stream list is shuffled) then the memory, so uncertainty ties (frequent: T + 1 values)
    fall in a random order.  Randomness: ``np.random.default_rng([seed, s, 13])`` and JAX keys from
    (seed, s, t), so a resumed run rebuilds the same memory.
    """

    budget: int  # memory.budget: images kept
    perturbations: int = RAINBOW_PERTURBATIONS
    perturbation: str = "randaugment"
    selection: str = "stride"
    refill: bool = True
    first_session: str = "random"

    keeps_memory = True

    def __post_init__(self):
        _check_choice("perturbation", self.perturbation, RAINBOW_PERTURBATION_KINDS)
        _check_choice("selection", self.selection, RAINBOW_SELECTIONS)
        _check_choice("first_session", self.first_session, RAINBOW_FIRST_SESSION)
        if int(self.perturbations) < 1:
            raise ConfigError(f"rainbow.perturbations={self.perturbations} must be at least 1.")

    def candidates(self, view: PolicyView, mem: ReplayMemory, s: int, rng: np.random.Generator) -> np.ndarray:
        """Dataset indices of the candidates, in the fork's order (stride) or the earlier pool order."""
        prev = view.plan.sessions[s - 1].train
        if self.selection == "stride":
            prev = prev[rng.permutation(len(prev))]
        return np.concatenate([prev, mem.source_ids]).astype(np.int64)

    def uncertainty(self, view: PolicyView, variables, pool: np.ndarray, s: int) -> np.ndarray:
        images = view.train_images(pool)
        predict = view.compiled(
            f"perturbed_predict_{self.perturbation}",
            lambda model, pipeline, head: _make_perturbed_predict(model, pipeline, self.perturbation, head),
        )
        valid = jnp.int32(view.plan.sessions[s - 1].num_outputs)
        preds = np.zeros((self.perturbations, images.shape[0]), np.int64)
        for t in range(self.perturbations):
            key = perturbation_key(view.seed, s, t, self.perturbation)
            for start, chunk, n in iter_chunks(images, view.eval_batch_size):
                out = predict(variables, jnp.asarray(chunk), jax.random.fold_in(key, start), valid)
                preds[t, start : start + n] = np.asarray(out)[:n]
        return replay.prediction_uncertainty(preds)

    def update(self, view: PolicyView, mem: ReplayMemory, variables, s: int) -> ReplayMemory:
        rng = np.random.default_rng([view.seed, s, 13])
        pool = self.candidates(view, mem, s, rng)
        labels, budget = view.train_labels[pool], self.budget
        if s == 1 and self.first_session == "random":
            ids, labels = replay.random_class_select(labels, pool, budget, rng, refill=self.refill)
            how = "random, equal shares per class"
        else:
            unc = self.uncertainty(view, variables, pool, s)
            refill_rng = rng if self.refill else None
            ids, labels = replay.uncertainty_select(
                unc, labels, pool, budget, selection=self.selection, refill_rng=refill_rng
            )
            how = f"uncertainty over {self.perturbations} {self.perturbation} draws, {self.selection}"
        view.log(f"rainbow memory after session {s}: {len(ids)} of {len(pool)} candidates ({how})")
        seen = mem.seen + len(view.plan.sessions[s - 1].train)
        return ReplayMemory(np.asarray(ids, np.int64), np.asarray(labels, np.int32), s - 1, seen)


# ------------------------------------------------------------------ parameter importance
# (EWC / RWalk: NoImportance, OnlineFisher, ForkFisher live in importance_policies.py)


# ------------------------------------------------------------------ batch composition


@functools.lru_cache(maxsize=4)  # a batch spans at most a few passes; called every step
def memory_pass_order(seed: int, session: int, epoch: int, cycle: int, n: int) -> np.ndarray:
    """The memory order of pass ``cycle`` of an epoch: a pure function of (seed, session, epoch, cycle)."""
    return np.random.default_rng([seed, session, epoch, cycle, 2]).permutation(n)


def cycled_memory_rows(seed: int, session: int, epoch: int, start: int, count: int, n: int) -> np.ndarray:
    """Rows ``start .. start + count - 1`` of the epoch's memory sequence: pass 0 (a random order of the
    ``n`` items), then pass 1 (a new random order), ...; position p is item ``order(p // n)[p % n]``."""
    cycle, offset = np.divmod(np.arange(start, start + count), n)
    rows = np.empty(count, np.int64)
    for c in np.unique(cycle):
        at = cycle == c
        rows[at] = memory_pass_order(seed, session, epoch, int(c), n)[offset[at]]
    return rows


def half_memory_split(batch_size: int, memory_batches: str) -> tuple[int, int]:
    """(stream rows, memory rows) of a half-memory batch (:class:`HalfMemoryEpochs`)."""
    half = batch_size // 2
    return (batch_size - half, half) if memory_batches == "cycle" else (half, batch_size - half)


@dataclasses.dataclass(frozen=True)
class HalfMemoryEpochs:
    """Rainbow Memory: half of each batch from the session stream, half from the memory.

    ``memory_batches="cycle"`` (the fork, ``rainbow_memory.py``): ``batch_size // 2`` rows from a
    shuffled memory loader that cycles (every memory item once per pass, a new random order each pass),
    restarted at every epoch as the fork's ``zip(train_loader, cycle(memory_loader))``; the stream gives
    the other ``batch_size - batch_size // 2`` rows (its loader drops the last partial batch).
    ``"with_replacement"`` (earlier cvs-jax): ``batch_size - batch_size // 2`` memory rows drawn i.i.d.
    with replacement per step, the stream ``batch_size // 2``.  Either way ``batch(epoch, i)`` is a pure
    function of (seed, session, epoch, i), so a run resumes exactly from a step number.
    """

    indices: np.ndarray
    memory: np.ndarray
    batch_size: int
    seed: int
    session: int
    memory_batches: str = "cycle"

    def __post_init__(self):
        _check_choice("memory_batches", self.memory_batches, RAINBOW_MEMORY_BATCHES)

    @property
    def split(self) -> tuple[int, int]:
        return half_memory_split(self.batch_size, self.memory_batches)

    @property
    def steps_per_epoch(self) -> int:
        return len(self.indices) // self.split[0]

    def batch(self, epoch: int, i: int) -> np.ndarray:
        n_stream, n_mem = self.split
        order = epoch_order(self.seed, self.session, epoch, len(self.indices))
        stream = self.indices[order[i * n_stream : (i + 1) * n_stream]]
        if self.memory_batches == "cycle":
            rows = cycled_memory_rows(self.seed, self.session, epoch, i * n_mem, n_mem, len(self.memory))
        else:
            rows = np.random.default_rng([self.seed, self.session, epoch, i, 1]).integers(0, len(self.memory), n_mem)
        return np.concatenate([stream, self.memory[rows]])


@dataclasses.dataclass(frozen=True)
class HalfMemoryBatches:
    """Rainbow Memory's batches (:class:`HalfMemoryEpochs`, ``memory_batches`` = ``rainbow.memory_batches``);
    plain shuffling while the memory is empty (session 1), as the fork."""

    memory_batches: str = "cycle"

    def __post_init__(self):
        _check_choice("memory_batches", self.memory_batches, RAINBOW_MEMORY_BATCHES)

    def plan(self, indices, mem: ReplayMemory, *, batch_size: int, seed: int, session: int):
        if len(mem) == 0:
            return ShuffledEpochs(indices, batch_size, seed, session)
        return HalfMemoryEpochs(indices, mem.source_ids, batch_size, seed, session, self.memory_batches)


# ------------------------------------------------------------------ per-session constants


@dataclasses.dataclass(frozen=True)
class ClassCenters:
    """L_d's targets: per-class means of the L2-normalised stored gallery rows."""

    per_session_mean: bool

    def __call__(self, view: PolicyView, gallery: Gallery, s: int = 0) -> dict:
        centers, mask = losses.class_centers(
            gallery.embeddings,
            gallery.labels,
            view.num_classes,
            gallery_sessions=gallery.sessions,
            per_session_mean=self.per_session_mean,
        )
        return {"centers": jnp.asarray(centers), "center_mask": jnp.asarray(mask)}


BATCHES = ("mixed", "half")  # cvs.batches, rainbow.batches


def batch_policy(kind: str, memory_batches: str = "cycle"):
    """``"mixed"``: replayed images shuffled into the session's data (CVS, RWalk); ``"half"``: half of
    every batch from a cycling shuffled memory (Rainbow, the fork)."""
    return MixedBatches() if kind == "mixed" else HalfMemoryBatches(memory_batches)
