"""The reading commands run for real in a fresh process, reporting which heavy modules each step loaded.

``search`` (with ``--html``: thumbnails read from the run's stores), ``info``, ``export``, ``search --add``
and the server (start-up, ``/search``, a thumbnail, ``/add``) read a trained run's record stores through
``data.stores`` alone: none of them should import tensorflow_datasets (or TensorFlow), which only
preparing a store (``main``, ``update``) needs.  A fresh process, because a test process has usually
imported it already (its fixtures trained runs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

HEAVY = ("tensorflow_datasets", "tensorflow")
STEPS = ("info", "search", "export", "serve start", "serve search", "serve thumbnail", "serve add", "search --add")

_SCRIPT = r"""
import json, os, sys
from absl import flags
from cvs_jax import export, info, search

wd, query, new, new2, out = sys.argv[1:6]
loaded = {}

def note(step):
    loaded[step] = sorted(m for m in HEAVY if m in sys.modules)

def cli(module, *args):
    fv = flags.FlagValues()
    module.define_flags(fv)
    assert module.main(fv([module.__name__, *args]), fv) == 0, (module.__name__, args)

cli(info, "--workdir", wd)
note("info")
cli(search, "--workdir", wd, "--images", query, "--html", os.path.join(out, "hits.html"))
note("search")
cli(export, "--workdir", wd, "--out", os.path.join(out, "export"))
note("export")
from fastapi.testclient import TestClient
from cvs_jax.serve.app import create_app
from cvs_jax.serve.state import Served
served = Served(wd, poll_s=0, max_batch=4)
client = TestClient(create_app(served))
note("serve start")
with open(query, "rb") as f:
    hits = client.post("/search", files=[("file", ("q.png", f.read()))]).json()["queries"][0]["hits"]
note("serve search")
assert client.get(f"/thumb/{hits[0]['id']}.png").status_code == 200
note("serve thumbnail")
with open(new, "rb") as f:
    r = client.post("/add", files=[("file", ("new.png", f.read()))], data={"label": hits[0]["class_name"]})
assert r.status_code == 200, r.text
note("serve add")
served.close()
cli(search, "--workdir", wd, "--images", new2, "--add", "--label", hits[0]["class_name"])
note("search --add")
print(json.dumps(loaded))
"""


def heavy_modules_by_step(workdir: str, query: str, new_images: tuple[str, str], out: str) -> dict[str, list[str]]:
    """Runs the steps (``STEPS``) on ``workdir`` (it gains two added rows: pass a copy) in a fresh process;
    returns, after each, the ``HEAVY`` modules the process had imported.  ``query``: an image to search
    for; ``new_images``: two whose bytes are in no run (the server's ``/add``, ``search --add``); ``out``: a
    new folder."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.makedirs(out, exist_ok=True)
    script = f"HEAVY = {HEAVY!r}\n" + _SCRIPT
    done = subprocess.run(
        [sys.executable, "-c", script, workdir, query, *new_images, out],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])
