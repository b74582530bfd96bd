"""Registry of methods: one place that maps ``config.method`` to its definition."""

from __future__ import annotations

import dataclasses
from typing import Callable

import ml_collections

from cvs_jax.errors import ConfigError
from cvs_jax.methods import memory_rules, policies
from cvs_jax.methods.base import Method, StepInputs
from cvs_jax.methods.baselines import make_bct, make_ewc, make_lwf, make_mmd, make_rainbow, make_rwalk
from cvs_jax.methods.cvs import make_cvs
from cvs_jax.methods.lce import make_lce
from cvs_jax.methods.ract import make_ract
from cvs_jax.methods.simplex import make_cl2r, make_cores, make_hoc
from cvs_jax.models.head_choice import make_head
from cvs_jax.models.heads import HEADS, Head

FINETUNE = Method(name="finetune", description="lower bound: L_c only, no replay, no re-extraction")
JOINT = Method(
    name="joint",
    scope=policies.AllSeenData(),
    description="upper bound: trains on all data seen so far (warm start) and re-embeds the gallery",
)
# the baseline every method must beat on photos: what the (pretrained) backbone and a fixed,
# seeded random projection to model.embed_dim give without any training; its gallery rows are all made
# by one model, so it never needs re-extraction and nothing is lost between sessions (BC 0, NFR 0).
FROZEN = Method(
    name="frozen",
    trains=False,
    population=False,
    description="baseline: the (pretrained) backbone and a fixed random projection, nothing trained",
)

METHODS: dict[str, Callable[[ml_collections.ConfigDict], Method]] = {
    "finetune": lambda config: FINETUNE,
    "joint": lambda config: JOINT,
    "frozen": lambda config: FROZEN,
    "cvs": make_cvs,
    "bct": make_bct,
    "lwf": make_lwf,
    "mmd": make_mmd,
    "ewc": make_ewc,
    "rwalk": make_rwalk,
    "rainbow": make_rainbow,
    "ract": make_ract,
    "lce": make_lce,
    "cl2r": make_cl2r,
    "hoc": make_hoc,
    "cores": make_cores,
}


_REGISTERED: dict[tuple[str, Callable], Method] = {}  # each method as first built, by name and factory


def _registered(name: str, make: Callable, config: ml_collections.ConfigDict) -> Method:
    """``make`` on the base config's sections, built once per process (per name and factory): what a
    method declares (its loss terms) is read at registration, not at every config build.  A factory that
    reads a field the defaults do not declare is refused in one line naming it."""
    key = (name, make)
    if key not in _REGISTERED:
        _REGISTERED[key] = _built(name, make, config)
    return _REGISTERED[key]


def _built(name: str, make: Callable, config: ml_collections.ConfigDict) -> Method:
    try:
        return make(config)
    except AttributeError as e:  # ConfigDict: a missing field
        field = str(e).strip("\"'")
        raise ConfigError(
            f"method {name!r}: {getattr(make, '__name__', 'its factory')} reads config field {field!r}, which "
            f"config/defaults.py does not declare; add it to a section there (docs/adding-a-method.md)."
        ) from None


def default_loss_weights(config: ml_collections.ConfigDict) -> dict[str, float]:
    """``config.loss_weights``' defaults: every registered method's terms with the weights it declares
    (``Method.loss_terms``), in registry order; each method is built once per process (``_registered``).
    ``config`` is the base config without ``loss_weights`` (a method's definition does not read the
    weights).  Two methods that give one term two defaults are refused: the config holds one weight per
    term."""
    weights: dict[str, float] = {}
    for name, make in METHODS.items():
        for term, weight in _registered(name, make, config).loss_terms.items():
            if weights.setdefault(term, weight) != weight:
                raise ConfigError(
                    f"loss term {term!r} has default weight {weights[term]} in one method and {weight} in "
                    f"method {name!r}; give the term one default, or name it differently."
                )
    return weights


def registered(config: ml_collections.ConfigDict) -> dict[str, Method]:
    """Every registered method as registration built it (``_registered``), in registry order."""
    return {name: _registered(name, make, config) for name, make in METHODS.items()}


def population_methods(config: ml_collections.ConfigDict) -> list[str]:
    """The methods that can run as a population (``Method.population``)."""
    return [name for name, make in METHODS.items() if make(config).population]


def get_method(config: ml_collections.ConfigDict) -> Method:
    if config.method not in METHODS:
        raise ConfigError(
            f"method={config.method!r} is unknown; choose one of {sorted(METHODS)} (e.g. --config.method=finetune)."
        )
    method = METHODS[config.method](config)
    memory = memory_rules.choose(config, method.memory, method.name)  # memory.rule: another method's memory
    return method if memory is method.memory else dataclasses.replace(method, memory=memory)


HEAD_CHOICES = ("official",) + HEADS  # config.model.head


def head_name(config: ml_collections.ConfigDict) -> str:
    """The head the run trains with: ``model.head``, where ``"official"`` is the method's reference head
    (cosine for the ivclab/CVS methods, linear_reset for the fork's EWC, RWalk and Rainbow, simplex for
    CL²R and d-Simplex-HOC)."""
    if config.model.head not in HEAD_CHOICES:
        raise ConfigError(
            f"model.head={config.model.head!r} is unknown; choose one of {list(HEAD_CHOICES)} "
            "('official': the method's reference head)."
        )
    return get_method(config).head_name(config.model.head)


def head_note(config: ml_collections.ConfigDict) -> str | None:
    """One ``note:`` line when a fixed-simplex method (CL²R, HOC, CoReS) trains with another head: the
    simplex is what makes those methods compatible, and the photo config's ``model.head=linear_reset``
    would otherwise swap it out without a word.  ``None`` for every other run."""
    method = get_method(config)
    head = method.head_name(config.model.head)
    if method.official_head != "simplex" or head == "simplex":
        return None
    return (
        f"note: {method.name} trains here with the {head} head (model.head={config.model.head}), not its own "
        "fixed d-simplex; for the simplex pass --config.model.head=official with model.head_block >= the "
        "classes the run will have and model.embed_dim >= model.head_block - 1 (docs/your-images.md)"
    )


def get_head(config: ml_collections.ConfigDict) -> Head:
    return make_head(head_name(config), config.train.temperature, reverse_labels=get_method(config).reverse_labels)


__all__ = [
    "HEAD_CHOICES",
    "METHODS",
    "Method",
    "StepInputs",
    "default_loss_weights",
    "get_head",
    "get_method",
    "head_name",
    "population_methods",
    "registered",
]
