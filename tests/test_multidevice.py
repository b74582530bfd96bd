"""Device-count invariance, one compile per session shape, mixed precision, multi-process plumbing.

Each check that needs N devices runs in a fresh Python process started with
``XLA_FLAGS=--xla_force_host_platform_device_count=N`` (the CPU backend then has
N devices; the flag must be set before JAX starts, hence the subprocess).  The
worker half of this file (``python tests/test_multidevice.py --worker ...``)
trains the tiny CVS config with ``cvs_jax.trainer.run`` and prints a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("CVS_JAX_TEST_CACHE", "/tmp/cvs_jax_xla_cache")


# ----------------------------------------------------------------------------- worker side
def _tiny_cvs_config(manual_dir: str, data_dir: str, *, sessions: int, epochs: int, dtype: str, seed: int,
                     width: int = 4, embed_dim: int = 8):
    from configs import fashion_mnist_general

    c = fashion_mnist_general.get_config()
    c.method = "cvs"
    c.seed = seed
    c.data.manual_dir = manual_dir
    c.data.data_dir = data_dir
    c.data.num_sessions = sessions
    c.data.first_classes = 4
    c.data.classes_per_session = 2
    c.data.samples_per_new_class = 40
    c.model.width = width
    c.model.embed_dim = embed_dim
    c.model.dtype = dtype
    c.train.epochs = epochs
    c.train.batch_size = 16
    c.train.eval_batch_size = 64
    c.memory.budget = 30
    return c


def _worker(argv) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["train", "search"], required=True)
    p.add_argument("--workdir", required=True)
    p.add_argument("--manual_dir")
    p.add_argument("--sessions", type=int, default=2)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--width", type=int, default=4)
    p.add_argument("--embed_dim", type=int, default=8)
    a = p.parse_args(argv)

    import jax

    jax.config.update("jax_compilation_cache_dir", CACHE)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    out = {"devices": jax.device_count()}
    if a.mode == "train":
        from cvs_jax import trainer

        steps = []
        original = trainer.make_train_step

        def recording_make_train_step(*args, **kwargs):
            steps.append(original(*args, **kwargs))
            return steps[-1]

        trainer.make_train_step = recording_make_train_step  # to count the step's compilations
        c = _tiny_cvs_config(a.manual_dir, os.path.join(a.workdir, "tfds"), sessions=a.sessions,
                             epochs=a.epochs, dtype=a.dtype, seed=a.seed, width=a.width, embed_dim=a.embed_dim)
        t0 = time.time()
        res = trainer.run(c, os.path.join(a.workdir, "run"))
        out["seconds"] = time.time() - t0
        with open(os.path.join(a.workdir, "run", "metrics.jsonl")) as f:
            out["epochs"] = [m for m in map(json.loads, f) if "loss" in m]
        out["recall"] = [r["recall"] for r in res["per_session"]]
        out["step_compiles"] = steps[0]._cache_size()
    else:
        from cvs_jax import evaluate

        rng = np.random.default_rng(7)
        out["cases"] = []
        for n, d, dup in ((300, 16, False), (5000, 8, True), (3, 4, False)):
            g = rng.normal(size=(n, d)).astype(np.float32)
            if dup:  # exact duplicates: ties that only the index tie-break can order
                g[1::2] = g[0::2][: len(g[1::2])]
            q = rng.normal(size=(130, d)).astype(np.float32)
            scores, idx = evaluate.topk_indices(q, g, 5, chunk=32, gallery_block=256)
            np.save(os.path.join(a.workdir, f"g{n}.npy"), g)
            _, idx_disk = evaluate.topk_indices_blocked(q, os.path.join(a.workdir, f"g{n}.npy"), 5, chunk=32,
                                                        gallery_block=256, block_rows=1024)
            out["cases"].append({"n": n, "idx": idx.tolist(), "scores": scores.tolist(),
                                 "idx_disk": idx_disk.tolist()})
    print("RESULT " + json.dumps(out), flush=True)


# ----------------------------------------------------------------------------- test side
def _run_worker(n_devices: int, *args: str, timeout: int = 600) -> dict:
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={n_devices}",
               PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", *args], env=env,
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise AssertionError(f"worker with {n_devices} devices failed ({proc.returncode}):\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["devices"] == n_devices
    return out


@pytest.fixture(scope="module")
def manual_dir(tmp_path_factory):
    from tests.tiny_data import write_fashion_idx

    return write_fashion_idx(str(tmp_path_factory.mktemp("idx")), train_per_class=60, test_per_class=10)


def _brute_force_topk(q, g, k):
    """Reference: float32 cosine scores (numpy), stable sort: highest first, lowest index on ties."""
    qn = q / np.linalg.norm(q, axis=1, keepdims=True)
    gn = g / np.linalg.norm(g, axis=1, keepdims=True)
    return np.argsort(-(qn @ gn.T), axis=1, kind="stable")[:, :k]


def test_sharded_search_equals_brute_force_on_1_2_4_devices(tmp_path):
    runs = {}
    for n_dev in (1, 2, 4):
        wd = tmp_path / f"search{n_dev}"
        wd.mkdir()
        runs[n_dev] = _run_worker(n_dev, "--mode", "search", "--workdir", str(wd))
    rng = np.random.default_rng(7)  # the worker's data, regenerated
    for case_i, (n, d, dup) in enumerate(((300, 16, False), (5000, 8, True), (3, 4, False))):
        g = rng.normal(size=(n, d)).astype(np.float32)
        if dup:
            g[1::2] = g[0::2][: len(g[1::2])]
        q = rng.normal(size=(130, d)).astype(np.float32)
        want = _brute_force_topk(q, g, min(5, n))
        for n_dev, out in runs.items():
            case = out["cases"][case_i]
            got = np.asarray(case["idx"])
            # every device count: bitwise-equal scores and indices to the 1-device run
            assert np.array_equal(got, np.asarray(runs[1]["cases"][case_i]["idx"])), (n, n_dev)
            assert case["scores"] == runs[1]["cases"][case_i]["scores"], (n, n_dev)
            # streamed from disk in blocks: the same answer
            assert np.array_equal(np.asarray(case["idx_disk"]), got), (n, n_dev)
            if dup:
                # numpy's float32 matmul may differ from XLA's by an ulp, so compare where
                # brute force is unambiguous, plus the tie order among exact duplicates.
                assert np.all(got[:, 0] % 2 == 0) and np.array_equal(got[:, 1], got[:, 0] + 1), n_dev
                assert np.array_equal(got[:, 0], want[:, 0]), n_dev
            else:
                assert np.array_equal(got, want), (n, n_dev)


@pytest.fixture(scope="module")
def training_runs(manual_dir, tmp_path_factory):
    """The tiny CVS run (2 sessions x 2 epochs, batch 16) on 1, 2 and 4 CPU devices."""
    runs = {}
    for n_dev in (1, 2, 4):
        wd = tmp_path_factory.mktemp(f"train{n_dev}")
        runs[n_dev] = _run_worker(n_dev, "--mode", "train", "--workdir", str(wd), "--manual_dir", manual_dir,
                                  "--sessions", "2", "--epochs", "2")
    return runs


# Losses on 1, 2 and 4 devices differ only by the order of float32 reductions (BatchNorm
# statistics and batch-wide losses see the same global batch): measured max relative
# difference of the per-epoch mean losses over 2 sessions x 2 epochs is ~1e-6; 1e-4 leaves
# room for other CPUs/XLA versions while still catching any real change (a wrong batch
# split, per-device BatchNorm, a dropped sample) which moves losses by >1e-2.
LOSS_RTOL = 1e-4


def test_training_is_device_count_invariant(training_runs):
    ref = training_runs[1]
    for n_dev, out in training_runs.items():
        assert [(m["session"], m["epoch"]) for m in out["epochs"]] == [(m["session"], m["epoch"]) for m in ref["epochs"]]
        for m, m_ref in zip(out["epochs"], ref["epochs"]):
            for key in ("loss", "L_c", "L_m", "L_d"):
                if key in m_ref:
                    np.testing.assert_allclose(m[key], m_ref[key], rtol=LOSS_RTOL, err_msg=f"{key} on {n_dev}")
        # retrieval after training: the same recall (a flipped near-tie would move it by 1/#queries)
        for r, r_ref in zip(out["recall"], ref["recall"]):
            assert r == pytest.approx(r_ref, abs=1e-9), n_dev


def test_train_step_compiles_once_per_session_shape(training_runs):
    # session 1 (no frozen model) and session 2 (frozen previous model): two programs, whatever
    # the device count; a recompile per epoch or per step (e.g. from an output sharding that
    # differs from the input's) would show up here.
    for n_dev, out in training_runs.items():
        assert out["step_compiles"] == 2, (n_dev, out["step_compiles"])


# Measured |R@1(bf16) - R@1(f32)| on the tiny config (2 sessions x 2 epochs): see BF16_R1_TOL.
BF16_R1_TOL = 0.10


def test_bfloat16_recall_close_to_float32(manual_dir, tmp_path):
    out = {}
    for dtype in ("float32", "bfloat16"):
        wd = tmp_path / dtype
        wd.mkdir()
        out[dtype] = _run_worker(1, "--mode", "train", "--workdir", str(wd), "--manual_dir", manual_dir,
                                 "--sessions", "2", "--epochs", "2", "--dtype", dtype)
    for r32, r16 in zip(out["float32"]["recall"], out["bfloat16"]["recall"]):
        assert abs(r32["1"] - r16["1"]) < BF16_R1_TOL, (r32, r16)
    for m32, m16 in zip(out["float32"]["epochs"], out["bfloat16"]["epochs"]):
        assert np.isfinite(m16["loss"])


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "--worker":
    _worker(sys.argv[2:])
