# Type stub (read by pyright only; see config_dict/__init__.pyi for why it exists).
from ml_collections import config_dict as config_dict
from ml_collections.config_dict import ConfigDict as ConfigDict
from ml_collections.config_dict import FieldReference as FieldReference
from ml_collections.config_dict import FrozenConfigDict as FrozenConfigDict

__all__ = ("ConfigDict", "FieldReference", "FrozenConfigDict")
__version__: str
