"""The least-squares d_dot law over level medians: a plain reference implementation that
``censored.law`` (the analysis' law) is checked against: without a censored level the two agree
to rounding, and dropping the bounded seeds before fitting it is what the censored law replaces.

Per family, ln n* = ln a + b ln d_dot is fitted by least squares over the d_dot levels, one point
per level (the median over its seeds of n*); t intervals with k - 2 degrees of freedom over k
levels; the joint F test of a = 1 and b = 1 (F(2, k - 2))."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from kernelzoo.analysis.censored import MIN_POINTS
from kernelzoo.analysis.intervals import LEVEL


@dataclass(frozen=True)
class LevelLaw:
    """n* = a d_dot^b over ``levels`` d_dot levels, with t intervals (NaN below MIN_POINTS) and
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

    def band(self, d_dot) -> tuple[np.ndarray, np.ndarray]:
        """The law's 95% confidence band at ``d_dot`` (the t band of the fitted line)."""
        lx = np.log(np.asarray(d_dot, float))
        half = self.spread * np.sqrt(1 / self.levels + (lx - math.log(self.centre)) ** 2
                                     / self.sxx)
        mid = math.log(self.a) + self.b * lx
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
    if k < MIN_POINTS:
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
