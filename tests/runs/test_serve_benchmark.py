"""``benchmarks/serve.py --quick`` runs end to end and reports every loop and goal line (a measurement:
minutes on a CPU, so it is marked ``benchmark`` and left out of the default suite)."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.benchmark
def test_serve_benchmark_quick(tmp_path):
    out = tmp_path / "serve.json"
    cmd = [sys.executable, os.path.join(REPO, "benchmarks", "serve.py"), "--quick", "--out", str(out)]
    text = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=1800).stdout
    results = json.loads(out.read_text())
    for system in ("serve", "search process per query", "FastAPI + export + faiss IndexFlatIP"):
        assert set(results["loops"][system]) == {"1", "4", "16"}
        assert all(r["failed"] == 0 for r in results["loops"][system].values())
    assert "single query p50" in text and "queries/s of 16 clients" in text
