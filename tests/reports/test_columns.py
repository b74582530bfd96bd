"""Tables of ``search`` and ``info`` align class names as a terminal shows them: a CJK character takes two
columns, a combining accent none (``str.ljust`` counts code points)."""

import types
import unicodedata

from cvs_jax import search
from cvs_jax.reports import columns

WIDE, DECOMPOSED = "猫", unicodedata.normalize("NFD", "crème")


def test_width_counts_terminal_columns():
    assert [columns.width(t) for t in ("lemon", WIDE, "猫の手", DECOMPOSED, "")] == [5, 2, 6, 5, 0]
    assert columns.pad(WIDE, 4) == WIDE + "  " and columns.pad(DECOMPOSED, 6, right=True) == " " + DECOMPOSED


def test_search_table_aligns_wide_and_combining_class_names():
    names = [WIDE, DECOMPOSED, "rocking chair"]
    hits = [
        dict(rank=i + 1, score=0.9, class_name=n, label=i, arrival_session=1, model_session=1, source=f"p{i}.png")
        for i, n in enumerate(names)
    ]
    lines = search.format_hits("q.png", types.SimpleNamespace(session=0, rows=[0] * 3), hits).splitlines()[1:]
    starts = {columns.width(line) - columns.width(line.split()[-1]) for line in lines}  # where "source" starts
    assert len(starts) == 1, lines
