"""``report.html``: a run's state on one page, from the files its workdir already holds.

A run's results are spread over ``results.json`` (recall per session, the compatibility matrix),
``protocol.json`` (what each session brought), ``metrics.jsonl`` (the curves) and the session
checkpoints (which model made which gallery rows).  The page puts them side by side: recall@K and
AR@K, the compatibility matrix as a heatmap with its numbers and the old rows newer models lose
marked, each session's new and returning classes with image counts, the training curves and a few
gallery images per session.  Everything is embedded: the page opens from disk and can be mailed.
"""

from __future__ import annotations

import os
from typing import Callable

import numpy as np

from cvs_jax.config.stored import stored_config
from cvs_jax.reports import html, plots
from cvs_jax.retrieval import compatibility, run_rows, topk
from cvs_jax.rundir import paths, run_files
from cvs_jax.rundir.checkpoint import Reader as _Reader
from cvs_jax.rundir.gallery import Gallery

LOST_POINTS = 5.0  # a newer model "loses" old rows when its recall@1 on them is this far below their own model's
SAMPLES = 8  # gallery images shown per session
_LIST = 14  # class names listed per cell before "+N more"
_SCAN = 4096  # rows of a session looked at when picking its samples (a session may hold millions)


def lost_cells(matrix) -> set[tuple[int, int]]:
    """(i, j), i > j: the model of session i finds the rows of session j at least ``LOST_POINTS``
    points worse (recall@1) than session j's own model did: rows that became harder to find."""
    out = set()
    n = len(matrix or [])
    for j in range(n):
        own = matrix[j][j]
        for i in range(j + 1, n):
            v = matrix[i][j]
            if own is not None and v is not None and 100 * (own - v) >= LOST_POINTS:
                out.add((i, j))
    return out


def stored_rows(workdir: str) -> tuple[int, run_rows.Rows] | None:
    """The newest completed session (0-based) and its gallery's columns, read from the session
    checkpoints alone (no model, no additions), or None before the first session: what the run
    report counts and shows."""
    config = stored_config(workdir)
    sessions_dir = paths.sessions_dir(workdir)
    reader = _Reader(sessions_dir, max_to_keep=None) if os.path.isdir(sessions_dir) else None
    if reader is None or not reader.steps():
        return None
    last = reader.steps()[-1]
    log = run_rows.PartLog(reader)
    gallery = Gallery.restore(log, last, config.model.embed_dim)
    return last, run_rows.Rows(
        embeddings=gallery.embeddings,
        labels=gallery.labels,
        arrival=run_rows.arrival_sessions(log.parts, gallery).astype(np.int32),
        model=gallery.sessions,
        source_ids=gallery.source_ids,
    )


def partial_results(records: list[dict], ks) -> dict:
    """``results.json``'s recall part from the session records of a run still going (no matrix yet)."""
    per = [dict(r, session=r["session"] + 1) for r in records]
    ar = topk.average_recall([{k: r["recall"][str(k)] for k in ks} for r in records]) if records else {}
    return {"per_session": per, "average_recall": {str(k): v for k, v in ar.items()}}


