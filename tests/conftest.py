"""Test set-up: a persistent XLA compilation cache (compiles dominate CPU test time).

Set through the environment, before jax is imported, so that every process a test starts (``main``,
``update``, ``compare``, multi-device and multi-host workers) reads and fills the same cache: a
subprocess without it compiled its whole program anew (the README walkthrough's two updates took
78 s each, mostly compiling what ``main`` had just compiled). Every program is cached, however quick its
compile, and test processes compile at XLA's backend optimisation level 0 (docs/testing.md, "The compiler
level, the cache threshold, and a slower host")."""

import os

os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.environ.get("CVS_JAX_TEST_CACHE", "/tmp/cvs_jax_xla_cache"))
# every program, however quick its compile: at the old 0.5 s threshold the suite's 559 compiles of `search`
# (0.27 s each) were never cached and every process compiled its own; a tiny warm `cvs_jax.main` 16.7 -> 14.2 s
# of CPU (docs/testing.md)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")  # jax reads these when imported
# XLA's backend optimisation level 0 in every test process and the processes tests start (cvs_jax/testing/xla_env.py
# says why; set before cvs_jax and jax are imported); pure os.environ code, as importing cvs_jax imports jax
if os.environ.get("CVS_JAX_TEST_XLA_LEVEL", "0") != "default" and "--xla_backend_optimization_level" not in (
    os.environ.get("XLA_FLAGS", "")
):
    _level = os.environ.get("CVS_JAX_TEST_XLA_LEVEL", "0")
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level={_level}".strip()

import pytest

import cvs_jax  # noqa: F401,E402  with CVS_JAX_COMPILE_LOG set, records this process's XLA compiles (docs/testing.md)


@pytest.fixture(scope="session")
def fashion_idx(tmp_path_factory):
    """The one Fashion-MNIST fixture factory: ``fashion_idx(train_per_class, test_per_class)`` -> a folder of
    learnable IDX files of that size (``cvs_jax.testing.tiny_data.write_fashion_idx``), written once per
    test process and shared read-only by every test that asks for that size."""
    from cvs_jax.testing.tiny_data import write_fashion_idx

    made: dict[tuple[int, int], str] = {}

    def make(train_per_class: int = 60, test_per_class: int = 10) -> str:
        key = (train_per_class, test_per_class)
        if key not in made:
            folder = str(tmp_path_factory.mktemp(f"idx{train_per_class}x{test_per_class}"))
            made[key] = write_fashion_idx(folder, train_per_class=train_per_class, test_per_class=test_per_class)
        return made[key]

    return make


@pytest.fixture(scope="module")
def manual_dir(fashion_idx):
    """60 train and 10 test images per class: the data of ``cvs_jax.testing.tiny_data.tiny_config``'s runs."""
    return fashion_idx(60, 10)


@pytest.fixture
def run_copy(run_to_copy, tmp_path):
    """A copy of the module's finished run (its ``run_to_copy`` fixture: a workdir) that a test may change."""
    import shutil

    wd = str(tmp_path / "run")
    shutil.copytree(run_to_copy, wd)
    return wd


# The heaviest test files, heaviest first: seconds of setup + call + teardown in one suite run (`--durations=0`, a
# fresh clone of 90a1f07 with a warm XLA cache on this project's 2-core host; docs/testing.md). `--dist loadfile`
# hands whole files to the two workers in queue order, so these go first and the light files fill in at the end:
# the workers then finish within seconds of each other. xdist's own order (files with the most tests first) put
# these last, and the worker that drew the walkthrough (120 s) ran about 180 s after the other had finished. A new
# file that takes over ~15 s belongs in this list; a listed file that is renamed or removed stops the run
# (`pytest_configure`).
HEAVIEST_FIRST = (
    "runs/test_resume.py",  # 109
    "runs/test_readme_walkthrough.py",  # 97
    "runs/test_methods_kill.py",  # 96
    "runs/test_population.py",  # 89
    "runs/test_config_smoke.py",  # 76
    "runs/test_serve_live.py",  # 71
    "runs/test_feature_cache.py",  # 53
    "runs/test_compare.py",  # 53
    "serve/test_from_added.py",  # 52
    "runs/test_end_to_end.py",  # 46
    "runs/test_image_folder.py",  # 40
    "runs/test_query_map_runs.py",  # 36
    "runs/test_multidevice.py",  # 36
    "runs/test_full_disk.py",  # 35
    "runs/test_compatible_methods_runs.py",  # 33
    "runs/test_image_folder_hardened.py",  # 33
    "runs/test_new_methods_on_photos.py",  # 29
    "models/test_efficientnet.py",  # 27
    "serve/test_serve_safety.py",  # 25
    "runs/test_refusals.py",  # 24
    "runs/test_stored_rows_run.py",  # 24
    "runs/test_cli.py",  # 22
    "runs/test_export.py",  # 21
    "runs/test_photo_sessions_views.py",  # 19
    "runs/test_rainbow_run.py",  # 19
    "retrieval/test_additions_store.py",  # 18
    "runs/test_report_pages.py",  # 15
    "runs/test_steps_per_call.py",  # 15
)
TESTS = os.path.dirname(os.path.abspath(__file__))


def pytest_configure(config):
    """Keep the collection order below for xdist's scheduler (its default reorders files by test count)."""
    missing = [f for f in HEAVIEST_FIRST if not os.path.isfile(os.path.join(TESTS, f))]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py HEAVIEST_FIRST lists missing files {missing}: update the list")
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    """The heaviest files first (``HEAVIEST_FIRST``), then the rest in collection order; within a file the
    tests keep their order. Every xdist worker sorts the same way, so their collections stay equal."""
    rank = {os.path.join(TESTS, f): i for i, f in enumerate(HEAVIEST_FIRST)}
    items.sort(key=lambda item: rank.get(str(item.path), len(rank)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With ``CVS_JAX_COMPILE_LOG`` set: name the running test for the compile log of this process and of every
    process the test starts (they inherit the variable); a module fixture's compiles count to its first test."""
    if os.environ.get("CVS_JAX_COMPILE_LOG"):
        os.environ["CVS_JAX_COMPILE_TEST"] = item.nodeid
    yield


def pytest_sessionfinish(session):
    """With ``CVS_JAX_COMPILE_LOG`` set, the controller (not an xdist worker) sums every process's compile log
    into ``summary.json`` there and prints the top of it (``cvs_jax.testing.compile_log``)."""
    folder = os.environ.get("CVS_JAX_COMPILE_LOG")
    if not folder or hasattr(session.config, "workerinput") or not os.path.isdir(folder):
        return
    import json

    from cvs_jax.testing import compile_log

    summary = compile_log.summarize(folder)
    with open(os.path.join(folder, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("\n" + compile_log.table(summary, rows=15) + f"\n(all of it: {folder}/summary.json)")
