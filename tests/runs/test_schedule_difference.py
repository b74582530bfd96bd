"""scripts/schedule_difference.py: the across-DIR paired table of RESULTS.md's schedule study."""

import json
import os
import subprocess
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _write(workdir, method, seed, ar1, drop):
    run = workdir / f"seed{seed}" / method
    run.mkdir(parents=True)
    recall = {"1": ar1 / 100, "2": (ar1 + 5) / 100, "4": (ar1 + 9) / 100}
    (run / "results.json").write_text(json.dumps({"average_recall": recall, "compatibility_mean_drop": drop}))


def test_interaction_is_the_difference_of_the_per_dir_gaps(tmp_path):
    ar1 = {  # (dir, method) -> AR@1 per seed
        ("base", "a"): [80.0, 81.0, 79.0],
        ("base", "b"): [78.0, 80.5, 78.0],
        ("new", "a"): [84.0, 85.5, 82.0],
        ("new", "b"): [83.0, 83.0, 81.5],
    }
    for (d, m), values in ar1.items():
        for seed, v in enumerate(values):
            _write(tmp_path / d, m, seed, v, -0.01 * (seed + 1))
    proc = subprocess.run(
        [
            sys.executable,
            "scripts/schedule_difference.py",
            str(tmp_path / "base"),
            str(tmp_path / "new"),
            "--methods",
            "a,b",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=REPO),
    )
    assert proc.returncode == 0, proc.stderr
    rows = {line.split(" | ")[0].lstrip("| "): line for line in proc.stdout.splitlines()[2:]}
    gap = lambda d: np.subtract(ar1[(d, "a")], ar1[(d, "b")])  # noqa: E731
    interaction = gap("new") - gap("base")
    d = interaction.mean()
    half = 4.302653 * interaction.std(ddof=1) / np.sqrt(3)  # t(0.975, df=2)
    assert f"{d:+.2f} [{d - half:+.2f}, {d + half:+.2f}]" in rows["(a - b): new - base"].split(" | ")[1]
    own = np.subtract(ar1[("new", "a")], ar1[("base", "a")]).mean()
    assert rows["a: new - base"].split(" | ")[1].startswith(f"{own:+.2f}")
    assert rows["a - b, new"].split(" | ")[4].startswith("+0.00")  # equal BC in both entries


def test_missing_run_is_one_error_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "scripts/schedule_difference.py", str(tmp_path), str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=REPO),
    )
    assert proc.returncode == 2 and proc.stderr.strip().startswith("error: ") and "does not exist" in proc.stderr
