"""``comparison.html``: a comparison's table, paired intervals and per-seed points on one page.

Drawn from ``comparison.json`` alone (``tables.comparison_json``), so ``compare`` writes it at the end
and ``python -m cvs_jax.report --workdir DIR`` rewrites it from a finished (or partly finished)
comparison.  Recalls are in %, as in the JSON.
"""

from __future__ import annotations

import numpy as np

from cvs_jax.reports import html, plots
from cvs_jax.reports.tables import BC, REFERENCE


def _mean_std(d: dict | None, unit: str = "") -> str:
    if not d or d.get("mean") is None:
        return "-"
    return f"{d['mean']:.2f} ± {d['std']:.2f}{unit}" if d.get("std") is not None else f"{d['mean']:.2f}{unit}"


def _interval(d: dict | None) -> tuple[str, str]:
    if not d or d.get("mean") is None:
        return "-", ""
    if d.get("ci95") is None:
        return f"{d['mean']:+.2f} (n/a: 1 seed)", ""
    lo, hi = d["ci95"]
    verdict = "significant" if d["significant"] else "not significant"
    return f"{d['mean']:+.2f} [{lo:+.2f}, {hi:+.2f}] {verdict}", ("lost" if d["significant"] and hi < 0 else "")


def _table(c: dict) -> str:
    summary = c["summary"]
    ks = next((list(e["average_recall"]) for e in summary if e["average_recall"]), [])
    head = ["method", "seeds"] + [f"AR@{k} (%)" for k in ks] + ["mAP (%)", "BC (points)", f"AR@1 − {REFERENCE}"]
    rows = []
    for e in summary:
        vs = (e.get("vs_" + REFERENCE) or {}).get("1") if ks else None
        diverged = f" ({len(e['diverged'])} diverged)" if e["diverged"] else ""
        none = "diverged" if e["diverged"] and not e["seeds"] else None  # every seed diverged: said, not "-"
        rows.append(
            [html.esc(e["method"]), f"{len(e['seeds'])}{diverged}"]
            + [
                f'<span data-ar="{html.esc(e["method"])}:{k}">{none or _mean_std(e["average_recall"][k])}</span>'
                for k in ks
            ]
            + [_mean_std(e.get("mAP")), _mean_std(e[BC])]
            + [_interval(vs)]
        )
    return html.table(head, rows)


def _pairs_table(c: dict) -> str:
    pairs = c.get("pairs") or []
    if not pairs:
        return ""
    head = ["a − b", "why", "AR@1", "BC"]
    rows = [
        [f"{html.esc(p['a'])} − {html.esc(p['b'])}", html.esc(p["why"]), _interval(p["difference"].get("1")),
         _interval(p["difference"].get(BC))]
        for p in pairs
    ]  # fmt: skip
    return "<h3>Paired comparisons</h3>" + html.table(head, rows, left=(0, 1))


def _points(c: dict):
    """AR@1 per seed (dots) and its mean (bar) per method; beside it, each method's paired difference
    to the reference with its 95 % interval."""
    summary = [e for e in c["summary"] if e["average_recall"]]
    fig, (a1, a2) = plots.pyplot().subplots(1, 2, figsize=(11, max(3.0, 0.9 + 0.42 * len(summary))))
    for y, e in enumerate(summary):
        ar = e["average_recall"]["1"]
        vals = list(ar["per_seed"].values())
        a1.scatter(vals, [y] * len(vals), color="#1a5fb4", zorder=3, s=28)
        if ar["mean"] is not None:
            a1.plot([ar["mean"]] * 2, [y - 0.3, y + 0.3], color="black", linewidth=2)
        d = (e.get("vs_" + REFERENCE) or {}).get("1")
        if d and d["mean"] is not None:
            if d["ci95"] is not None:
                a2.plot(d["ci95"], [y, y], color="#555", linewidth=2)
            a2.scatter([d["mean"]], [y], color="#c01c28" if d.get("significant") else "#555", zorder=3, s=30)
            a2.scatter(list(d["per_seed"].values()), [y] * len(d["per_seed"]), color="#999", s=10, zorder=2)
    names = [e["method"] for e in summary]
    for ax in (a1, a2):
        ax.set_yticks(range(len(summary)), names)
        ax.set_ylim(len(summary) - 0.5, -0.5)
        ax.grid(axis="x", alpha=0.3)
    a1.set_xlabel("AR@1 (%): each dot a seed, bar the mean")
    a2.axvline(0, color="black", linewidth=1)
    a2.set_xlabel(f"AR@1 − {REFERENCE} (points) by seed: mean, 95 % interval (red: excludes 0)")
    fig.tight_layout()
    return fig


def _sessions(c: dict):
    summary = [e for e in c["summary"] if e.get("recall1_per_session")]
    if not summary:
        return None
    fig, ax = plots.pyplot().subplots(figsize=(7.5, 3.6))
    for e in summary:
        r = e["recall1_per_session"]
        ax.plot(np.arange(1, len(r) + 1), r, marker="o", label=e["method"])
    ax.set_xlabel("session")
    ax.set_ylabel("recall@1 (%), mean over seeds")
    ax.set_xticks(np.arange(1, len(summary[0]["recall1_per_session"]) + 1))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))  # beside the lines, never over them
    fig.tight_layout()
    return fig


def render(c: dict, workdir: str) -> str:
    """The page of ``comparison.json``'s contents ``c``."""
    split = (
        "each seed has its own class order and split"
        if c.get("split_seed") is None
        else f"every seed on the split of split_seed={c['split_seed']}"
    )
    subtitle = f"{workdir} · {c['dataset']} / {c['setup']} · seeds {', '.join(map(str, c['seeds']))} · {split}"
    body = [
        "<h2>Table</h2>",
        '<p class="legend">AR@K mean ± std over seeds (%); BC: recall@1 newer models lose on older gallery '
        f"rows (points, mean over parts); AR@1 − {REFERENCE}: paired difference by seed, mean [95 % Student-t "
        "interval].</p>",
        _table(c),
        _pairs_table(c),
    ]
    if any(e["seeds"] for e in c["summary"]):  # a finished run to plot
        body += ["<h2>Per seed and paired intervals</h2>", html.img(html.figure_uri(_points(c)), "per-seed", "plot")]
    fig = _sessions(c)
    if fig is not None:
        body += ["<h2>Recall@1 per session</h2>", html.img(html.figure_uri(fig), "recall per session", "plot")]
    return html.page(f"comparison: {c['dataset']} / {c['setup']}", subtitle, "\n".join(body))
