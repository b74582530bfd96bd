# Records each XLA compile when CVS_JAX_COMPILE_LOG is set (the suite's compile log, docs/testing.md); else nothing.
from cvs_jax.testing import compile_log as _compile_log  # noqa: F401