def _recall_section(results: dict | None) -> str:
    per = (results or {}).get("per_session") or []
    if not per:
        return "<h2>Recall</h2><p>No session has finished yet.</p>"
    assert results is not None  # per came from it
    ks = list(per[0]["recall"])
    head = ["session"] + [f"R@{k} (%)" for k in ks] + ["mAP (%)", "test queries", "gallery rows"]
    rows = [
        [str(r["session"])]
        + [f'<span data-recall="{r["session"]}:{k}">{html.pct(r["recall"][k])}</span>' for k in ks]
        + [f'<span data-map="{r["session"]}">{html.pct(r.get("map"))}</span>']  # absent in runs before mAP
        + [str(r.get("test_queries", "-")), str(r.get("gallery_rows", "-"))]
        for r in per
    ]
    ar = results.get("average_recall") or {}
    mean_ap = f'<span data-map="AR">{html.pct(results.get("average_map"))}</span>'
    rows.append(["AR"] + [f'<span data-ar="{k}">{html.pct(ar.get(k))}</span>' for k in ks] + [mean_ap, "", ""])
    fig, ax = plots.pyplot().subplots(figsize=(5.2, 3.2))
    x = [r["session"] for r in per]
    for k in ks:
        ax.plot(x, [100 * r["recall"][k] for r in per], marker="o", label=f"R@{k}")
    ax.set_xticks(x)
    ax.set_xlabel("session")
    ax.set_ylabel("recall (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    return (
        "<h2>Recall per session</h2>"
        '<p class="legend">Recall@K of each session\'s test queries (every class seen so far) against the whole '
        "gallery; mAP: their mean average precision over the whole ranking; AR: the mean over sessions"
        + (
            f"; queries scored older gallery parts through the run's {html.esc(results['query_map'])} query maps"
            if results.get("query_map", "none") != "none"
            else ""
        )
        + ".</p>"
        '<div style="display:flex;gap:24px;align-items:flex-start;flex-wrap:wrap">'
        + html.table(head, rows, [""] * (len(rows) - 1) + ["total"])
        + html.img(html.figure_uri(fig), "recall per session", "plot")
        + "</div>"
    )


def heatmap(matrix, lost: set[tuple[int, int]]):
    """The compatibility matrix in %, its numbers in each cell up to ``plots.MATRIX_CELL_TEXT_MAX`` sessions (dark
    text on light cells), lost cells framed in red; its side bounded (``plots.matrix_side``)."""
    m = np.asarray([[np.nan if v is None else 100 * v for v in row] for row in matrix], np.float64)
    n = m.shape[0]
    side = plots.matrix_side(n, 1.4, 0.75, 3.6)
    fig, ax = plots.pyplot().subplots(figsize=(side + 1.2, side))
    im = ax.imshow(m, vmin=0, vmax=100, cmap="viridis")
    for i in range(n if n <= plots.MATRIX_CELL_TEXT_MAX else 0):
        for j in range(n):
            if np.isfinite(m[i, j]):
                ax.text(
                    j, i, f"{m[i, j]:.1f}", ha="center", va="center", fontsize=10 if n <= 8 else 7,
                    color="black" if m[i, j] > 55 else "white", fontweight="bold" if (i, j) in lost else "normal",
                )  # fmt: skip
    from matplotlib.patches import Rectangle  # pylint: disable=g-import-not-at-top  # loaded with pyplot

    for i, j in lost:
        edge = min(2.5, 50.0 / n)  # thinner as the cells get smaller
        ax.add_patch(Rectangle((j - 0.47, i - 0.47), 0.94, 0.94, fill=False, edgecolor="#ff3b30", linewidth=edge))
    plots.session_ticks(ax, n)
    ax.set_xlabel("gallery rows of session j (embedded by model j)")
    ax.set_ylabel("queries embedded by model of session i")
    fig.colorbar(im, ax=ax, label="recall@1 (%)", fraction=0.046, pad=0.04)
    fig.tight_layout()
    return fig


