"""The typed seams between the engine and the methods' policies (``cvs_jax.methods.seams``): every
registered method, in each of its switches, holds policies that fit their Protocols, and a policy that
does not fit is refused when its method is defined."""

import types

import pytest

from configs import fashion_mnist_general
from cvs_jax.engine import phases
from cvs_jax.methods import importance_policies, policies, seams
from cvs_jax.methods.base import Method
from cvs_jax.methods.registry import METHODS, get_method

# the config switches that change which policies a method is built from
SWITCHES = {
    "cvs.replay": (True, False),
    "cvs.use_ld": (True, False),
    "cvs.batches": ("mixed", "half"),
    "data.setup": ("general", "disjoint"),
    "importance.mode": ("fork", "online"),
    "rainbow.memory": ("uncertainty", "herding"),
    "rainbow.batches": ("mixed", "half"),
}


def _methods():
    """Every registered method with the default config, then with each switch turned on its own."""
    for name in METHODS:
        for key, value in [(None, None)] + [(k, v) for k, values in SWITCHES.items() for v in values[1:]]:
            config = fashion_mnist_general.get_config()
            config.method = name
            if key:
                group, field = key.split(".")
                config[group][field] = value
            yield get_method(config)


def test_every_registered_method_fits_the_seams():
    kinds = {"scope": seams.ScopePolicy, "memory": seams.MemoryPolicy, "batches": seams.BatchPolicy}
    kinds["importance"] = seams.ImportancePolicy
    seen = set()
    for method in _methods():
        for field, kind in kinds.items():
            assert seams.misfit(getattr(method, field), kind) is None, (method.name, field)
            seen.add(type(getattr(method, field)))
        for provider in method.constants:
            assert seams.misfit(provider, seams.ConstantsPolicy) is None, method.name
            seen.add(type(provider))
    # every policy class of methods.policies and importance_policies is held by some method (the registry
    # reaches them all)
    defined = {
        p
        for module in (policies, importance_policies)
        for p in vars(module).values()
        if isinstance(p, type) and p.__module__ == module.__name__
    }
    defined -= {policies.ShuffledEpochs, policies.HalfMemoryEpochs}  # what BatchPolicy.plan returns
    assert defined <= seen, defined - seen


class ContextMemory:
    """A memory policy written against the whole run context, as before the seams."""

    keeps_memory = True

    def update(self, ctx, mem, variables, s):
        return mem


def test_a_policy_that_does_not_fit_is_refused():
    with pytest.raises(TypeError, match="ContextMemory.update.ctx, mem, variables, s. is not MemoryPolicy.update"):
        Method(name="stale", memory=ContextMemory())
    with pytest.raises(TypeError, match="is not a ImportancePolicy"):
        Method(name="swapped", importance=policies.HerdingMemory(20))
    with pytest.raises(TypeError, match="is not a ConstantsPolicy"):
        Method(name="plain", constants=(types.SimpleNamespace(),))


def test_the_engine_passes_a_session_result_that_fits():
    """``after_session`` reads the last model and what the step tracked of a ``phases.Selection``."""
    selection = phases.Selection({}, 0.0, 0)
    assert all(hasattr(selection, name) for name in seams.TrainedSession.__annotations__)
