# Type stub of ml_collections.config_flags (1.x): the one function cvs_jax uses (see ../config_dict/__init__.pyi).
from typing import Any

from absl import flags

def DEFINE_config_file(
    name: str,
    default: str | None = None,
    help_string: str = "path to config file.",
    flag_values: flags.FlagValues = ...,
    lock_config: bool = True,
    accept_new_attributes: bool = False,
    sys_argv: list[str] | None = None,
    **kwargs: Any,
) -> flags.FlagHolder[Any]: ...
