"""Shared by the every-method rerun and kill tests: the tiny two-session command and its outcome."""

import json
import os
import subprocess
import sys

from cvs_jax.config import fashion_mnist_general
from cvs_jax.methods import registry
from cvs_jax.rundir import paths

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root


def _tiny_config(method: str):
    config = fashion_mnist_general.get_config()
    config.method = method
    return config


# every registered method that trains (``frozen`` trains nothing: it has no run to rerun or kill)
ALL_METHODS = [name for name in registry.METHODS if registry.get_method(_tiny_config(name)).trains]


def shares_first_session(method: str) -> bool:
    """Whether compare reuses finetune's session 1 for ``method`` (as in the tiny config): the method
    shares its session 1 and trains finetune's (cosine) head."""
    config = _tiny_config(method)
    return registry.get_method(config).shares_first_session and registry.head_name(config) == "cosine"


def overrides(manual, tfds_dir):
    return [
        f"--config.data.manual_dir={manual}",
        f"--config.data.data_dir={tfds_dir}",
        "--config.data.num_sessions=2",
        "--config.data.samples_per_new_class=30",
        "--config.model.width=4",
        "--config.model.embed_dim=8",
        "--config.train.epochs=2",
        "--config.train.batch_size=16",
        "--config.train.eval_batch_size=64",
        "--config.train.checkpoint_every_steps=3",
        "--config.memory.budget=20",
        # these runs are compared by their results, metrics and checkpoints: no page or PNGs (~2.3 s of CPU a run;
        # a run's pictures: tests/runs/test_report_pages.py)
        "--config.pictures=False",
    ]


def _command(name: str, workdir: str, *flags: str) -> list[str]:
    """``python -m cvs_jax.<name>`` on the tiny Fashion-MNIST config in ``workdir``."""
    config = "configs/fashion_mnist_general.py"
    return [sys.executable, "-m", f"cvs_jax.{name}", "--config", config, "--workdir", workdir, *flags]


def compare_cmd(manual, tfds_dir, workdir, methods):
    return _command("compare", workdir, "--methods", ",".join(methods), "--seeds", "0") + overrides(manual, tfds_dir)


def main_cmd(manual, tfds_dir, workdir, method):
    return _command("main", workdir, f"--config.method={method}", "--config.seed=0") + overrides(manual, tfds_dir)


def env(fault=None):
    e = dict(os.environ, JAX_PLATFORMS="cpu")  # the compilation cache: set in os.environ by conftest
    e.pop("CVS_JAX_FAULT", None)
    if fault:
        e["CVS_JAX_FAULT"] = fault
    return e


def run(cmd, fault=None):
    return subprocess.run(cmd, cwd=REPO, env=env(fault), capture_output=True, text=True, timeout=900)


def outcome(workdir):
    """results.json and metrics.jsonl without wall times."""
    with open(paths.results_file(workdir)) as f:
        results = json.load(f)
    for r in results["per_session"]:
        r.pop("seconds")
    with open(paths.metrics_file(workdir)) as f:
        metrics = [json.loads(line) for line in f]
    for m in metrics:
        m.pop("time")
        m.pop("images_per_s", None)
    return results, metrics


def checkpoint_files(root) -> list[str]:
    """Every file under a ``checkpoints`` folder below ``root``: a rerun that writes, moves or removes none leaves
    this list as it was."""
    return sorted(os.path.join(d, f) for d, _, files in os.walk(root) for f in files if "checkpoints" in d)


def moved_aside(root):
    """Every directory under root that a restore moved aside."""
    return [os.path.join(d, n) for d, dirs, _ in os.walk(root) for n in dirs if n.startswith("unreadable-")]


# The two-session tiny runs of test_population and test_steps_per_call (write_fashion_idx(40, 6),
# samples_per_new_class=30): session 1 prints this line, session 2 has 20 val / 36 test queries.
SMALLEST_QUERY_SET = "12 val / 24 test queries"
ONE_QUERY = 1 / 12  # the most that one flipped query changes any recall of those runs
RECALL_KEYS = (
    "recall",
    "average_recall",
    "compatibility_recall1",
    "val_recall1",
    "test_recall",
    "map",
    "average_map",
    "compatibility_am",  # a mean of recalls
    "negative_flip_rate",  # a share of the queries
)
POINT_KEYS = ("compatibility_bc_points",)  # BC in recall points: one flipped query moves it 100x a recall


def assert_close_outcomes(a, b, *, rtol: float, one_query: float, path: str = "") -> None:
    """Two ``outcome``s of runs by different XLA programs (vmapped, k steps per call) on one machine:
    equal structure, counts, sizes, steps and strings; recalls within ``one_query`` (1 / the smallest
    query set: a near-tie flipped by last-bit float differences moves one query); other floats within
    ``rtol``."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            assert_close_outcomes(a[k], b[k], rtol=rtol, one_query=one_query, path=f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_close_outcomes(x, y, rtol=rtol, one_query=one_query, path=f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        if any(f".{key}" in path for key in RECALL_KEYS):
            assert abs(a - b) <= one_query + 1e-12, (path, a, b)
        elif any(f".{key}" in path for key in POINT_KEYS):
            assert abs(a - b) <= 100 * one_query + 1e-9, (path, a, b)
        else:
            assert abs(a - b) <= rtol * abs(b), (path, a, b)
    else:
        assert a == b, (path, a, b)
