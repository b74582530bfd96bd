"""No tracker references in the repository: a clone has no issue tracker, so a comment, docstring or
message that says "see issue <number>" points nowhere. Each such line says in words what it means (the
behaviour, the finding) instead. The user-facing pages (README.md, RESULTS.md, BENCHMARKS.md, docs/) are checked too."""

import os
import re
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRACKER_REF = re.compile(r"\bissues?[\s#-]*\d+", re.IGNORECASE)
NOT_YET = ("tests/test_docs_links.py",)  # its own checker of the pages, whose examples are tracker references


def repository_files() -> list[str]:
    """The tracked files and the new ones git would track (``git ls-files``); outside a git checkout,
    every file under the root but the environment, build and run outputs."""
    proc = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if proc.returncode == 0:
        return [p for p in proc.stdout.split("\0") if p]
    skip = {".git", ".venv", "build", "workdirs", "__pycache__"}
    found = []
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in skip and not d.endswith(".egg-info")]
        found += [os.path.relpath(os.path.join(root, f), REPO) for f in files]
    return found


def tracker_references(paths: list[str]) -> list[str]:
    hits = []
    for rel in paths:
        if rel.startswith(NOT_YET) or not os.path.isfile(os.path.join(REPO, rel)):
            continue
        with open(os.path.join(REPO, rel), "rb") as f:
            data = f.read()
        if b"\0" in data:  # binary: fixtures, packaged arrays
            continue
        for n, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            if TRACKER_REF.search(line):
                hits.append(f"{rel}:{n}: {line.strip()}")
    return hits


def test_the_pattern_finds_tracker_references_and_nothing_else():
    found = ("see issue {n}", "Issue {n}'s race", "(issue #{n})", "issues {n} and 4", "issue-{n}")  # {n}: no hit here
    for text in (t.format(n=26) for t in found):
        assert TRACKER_REF.search(text), text
    for text in ("the issue's goals", "tissue 3", "an issue with 2 sessions", "#10003;"):
        assert not TRACKER_REF.search(text), text


def test_no_tracker_references_outside_the_pages_being_rewritten():
    paths = repository_files()
    assert "cvs_jax/main.py" in paths and "tests/test_docs_refs.py" in paths  # the listing reached the tree
    assert tracker_references(paths) == []
