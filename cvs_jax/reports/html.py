"""Self-contained HTML pages: a string template, escaping and embedded pictures (data URIs).

Static pages need no web framework: the pages are written once and opened from disk, so a template
string, ``html.escape`` and pictures embedded as base64 PNG/JPEG are all it takes, with nothing to
install and nothing to serve.  Plots are matplotlib figures (Agg), thumbnails PIL images.
"""

from __future__ import annotations

import base64
import html
import io
import os
from typing import Sequence

import numpy as np
from PIL import Image

from cvs_jax.reports import plots

THUMB = 112  # thumbnail side in pixels: every thumbnail of a page has this size
# zlib's default level, not ``optimize=True``: that tried every level and strategy, 12.6 ms per 64-px photo's
# thumbnail against 1.5 ms, for 1.6 % fewer bytes; a run's page shows 8 a session and is written after every
# session (BENCHMARKS.md, "The run page's thumbnails")
PNG_OPTIONS: dict = {}

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 24px; color: #222;
       background: #fff; max-width: 1500px; }
h1 { font-size: 22px; margin: 0 0 4px 0; }
h2 { font-size: 18px; margin: 28px 0 8px 0; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
p.sub { color: #555; margin: 0 0 12px 0; font-size: 14px; }
table.num { border-collapse: collapse; font-size: 14px; }
table.num th, table.num td { border: 1px solid #ccc; padding: 4px 10px; text-align: right; }
table.num th { background: #f3f3f3; }
table.num td.l, table.num th.l { text-align: left; }
table.num tr.total td { font-weight: 600; background: #fafafa; }
td.lost { background: #fde0dc; color: #a50e0e; font-weight: 600; }
td.na { color: #aaa; }
.row { display: flex; flex-wrap: wrap; gap: 10px; align-items: flex-start; margin: 10px 0 18px 0;
       padding-bottom: 12px; border-bottom: 1px solid #eee; }
.cell { width: 124px; font-size: 12px; line-height: 1.35; word-wrap: break-word; }
.cell img, .cell .missing { width: 112px; height: 112px; display: block; border: 3px solid transparent;
       image-rendering: pixelated; object-fit: cover; background: #eee; }
.cell.query img { border-color: #1a5fb4; }
.cell.match img { border-color: #26a269; }
.cell .missing { display: flex; align-items: center; justify-content: center; color: #888; font-size: 11px;
       text-align: center; }
.cell .name { font-weight: 600; }
.cell .ok { color: #26a269; font-weight: 600; }
.error { color: #a50e0e; font-size: 14px; padding: 8px; background: #fde0dc; border-radius: 4px; }
.plot { max-width: 100%; height: auto; }
.legend { font-size: 13px; color: #555; }
.classes { font-size: 13px; }
"""

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>{style}</style>
</head>
<body>
<h1>{title}</h1>
<p class="sub">{subtitle}</p>
{body}
</body>
</html>
"""


def esc(value) -> str:
    return html.escape(str(value), quote=True)


def page(title: str, subtitle: str, body: str) -> str:
    return _PAGE.format(title=esc(title), subtitle=esc(subtitle), style=_STYLE, body=body)


def write(path: str, text: str) -> str:
    """Writes the page atomically (a browser or a test never reads half a page); returns ``path``."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
    return path


def _uri(data: bytes, mime: str) -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode("ascii")


def thumbnail_uri(image: np.ndarray, side: int = THUMB) -> str:
    """A uint8 [H, W(, C)] image as a ``side`` x ``side`` thumbnail (centre crop of the shorter side;
    pixels kept sharp when enlarged) in a data URI: PNG for small images, JPEG for photos."""
    arr = np.asarray(image, np.uint8)
    if arr.ndim == 3 and arr.shape[-1] == 1:
        arr = arr[..., 0]
    im = Image.fromarray(arr)
    w, h = im.size
    s = min(w, h)
    im = im.crop(((w - s) // 2, (h - s) // 2, (w - s) // 2 + s, (h - s) // 2 + s))
    small = s <= 64  # e.g. 28x28 Fashion-MNIST: enlarge without blurring, PNG keeps it exact and small
    im = im.resize((side, side), Image.Resampling.NEAREST if small else Image.Resampling.BILINEAR)
    buf = io.BytesIO()
    if small:
        im.save(buf, format="PNG", **PNG_OPTIONS)
        return _uri(buf.getvalue(), "image/png")
    im.convert("RGB").save(buf, format="JPEG", quality=85)
    return _uri(buf.getvalue(), "image/jpeg")


def figure_uri(fig, dpi: int = 100) -> str:
    """A matplotlib figure as a PNG data URI (the figure is closed)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plots.pyplot().close(fig)
    return _uri(buf.getvalue(), "image/png")


def img(uri: str, alt: str, cls: str = "") -> str:
    """An image; its ``alt`` text is also its tooltip (e.g. a hit's source file)."""
    return f'<img src="{uri}" alt="{esc(alt)}" title="{esc(alt)}"{f" class={chr(34)}{cls}{chr(34)}" if cls else ""}>'


def cell(image_uri: str | None, lines: list[str], cls: str = "", alt: str = "") -> str:
    """A thumbnail with lines under it (``lines`` are HTML); without an image a grey square says so."""
    picture = img(image_uri, alt) if image_uri else '<div class="missing">image not available</div>'
    return f'<div class="cell {cls}">{picture}' + "".join(f"<div>{line}</div>" for line in lines) + "</div>"


def table(
    head: list[str], rows: Sequence[Sequence[str | tuple[str, str]]], row_classes: list[str] | None = None, left=(0,)
) -> str:
    """``head`` and ``rows``: cell HTML; a cell given as ``(html, class)`` gets that class.  Columns
    ``left`` (text) are left-aligned, the others (numbers) right-aligned."""

    def td(value, tag, i):
        text, cls = value if isinstance(value, tuple) else (value, "")
        cls = " ".join(c for c in (cls, "l" if i in left else "") if c)
        return f"<{tag}{f' class={chr(34)}{cls}{chr(34)}' if cls else ''}>{text}</{tag}>"

    out = ['<table class="num">', "<tr>" + "".join(td(h, "th", i) for i, h in enumerate(head)) + "</tr>"]
    for r, row in enumerate(rows):
        cls = (row_classes or [""] * len(rows))[r]
        out.append(
            f"<tr{f' class={chr(34)}{cls}{chr(34)}' if cls else ''}>"
            + "".join(td(v, "td", i) for i, v in enumerate(row))
            + "</tr>"
        )
    return "\n".join(out + ["</table>"])


def pct(value) -> str:
    """A fraction as a percentage with two decimals, as the text tables print it; ``-`` for none."""
    return "-" if value is None or (isinstance(value, float) and np.isnan(value)) else f"{100 * value:.2f}"
