"""Kept so that ``from configs import base`` works in the repository: the config lives in
``cvs_jax/config/base.py`` (with its docstring), so an installed cvs_jax carries it too."""

from cvs_jax.config.base import *  # noqa: F403
from cvs_jax.config.base import get_config as get_config
