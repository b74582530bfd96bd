"""docs/your-images.md ("Your own images"): every command of the walkthrough, run as written (from a folder laid out
like the repository root beside ../shared/data), and its promises checked: three sessions from main +
two updates, search hits that are files, an export that faiss searches, and the manifest run equal to
the live one.

``as_written`` runs them verbatim (about 6 1/2 minutes on 2 cores): marked ``slow``, outside the default
suite (``pytest -m slow tests/runs/test_readme_walkthrough.py``).  ``one_epoch`` runs the same commands with
``--config.train.epochs=1`` and 32-pixel images (``--config.data.stored_size=32
--config.augment.size=28``, a quarter of ``:cpu``'s pixels) appended to the two ``cvs_jax.main``
commands (``update``, ``search`` and ``export`` keep the run's recipe and stored size), so CI checks
every command, path and promise at a fraction of the training."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = os.path.join(os.path.dirname(REPO), "shared")
MINI_ZIP = os.path.join(SHARED, "data", "tiny-imagenet-200-mini.zip")
DOC_PAGE = os.path.join("docs", "your-images.md")


def walkthrough_blocks() -> tuple[list[str], str]:
    """The page's bash commands (one per line) and its python snippet (the export to faiss)."""
    with open(os.path.join(REPO, DOC_PAGE), encoding="utf-8") as f:
        page = f.read()
    bash = re.search(r"```bash\n(.*?)```", page, re.S).group(1)
    python = re.search(r"```python\n(.*?)```", page, re.S).group(1)
    return [line for line in bash.splitlines() if line.strip()], python


def _results(path: str) -> list[dict]:
    with open(path) as f:
        per_session = json.load(f)["per_session"]
    for r in per_session:
        r.pop("seconds")
    return per_session


@pytest.mark.skipif(not os.path.exists(MINI_ZIP), reason="needs ../shared/data/tiny-imagenet-200-mini.zip")
@pytest.mark.parametrize(
    "extra",
    [
        pytest.param([], id="as_written", marks=pytest.mark.slow),
        pytest.param(
            ["--config.train.epochs=1", "--config.data.stored_size=32", "--config.augment.size=28"], id="one_epoch"
        ),
    ],
)
def test_readme_walkthrough_runs(tmp_path, extra):
    root = tmp_path / "repo"
    root.mkdir()
    os.symlink(os.path.join(REPO, "configs"), root / "configs")
    os.symlink(os.path.join(REPO, "scripts"), root / "scripts")
    os.symlink(SHARED, tmp_path / "shared")
    env = dict(os.environ, PYTHONPATH=REPO, HOME=str(tmp_path / "home"))
    commands, snippet = walkthrough_blocks()
    assert len(commands) == 8
    outputs = []
    for line in commands:
        argv = shlex.split(line)
        assert argv[0] == "python", line
        if argv[1:3] == ["-m", "cvs_jax.main"]:
            argv += extra
        done = subprocess.run([sys.executable] + argv[1:], cwd=root, env=env, capture_output=True, text=True)
        assert done.returncode == 0, f"{line}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        outputs.append(done.stdout)

    live = _results(root / "workdirs" / "mine" / "results.json")
    assert len(live) == 3
    assert live == _results(root / "workdirs" / "manifest" / "results.json")
    hits = re.findall(re.escape(str(root / "workdirs" / "photos")) + r"[^\n]*?\.JPEG", outputs[4])
    assert len(hits) == 3 and all(os.path.isfile(h) for h in hits), outputs[4]
    assert "compatibility (recall@1" in outputs[7] and "session 3:" in outputs[7]  # info
    for page in (root / "workdirs" / "mine" / "report.html", root / "workdirs" / "mine-hits.html"):
        assert page.is_file() and page.read_text().rstrip().endswith("</html>"), page

    pytest.importorskip("faiss")
    namespace: dict = {}
    cwd = os.getcwd()
    os.chdir(root)
    try:
        exec(compile(snippet, DOC_PAGE, "exec"), namespace)  # noqa: S102 -- the page's own code
    finally:
        os.chdir(cwd)
    assert namespace["ids"].shape == (1, 5)
