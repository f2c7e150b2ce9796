"""Studies with known truth, simulated to check the analysis' intervals and tests: the d_dot
law's and the median's intervals (``intervals_*``), the factorial effects' (``factorial_*``) and
the learning-rate and stopping-rule test (``optimisation_*``). Each ``*_coverage`` reports how
often the intervals cover the truth, or how often each verdict is reached."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np

from kernelzoo.analysis.factorial import contrast_names, estimate
from kernelzoo.analysis.censored import law as censored_law
from kernelzoo.analysis.intervals import median_interval
from least_squares import level_medians
from kernelzoo.analysis.optimisation import (ALPHA, MARGIN, RISES, TESTS, VERDICTS, bounds,
                                            decide)


def intervals_simulate(rng, levels=(16, 32, 64, 128, 256), seeds: int = 5, a: float = 0.9,
                       b: float = 1.0, between: float = 0.05, within: float = 0.1, outlier_rate: float = 0.1,
             outlier_factor: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """A study with known truth: per level a log-normal deviation (sd ``between``) from
    n* = a d_dot^b, per seed log-normal noise (sd ``within``), and stall-like outliers: with
    probability ``outlier_rate`` a seed's n* is multiplied by ``outlier_factor``."""
    d = np.repeat(np.asarray(levels, float), seeds)
    level_dev = np.repeat(rng.normal(0, between, len(levels)), seeds)
    noise = rng.normal(0, within, len(d))
    out = np.where(rng.random(len(d)) < outlier_rate, math.log(outlier_factor), 0.0)
    return d, a * d ** b * np.exp(level_dev + noise + out)


def intervals_coverage(studies: int = 2000, seed: int = 0, **truth) -> dict[str, float]:
    """Share of simulated studies (``intervals_simulate`` with ``truth``) whose intervals cover
    the truth.
    The truth of a law fitted to level medians is the law of the medians: a times the median of
    a seed's factor (outliers shift it), found from 200,000 draws; b is unchanged. Reported: the
    coverage of b and a, the share of studies in which the test keeps n* = d_dot (its coverage
    when that is the truth), and the coverage of one configuration's median interval (over ten
    times as many draws of its seeds)."""
    rng = np.random.default_rng(seed)
    a, b = truth.get("a", 0.9), truth.get("b", 1.0)
    one = {k: v for k, v in truth.items() if k not in ("levels", "between", "seeds")}
    factors = intervals_simulate(np.random.default_rng(seed + 1), levels=(1,), seeds=200_000,
                       **{**one, "a": 1.0, "b": 1.0, "between": 0.0})[1]
    a_median = a * float(np.median(factors))
    hits = {"b": 0, "a": 0, "identity": 0}
    for _ in range(studies):
        levels, medians = level_medians(*intervals_simulate(rng, **truth))
        law = censored_law(levels, medians, medians)
        hits["b"] += law.b_low <= b <= law.b_high
        hits["a"] += law.a_low <= a_median <= law.a_high
        hits["identity"] += bool(law.follows)
    found = {k: v / studies for k, v in hits.items()}
    n = truth.get("seeds", 5)  # one configuration's seeds, ten times as many studies
    draws = intervals_simulate(rng, levels=(1,), seeds=10 * studies * n,
                               **{**one, "between": 0.0})[1]
    covered = [low <= a_median <= high for _, low, high, _ in
               map(median_interval, draws.reshape(10 * studies, n))]
    return {**found, "median": float(np.mean(covered))}


def factorial_simulate(rng, k: int = 3, seeds: int = 3, effects_log=(0.5, 0.3, 0.0),
                       interaction=0.2,
             within: float = 0.1, spread_ratio: float = 1.0, outlier_rate: float = 0.0,
             outlier_factor: float = 0.5):
    """A factorial with known truth: ln n* = 4 + sum_j beta_j x_j + gamma x_0 x_1 (x = ±1/2
    coded as 0/1 - 1/2, so each main effect is beta_j and the first interaction gamma / 2),
    per-seed normal noise whose sd grows from ``within`` to ``spread_ratio`` x ``within``
    across the cells, and stall-like outliers (probability ``outlier_rate``: the value times
    ``outlier_factor``). Returns (cells, y)."""
    cells = list(itertools.product((0, 1), repeat=k))
    y = []
    for i, cell in enumerate(cells):
        x = np.array(cell, float) - 0.5
        mu = 4 + float(np.dot(effects_log[:k], x)) + interaction * x[0] * x[1]
        sd = within * spread_ratio ** (i / max(len(cells) - 1, 1))
        v = mu + rng.normal(0, sd, seeds)
        v += np.where(rng.random(seeds) < outlier_rate, math.log(outlier_factor), 0.0)
        y.append(v)
    return cells, y


