"""Kept so that ``--config configs/tinyimagenet_disjoint.py`` works in the repository: the config lives in
``cvs_jax/config/tinyimagenet_disjoint.py`` (with its docstring), so an installed cvs_jax carries it too."""

from cvs_jax.config.tinyimagenet_disjoint import *  # noqa: F403
from cvs_jax.config.tinyimagenet_disjoint import get_config as get_config
