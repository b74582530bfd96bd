"""The pictures a person looks at after a run (PNG, matplotlib's Agg backend, no display).

* recall@1 per session, one line per method (the paper's Fig. 4 style);
* the class distribution of the sessions: training images per class per session (Fig. 3 style);
* the backward-compatibility matrix (see ``compatibility.py``);
* the training curves of a run's page: loss (and its terms) and validation recall@1 per epoch.
"""

from __future__ import annotations

import functools

import numpy as np


@functools.cache
def pyplot():
    """``matplotlib.pyplot`` on the Agg backend, imported at the first picture: it costs ~0.4 s, which
    the commands that draw nothing (``search`` without ``--html``, ``info``, ``export``) do not pay."""
    import matplotlib  # pylint: disable=g-import-not-at-top

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

    return plt


def recall_per_session(
    results: list[dict], path: str, xlabel: str = "session", ylabel: str = "recall@1 (%)", key: str = "recall"
) -> None:
    """One line per result: ``per_session[i][key]["1"]`` against ``per_session[i]["session"]`` (a benchmark's
    days use the same picture with ``xlabel="day"``)."""
    fig, ax = pyplot().subplots(figsize=(6, 4))
    for r in results:
        sessions = [s["session"] for s in r["per_session"]]  # numbered from 1 (results.json)
        ax.plot(
            sessions,
            [np.nan if s[key]["1"] is None else 100 * s[key]["1"] for s in r["per_session"]],
            marker="o",
            label=f"{r['method']} (AR@1 {100 * r['average_recall']['1']:.2f})",
        )
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(f"{results[0]['dataset']} / {results[0]['setup']}")
    ax.set_xticks(sessions)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    pyplot().close(fig)


def class_distribution(counts: np.ndarray, path: str, title: str) -> None:
    """``counts[s, c]``: training images of (protocol) class c in session s."""
    fig, (ax1, ax2) = pyplot().subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 1]})
    im = ax1.imshow(counts, aspect="auto", interpolation="nearest", cmap="viridis")
    ax1.set_xlabel("class (protocol order)")
    ax1.set_ylabel("session")
    ax1.set_yticks(range(counts.shape[0]), [str(s + 1) for s in range(counts.shape[0])])
    fig.colorbar(im, ax=ax1, label="training images")
    seen = np.zeros(counts.shape[1], bool)
    new, old = [], []
    for row in counts:
        present = row > 0
        new.append(row[present & ~seen].sum())
        old.append(row[present & seen].sum())
        seen |= present
    x = np.arange(1, counts.shape[0] + 1)
    ax2.bar(x, new, label="new classes")
    ax2.bar(x, old, bottom=new, label="seen classes")
    ax2.set_xticks(x)
    ax2.set_xlabel("session")
    ax2.set_ylabel("training images")
    ax2.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    pyplot().close(fig)


# A compatibility matrix's figure grows with the sessions up to this side (inches), and shows each cell's number
# up to MATRIX_CELL_TEXT_MAX sessions (above, colours only: the page's table and results.json hold the numbers).
# Grown at 0.6-0.75 inch a session, the figures of a run grown to 25 sessions by update took 1.7 s of each
# update to draw (py-spy) and a 300-session run's would have been 22,000 px square (about 2 GB to draw).
MATRIX_MAX_INCHES = 12.0
MATRIX_CELL_TEXT_MAX = 20


def matrix_side(n: int, base: float, per_session: float, least: float) -> float:
    """A matrix figure's side for ``n`` sessions: ``base + per_session * n`` inches, at least ``least``, at most
    ``MATRIX_MAX_INCHES``."""
    return min(MATRIX_MAX_INCHES, max(least, base + per_session * n))


def session_ticks(ax, n: int) -> None:
    """Sessions 1..n on both axes of a matrix, at most about 20 labels each."""
    ticks = list(range(0, n, max(1, -(-n // 20))))
    ax.set_xticks(ticks, [str(j + 1) for j in ticks])
    ax.set_yticks(ticks, [str(i + 1) for i in ticks])


def compatibility(matrix: np.ndarray, path: str, title: str) -> None:
    n = matrix.shape[0]
    side = matrix_side(n, 1.5, 0.6, 4.5)
    fig, ax = pyplot().subplots(figsize=(side + 1.0, side))
    im = ax.imshow(100 * matrix, vmin=0, vmax=100, cmap="magma")
    for i in range(n if n <= MATRIX_CELL_TEXT_MAX else 0):
        for j in range(n):
            if np.isfinite(matrix[i, j]):
                ax.text(
                    j,
                    i,
                    f"{100 * matrix[i, j]:.0f}",
                    ha="center",
                    va="center",
                    color="white" if matrix[i, j] < 0.6 else "black",
                    fontsize=8,
                )
    session_ticks(ax, n)
    ax.set_xlabel("gallery rows made by session j")
    ax.set_ylabel("queries embedded by model i")
    ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, label="recall@1 (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    pyplot().close(fig)


LOG_RANGE = 1e3  # a loss plot whose values span more than this is drawn on a log axis


def loss_axis(ax, values) -> None:
    """A log y axis when the finite positive ``values`` span more than ``LOG_RANGE`` (a diverging session
    would flatten every other curve into a line at 0 on a linear axis)."""
    v = np.asarray([x for x in values if x is not None], np.float64)
    v = v[np.isfinite(v) & (v > 0)]
    if v.size and v.max() / v.min() > LOG_RANGE:
        ax.set_yscale("log")


def training_curves(epochs: list[dict]):
    """The figure of a run's epoch records (``metrics.jsonl``): the training loss and its ``L_`` terms,
    and the validation recall@1; dashed lines where a session starts."""
    x = np.arange(1, len(epochs) + 1)
    terms = sorted({k for r in epochs for k in r if k.startswith("L_")})
    fig, (a1, a2) = pyplot().subplots(1, 2, figsize=(11, 3.4))
    lines = {"loss": [r["loss"] for r in epochs], **{t: [r.get(t, np.nan) for r in epochs] for t in terms}}
    a1.plot(x, lines["loss"], marker=".", label="loss", color="black")
    for t in terms:
        a1.plot(x, lines[t], marker=".", label=t, alpha=0.8)
    loss_axis(a1, [v for values in lines.values() for v in values])
    a2.plot(x, [100 * r.get("val_recall1", np.nan) for r in epochs], marker="o", color="#1a5fb4")
    starts = [i for i in range(1, len(epochs)) if epochs[i]["session"] != epochs[i - 1]["session"]]
    for ax in (a1, a2):
        for i in starts:
            ax.axvline(i + 0.5, color="#999", linestyle="--", linewidth=1)
        ax.set_xlabel("epoch (dashed lines: a new session)")
        ax.grid(alpha=0.3)
    a1.set_ylabel("training loss" + (" (log scale)" if a1.get_yscale() == "log" else ""))
    a1.legend(fontsize=8, loc="upper right")
    a2.set_ylabel("validation recall@1 (%)")
    fig.tight_layout()
    return fig
