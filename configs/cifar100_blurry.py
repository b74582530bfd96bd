"""Kept so that ``--config configs/cifar100_blurry.py`` works in the repository: the config lives in
``cvs_jax/config/cifar100_blurry.py`` (with its docstring), so an installed cvs_jax carries it too."""

from cvs_jax.config.cifar100_blurry import *  # noqa: F403
from cvs_jax.config.cifar100_blurry import get_config as get_config
