"""Text columns as a terminal shows them: a CJK character takes two columns and a combining accent none,
so ``str.ljust`` misaligned the tables of ``info`` and ``search`` for class names such as ``猫`` or a
decomposed ``crème`` (``len`` counts code points, not columns)."""

from __future__ import annotations

import unicodedata


def width(text: str) -> int:
    """Columns ``text`` takes in a terminal: 2 for East Asian wide and fullwidth characters, 0 for combining
    marks and format characters, 1 otherwise."""
    columns = 0
    for c in text:
        if unicodedata.combining(c) or unicodedata.category(c) in ("Mn", "Me", "Cf"):
            continue
        columns += 2 if unicodedata.east_asian_width(c) in ("W", "F") else 1
    return columns


def pad(text: str, columns: int, *, right: bool = False) -> str:
    """``text`` padded with spaces to ``columns`` terminal columns (on the left with ``right``)."""
    fill = " " * max(0, columns - width(text))
    return fill + text if right else text + fill
