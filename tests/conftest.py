"""Test set-up: a persistent XLA compilation cache (compiles dominate CPU test time).

Set through the environment, before jax is imported, so that every process a test starts (``main``,
``update``, ``compare``, multi-device and multi-host workers) reads and fills the same cache: a
subprocess without it compiled its whole program anew (the README walkthrough's two updates took
78 s each, mostly compiling what ``main`` had just compiled)."""

import os

os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.environ.get("CVS_JAX_TEST_CACHE", "/tmp/cvs_jax_xla_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")  # jax reads these when imported
