"""The config a run starts from: the defaults (``config/defaults.py``, the official CVS training
recipe) with every registered method's loss terms at the weights it declares (``Method.loss_terms``).

Every field a run reads is set here or in the dataset config that imports this file; nothing falls
back to a hidden default in the code.  Where each default comes from is in
``docs/config-provenance.md``.
"""

import ml_collections

from cvs_jax.config import defaults
from cvs_jax.methods import registry


def get_config() -> ml_collections.ConfigDict:
    c = defaults.get_config()
    # filled once every section a method's definition reads is set
    c.loss_weights.update(registry.default_loss_weights(c))
    return c
