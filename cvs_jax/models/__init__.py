"""Model zoo: ResNet embedding networks and the growing cosine head."""

from cvs_jax.models.heads import grow_head, init_head
from cvs_jax.models.resnet import ResNetEmbedding

# Named architectures. ``tiny`` is the test/demo model: same code path, 1 block per stage.
ARCHITECTURES = {
    "resnet18": dict(stage_sizes=(2, 2, 2, 2)),
    "resnet34": dict(stage_sizes=(3, 4, 6, 3)),
    "tiny": dict(stage_sizes=(1, 1, 1)),
}


def build_model(name: str, *, width: int, layout: str, embed_dim: int, dtype="float32") -> ResNetEmbedding:
    if name not in ARCHITECTURES:
        raise ValueError(f"model.name={name!r} is unknown; choose one of {sorted(ARCHITECTURES)}.")
    return ResNetEmbedding(width=width, layout=layout, embed_dim=embed_dim, dtype=dtype,
                           **ARCHITECTURES[name])


__all__ = ["ARCHITECTURES", "ResNetEmbedding", "build_model", "grow_head", "init_head"]
