"""The suite's XLA compile log as a table (docs/testing.md), also from a run still going or stopped.

    CVS_JAX_TEST_CACHE=/tmp/cold-cache-$$ CVS_JAX_COMPILE_LOG=/tmp/compile-log-$$ \\
        python -m pytest -q -n 2 --dist loadfile tests
    python scripts/compile_log.py /tmp/compile-log-NNN [ROWS]

Prints the totals and the top ROWS (25) test files, tests and jitted functions by compile CPU seconds
(``cvs_jax.testing.compile_log.summarize``; the suite's end writes the whole of it to ``summary.json``).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cvs_jax.testing import compile_log  # noqa: E402

if __name__ == "__main__":
    print(compile_log.table(compile_log.summarize(sys.argv[1]), rows=int(sys.argv[2]) if len(sys.argv) > 2 else 25))
