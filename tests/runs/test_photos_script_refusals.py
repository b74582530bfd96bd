"""``scripts/photos_from_tiny_imagenet.py`` (the README walkthrough's first command) in a clone without
the shared data: one ``error:`` line saying where the zip comes from, no traceback, nothing written."""

from __future__ import annotations

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(*args):
    cmd = [sys.executable, "scripts/photos_from_tiny_imagenet.py", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)


def test_missing_or_broken_zip_is_one_line_naming_where_it_comes_from(tmp_path):
    out = tmp_path / "photos"
    for zip_path in (tmp_path / "shared" / "data" / "tiny-imagenet-200-mini.zip", tmp_path / "notazip.zip"):
        if zip_path.name == "notazip.zip":
            zip_path.write_bytes(b"not a zip")
        proc = _run("--zip", str(zip_path), "--out", str(out), "--classes", "3")
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: --zip {zip_path}"), proc.stderr
        assert "shared data" in lines[0] and "--config.data.manual_dir" in lines[0]
        assert not out.exists()
