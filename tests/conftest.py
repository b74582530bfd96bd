"""Test set-up: a persistent XLA compilation cache (compiles dominate CPU test time)."""

import os

import jax

jax.config.update("jax_compilation_cache_dir", os.environ.get("CVS_JAX_TEST_CACHE", "/tmp/cvs_jax_xla_cache"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
