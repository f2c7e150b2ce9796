"""Bounds as censored values: a seed whose failure point in a view is a bound is an interval of
values, never a number and never left out. Pure: it reads no file.

Its rule is stated once, in docs/analysis.md ("Bounds as censored values").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, special, stats

from kernelzoo.analysis.intervals import LEVEL, median_order

MIN_POINTS = 3
REJECT = 0.025  # the joint test of n* = d_dot rejects below this p (docs/analysis.md)
LOWER, UPPER = "never_fails", "fails_everywhere"  # outcomes that are bounds


def seed_intervals(outcomes, values) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) per seed from its outcome and value (module docstring); seeds without data
    (no_data, NaN) are left out: they are no interval at all."""
    lo, hi = [], []
    for outcome, value in zip(outcomes, values):
        if outcome == "no_data" or value is None or not np.isfinite(value):
            continue
        lo.append(float(value) if outcome != UPPER else 0.0)
        hi.append(float(value) if outcome != LOWER else math.inf)
    return np.asarray(lo, float), np.asarray(hi, float)


@dataclass(frozen=True)
class Median:
    """The median over seeds of censored values: it lies in [lowest, highest] (equal: a point),
    and the order-statistic interval [low, high] covers it at ``level`` (NaN: one seed, whose
    interval is its own). ``n`` seeds with data, ``bounds`` of them bounds."""

    lowest: float
    highest: float
    low: float
    high: float
    level: float
    n: int
    bounds: int

    @property
    def point(self) -> bool:
        return self.n > 0 and self.lowest == self.highest

    @property
    def value(self) -> float:
        """The median when it is a point, else NaN."""
        return self.lowest if self.point else math.nan

    def scaled(self, by: float) -> "Median":
        """The same median divided by ``by`` (a ratio to d_dot)."""
        return Median(self.lowest / by, self.highest / by, self.low / by, self.high / by,
                      self.level, self.n, self.bounds)

    def words(self, spec: str = ".2f") -> str:
        """"0.91 [0.84, 0.97]", ">= 1.03 [0.95, inf)", "in [0.8, 0.9] [0.7, inf)"."""
        def f(v):
            return "inf" if v == math.inf else f"{v:{spec}}"
        if self.n == 0:
            return "–"
        if self.point:
            head = f(self.value)
        elif self.highest == math.inf:
            head = f">= {f(self.lowest)}"
        elif self.lowest == 0:
            head = f"<= {f(self.highest)}"
        else:
            head = f"in [{f(self.lowest)}, {f(self.highest)}]"
        if self.n == 1 or (self.low == self.high == self.value):
            return head
        right = ")" if self.high == math.inf else "]"
        left = "(" if self.low == 0 else "["
        return f"{head} {left}{f(self.low)}, {f(self.high)}{right}"


def median(lo, hi) -> Median:
    """The censored median and its interval (module docstring) of seeds [lo_i, hi_i]."""
    lo, hi = np.asarray(lo, float), np.asarray(hi, float)
    n, bounds = len(lo), int((lo != hi).sum())
    lo, hi = np.sort(lo), np.sort(hi)
    if n == 0:
        return Median(math.nan, math.nan, math.nan, math.nan, math.nan, 0, 0)
    if n == 1:
        return Median(lo[0], hi[0], lo[0], hi[0], math.nan, 1, bounds)
    k, level = median_order(n)
    return Median(float(np.median(lo)), float(np.median(hi)), float(lo[k - 1]),
                  float(hi[n - k]), level, n, bounds)


