"""Small-sample statistics of ``compare``'s tables: Student-t quantiles, mean ± std, paired differences.

No SciPy: the regularized incomplete beta function by a continued fraction (modified Lentz).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

CONFIDENCE = 0.95


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom (``math.inf``: the standard normal)."""
    if math.isinf(df):
        return 0.5 * (1.0 + math.erf(t / math.sqrt(2.0)))
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))  # P(T > |t|)
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t (``df`` > 0, ``math.inf``: normal), by bisection on ``t_cdf``.

    E.g. ``t_quantile(0.975, 1)`` = 12.706, ``t_quantile(0.975, 4)`` = 2.776, ``t_quantile(0.975, math.inf)`` = 1.960.
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"p={p} must lie in (0, 1)")
    if not df > 0:
        raise ValueError(f"df={df} must be > 0")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    if p == 0.5:
        return 0.0
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def mean_std(values: list[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (ddof 1; 0 for one value); (None, None) for no value."""
    if not values:
        return None, None
    a = np.asarray(values, np.float64)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0


def paired_difference(values: dict[int, float], reference: dict[int, float]) -> dict:
    """``values[seed] - reference[seed]`` over the seeds both hold: per-seed differences, their mean,
    sample std, the 95 % Student-t interval of the mean (df = n - 1) and whether it excludes 0.
    With fewer than two seeds the interval and the verdict are None ("n/a")."""
    seeds = sorted(set(values) & set(reference))
    diffs = [float(values[s] - reference[s]) for s in seeds]
    out: dict[str, Any] = {
        "n": len(seeds),
        "per_seed": {str(s): d for s, d in zip(seeds, diffs)},
        "mean": None,
        "std": None,
        "ci95": None,
        "t_quantile": None,
        "significant": None,
    }
    if diffs:
        out["mean"], out["std"] = mean_std(diffs)
    if len(diffs) >= 2:
        q = t_quantile(0.5 + CONFIDENCE / 2, len(diffs) - 1)
        mean, std = out["mean"], out["std"]
        assert mean is not None and std is not None  # set above: diffs is not empty
        half = q * std / math.sqrt(len(diffs))
        out["ci95"] = [mean - half, mean + half]
        out["t_quantile"] = q
        out["significant"] = bool(out["ci95"][0] > 0 or out["ci95"][1] < 0)
    return out


def format_difference(d: dict | None) -> str:
    """``+1.23 [+0.40, +2.06] significant`` / ``... not significant`` / ``n/a``."""
    if d is None or d["significant"] is None:
        return "n/a"
    lo, hi = d["ci95"]
    verdict = "significant" if d["significant"] else "not significant"
    return f"{d['mean']:+.2f} [{lo:+.2f}, {hi:+.2f}] {verdict}"
