"""What a continual-learning method contributes to the shared session engine.

Every method trains its embedding with a classification loss L_c on a head
(``models.heads``: the cosine ``NormLayer`` or the fork's linear head reset every
session; ``official_head`` is the one the method's reference code uses).  A method
adds named loss terms, each declared with its default weight (``loss_terms``: the defaults of
``config.loss_weights``, which ``--config.loss_weights.<term>=`` overrides), says
whether the jitted step runs the frozen previous model, and composes host-side
policies (``methods.policies``): its data scope, replay memory, parameter
importance, batch composition and per-session constants, each of the Protocol of its kind
(``methods.seams``).  The engine calls them without branching on the method, so adding a
baseline touches no engine code.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

import jax

from cvs_jax.errors import ConfigError
from cvs_jax.methods.seams import (
    BatchPolicy,
    ConstantsPolicy,
    ImportancePolicy,
    MemoryPolicy,
    MixedBatches,
    NoImportance,
    NoMemory,
    ScopePolicy,
    SessionData,
    misfit,
)
from cvs_jax.models.heads import HEADS, Head


@dataclasses.dataclass(frozen=True)
class StepInputs:
    """Everything a method's loss terms may read inside the jitted step."""

    params: Mapping[str, Any]  # current parameters: "net", the head's arrays and any method extras
    new_emb: jax.Array  # [B, D] current model, train mode
    old_emb: jax.Array | None  # [B, D] frozen previous model, eval mode (None if unused)
    labels: jax.Array  # [B] protocol labels
    classifier: Head  # the run's head: ``classifier.logits(head, emb)`` are what its softmax sees
    head: Mapping[str, jax.Array]  # the current head's arrays
    old_head: Mapping[str, jax.Array]  # the previous session's head's arrays (frozen)
    consts: Mapping[str, jax.Array]  # per-session constants: valid_classes, old_classes, centers, ...


# A term function returns {name: scalar} for names the method declares in ``loss_terms``; each is
# weighted by ``config.loss_weights.<name>`` (default: the declared weight).
TermFn = Callable[[StepInputs], dict]


def no_extra_params(frozen_params: Mapping[str, Any], frozen_head: Mapping[str, Any]) -> dict:
    return {}


@dataclasses.dataclass(frozen=True)
class Method:
    name: str
    description: str = ""
    official_head: str = "cosine"  # the head of the method's reference code (one of models.heads.HEADS)
    scope: ScopePolicy = SessionData()  # which images a session trains on and adds to the gallery
    memory: MemoryPolicy = NoMemory()  # replay memory policy
    batches: BatchPolicy = MixedBatches()  # how replayed images enter the batches
    importance: ImportancePolicy = NoImportance()  # EWC/RWalk parameter importance
    constants: tuple[ConstantsPolicy, ...] = ()  # per-session constants for the step, e.g. (ClassCenters(...),)
    uses_old_model: bool = False  # run the frozen previous model in the step (sessions >= 1)
    # trainable extras made from the frozen previous parameters at each session (LwF's head copy);
    # they live for one session: the selected model keeps only "net" and the head's arrays.
    # (frozen previous parameters, their head's arrays) -> extras
    extra_params: Callable[[Mapping[str, Any], Mapping[str, Any]], dict] = no_extra_params
    extra_terms: TermFn | None = None  # added to L_c from session 2 on
    # the terms ``extra_terms`` may return, with their default weights: ``config.loss_weights`` is made
    # of these (``registry.default_loss_weights``), so a new term needs no edit anywhere else
    loss_terms: Mapping[str, float] = dataclasses.field(default_factory=dict)
    trains: bool = True  # False (``frozen``): each session keeps the model it starts from, no step runs
    # N members in one vmapped step (``config.population``): only where every per-session state of the
    # method (memory, centres, head copies) is a function of the member's own run; parameter importance
    # and uncertainty memory are not stacked over members
    population: bool = True
    # the simplex head writes class y on row K - 1 - y (d-Simplex-HOC's target transform); such a session 1
    # differs from another simplex method's, so it is not shared
    reverse_labels: bool = False
    # the config sections only this method reads (``config.cvs``), all of them acting from session 2 on:
    # a compare entry that overrides only these shares session 1 (``comparison.session_two_groups``)
    own_sections: tuple[str, ...] = ()

    def __post_init__(self):
        _check_loss_terms(self)
        if self.official_head not in HEADS:
            raise ValueError(f"official_head={self.official_head!r} is not one of {HEADS}")
        # a policy that does not fit its seam fails here, when the method is defined, not sessions later
        seams = [(self.scope, ScopePolicy), (self.memory, MemoryPolicy), (self.batches, BatchPolicy)]
        seams += [(self.importance, ImportancePolicy)] + [(c, ConstantsPolicy) for c in self.constants]
        for policy, kind in seams:
            why = misfit(policy, kind)
            if why:
                raise TypeError(f"method {self.name!r}: {why} (methods.seams)")

    def head_name(self, configured: str) -> str:
        """``model.head`` resolved: ``"official"`` is this method's reference head."""
        return self.official_head if configured == "official" else configured

    @property
    def uses_memory(self) -> bool:
        return self.memory.keeps_memory

    @property
    def shares_first_session(self) -> bool:
        """Whether another method's session-1 checkpoint can stand for this method's (``compare``, for
        runs with the same head): session 1 is plain L_c training, unless a policy keeps statistics of
        it (fork EWC/RWalk), the method does not train, or its head's rows are ordered its own way
        (``reverse_labels``)."""
        return self.trains and self.importance.shares_first_session and not self.reverse_labels


def _check_loss_terms(method: Method) -> None:
    """A term must have a default weight: refused here, when the method is defined, not when session 2
    compiles after session 1 has trained."""
    if method.extra_terms is not None and not method.loss_terms:
        raise ConfigError(
            f"method {method.name!r} adds loss terms (extra_terms) but declares none: pass "
            "loss_terms={'<term>': <default weight>} naming every term extra_terms returns."
        )
    for term, weight in method.loss_terms.items():
        if term == "L_c":
            raise ConfigError(f"method {method.name!r}: L_c is the head's loss, weight 1; name the term otherwise.")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise ConfigError(
                f"method {method.name!r}: loss term {term!r} has no default weight ({weight!r}); declare "
                f"loss_terms={{{term!r}: <a finite number, e.g. 1.0>}}."
            )