@dataclass(frozen=True)
class CensoredLaw:
    """n* = a d_dot^b fitted over ``levels`` levels, ``censored`` of them an interval, with
    t intervals and the joint test of n* = d_dot (``p_identity``); ``cov`` is the covariance of
    (ln n* at the centre, b), ``t`` its quantile."""

    a: float
    b: float
    a_low: float
    a_high: float
    b_low: float
    b_high: float
    centre: float
    ratio_centre: float
    p_identity: float
    levels: int
    censored: int
    cov: tuple = ((math.nan, math.nan), (math.nan, math.nan))
    t: float = math.nan
    sd: float = math.nan  # the residual sd of the levels about the law (k - 2 degrees of freedom)

    @property
    def follows(self) -> bool | None:
        """True when n* = d_dot is not rejected at 5% (what that is worth: ``power.py``)."""
        return None if math.isnan(self.p_identity) else bool(self.p_identity >= REJECT)

    def curve(self, d_dot) -> np.ndarray:
        return self.a * np.asarray(d_dot, float) ** self.b

    def band(self, d_dot) -> tuple[np.ndarray, np.ndarray]:
        """The fitted line's 95% t band at ``d_dot``."""
        u = np.log(np.asarray(d_dot, float)) - math.log(self.centre)
        (vc, vcb), (_, vb) = self.cov
        half = self.t * np.sqrt(vc + 2 * u * vcb + u ** 2 * vb)
        mid = np.log(self.curve(d_dot))
        return np.exp(mid - half), np.exp(mid + half)


_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def loglik(mu, ln_s: float, lo, hi) -> tuple[float, np.ndarray, float]:
    """(log-likelihood, its gradient in each mu_j, its derivative in ln s) of levels
    [lo_j, hi_j] (log scale; equal: a point) under N(mu_j, s^2)."""
    s = math.exp(ln_s)
    point = lo == hi
    grad_mu = np.zeros(len(mu))
    z = (lo[point] - mu[point]) / s
    total = float((-0.5 * z ** 2 - ln_s - _HALF_LOG_2PI).sum())
    grad_mu[point] = z / s
    grad_s = float((z ** 2 - 1).sum())
    if not point.all():
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            zl = (lo[~point] - mu[~point]) / s
            zh = (hi[~point] - mu[~point]) / s
            log_p = _log_between(zl, zh)
            # phi(z) / P and z phi(z) / P at each end, 0 at an infinite end
            end_l = np.where(np.isfinite(zl), np.exp(-0.5 * zl ** 2 - _HALF_LOG_2PI - log_p), 0.0)
            end_h = np.where(np.isfinite(zh), np.exp(-0.5 * zh ** 2 - _HALF_LOG_2PI - log_p), 0.0)
            grad_mu[~point] = (end_l - end_h) / s
            grad_s += float((np.where(np.isfinite(zl), zl * end_l, 0.0)
                             - np.where(np.isfinite(zh), zh * end_h, 0.0)).sum())
        total += float(log_p.sum())
    return total, grad_mu, grad_s


def _log_between(zl, zh) -> np.ndarray:
    """log(Phi(zh) - Phi(zl)), accurate in either tail."""
    upper = special.log_ndtr(zh) + np.log1p(-np.exp(np.minimum(special.log_ndtr(zl)
                                                               - special.log_ndtr(zh), 0.0)))
    lower = special.log_ndtr(-zl) + np.log1p(-np.exp(np.minimum(special.log_ndtr(-zh)
                                                                - special.log_ndtr(-zl), 0.0)))
    return np.where(zl > 0, lower, upper)


LN_S_MIN = -12.0  # s is kept above exp(-12): a censored level cannot shrink it to 0


def _nll(theta, u, xc: float, lo, hi, free: bool) -> tuple[float, np.ndarray]:
    """(-log-likelihood, its gradient) in theta = (c, b, ln s), mu = c + b u (``free``), or
    theta = (ln s) with mu = u + xc = ln d_dot (n* = d_dot)."""
    ln_s = max(float(theta[-1]), LN_S_MIN)
    mu = theta[0] + theta[1] * u if free else u + xc
    value, g_mu, g_s = loglik(mu, ln_s, lo, hi)
    g_s = g_s if theta[-1] > LN_S_MIN else 0.0
    grad = [g_mu.sum(), (g_mu * u).sum(), g_s] if free else [g_s]
    return -value, -np.asarray(grad)


