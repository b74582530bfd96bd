import os

if os.environ.get("CVS_JAX_COMPILE_LOG"):  # the test suite's compile log, off by default (docs/testing.md)
    from cvs_jax.testing import compile_log

    compile_log.install()
