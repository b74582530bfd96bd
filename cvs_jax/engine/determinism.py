"""Bit-reproducible GPU runs on request (``config.deterministic``).

On GPUs, XLA autotunes convolution algorithms and uses atomics in some reductions,
so two runs of the same command can differ in the last bits and then drift apart
(CPU runs are reproducible anyway).  ``--xla_gpu_deterministic_ops=true`` removes
both sources, at a measured cost (BENCHMARKS.md).  XLA reads the flag once, when
the backend starts, so the entry points call :func:`apply` before any JAX work.
"""

from __future__ import annotations

import os

FLAG = "--xla_gpu_deterministic_ops=true"


def apply(deterministic: bool) -> None:
    if not deterministic:
        return
    flags = os.environ.get("XLA_FLAGS", "")
    if FLAG not in flags.split():
        os.environ["XLA_FLAGS"] = f"{flags} {FLAG}".strip()
