"""A command's ``--help`` prints its module docstring, so the example written there must be the one
printed. In a plain (non-raw) string a backslash at the end of a line is a line continuation: Python
drops it and the newline, and ``python -m cvs_jax.main --help`` printed its two-line example as one
line with a run of spaces in the middle. Read from the source, no import: no JAX, no compile."""

from __future__ import annotations

import ast
import pathlib

REPO = pathlib.Path(__file__).resolve().parent.parent
HELP_FROM_DOCSTRING = ("cli.run(", "description=__doc__")  # entry points whose --help is the docstring


def help_modules(repo: pathlib.Path = REPO) -> list[pathlib.Path]:
    """The commands and scripts that print their module docstring as their help."""
    found = []
    for folder in ("cvs_jax", "scripts", "benchmarks"):
        for path in sorted((repo / folder).rglob("*.py")):
            if any(marker in path.read_text(encoding="utf-8") for marker in HELP_FROM_DOCSTRING):
                found.append(path)
    return found


def swallowed_continuations(source: str) -> list[int]:
    """Line numbers (in the file) of docstring lines ending in a backslash that Python swallows: the
    docstring is not a raw string and the backslash is not itself escaped."""
    tree = ast.parse(source)
    doc = tree.body[0].value if tree.body and isinstance(tree.body[0], ast.Expr) else None
    if not (isinstance(doc, ast.Constant) and isinstance(doc.value, str)):
        return []
    literal = ast.get_source_segment(source, doc) or ""
    if literal[:1] in "rR":
        return []
    lines = []
    for n, line in enumerate(literal.splitlines(), doc.lineno):
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            lines.append(n)
    return lines


def test_the_rule_finds_a_swallowed_continuation_and_nothing_else():
    plain = '"""Run it.\n\n    python -m x --a 1 \\\n        --b 2\n"""\n'
    assert swallowed_continuations(plain) == [3]
    assert swallowed_continuations("r" + plain) == []
    assert swallowed_continuations(plain.replace(" \\\n", " \\\\\n")) == []  # an escaped backslash prints
    assert swallowed_continuations("import os\n") == []


def test_every_help_text_prints_its_example_as_written():
    modules = help_modules()
    names = {p.relative_to(REPO).as_posix() for p in modules}
    assert {"cvs_jax/main.py", "cvs_jax/compare.py", "cvs_jax/serve/__main__.py"} <= names  # the scan found them
    problems = [
        f"{p.relative_to(REPO)}:{n}" for p in modules for n in swallowed_continuations(p.read_text(encoding="utf-8"))
    ]
    assert not problems, 'make the docstring raw (r"""...) or escape the backslash:\n' + "\n".join(problems)
