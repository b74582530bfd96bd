"""What the pages say a command writes is what it writes, where the code names it in one constant: a
page that lists ``rows.csv``'s columns lists ``export.ROW_COLUMNS``, in order (docs/your-images.md
listed six of the seven, without ``id``). Reads the pages and the constant: no run, no compile."""

from __future__ import annotations

import pathlib
import re

from cvs_jax import export

REPO = pathlib.Path(__file__).resolve().parent.parent

_ROWS_CSV = re.compile(r"`rows\.csv`\s*\(`([^`]+)`")


def listed_columns(text: str) -> list[list[str]]:
    """Every column list a page gives as "`rows.csv` (`a, b, ...`", a list that may wrap across lines."""
    return [[c.strip() for c in m.group(1).split(",")] for m in _ROWS_CSV.finditer(text)]


def test_the_pattern_reads_a_wrapped_column_list():
    assert listed_columns("`rows.csv` (`row, path,\nlabel`), and `rows.csv` alone") == [["row", "path", "label"]]


def test_pages_list_the_exported_rows_csv_columns():
    pages = [REPO / "README.md", REPO / "RESULTS.md", REPO / "BENCHMARKS.md", *sorted((REPO / "docs").glob("*.md"))]
    found = {p.name: listed_columns(p.read_text(encoding="utf-8")) for p in pages}
    assert any(found.values()), "no page lists rows.csv's columns any more: drop this test or its pattern"
    wrong = {name: lists for name, lists in found.items() for cols in lists if cols != list(export.ROW_COLUMNS)}
    assert not wrong, f"rows.csv has the columns {', '.join(export.ROW_COLUMNS)}; the pages say {wrong}"
