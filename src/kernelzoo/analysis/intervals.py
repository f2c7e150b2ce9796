"""The order-statistic interval of a median over seeds, with the coverage that
tests/simulations.py checks by simulation with known truth. Pure: it reads no file.

Its rule is stated once, in docs/analysis.md ("Intervals").
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import stats

LEVEL = 0.95
MEDIAN_WORDS = ("distribution-free: 95% or more from 6 seeds, 93.75% for 5, 87.5% for 4, 75% for "
                "3 (the min-max)")


def order_level(n: int, k: int) -> float:
    """Coverage of [x_(k), x_(n+1-k)] for the median of n continuous values."""
    return 1 - 2 * float(stats.binom.cdf(k - 1, n, 0.5))


@functools.cache
def median_order(n: int) -> tuple[int, float]:
    """(k, its level): the largest k whose interval keeps LEVEL, else 1."""
    k = max([k for k in range(1, n // 2 + 1) if order_level(n, k) >= LEVEL], default=1)
    return k, order_level(n, k)


def median_interval(values) -> tuple[float, float, float, float]:
    """(median, low, high, level) over the finite ``values`` (NaNs dropped; all NaN: NaNs)."""
    x = np.sort(np.asarray([v for v in values if not math.isnan(v)], float))
    n = len(x)
    if n == 0:
        return math.nan, math.nan, math.nan, math.nan
    if n == 1:
        return float(x[0]), float(x[0]), float(x[0]), math.nan
    k, level = median_order(n)
    return float(np.median(x)), float(x[k - 1]), float(x[n - k]), level


def describe(n: int) -> str:
    """What ``median_interval`` spans over ``n`` seeds, for a legend: "min-max of 3 seeds
    (order-statistic interval, 75%)", "[x_(2), x_(8)] of 9 seeds (order-statistic interval,
    96.09%)"; "one seed: no interval" below 2."""
    if n < 2:
        return "one seed: no interval"
    k, level = median_order(n)
    span = "min-max" if k == 1 else f"[x_({k}), x_({n + 1 - k})]"
    return f"{span} of {n} seeds (order-statistic interval, {100 * level:.4g}%)"
