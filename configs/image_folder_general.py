"""Kept so that ``--config configs/image_folder_general.py`` works in the repository: the config lives in
``cvs_jax/config/image_folder_general.py`` (with its docstring), so an installed cvs_jax carries it too."""

from cvs_jax.config.image_folder_general import *  # noqa: F403
from cvs_jax.config.image_folder_general import get_config as get_config
