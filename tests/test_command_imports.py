"""Start-up cost: the commands that read a run (``search``, ``info``, ``export``, the server) and those that
train (``main``, ``update``, ``compare``) do not import
matplotlib or tensorflow_datasets (~0.4 s each per process) just by being imported; they load matplotlib
when they draw a picture.  Run for real, they never load tensorflow_datasets: ``testing/reading_probe.py``,
checked on a photo run (tests/serve/test_serve_api.py) and a Fashion-MNIST run (tests/runs/test_export.py)."""

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HEAVY = ("matplotlib", "tensorflow_datasets")
# and the commands that train: a rerun, a resumed run or an update on a prepared store reads it without TFDS
# (0.8 s of CPU a process; TFDS comes with `data/builders/tfds_builders.py` when a dataset is prepared)
COMMANDS = (
    *("cvs_jax.search", "cvs_jax.info", "cvs_jax.export", "cvs_jax.serve.__main__", "cvs_jax.serve.app"),
    *("cvs_jax.main", "cvs_jax.update", "cvs_jax.compare"),
)

_PROBE = f"""
import importlib, json, sys
loaded = {{}}
for name in {COMMANDS!r}:
    importlib.import_module(name)
    loaded[name] = sorted(m for m in {HEAVY!r} if m in sys.modules)
print(json.dumps(loaded), flush=True)
from cvs_jax.reports import plots
plt = plots.pyplot()
import matplotlib
print(json.dumps({{"backend": matplotlib.get_backend().lower(), "same": plt is plots.pyplot()}}))
"""


def test_reading_commands_import_neither_matplotlib_nor_tfds_until_used():
    out = subprocess.run([sys.executable, "-c", _PROBE], cwd=REPO, capture_output=True, text=True, timeout=300)
    lines = out.stdout.splitlines()
    assert lines, out.stderr
    assert json.loads(lines[0]) == {name: [] for name in COMMANDS}
    assert out.returncode == 0, out.stderr
    report = json.loads(lines[1])
    # the first picture loads pyplot once, on the file-only Agg backend (no display needed)
    assert report["backend"] == "agg" and report["same"]
