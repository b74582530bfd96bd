"""Shared helpers of the benchmarks: timing, device peaks, a Markdown table printer.

Peak numbers are vendor datasheet figures (dense, no sparsity) keyed by a
substring of ``jax.Device.device_kind``; for a CPU (or an unknown device) the
peaks are estimated in the same run with a jitted f32 matmul and a jitted copy.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import sys
import time
from typing import Callable, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)  # for ``configs``


@dataclasses.dataclass(frozen=True)
class Peaks:
    name: str
    f32: float  # FLOP/s, full-precision f32 (CUDA cores; what Precision.HIGHEST gets)
    tf32: float  # FLOP/s, TF32 tensor cores (f32 matmul at default precision on NVIDIA)
    bf16: float  # FLOP/s, bf16 tensor cores, dense
    hbm: float  # bytes/s, device memory bandwidth
    source: str


# Datasheet numbers (dense).  Order matters: first substring match wins.
GPU_PEAKS: Sequence[tuple[str, Peaks]] = (
    ("H200", Peaks("H200 SXM", 66.9e12, 494.7e12, 989.4e12, 4.8e12, "datasheet")),
    ("H100 PCIe", Peaks("H100 PCIe", 51.2e12, 378e12, 756e12, 2.0e12, "datasheet")),
    ("H100 NVL", Peaks("H100 NVL", 60e12, 417.5e12, 835e12, 3.9e12, "datasheet")),
    ("H100", Peaks("H100 SXM", 66.9e12, 494.7e12, 989.4e12, 3.35e12, "datasheet")),
    ("A100-SXM4-80GB", Peaks("A100 SXM 80GB", 19.5e12, 156e12, 312e12, 2.039e12, "datasheet")),
    ("A100 80GB PCIe", Peaks("A100 PCIe 80GB", 19.5e12, 156e12, 312e12, 1.935e12, "datasheet")),
    ("A100", Peaks("A100 40GB", 19.5e12, 156e12, 312e12, 1.555e12, "datasheet")),
    ("L4", Peaks("L4", 30.3e12, 60e12, 121e12, 0.3e12, "datasheet")),
)


def block(x):
    import jax

    return jax.block_until_ready(x)


def time_fn(fn: Callable[[], object], *, repeats: int = 3, min_time: float = 0.0) -> float:
    """Best wall time of ``repeats`` calls of ``fn`` (each blocked until ready), after one warm-up."""
    block(fn())
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        block(fn())
        best = min(best, time.perf_counter() - t0)
        if min_time and best > min_time:
            break
    return best


def _matmul_rate(n: int, dtype, precision, repeats: int) -> float:
    """FLOP/s of an ``n^3`` matmul on random data (never zeros: they can run faster than real data)."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(dtype)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32).astype(dtype)
    mm = jax.jit(lambda x, y: jnp.dot(x, y, precision=precision))
    return 2 * n**3 / time_fn(lambda: mm(a, b), repeats=repeats)


def _copy_bandwidth(copy_mb: int, repeats: int) -> float:
    """Bytes/s of an elementwise pass that reads and writes every byte once."""
    import jax
    import jax.numpy as jnp

    m = copy_mb * (1 << 20) // 4
    x = jax.random.normal(jax.random.key(2), (m,), jnp.float32)
    cp = jax.jit(lambda v: v * 1.0000001)
    return 2 * m * 4 / time_fn(lambda: cp(x), repeats=repeats)


def measure_cpu_peaks(n: int = 1024, copy_mb: int = 256) -> Peaks:
    """Measured f32 matmul FLOP/s and copy bandwidth of the default JAX device."""
    import jax
    import jax.numpy as jnp

    flops = _matmul_rate(n, jnp.float32, jax.lax.Precision.HIGHEST, repeats=5)
    return Peaks(
        f"{jax.devices()[0].device_kind} ({os.cpu_count()} cores)",
        flops,
        flops,
        flops,
        _copy_bandwidth(copy_mb, repeats=5),
        f"measured: {n}^3 f32 matmul, {copy_mb} MiB read+write",
    )


def measure_gpu_peaks(n: int = 8192, copy_mb: int = 4096) -> Peaks:
    """Measured ceilings of the default GPU: f32 (HIGHEST), TF32 (DEFAULT) and bf16 matmuls, and a
    large copy counting bytes read plus bytes written (METHOD: measure, don't trust the datasheet)."""
    import jax
    import jax.numpy as jnp

    hi, default = jax.lax.Precision.HIGHEST, jax.lax.Precision.DEFAULT
    return Peaks(
        jax.devices()[0].device_kind,
        _matmul_rate(n, jnp.float32, hi, 10),
        _matmul_rate(n, jnp.float32, default, 10),
        _matmul_rate(n, jnp.bfloat16, default, 10),
        _copy_bandwidth(copy_mb, 10),
        f"measured: {n}^3 matmuls on random data, {copy_mb} MiB read+write",
    )


def datasheet_peaks() -> Peaks | None:
    import jax

    kind = jax.devices()[0].device_kind
    if jax.devices()[0].platform == "gpu":
        for key, peaks in GPU_PEAKS:
            if key in kind:
                return peaks
    return None


def describe(p: Peaks) -> str:
    return (
        f"{p.name} ({p.source}): f32 {p.f32 / 1e12:.1f}, tf32 {p.tf32 / 1e12:.1f}, bf16 {p.bf16 / 1e12:.1f} "
        f"TFLOP/s, memory {p.hbm / 1e9:,.0f} GB/s"
    )


def device_peaks() -> Peaks:
    """The ceilings the floors use: measured in this run (GPU and CPU alike)."""
    import jax

    if jax.devices()[0].platform == "gpu":
        return measure_gpu_peaks()
    return measure_cpu_peaks()


def environment() -> str:
    import jax

    d = jax.devices()
    return (
        f"jax {jax.__version__}, {len(d)} x {d[0].device_kind} ({d[0].platform}), "
        f"python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} host cores"
    )


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------- shared by benchmarks/race.py and its parts


def write_json(path: str, rows: Sequence[dict], **meta) -> None:
    """``{**meta, "rows": rows}`` to ``path`` (the layout ``input_pipeline.py --json`` writes), atomically."""
    import json

    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump({**meta, "rows": list(rows)}, f, indent=1)
    os.replace(tmp, path)


def read_json(path: str) -> dict:
    import json

    with open(path) as f:
        return json.load(f)


def torch_environment() -> str | None:
    """``torch X, device, python`` or None when torch does not import (the caller says so in its rows)."""
    try:
        import torch
    except ImportError:
        return None
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else f"cpu ({torch.get_num_threads()} threads)"
    return f"torch {torch.__version__}, {dev}, python {platform.python_version()}"


def ratio(a: float | None, b: float | None) -> str:
    """``a / b`` as ``2.95x``, or ``-`` when either side was not measured."""
    return f"{a / b:.2f}x" if a and b else "-"
