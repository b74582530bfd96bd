"""What checkpoints leave out of a run on a frozen pretrained trunk (``model.train_blocks`` set): the
trunk's leaves, which never change and are read from the weight file instead.

A session or progress checkpoint of such a run stores the trained leaves only (the top blocks, the
projection, the head) and, in its JSON meta, the SHA-256 of the weight file. Restoring puts the
trunk back from the run's own initial variables (``RunContext.initial_variables`` merges the file)
or, for a reader without them (``search``, ``export``), from the file; a checkpoint written against a
file with other bytes is refused with one error line (its trained leaves were trained on another trunk).
A frozen ViT-S/16 trunk is about 86 MB of float32: without this, each progress checkpoint held it twice
(the state and the best model) and each session checkpoint once more.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os

from cvs_jax.errors import CheckpointError, WeightsError
from cvs_jax.models import networks as models
from cvs_jax.models.weight_packages import resolve

META_KEY = "frozen_trunk"  # in a checkpoint's meta: {"weights_sha256", "leaves"}
_FILE_DIGESTS: dict = {}


def file_digest(path: str) -> str:
    """sha256 of a weight file's bytes (once per process for a path, size and mtime)."""
    st = os.stat(path)
    at = (os.path.abspath(path), st.st_size, st.st_mtime_ns)
    if at not in _FILE_DIGESTS:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
        _FILE_DIGESTS[at] = h.hexdigest()
    return _FILE_DIGESTS[at]


@dataclasses.dataclass(frozen=True)
class FrozenTrunk:
    names: tuple[str, ...]  # the network's top-level modules that never train (``frozen_names``)
    path: str  # the weight file
    digest: str  # its SHA-256

    @classmethod
    def of(cls, config) -> "FrozenTrunk | None":
        """The run's frozen trunk, or None when every leaf trains (nothing is left out)."""
        if models.train_blocks(config) is None or config.model.pretrained is None:
            return None
        path = resolve(config.model.pretrained)
        if not os.path.isfile(path):
            raise WeightsError(
                f"model.pretrained={path} is missing: the run's frozen trunk is read from it (its checkpoints "
                "store only what trains); put the weight file back at that path."
            )
        names = tuple(sorted(models.from_config(config).frozen_names()))
        return cls(names, path, file_digest(path))

    def meta(self) -> dict:
        return {META_KEY: {"weights_sha256": self.digest, "leaves": list(self.names)}}

    def params_without(self, params: dict) -> dict:
        """``{"net", head...}`` without the trunk's modules in ``net``."""
        return dict(params, net={k: v for k, v in params["net"].items() if k not in self.names})

    def params_with(self, params: dict, full: dict) -> dict:
        """``params`` (stored, no trunk) with the trunk's modules of ``full`` put back in ``net``."""
        net = dict(params["net"])
        net.update({k: full["net"][k] for k in self.names if k in full["net"]})  # e.g. no reg_token
        return dict(params, net=net)

    def without(self, variables: dict) -> dict:
        return dict(variables, params=self.params_without(variables["params"]))

    def with_(self, variables: dict, full: dict) -> dict:
        return dict(variables, params=self.params_with(variables["params"], full["params"]))

    def check(self, meta: dict, where: str) -> None:
        """Refuses a checkpoint written against a weight file with other bytes."""
        stored = meta[META_KEY]["weights_sha256"] if META_KEY in meta else None
        if stored != self.digest:
            raise CheckpointError(
                f"checkpoint {where} was trained on the frozen trunk of a weight file with SHA-256 "
                f"{(stored or 'unknown')[:16]}..., but model.pretrained={self.path} has {self.digest[:16]}...; pass "
                "the weight file the run was made with (its bytes, not only its name, must match)."
            )

    def file_params(self, config, image_shape) -> dict:
        """The trunk's modules as the run's network holds them, read from the weight file."""
        model = models.from_config(config)
        loaded = models.load_pretrained(model, self.path, models.input_shape(config, image_shape))["params"]
        return {"net": {k: loaded[k] for k in self.names if k in loaded}}