def _compat_section(results: dict | None) -> str:
    matrix = (results or {}).get("compatibility_recall1")
    if not matrix:
        return "<h2>Compatibility</h2><p>Not computed yet: the matrix is written when a run or an update finishes.</p>"
    assert results is not None  # matrix came from it
    lost = lost_cells(matrix)
    n = len(matrix)
    head = ["model \\ rows"] + [f"S{j + 1}" for j in range(n)]
    rows = []
    for i, row in enumerate(matrix):
        cells: list[str | tuple[str, str]] = [f"S{i + 1}"]  # a cell: its html, or (html, its class)
        for j, v in enumerate(row):
            text = f'<span data-compat="{i + 1}:{j + 1}">{html.pct(v)}</span>'
            cells.append((text, "lost" if (i, j) in lost else ("na" if v is None else "")))
        rows.append(cells)
    drop = compatibility.bc_points(results)
    ac, am = compatibility.average_compatibility(matrix), compatibility.average_multimodel_accuracy(matrix)
    ac_pass = compatibility.average_compatibility(matrix, ties="pass")
    ac_text = f'<b><span data-summary="AC">{html.pct(ac)}</span></b> %'  # in %, as in the text and compare
    if ac_pass != ac:  # a later model ties a part's own model: CoReS's rule passes the tie, iamcl2r's fails it
        ac_text += (
            f' (a tie fails; <b><span data-summary="AC-ties-pass">{html.pct(ac_pass)}</span></b> % if a tie passes)'
        )
    nfr = compatibility.mean_flips(results.get("negative_flip_rate"))
    note = (
        f"BC, the mean change on old rows (newer models minus the rows' own model): "
        f'<b><span data-summary="BC">{"-" if drop is None else f"{drop:+.2f}"}</span></b> points; '
        f"AC (of later-model / earlier-part pairs, the later model beating the part's own model on its rows): "
        f"{ac_text}; "
        "AM (every model on every part it searches): "
        f'<b><span data-summary="AM">{html.pct(am)}</span></b> %; NFR (queries right before an update and '
        f'wrong after, mean over updates): <b><span data-summary="NFR">{html.pct(nfr)}</span></b> %. '
        if drop is not None or n > 1
        else ""
    )
    lost_text = (
        f"<b>{len(lost)}</b> cell(s) marked red: a newer model finds those rows {LOST_POINTS:.0f} or more points "
        "worse than the model that embedded them (they are never re-embedded)."
        if lost
        else f"No old rows lost: every newer model finds them within {LOST_POINTS:.0f} points of their own model."
    )
    return (
        "<h2>Compatibility</h2>"
        '<p class="legend">Recall@1 (%) of the last session\'s test queries embedded by the model of session i '
        "(row) against only the gallery rows of session j (column). The diagonal is same-model search; below "
        f'it, old rows searched by newer models. Different queries from "Recall per session": '
        f"{compatibility.QUERIES_NOTE}. {note}{lost_text}</p>"
        '<div style="display:flex;gap:24px;align-items:flex-start;flex-wrap:wrap">'
        + html.img(html.figure_uri(heatmap(matrix, lost)), "compatibility heatmap", "plot")
        + html.table(head, rows)
        + "</div>"
    )


def _names(labels_counts: list[tuple[str, int]]) -> str:
    shown = ", ".join(f"{html.esc(n)}&nbsp;({c})" for n, c in labels_counts[:_LIST])
    more = len(labels_counts) - _LIST
    return (shown + (f", +{more} more" if more > 0 else "")) or "-"


def _sessions_section(protocol: dict, stored, results: dict | None = None) -> str:
    names = protocol["class_names"]
    last, rows = stored if stored is not None else (-1, None)
    per = {r["session"] - 1: r for r in (results or {}).get("per_session") or []}
    head = [
        "session",
        "new training images",
        "trained on (replay incl.)",
        "new classes (images)",
        "returning classes (images)",
        "gallery rows",
    ]
    out = []
    for s, sess in enumerate(protocol["sessions"]):
        new = [int(c) for c in sess["new_classes"]]
        seen = run_rows.trained_on(per[s]) if s in per else None
        counts_cells = [str(s + 1), str(sess["train"]), "-" if seen is None else str(seen)]
        if rows is not None and s <= last:
            counts = np.bincount(rows.labels[(rows.arrival == s) & (rows.labels >= 0)], minlength=len(names))
            new_cells = [(names[c], int(counts[c])) for c in new if c < len(names)]
            back = [(names[c], int(counts[c])) for c in np.flatnonzero(counts) if c not in new]
            gallery = f'<span data-gallery-rows="{s + 1}">{int(np.sum(rows.model == s))}</span>'
            out.append(counts_cells + [_names(new_cells), _names(back), gallery])
        else:
            listed = ", ".join(html.esc(names[c]) for c in new[:_LIST] if c < len(names)) or "-"
            out.append(counts_cells + [listed, "not completed", "-"])
    return (
        "<h2>Sessions</h2>"
        '<p class="legend">What each session brought: its new training images, the images it trained on (the '
        "new ones plus the method's replayed memory, or every image so far for joint), its classes first seen "
        "there and the known classes that came back, with the images each added to the gallery; gallery rows: "
        "the rows its model embedded.</p>" + html.table(head, out, left=(0, 3, 4))
    )


