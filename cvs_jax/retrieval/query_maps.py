"""Training-free query maps: carry a newer model's query into an older model's space before it scores
the gallery rows that older model made.

A map is fitted when session s completes, on images both the model of session s and the model of
session s - 1 embed (the replay memory, or the session's own training images), and sends model s's
space to model s - 1's: q -> q A + b.  Kinds (``retrieval.query_map``):

* ``none``: the identity;
* ``procrustes``: A = U V^T from the SVD of X_new^T X_old (orthogonal Procrustes), b = 0;
* ``affine``: least squares [X_new, 1] [A; b] = X_old (the minimum-norm solution when underdetermined);
* ``mean_shift``: A = I, b = -mean(X_new - X_old) (QDC, dipamgoswami/QDC ``trainers/base.py`` 543-556:
  the drift is the mean of new - old over the task's training queries; ``eval/eval_retrieval.py`` 84:
  q' = q - sum of the drifts).

Maps are fitted and applied on L2-normalised rows (retrieval is cosine search): :func:`fit_query_map`
normalises both sides, :func:`map_queries` normalises the query once and then applies the composed
chain as one affine map (no renormalisation between steps; the search normalises the result).

When the model of session i queries the rows of session j < i, the query goes through
i -> i-1 -> ... -> j (:func:`chain`); rows of session i itself take the query as it is.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Sequence

import numpy as np

from cvs_jax.errors import CheckpointError
from cvs_jax.retrieval import topk
from cvs_jax.rundir import paths
from cvs_jax.rundir.gallery import Gallery

KINDS = ("none", "procrustes", "affine", "mean_shift")


def _normalize(x) -> np.ndarray:
    x = np.asarray(x, np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


@dataclasses.dataclass(frozen=True)
class QueryMap:
    """q -> q @ matrix + bias, [D, D] and [D] float64; ``kind`` names how it was made."""

    matrix: np.ndarray
    bias: np.ndarray
    kind: str

    def __post_init__(self):
        d = self.matrix.shape[0]
        if self.matrix.shape != (d, d) or self.bias.shape != (d,):
            shapes = f"{self.matrix.shape} and {self.bias.shape}"
            raise ValueError(f"a query map needs a [D, D] matrix and a [D] bias, not {shapes}")

    @property
    def dim(self) -> int:
        return int(self.matrix.shape[0])

    def apply(self, queries) -> np.ndarray:
        """The rows mapped as they are (no normalisation)."""
        return np.asarray(queries, np.float64) @ self.matrix + self.bias

    def then(self, other: "QueryMap") -> "QueryMap":
        """This map followed by ``other``: q A1 A2 + (b1 A2 + b2)."""
        return QueryMap(self.matrix @ other.matrix, self.bias @ other.matrix + other.bias, "chain")

    def as_dict(self) -> dict[str, np.ndarray]:
        return {"matrix": self.matrix, "bias": self.bias, "kind": np.asarray(self.kind)}

    @classmethod
    def from_dict(cls, d) -> "QueryMap":
        return cls(np.asarray(d["matrix"], np.float64), np.asarray(d["bias"], np.float64), str(d["kind"]))

    def save(self, path: str) -> None:
        """An ``.npz`` beside the session checkpoints (written whole or not at all)."""
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path + ".tmp", "wb") as f:
            # pyright cannot tell the keys from savez's allow_pickle keyword (they are matrix, bias, kind)
            np.savez(f, **self.as_dict())  # pyright: ignore[reportArgumentType]
        os.replace(path + ".tmp", path)

    @classmethod
    def load(cls, path: str) -> "QueryMap":
        with np.load(path) as d:
            return cls.from_dict(d)


def stored_maps(workdir: str, last_session: int, kind: str) -> dict[int, QueryMap]:
    """The query maps of a run whose ``retrieval.query_map`` is ``kind``, for sessions 1..``last_session``
    (0-based; none for ``"none"``).  A run writes session s's map before session s's checkpoint, so every
    completed session s >= 1 has one; a missing file is refused (the scores would silently change)."""
    if kind == "none":
        return {}
    files = {s: paths.query_map_file(workdir, s) for s in range(1, last_session + 1)}
    missing = [s for s, f in files.items() if not os.path.exists(f)]
    if missing:
        raise CheckpointError(
            f"{workdir} was run with retrieval.query_map={kind} but holds no query map for session(s) "
            f"{[s + 1 for s in missing]} ({paths.query_map_file(workdir, missing[0])} is missing); restore "
            f"{paths.QUERY_MAPS} from a backup, or start the run anew in another --workdir."
        )
    return {s: QueryMap.load(f) for s, f in files.items()}


def identity(dim: int) -> QueryMap:
    return QueryMap(np.eye(dim), np.zeros(dim), "none")


def fit_query_map(kind: str, new_emb, old_emb) -> QueryMap:
    """The map of ``kind`` from the new model's embeddings to the old model's, row i of both being the
    same image."""
    if kind not in KINDS:
        raise ValueError(f"query map {kind!r} is unknown; choose one of {list(KINDS)}")
    x, y = _normalize(new_emb), _normalize(old_emb)
    if x.shape != y.shape or x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"a query map is fitted on [N, D] pairs of the same shape, not {x.shape} and {y.shape}")
    d = x.shape[1]
    if kind == "none":
        return identity(d)
    if kind == "procrustes":
        u, _, vt = np.linalg.svd(x.T @ y)
        return QueryMap(u @ vt, np.zeros(d), kind)
    if kind == "affine":
        solution = np.linalg.lstsq(np.concatenate([x, np.ones((x.shape[0], 1))], axis=1), y, rcond=None)[0]
        return QueryMap(solution[:d], solution[d], kind)
    return QueryMap(np.eye(d), np.mean(y - x, axis=0), kind)  # mean_shift


def chain(maps: Mapping[int, QueryMap], model_session: int, part_session: int, dim: int) -> QueryMap:
    """The composed map from the space of ``model_session``'s model to ``part_session``'s:
    ``maps[s]`` (model s -> model s - 1) for s = model_session, ..., part_session + 1."""
    if part_session > model_session:
        raise ValueError(f"the model of session {model_session} cannot map to a later session {part_session}")
    out = identity(dim)
    for s in range(model_session, part_session, -1):
        if s not in maps:
            raise KeyError(f"no query map stored for session {s}")
        out = out.then(maps[s])
    return out


def map_chains(maps: Mapping[int, QueryMap], model_session: int, part_sessions: Sequence[int]) -> dict:
    """``{"matrix_<j+1>", "bias_<j+1>"}``: the composed chain to each part session j (what ``export`` writes);
    a part newer than the model (an exported older model) takes the query as it is (the identity), as a server
    pinned to that model searches it (``mapped_topk_indices``)."""
    d = next(iter(maps.values())).dim
    out = {}
    for j in part_sessions:
        c = identity(d) if j > model_session else chain(maps, model_session, j, d)
        out[f"matrix_{j + 1}"], out[f"bias_{j + 1}"] = c.matrix, c.bias
    return out


def map_queries(
    maps: Mapping[int, QueryMap], queries, model_session: int, part_sessions: Sequence[int]
) -> dict[int, np.ndarray]:
    """``{j: queries of model_session mapped into part j's space}`` (float32), one per gallery part
    session j; the queries are L2-normalised first."""
    q = _normalize(queries)
    d = q.shape[1]
    return {j: chain(maps, model_session, j, d).apply(q).astype(np.float32) for j in sorted(set(part_sessions))}


def mapped_topk_indices(
    query_emb, parts: Sequence[tuple[int, Any]], maps: Mapping[int, QueryMap], model_session: int, k: int
):
    """``(scores, rows)`` ``[Q, k]`` of the nearest rows of ``parts`` (``(session j, rows [N_j, D])`` in
    gallery order; rows numbered across them) for queries of ``model_session``'s model, each part searched
    with the queries mapped down to its session; the parts' top-k merged by score, ties by the lowest row
    (as one search).  Fewer than k rows: the missing ranks hold row -1 and score -inf."""
    # a part newer than the model (a pinned older model, serve) takes the query as it is
    per_part = map_queries(maps, query_emb, model_session, [j for j, _ in parts if j <= model_session])
    q = np.asarray(query_emb)
    scores, rows, base = [np.full((q.shape[0], 0), -np.inf)], [np.zeros((q.shape[0], 0), np.int64)], 0
    for session, emb in parts:
        if len(emb):
            s, idx = topk.topk_indices(per_part.get(session, q), emb, k)
            scores.append(np.asarray(s, np.float64))
            rows.append(np.asarray(idx, np.int64) + base)
        base += len(emb)
    scores, rows = np.concatenate(scores, axis=1), np.concatenate(rows, axis=1)
    order = np.lexsort((rows, -scores), axis=1)[:, :k]  # best score first, then the lowest row
    scores, rows = np.take_along_axis(scores, order, axis=1), np.take_along_axis(rows, order, axis=1)
    if rows.shape[1] < k:
        pad = k - rows.shape[1]
        scores = np.concatenate([scores, np.full((rows.shape[0], pad), -np.inf)], 1)
        rows = np.concatenate([rows, np.full((rows.shape[0], pad), -1, np.int64)], 1)
    return scores, rows


def mapped_topk_labels(query_emb, gallery: Gallery, maps: Mapping[int, QueryMap], model_session: int, k: int):
    """Labels ``[Q, k]`` of the nearest rows of the whole gallery (-1: no row) for queries of
    ``model_session``'s model, each part searched with the queries mapped down to its session
    (``mapped_topk_indices``)."""
    if len(gallery) == 0:
        raise ValueError("the gallery is empty: nothing to search")
    parts = [(p.session, p.embeddings) for p in gallery.parts]
    _, rows = mapped_topk_indices(query_emb, parts, maps, model_session, k)
    labels = np.asarray(gallery.labels)
    return np.where(rows >= 0, labels[np.maximum(rows, 0)], -1)


def mapped_recall_at_k(
    query_emb, query_labels, gallery: Gallery, maps: Mapping[int, QueryMap], model_session: int, ks=(1, 2, 4)
) -> dict[int, float]:
    """recall@K of :func:`mapped_topk_labels` (``topk.recall_at_k`` with the maps applied per part)."""
    nearest = mapped_topk_labels(query_emb, gallery, maps, model_session, max(ks))
    hits = nearest == np.asarray(query_labels)[:, None]
    return {int(k): float(np.mean(np.any(hits[:, :k], axis=1))) for k in ks}
