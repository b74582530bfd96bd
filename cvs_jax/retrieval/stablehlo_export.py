"""``export --format stablehlo``: the embedding function as StableHLO and its weights as safetensors, so
that a trained model runs with jax (or any StableHLO runtime) and no cvs_jax, Flax or config code.

Writes, next to the other export files:

* ``embed.stablehlo``: ``jax.export.Exported.serialize()`` of ``embed(weights, images) -> float32 [B, D]``,
  the eval transform (``augment.Pipeline.eval``: centre crop where the run crops, normalisation) and the
  eval-mode network together, as ``search`` embeds its queries; ``images`` is uint8 ``[B, H, W, C]`` of
  the stored image shape with any batch size ``B`` (a symbolic dimension); ``weights`` is the dict read
  from ``weights.safetensors``.  Lowered for CPU and CUDA.
* ``weights.safetensors``: every variable of the newest embedding network (no cosine head) under its
  "/"-joined Flax path (``params/...``, ``batch_stats/...``), with metadata: architecture, session
  (1-based), embed_dim, input shape and dtype, and the preprocessing (what to do to a picture before
  ``embed``, and what ``embed`` does itself).

Running it with jax alone (``safetensors.numpy`` reads the weights)::

    import jax, numpy as np
    from safetensors.numpy import load_file
    embed = jax.export.deserialize(open(f"{out}/embed.stablehlo", "rb").read())
    vectors = np.asarray(embed.call(load_file(f"{out}/weights.safetensors"), images_u8))

A picture of another size is first resized to the stored shape as the gallery was (shorter side to
the stored size with bilinear resampling, centre crop, "L" or "RGB"; the metadata says so).
"""

from __future__ import annotations

import json
import os
from typing import cast

import flax.traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import safetensors.numpy

from cvs_jax.augment import transforms as augment
from cvs_jax.models import networks as models
from cvs_jax.models.heads import net_variables

FUNCTION = "embed.stablehlo"
WEIGHTS = "weights.safetensors"
FILES = (FUNCTION, WEIGHTS)
PLATFORMS = ("cpu", "cuda")  # lowered for both: jax.export cross-lowers without the devices
RESIZE = (
    "turn the picture upright by its EXIF orientation, bring 16-bit greyscale to 8 bits (v / 257), "
    "resize the shorter side to the stored size (PIL bilinear), centre crop to the stored height x width, "
    "convert to 'L' (1 channel) or 'RGB' (3 channels); an image already of the stored shape is used as it is"
)


def _flat(variables: dict) -> dict[str, np.ndarray]:
    """The embedding network's variables alone (no cosine head, no method extras), flat."""
    net = net_variables(variables["params"], variables.get("batch_stats", {}))
    flat = flax.traverse_util.flatten_dict(jax.device_get(net), sep="/")
    return {k: np.ascontiguousarray(np.asarray(v)) for k, v in flat.items()}


def embed_function(config, image_shape):
    """``embed(weights, images_u8)``: the flat weights dict as stored -> raw float32 embeddings."""
    model = models.from_config(config)
    pipeline = augment.Pipeline.from_config(config)

    def embed(weights, images):
        variables = flax.traverse_util.unflatten_dict(weights, sep="/")
        out = cast(jax.Array, model.apply(variables, pipeline.eval(images), train=False))  # no mutable: output only
        return out.astype(jnp.float32)

    return embed


def preprocessing(config, image_shape) -> dict:
    """What happens to a picture before and inside ``embed`` (stored in the safetensors metadata)."""
    p = augment.Pipeline.from_config(config)
    inside = "centre crop to {0}x{0}, then ".format(p.size) if p.crop == "resized" else ""
    return {
        "before_embed": RESIZE,
        "inside_embed": inside + "(x / 255 - mean) / std per channel",
        "mean": list(p.mean),
        "std": list(p.std),
        "input_shape": ["B", *(int(d) for d in image_shape)],
        "input_dtype": "uint8",
    }


def write(config, variables: dict, image_shape, session: int, out: str) -> dict:
    """Writes ``embed.stablehlo`` and ``weights.safetensors`` into ``out``; returns their description
    (kept in ``export.json``).  ``session``: 1-based, as ``search`` prints it."""
    weights = _flat(variables)
    shape = tuple(int(d) for d in image_shape)
    (batch,) = jax.export.symbolic_shape("B")
    images = jax.ShapeDtypeStruct((batch, *shape), jnp.uint8)
    specs = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in weights.items()}
    fn = jax.jit(embed_function(config, shape))
    exported = jax.export.export(fn, platforms=PLATFORMS)(specs, images)
    with open(os.path.join(out, FUNCTION), "wb") as f:
        f.write(exported.serialize())
    prep = preprocessing(config, shape)
    meta = {
        "format": "cvs_jax.export stablehlo 1",
        "architecture": str(config.model.name),
        "width": str(config.model.width),
        "layout": str(config.model.layout),
        "session": str(session),
        "embed_dim": str(int(config.model.embed_dim)),
        "input_shape": json.dumps(prep["input_shape"]),
        "input_dtype": "uint8",
        "preprocessing": json.dumps(prep),
        "function": FUNCTION,
    }
    with open(os.path.join(out, WEIGHTS), "wb") as f:  # save_file made it 0600: unreadable by the service
        f.write(safetensors.numpy.save(weights, metadata=meta))  # account the folder is copied to; open obeys umask
    return {"files": list(FILES), "platforms": list(PLATFORMS), **prep}