def _curves_section(metrics: list[dict]) -> str:
    epochs = [r for r in metrics if "epoch" in r and "loss" in r]
    if not epochs:
        return "<h2>Training curves</h2><p>No epoch has finished yet (metrics.jsonl is empty).</p>"
    fig = plots.training_curves(epochs)
    return (
        "<h2>Training curves</h2>"
        '<p class="legend">Per epoch, from metrics.jsonl: the training loss (and its terms) and the recall@1 on '
        "the session's validation images that selects each session's model.</p>"
        + html.img(html.figure_uri(fig), "training curves", "plot")
    )


def _samples(rows, read: Callable | None, names: list[str], last: int) -> str:
    if rows is None or read is None:
        return "<h2>Gallery samples</h2><p>The run's images are not readable here.</p>"
    parts = []
    for s in range(last + 1):
        mine = np.flatnonzero((rows.arrival == s) & (rows.source_ids >= 0))[:_SCAN]
        if not mine.size:
            continue
        picked, seen = [], set()
        for r in mine:  # one per class first, then more of the same classes
            if int(rows.labels[r]) not in seen:
                seen.add(int(rows.labels[r]))
                picked.append(int(r))
            if len(picked) == SAMPLES:
                break
        picked += [int(r) for r in mine if int(r) not in picked][: SAMPLES - len(picked)]
        images = read(np.asarray([rows.source_ids[r] for r in picked], np.int64))
        cells = [
            html.cell(html.thumbnail_uri(im), [html.esc(names[rows.labels[r]] if rows.labels[r] >= 0 else "?")])
            for r, im in zip(picked, images)
        ]
        parts.append(f"<h3>Session {s + 1}</h3><div class='row'>" + "".join(cells) + "</div>")
    return "<h2>Gallery samples</h2>" + "".join(parts)


def render(workdir: str, *, results: dict | None = None, stored=None, read_train: Callable | None = None) -> str:
    """The page.  By default everything is read from the workdir (``results.json``, the gallery of the
    session checkpoints, the run's images); the engine passes what it holds instead (a run in
    progress: ``partial_results``)."""
    protocol = run_files.read_json(paths.protocol_file(workdir), fields=run_files.PROTOCOL_FIELDS)
    if results is None:
        results = run_files.read_json(paths.results_file(workdir), fields=("per_session",), missing=None)
    if stored is None:
        stored = stored_rows(workdir)
    config = stored_config(workdir)
    if read_train is None and stored is not None:
        split = run_rows.train_split(config)
        read_train = None if split is None else split.read
    done = stored[0] + 1 if stored is not None else 0
    last, rows = stored if stored is not None else (-1, None)
    subtitle = (
        f"{os.path.abspath(workdir)} · {protocol.get('dataset')} / {protocol.get('setup')} / {config.method} · "
        f"{done} of {len(protocol['sessions'])} session(s) completed · gallery "
        f"{0 if rows is None else len(rows)} rows"
    )
    body = "".join(
        [
            _recall_section(results),
            _compat_section(results),
            _sessions_section(protocol, stored, results),
            _curves_section(run_files.read_metrics(paths.metrics_file(workdir))),
            _samples(rows, read_train, protocol["class_names"], last),
        ]
    )
    return html.page(f"run report: {config.method} on {protocol.get('dataset')}", subtitle, body)


def write(workdir: str, **kwargs) -> str:
    """Writes ``report.html`` in the workdir; returns its path."""
    return html.write(paths.report_file(workdir), render(workdir, **kwargs))


def write_or_warn(workdir: str, warn: Callable[[str], None], **kwargs) -> str | None:
    """``write`` that never stops a run: a failure is one warning line (the run's results are safe)."""
    try:
        return write(workdir, **kwargs)
    except Exception as e:  # noqa: BLE001 -- the report is a view; a run never fails for it
        warn(f"warning: {paths.report_file(workdir)} not written ({type(e).__name__}: {e})")
        return None