def factorial_coverage(studies: int = 2000, seed: int = 0, **truth) -> dict[str, float]:
    """Share of simulated factorials (``factorial_simulate``) whose intervals cover the true
    effects: the first main effect, the null main effect (the third), and the first interaction,
    among the factorials that can tell (``told``: their share). Outliers shift every cell's
    expected value alike, so the true effects are unchanged; ``cap`` (ln n*) turns every value
    above it into a lower bound at it, as a search's top probe does."""
    rng = np.random.default_rng(seed)
    k = truth.get("k", 3)
    beta, gamma = truth.get("effects_log", (0.5, 0.3, 0.0)), truth.get("interaction", 0.2)
    want = {(0,): beta[0], (k - 1,): beta[k - 1], (0, 1): gamma / 2}
    names = contrast_names(k)
    hits = Counter()
    told = 0
    for _ in range(studies):
        cells, y = factorial_simulate(rng, **{k: v for k, v in truth.items() if k != "cap"})
        cap = truth.get("cap", math.inf)  # a value above it is a lower bound there (never_fails)
        lo = [np.minimum(v, cap) for v in y]
        hi = [np.where(v > cap, math.inf, v) for v in y]
        got = dict(zip(names, estimate(cells, lo, hi=hi)))
        if math.isnan(got[names[0]][1]):
            continue  # a cell mostly bounds: cannot tell
        told += 1
        for key, value in want.items():
            hits[key] += got[key][1] <= value <= got[key][2]
    return {"main": hits[(0,)] / told, "null_main": hits[(k - 1,)] / told,
            "interaction": hits[(0, 1)] / told, "told": told / studies}


def optimisation_simulate(rng, studies: int, seeds: int, means, sds, noise: str = "normal",
             outlier_rate: float = 0.0, outlier_factor: float = 0.5,
             rho: float = 0.0) -> np.ndarray:
    """Failure points of simulated studies with known truth, shape (studies, levels, seeds):
    level j's seeds have mean ``means[j]`` and standard deviation ``sds[j]``,
    normal or log-normal (``noise``, with that mean and sd); a seed's values at the levels
    correlate by ``rho`` (a share of the noise is the seed's own, as when it draws the same
    initialisation and data at every level); and stall-like outliers: with probability
    ``outlier_rate`` a value is multiplied by ``outlier_factor``, each value on its own."""
    means, sds = np.asarray(means, float)[:, None], np.asarray(sds, float)[:, None]
    z = rng.standard_normal((studies, len(means), seeds))
    if rho:
        z = math.sqrt(1 - rho) * z + math.sqrt(rho) * rng.standard_normal((studies, 1, seeds))
    if noise == "normal":
        x = means + sds * z
    else:
        s = np.sqrt(np.log1p((sds / means) ** 2))
        x = means * np.exp(s * z - s ** 2 / 2)
    return np.where(rng.random(x.shape) < outlier_rate, x * outlier_factor, x)


def optimisation_coverage(studies: int = 2000, seed: int = 0, seeds: int = 3, d_dot: float = 64.0,
             rises=(0.0, 0.0, 0.0, 0.0), sd: float = 0.05, sd_ratios=(1.0, 0.5, 1.0, 2.0, 1.0),
             noise: str = "normal", outlier_rate: float = 0.0, outlier_factor: float = 0.5,
             rho: float = 0.0, moved_share: float = 1.0,
             test: str = "welch") -> dict[str, float]:
    """The test on ``studies`` simulated studies (``optimisation_simulate``) with known truth.
    At the published level the failure point has mean d_dot and sd ``sd`` x d_dot; at the m = len(rises) other levels
    the mean is raised by ``rises[j]`` x delta (delta = MARGIN x d_dot) and the sd is
    ``sd`` x d_dot x ``sd_ratios[j + 1]`` (``sd_ratios[0]``: the published level's); a seed's
    values correlate by ``rho`` across levels. With ``moved_share`` below 1, a seed at another
    level repeats its published value exactly (the run is the same run) unless, with that
    probability, it moves, by ``rises[j]`` x delta / ``moved_share``: the mean rise is the same,
    carried by a few seeds. The outliers shift every mean by the same factor, 1 - outlier_rate
    (1 - outlier_factor): the true difference of the observed means is the rise times it; the
    verdicts are judged against the rise itself. ``test``: a name in ``TESTS``. Reported:
    ``covers``, the share of (study, level) whose two-sided (1 - 2 ALPHA) = 95% interval covers
    the true difference; ``upper``, the share whose one-sided (1 - ALPHA) upper bound lies above
    it; ``lower``, the share whose Bonferroni lower bound lies below it (nominal 1 - ALPHA/m); and the share of studies with each verdict (VERDICTS, without the
    power condition on "does not move") and with either rise (``rises``)."""
    rng = np.random.default_rng(seed)
    delta, m = MARGIN * d_dot, len(rises)
    rise = delta * np.concatenate([[0.0], np.asarray(rises, float)])
    sds = sd * d_dot * np.asarray(sd_ratios, float)[:m + 1]
    x = optimisation_simulate(rng, studies, seeds, d_dot + rise / moved_share, sds, noise,
                              outlier_rate, outlier_factor, rho)
    x[:, 1:, :] = np.where(rng.random(x[:, 1:, :].shape) < moved_share, x[:, 1:, :],
                           x[:, :1, :])
    truth = rise[1:] * (1 - outlier_rate * (1 - outlier_factor))
    found = TESTS[test](x[:, :1, :], x[:, 1:, :])
    low95, high95 = bounds(found, 1 - ALPHA)
    lower, upper = bounds(found, 1 - ALPHA / m)[0], bounds(found, 1 - ALPHA)[1]
    verdicts = decide(lower, upper, delta)
    return {"covers": float(((low95 <= truth) & (truth <= high95)).mean()),
            "upper": float((truth <= upper).mean()), "lower": float((lower <= truth).mean()),
            **{v: float((verdicts == v).mean()) for v in VERDICTS},
            "rises": float(np.isin(verdicts, RISES).mean())}
