"""The compatibility matrix's figures stay a bounded size as a run's sessions grow: they grew 0.6-0.75 inch a
session, so a run grown to 300 sessions by ``update`` would have drawn a 22,000 px square PNG after every session
(about 2 GB), and each of its cells' numbers."""

import numpy as np
from PIL import Image

from cvs_jax.reports import plots, run_page


def _matrix(n: int) -> np.ndarray:
    m = np.random.default_rng(n).uniform(0, 1, (n, n))
    m[np.triu_indices(n, 1)] = np.nan
    return m


def test_the_png_keeps_its_small_run_size_and_is_bounded_for_many_sessions(tmp_path):
    sizes = {}
    for n in (3, 12, 120):
        path = str(tmp_path / f"m{n}.png")
        plots.compatibility(_matrix(n), path, "t")
        sizes[n] = Image.open(path).size
    assert sizes[3] == (660, 540)  # 5.5 x 4.5 inches at 120 dpi, as before
    assert sizes[12] == (int(120 * (2.5 + 0.6 * 12)), int(120 * (1.5 + 0.6 * 12)))
    side = plots.MATRIX_MAX_INCHES * 120
    assert sizes[120][0] <= side + 120 and sizes[120][1] <= side


def test_the_page_heatmap_numbers_its_cells_only_while_they_fit():
    small, lost = _matrix(5), {(1, 0), (4, 2)}
    fig = run_page.heatmap([[None if np.isnan(v) else v for v in row] for row in small], lost)
    (ax,) = [a for a in fig.axes if a.get_label() != "<colorbar>"]
    assert len(ax.texts) == 15 and len(ax.patches) == 2  # the lower triangle, and the lost cells framed
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "3", "4", "5"]
    plots.pyplot().close(fig)
    big = _matrix(120)
    fig = run_page.heatmap([[None if np.isnan(v) else v for v in row] for row in big], set())
    (ax,) = [a for a in fig.axes if a.get_label() != "<colorbar>"]
    assert len(ax.texts) == 0 and max(fig.get_size_inches()) <= plots.MATRIX_MAX_INCHES + 1.2
    assert len(ax.get_xticks()) <= 20
    plots.pyplot().close(fig)
