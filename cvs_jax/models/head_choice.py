"""The head a name chooses (``config.model.head``, ``Method.official_head``): one of ``heads.HEADS``.

Apart from ``models.heads`` because it imports every head, ``simplex_head`` included, and ``heads`` is
imported low in the package (the methods' loss helpers read its ``Head`` Protocol)."""

from __future__ import annotations

from cvs_jax.models.heads import HEADS, CosineHead, Head, LinearResetHead
from cvs_jax.models.simplex_head import SimplexHead


def make_head(name: str, temperature: float, reverse_labels: bool = False) -> Head:
    """The head called ``name``; ``temperature`` is the cosine head's, ``reverse_labels`` the simplex
    head's (class y on row K - 1 - y, d-Simplex-HOC)."""
    if name == "cosine":
        return CosineHead(temperature)
    if name == "linear_reset":
        return LinearResetHead()
    if name == "simplex":
        return SimplexHead(reverse_labels=reverse_labels)
    raise ValueError(f"unknown head {name!r}; choose one of {list(HEADS)}")
