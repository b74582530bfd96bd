"""Kept so that ``--config configs/finegrained.py`` works in the repository: the config lives in
``cvs_jax/config/finegrained.py`` (with its docstring), so an installed cvs_jax carries it too."""

from cvs_jax.config.finegrained import *  # noqa: F403
from cvs_jax.config.finegrained import get_config as get_config
