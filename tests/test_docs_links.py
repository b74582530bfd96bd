"""The documentation holds together: every relative link and image in README.md, RESULTS.md,
BENCHMARKS.md and docs/*.md names a file that exists, every ``#anchor`` names a heading of its target
(GitHub's slug rule), the README stays a front page (at most 1,500 words), and no page points at an
issue tracker a clone does not have ("issue 22", "issue #22", "#22")."""

from __future__ import annotations

import pathlib
import re
import unicodedata

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
README_MAX_WORDS = 1500

_FENCE = re.compile(r"^ {0,3}(```|~~~)")
_INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
_HTML = re.compile(r"<(?:a|img)\b[^>]*?\b(?:href|src)\s*=\s*[\"']([^\"']+)[\"']", re.I)
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_HTML_ANCHOR = re.compile(r"<a\s[^>]*\b(?:name|id)\s*=\s*[\"']([^\"']+)[\"']", re.I)
_TRACKER = re.compile(r"\bissues?\s*#?\s*\d+|(?<![\w&/#])#\d+\b", re.I)


def doc_files(repo: pathlib.Path = REPO) -> list[pathlib.Path]:
    """The pages a reader follows links between."""
    top = [repo / name for name in ("README.md", "RESULTS.md", "BENCHMARKS.md")]
    return [p for p in top if p.exists()] + sorted((repo / "docs").glob("*.md"))


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks: links and headings in code are not links."""
    out, fence = [], None
    for n, line in enumerate(text.splitlines(), 1):
        m = _FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif line.strip().startswith(fence):
                fence = None
            continue
        if fence is None:
            out.append((n, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its rendered text, lower-cased, every character but letters,
    digits, spaces, hyphens and underscores dropped, spaces made hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").lower()
    kept = []
    for ch in text:
        cat = unicodedata.category(ch)
        if ch in " -_" or cat[0] in "LN" or cat == "Mn":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
    """Every anchor GitHub gives the page: one per heading, repeats numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        out.update(_HTML_ANCHOR.findall(line))
        m = _HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def links(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line number, target) of every link and image in the page's prose."""
    found = []
    for n, line in prose_lines(path.read_text(encoding="utf-8")):
        line = _INLINE_CODE.sub("", line)
        for pattern in (_LINK, _REF_DEF, _HTML):
            found += [(n, target) for target in pattern.findall(line)]
    return found


def broken_links(files: list[pathlib.Path]) -> list[str]:
    """'file:line: target (why)' for each relative link whose file or heading does not exist."""
    problems = []
    for page in files:
        for n, target in links(page):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("//"):
                continue  # http:, https:, mailto:: not checked offline
            file_part, _, anchor = target.partition("#")
            dest = (page.parent / file_part).resolve() if file_part else page
            where = f"{page.relative_to(page.parent.parent) if page.parent.name == 'docs' else page.name}:{n}"
            if not dest.exists():
                problems.append(f"{where}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{where}: {target} (no heading with anchor #{anchor} in {dest.name})")
    return problems


def tracker_references(files: list[pathlib.Path]) -> list[str]:
    """'file:line: text' for each reference to an issue tracker (code blocks included)."""
    problems = []
    for page in files:
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            problems += [f"{page.name}:{n}: {m.group(0)!r}" for m in _TRACKER.finditer(line)]
    return problems


def word_count(text: str) -> int:
    """As ``wc -w`` counts: runs of non-whitespace."""
    return len(text.split())


def test_every_relative_link_and_image_resolves():
    files = doc_files()
    assert len(files) >= 4 and any(f.parent.name == "docs" for f in files)
    assert sum(len(links(f)) for f in files) > 20  # the pages do link to each other
    problems = broken_links(files)
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_readme_is_a_front_page():
    words = word_count((REPO / "README.md").read_text(encoding="utf-8"))
    assert words <= README_MAX_WORDS, f"README.md has {words} words; move detail into docs/"


def test_no_issue_tracker_references():
    found = tracker_references(doc_files())
    assert not found, "say what the tracker reference meant, in words:\n" + "\n".join(found)


def test_readme_keeps_the_quickstart_commands():
    """scripts/test.sh and .ci/run run "the README's test command"; the front page must show it."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "bash scripts/demo.sh" in readme and "bash scripts/test.sh" in readme


@pytest.mark.parametrize(
    "heading, expected",
    [
        ("Deviations and switches", "deviations-and-switches"),
        ("Export to an ANN index", "export-to-an-ann-index"),
        ("Heads × methods on the demo: 5 seeds (one split)", "heads--methods-on-the-demo-5-seeds-one-split"),
        ("`image_folder_general.py`'s default", "image_folder_generalpys-default"),
        ("Tiny-ImageNet mini on one GPU (`:gpu`): not run yet", "tiny-imagenet-mini-on-one-gpu-gpu-not-run-yet"),
        ("See [the docs](docs/index.md)", "see-the-docs"),
    ],
)
def test_slug_follows_github(heading, expected):
    assert slug(heading) == expected


def test_checker_finds_broken_links_anchors_and_tracker_references(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.png").write_bytes(b"")
    (tmp_path / "docs" / "page.md").write_text(
        "# Page\n\n## Same\n\n## Same\n\nSee [ok](page.md#same-1) and [top](#page) and ![img](a.png).\n"
        "In `[code](nowhere.md)` and\n```\n[fenced](nowhere.md)\n# not a heading\n```\n",
        encoding="utf-8",
    )
    (tmp_path / "README.md").write_text(
        "# R\n\n[good](docs/page.md#same) [gone](docs/missing.md) ![pic](docs/b.png)\n"
        "[bad anchor](docs/page.md#not-a-heading) [fenced anchor](docs/page.md#not-a-heading-1) "
        '<img src="docs/a.png"> [web](https://example.com/x.md)\n\nAs issue 22 said (issue #5; see #6).\n',
        encoding="utf-8",
    )
    files = doc_files(tmp_path)
    assert [f.name for f in files] == ["README.md", "page.md"]
    problems = broken_links(files)
    assert problems == [
        "README.md:3: docs/missing.md (no such file)",
        "README.md:3: docs/b.png (no such file)",
        "README.md:4: docs/page.md#not-a-heading (no heading with anchor #not-a-heading in page.md)",
        "README.md:4: docs/page.md#not-a-heading-1 (no heading with anchor #not-a-heading-1 in page.md)",
    ]
    assert tracker_references(files) == ["README.md:6: 'issue 22'", "README.md:6: 'issue #5'", "README.md:6: '#6'"]
    assert word_count("one two\tthree\n four") == 4
