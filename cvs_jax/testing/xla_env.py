"""The XLA flags of the test suite's processes, and of the processes its tests start.

``tests/conftest.py`` (the one place that sets them, before jax is imported) compiles every test process at XLA's
backend optimisation level 0 (LLVM without its optimisation passes): on a cold XLA cache compiles were 37 % of the
suite's test time (1,268 of 3,397 s, a 2-core CPU host, 2026-12-07, docs/testing.md), and level 0 takes a tiny two-
session ``cvs_jax.main`` from 43.4 to 30.5 s of CPU with an empty cache, and leaves it at ~14 s with a full one (its
programs are small). Code that XLA emits itself runs slower: the EfficientNet-Lite0 tests take 29 s of CPU instead
of 13 with a warm cache (fewer with a cold one). Tests compare runs with runs of the same suite, and with references
at a tolerance, so the level changes no verdict; the one test that needs XLA's default code (the bits of Flax's own
op-by-op initialisers) reruns itself without it (``default_compiler``); the one-jit initialisation, at level 1
elsewhere, follows the suite's level too (``models.networks.INIT_COMPILER_OPTIONS``). Set
``CVS_JAX_TEST_XLA_LEVEL=default`` to run the suite with XLA's default level."""

from __future__ import annotations

import os
import subprocess
import sys

LEVEL_VAR = "CVS_JAX_TEST_XLA_LEVEL"
LEVEL_FLAG = "--xla_backend_optimization_level"


def with_flags(*extra: str) -> str:
    """This process's ``XLA_FLAGS`` (the suite's) with ``extra`` added, for a process a test starts with its
    own flags (``--xla_force_host_platform_device_count=4``): replacing them would compile that process at
    XLA's default level, whose compiles cost more."""
    return " ".join([os.environ.get("XLA_FLAGS", ""), *extra]).strip()


def default_compiler(nodeid: str) -> bool:
    """For a test whose bits are XLA's default code: when the suite's level is set, run that test again in a
    pytest process with XLA's default level, assert that it passed, and return False (the caller returns);
    return True where this process already compiles at the default level (run the test here)."""
    if LEVEL_FLAG not in os.environ.get("XLA_FLAGS", ""):
        return True
    env = dict(os.environ, **{LEVEL_VAR: "default"})
    env["XLA_FLAGS"] = " ".join(f for f in env["XLA_FLAGS"].split() if not f.startswith(LEVEL_FLAG))
    env.pop("PYTEST_XDIST_WORKER", None)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", nodeid],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, f"{nodeid} at XLA's default level:\n{done.stdout[-3000:]}{done.stderr[-2000:]}"
    return False
