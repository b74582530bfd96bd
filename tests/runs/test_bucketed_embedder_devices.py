"""The bucketed embedder on 4 CPU devices (a subprocess: the device count is fixed at start): a short
chunk is padded to a multiple of the device count, and the rows equal one device's within EXACTNESS."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from cvs_jax.testing import xla_env

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = """
import json, jax, numpy as np
from configs import image_folder_general
from cvs_jax.augment import transforms as augment
from cvs_jax.models import networks as models
from cvs_jax import distributed
from cvs_jax.retrieval.embedder import Embedder

c = image_folder_general.get_config("cpu")
c.data.stored_size, c.augment.size, c.model.width, c.model.embed_dim = 16, 12, 4, 8
model = models.from_config(c)
k0, k1 = jax.random.split(jax.random.key(0))
variables = jax.device_get(models.init_variables(model, c, (16, 16, 3), 10, k0, k1))
images = np.random.default_rng(0).integers(0, 256, (70, 16, 16, 3), np.uint8)
out = {}
for devices in (1, 4):
    mesh = distributed.data_mesh(jax.devices()[:devices])
    embed = Embedder(model, augment.Pipeline.from_config(c), 64, "float32", mesh, 8)
    out[devices] = {"one": embed(variables, images[:1]).tolist(), "rows_one": embed.rows_run}
    out[devices]["all"] = embed(variables, images).tolist()
    out[devices]["rows_all"] = embed.rows_run - out[devices]["rows_one"]
print(json.dumps(out))
"""


def test_short_chunks_pad_to_a_multiple_of_the_devices():
    env = {
        **os.environ,
        "XLA_FLAGS": xla_env.with_flags("--xla_force_host_platform_device_count=4"),
        "JAX_PLATFORMS": "cpu",
    }
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    # 1 image: a bucket of 1 on one device, of 4 (one row per device) on four
    assert (out["1"]["rows_one"], out["4"]["rows_one"]) == (1, 4)
    # 70 images: a chunk of 64, then 6 rows padded to 6 on one device and to 8 on four
    assert (out["1"]["rows_all"], out["4"]["rows_all"]) == (64 + 6, 64 + 8)
    for key in ("one", "all"):
        one, four = np.asarray(out["1"][key]), np.asarray(out["4"][key])
        assert one.shape == four.shape
        np.testing.assert_allclose(four, one, rtol=0, atol=1e-5 * np.abs(one).max())
