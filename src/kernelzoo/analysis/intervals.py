"""Intervals over seeds and over d_dot levels, each with a coverage that tests/simulations.py
checks by simulation with known truth. Pure: it reads no file.

Its rule is stated once, in docs/analysis.md ("Intervals").
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

LEVEL = 0.95
MIN_LEVELS = 3
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


@dataclass(frozen=True)
class LevelLaw:
    """n* = a d_dot^b over ``levels`` d_dot levels, with t intervals (NaN below MIN_LEVELS) and
    the joint test of n* = d_dot (``p_identity``)."""

    a: float
    b: float
    a_low: float
    a_high: float
    b_low: float
    b_high: float
    centre: float        # d_c, the geometric mean of the levels
    ratio_centre: float  # n* / d_dot at d_c by the law
    ratio_low: float
    ratio_high: float
    p_identity: float    # the F test of a = 1, b = 1 (NaN: no test)
    levels: int
    spread: float = field(default=math.nan, repr=False)  # t * residual sd (NaN: none)
    sxx: float = field(default=math.nan, repr=False)

    @property
    def follows(self) -> bool | None:
        """True when n* = d_dot is not rejected at 5%; None without a test."""
        return None if math.isnan(self.p_identity) else bool(self.p_identity >= 1 - LEVEL)

    def curve(self, d_dot) -> np.ndarray:
        return self.a * np.asarray(d_dot, float) ** self.b

    def band(self, d_dot) -> tuple[np.ndarray, np.ndarray]:
        """The law's 95% confidence band at ``d_dot`` (the t band of the fitted line)."""
        lx = np.log(np.asarray(d_dot, float))
        half = self.spread * np.sqrt(1 / self.levels + (lx - math.log(self.centre)) ** 2
                                     / self.sxx)
        mid = np.log(self.curve(d_dot))
        return np.exp(mid - half), np.exp(mid + half)


def level_law(d_dot, medians) -> LevelLaw:
    """The fit of the module docstring over one point per level: (d_dot[i], n* ``medians[i]``),
    the median n* over the level's seeds."""
    x = np.log(np.asarray(d_dot, float))
    y = np.log(np.asarray(medians, float))
    k = len(x)
    xc = float(x.mean())
    sxx = float(((x - xc) ** 2).sum())
    b = float(((x - xc) * (y - y.mean())).sum() / sxx)
    c = float(y.mean())  # ln n* at d_c
    resid = y - (c + b * (x - xc))
    ln_a, nan = c - b * xc, math.nan
    if k < MIN_LEVELS:
        return LevelLaw(math.exp(ln_a), b, nan, nan, nan, nan, math.exp(xc), math.exp(c - xc),
                        nan, nan, nan, k)
    dof = k - 2
    rss = float((resid ** 2).sum())
    s = math.sqrt(rss / dof)
    t = float(stats.t.ppf(0.5 + LEVEL / 2, dof))
    se_b, se_c, se_a = s / math.sqrt(sxx), s / math.sqrt(k), s * math.sqrt(1 / k + xc ** 2 / sxx)
    rss0 = float(((y - x) ** 2).sum())  # the residuals of n* = d_dot
    f = ((rss0 - rss) / 2) / (rss / dof) if rss > 0 else (math.inf if rss0 > 0 else 0.0)
    p = float(stats.f.sf(f, 2, dof)) if math.isfinite(f) else 0.0
    return LevelLaw(math.exp(ln_a), b, math.exp(ln_a - t * se_a), math.exp(ln_a + t * se_a),
                    b - t * se_b, b + t * se_b, math.exp(xc), math.exp(c - xc),
                    math.exp(c - xc - t * se_c), math.exp(c - xc + t * se_c), p, k, t * s, sxx)


def level_medians(d_dot, values) -> tuple[np.ndarray, np.ndarray]:
    """(levels, median of ``values`` per level) of points (d_dot[i], values[i])."""
    d_dot, values = np.asarray(d_dot, float), np.asarray(values, float)
    levels = np.unique(d_dot)
    return levels, np.array([np.median(values[d_dot == d]) for d in levels])
