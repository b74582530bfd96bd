"""``search --html``: each query and its hits as pictures, on one page that opens from disk.

People judge retrieval by looking at it: a row per query (the query as the model saw it, then its
top-k hits, all thumbnails of one size), and under each hit what the text table prints (class,
score, the session its image arrived in, the session whose model embedded it).  A hit of the
query's class is framed in green when the query's class is known.
"""

from __future__ import annotations

import os
from typing import Callable

from cvs_jax.reports import html


def query_class(path: str, label: str | None, class_names: list[str]) -> str | None:
    """The class a query is known to be: ``--label`` when given, else its folder's name when that is a
    class of the run (``photos/test/lemon/x.jpg`` is a lemon), else None (unknown)."""
    if label is not None:
        if label in class_names:
            return label
        if label.lstrip("-").isdigit() and 0 <= int(label) < len(class_names):
            return class_names[int(label)]
        return label
    folder = os.path.basename(os.path.dirname(os.path.abspath(path)))
    return folder if folder in class_names else None


def summary(queries: list[dict]) -> str | None:
    """ "top-1 of the query's class: 14 of 84" over the answered queries whose class is known (None: none)."""
    known = [q for q in queries if q["error"] is None and q["class_name"] is not None]
    if not known:
        return None
    top1 = sum(bool(q["hits"]) and q["hits"][0]["class_name"] == q["class_name"] for q in known)
    text = f"top-1 of the query's class: {top1} of {len(known)}"
    unknown = sum(q["error"] is None for q in queries) - len(known)
    return text + (f" ({unknown} queries of unknown class left out)" if unknown else "")


def _hit_cell(hit: dict, uri: str | None, known: str | None) -> str:
    match = known is not None and hit["class_name"] == known
    mark = ' <span class="ok">&#10003;</span>' if match else ""
    lines = [
        f'<span class="name">{html.esc(hit["class_name"])}</span>{mark}',
        f'score <span class="score">{hit["score"]:.4f}</span>',
        f'arrived in session <span class="arrival">{hit["arrival_session"]}</span>',
        f'model of session <span class="model">{hit["model_session"]}</span>',
    ]
    cls = "hit match" if match else "hit"
    return html.cell(uri, lines, cls, alt=f"rank {hit['rank']}: {hit['source']}")


def query_row(q: dict, hit_uri: Callable[[dict], str | None]) -> str:
    """One query's row: ``q`` as ``render`` takes it; ``hit_uri(hit)`` is the picture of a hit (a data
    URI on a page that opens from disk, a row's thumbnail route on a server's page)."""
    head = f'<div class="cell query"><div class="qpath" title="{html.esc(q["query"])}">'
    name = html.esc(os.path.basename(q["query"]))
    if q["error"] is not None:
        return (
            f'<div class="row qrow" data-query="{html.esc(q["query"])}">{head}<b>{name}</b></div></div>'
            f'<div class="error">could not search with this image: {html.esc(q["error"])}</div></div>'
        )
    known = q["class_name"]
    lines = ["<b>query</b>", name, f"class: {html.esc(known) if known else 'unknown'}"]
    if known is not None:
        same = sum(h["class_name"] == known for h in q["hits"])
        lines.append(f'same class: <span class="same">{same} of {len(q["hits"])}</span>')
    query_cell = html.cell(
        html.thumbnail_uri(q["image"]),
        lines,
        "query",
        alt=q["query"],
    )
    hits = "".join(_hit_cell(h, hit_uri(h), known) for h in q["hits"])
    return f'<div class="row qrow" data-query="{html.esc(q["query"])}">{query_cell}{hits}</div>'


LEGEND = (
    '<p class="legend">Blue frame: the query (as the model sees it: resized, centre crop). Green frame and '
    "&#10003;: a hit of the query's class (its folder name or --label). Under each hit: class, cosine "
    "score, the session its image arrived in and the session whose model embedded it (rows are never "
    "re-embedded).</p>"
)


def _data_uri(hit: dict) -> str | None:
    return html.thumbnail_uri(hit["image"]) if hit.get("image") is not None else None


def render(queries: list[dict], *, workdir: str, model_session: int, gallery_rows: int, k: int) -> str:
    """``queries``: per query, in order, ``query`` (its path), ``class_name`` (None: unknown),
    ``image`` (uint8, as prepared for the model; None when unreadable), ``error`` (the reason it could
    not be read, else None) and ``hits`` (``Run.search``'s dicts, each with its ``image`` or None)."""
    rows = [query_row(q, _data_uri) for q in queries]
    answered = sum(q["error"] is None for q in queries)
    subtitle = (
        f"{workdir}: {answered} of {len(queries)} queries answered by the model of session {model_session}, "
        f"top {k} of {gallery_rows} gallery rows (exact cosine)"
    )
    found = summary(queries)
    head = "" if found is None else f'<p class="summary"><b>{html.esc(found)}</b></p>'
    return html.page("search results", subtitle, head + LEGEND + "\n".join(rows))
