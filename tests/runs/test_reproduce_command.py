"""``python -m cvs_jax.reproduce`` as a subprocess: --help, --plan, a report over fake result directories,
and its error line."""

import json
import os
import subprocess
import sys

from cvs_jax.reports import paper_results
from cvs_jax.testing.result_dirs import fake_results

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(*args):
    return subprocess.run(
        [sys.executable, "-m", "cvs_jax.reproduce", *args], cwd=REPO, capture_output=True, text=True, timeout=300
    )


def test_command_line_help_plan_results_and_errors(tmp_path):
    proc = _run("--help")
    assert proc.returncode == 0, proc.stderr
    assert "--plan" in proc.stdout and "python -m cvs_jax.reproduce DIR" in proc.stdout
    proc = _run("--plan", "--plan_seeds", "0", "--output_json", str(tmp_path / "plan.json"))
    assert proc.returncode == 0, proc.stderr
    assert sum(line.startswith("Table 1 | ") for line in proc.stdout.splitlines()) == 24
    assert len(json.load(open(tmp_path / "plan.json"))["cells"]) == len(paper_results.ENTRIES)
    dirs = fake_results(tmp_path)
    proc = _run(*dirs)
    assert proc.returncode == 0, proc.stderr
    assert "not run" in proc.stdout and "-2.95 / -1.23 / -0.34" in proc.stdout
    proc = _run("/nonexistent/results")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: /nonexistent/results is not a directory; name the --workdir of a compare or main run."
    ]
