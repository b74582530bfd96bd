"""Kept so that ``from configs import variants`` works in the repository: the config lives in
``cvs_jax/config/variants.py`` (with its docstring), so an installed cvs_jax carries it too."""

from cvs_jax.config.variants import *  # noqa: F403
