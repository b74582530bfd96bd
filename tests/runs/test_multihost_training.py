"""Multi-host training with several devices per process: 2 processes x 2 CPU devices on
loopback train the smoke config as 1 process x 4 devices does, also when one process reaches its first
collective 40 s after the other (the Gloo connection timeout is 30 s).  Slow: three small runs of
``python -m cvs_jax.main`` (about 6 min on the shared 2-core host)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.slow

# python -m cvs_jax.main, except that process 1 sleeps SKEW seconds at its first global batch after
# jax.distributed is up: the processes then meet at the first collective over all devices that far apart.
LATE_MAIN = """\
import os, sys, time
from cvs_jax import cli, distributed, main

distributed.maybe_initialize(True)
_put = distributed.global_batch
_late = [os.environ["JAX_PROCESS_ID"] == "1"]

def global_batch(*args, **kwargs):
    if _late.pop() if _late else False:
        time.sleep(float(os.environ["SKEW"]))
    return _put(*args, **kwargs)

distributed.global_batch = global_batch
sys.argv[0] = "cvs_jax.main"
cli.run(main.main, main.define_flags)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(devices: int, **extra: str) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("CVS_JAX_MULTIHOST", None)
    env.update(extra)
    return env


def _args(manual_dir: str, tmp_path, workdir: str) -> list[str]:
    return [
        "--config",
        "configs/fashion_mnist_general.py:smoke",
        "--workdir",
        workdir,
        f"--config.data.manual_dir={manual_dir}",
        f"--config.data.data_dir={tmp_path / 'tfds'}",
    ]


def _summary(workdir: str) -> tuple[list[dict], np.ndarray]:
    from cvs_jax.retrieval import run_reader

    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        lines = [json.loads(line) for line in f]
    for line in lines:
        line.pop("time", None)
        line.pop("images_per_s", None)
    return lines, np.asarray(run_reader.Run(workdir).rows.embeddings[:])


def test_two_processes_of_two_devices_train_as_one_process_of_four(manual_dir, tmp_path):
    one = str(tmp_path / "one")
    subprocess.run(
        [sys.executable, "-m", "cvs_jax.main", *_args(manual_dir, tmp_path, one)],
        env=_env(4),
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=900,
    )
    two = str(tmp_path / "two")
    port, procs = _free_port(), []
    for pid in range(2):
        env = _env(
            2,
            CVS_JAX_MULTIHOST="1",
            JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
            JAX_NUM_PROCESSES="2",
            JAX_PROCESS_ID=str(pid),
            SKEW="40",
        )
        args = [sys.executable, "-c", LATE_MAIN, *_args(manual_dir, tmp_path, two)]
        procs.append(
            subprocess.Popen(args, env=env, cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        )
    try:
        outs = [p.communicate(timeout=900)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-4000:]
    assert "devices: cpu 4 x cpu (2 local), 2 process(es)" in outs[0]
    (lines_one, rows_one), (lines_two, rows_two) = _summary(one), _summary(two)
    assert [sorted(x) for x in lines_one] == [sorted(x) for x in lines_two]
    for a, b in zip(lines_one, lines_two):  # the same 4 devices: equal up to the order of float reductions
        for key, value in a.items():
            np.testing.assert_allclose(b[key], value, rtol=1e-5, atol=1e-6, err_msg=key)
    assert rows_one.shape == rows_two.shape
    np.testing.assert_allclose(rows_two, rows_one, rtol=0, atol=1e-5)
    print("max |rows 2x2 - rows 1x4|:", float(np.abs(rows_two - rows_one).max()))