def _fit(u, xc: float, lo, hi, free: bool) -> tuple[np.ndarray, float]:
    """(theta, max log-likelihood) over levels at u = ln d_dot - xc (``_nll``), from least
    squares over the levels whose median is a point."""
    point = lo == hi
    start = list(np.polyfit(u[point], lo[point], 1)[::-1]) if free else []
    resid = lo[point] - (start[0] + start[1] * u[point] if free else (u + xc)[point])
    start.append(math.log(max(float(np.sqrt(np.mean(resid ** 2))), 1e-3)))
    found = optimize.minimize(_nll, np.asarray(start), args=(u, xc, lo, hi, free), jac=True,
                              method="BFGS", options={"gtol": 1e-8})
    return found.x, -float(found.fun)


def hessian(f, theta, h: float = 1e-4) -> np.ndarray:
    """Central-difference Hessian of ``f`` at ``theta``."""
    m = len(theta)
    out = np.empty((m, m))
    for i in range(m):
        for j in range(i, m):
            e_i, e_j = np.eye(m)[i] * h, np.eye(m)[j] * h
            out[i, j] = out[j, i] = (f(theta + e_i + e_j) - f(theta + e_i - e_j)
                                     - f(theta - e_i + e_j) + f(theta - e_i - e_j)) / (4 * h * h)
    return out


def law(d_dot, lowest, highest) -> CensoredLaw | None:
    """The law of the module docstring over levels (d_dot[j], median in [lowest[j],
    highest[j]]); None with fewer than MIN_POINTS levels whose median is a point."""
    x = np.log(np.asarray(d_dot, float))
    with np.errstate(divide="ignore"):
        lo, hi = np.log(np.asarray(lowest, float)), np.log(np.asarray(highest, float))
    k, point = len(x), lo == hi
    if point.sum() < MIN_POINTS:
        return None
    xc = float(x.mean())
    u = x - xc
    dof = k - 2
    t = float(stats.t.ppf(0.5 + LEVEL / 2, dof))
    if point.all():  # least squares (tests/least_squares.py is its reference)
        sxx = float((u ** 2).sum())
        b = float((u * (lo - lo.mean())).sum() / sxx)
        c = float(lo.mean())
        rss = float(((lo - c - b * u) ** 2).sum())
        rss0 = float(((lo - x) ** 2).sum())
        s2 = rss / dof
        cov = np.array([[s2 / k, 0.0], [0.0, s2 / sxx]])
        f = ((rss0 - rss) / 2) / s2 if rss > 0 else (math.inf if rss0 > 0 else 0.0)
        sd = math.sqrt(s2)
    else:
        theta, l1 = _fit(u, xc, lo, hi, True)
        _, l0 = _fit(u, xc, lo, hi, False)
        c, b = float(theta[0]), float(theta[1])

        def nll(th):
            return _nll(th, u, xc, lo, hi, True)[0]

        try:
            cov = np.linalg.inv(hessian(nll, theta))[:2, :2] * k / dof
        except np.linalg.LinAlgError:
            cov = np.full((2, 2), math.nan)
        lr = max(2 * (l1 - l0), 0.0)
        sd = math.exp(theta[2]) * math.sqrt(k / dof)
        f = (math.exp(min(lr / k, 700)) - 1) * dof / 2
    p = float(stats.f.sf(f, 2, dof)) if math.isfinite(f) else 0.0
    se_b = math.sqrt(max(cov[1, 1], 0))
    ln_a = c - b * xc
    se_a = math.sqrt(max(cov[0, 0] + xc ** 2 * cov[1, 1] - 2 * xc * cov[0, 1], 0))
    return CensoredLaw(math.exp(ln_a), b, math.exp(ln_a - t * se_a), math.exp(ln_a + t * se_a),
                       b - t * se_b, b + t * se_b, math.exp(xc), math.exp(c - xc), p, k,
                       int((~point).sum()),
                       tuple(tuple(float(v) for v in row) for row in cov), t, sd)
