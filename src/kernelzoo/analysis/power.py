"""What a test could have detected: its power, by simulating the same study with a known truth
and running the same machinery on it. Pure: it reads no file.

Its rule is stated once, in docs/analysis.md ("What a test could detect").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

from kernelzoo.analysis import censored

RATIO = 0.9      # the shortfall of n* / d_dot the law's test is asked to detect
STUDIES = 200    # simulated studies per power


@dataclass(frozen=True)
class LawDesign:
    """One family's design in one view: per level its d_dot, seeds, the probe above which a
    seed is a lower bound (inf: none seen) and below which an upper bound (0: none seen); and
    the spreads of ln n* within a level and between levels."""

    d_dot: tuple[float, ...]
    seeds: tuple[int, ...]
    top: tuple[float, ...]
    floor: tuple[float, ...]
    within: float
    between: float


def simulate(rng, design: LawDesign, studies: int, a: float = 1.0, b: float = 1.0,
             outlier_rate: float = 0.0, outlier_factor: float = 0.5) -> list[tuple]:
    """``studies`` simulated families with known truth n* = a d_dot^b: per study and level the
    (lo, hi) of its seeds (``censored.seed_intervals``), censored at the design's probes; with
    probability ``outlier_rate`` a seed's n* is multiplied by ``outlier_factor`` (a stall-like
    outlier)."""
    out = []
    for _ in range(studies):
        levels = []
        for d, n, top, floor in zip(design.d_dot, design.seeds, design.top, design.floor):
            noise = rng.normal(0, design.between) + rng.normal(0, design.within, n)
            y = a * d ** b * np.exp(noise) * np.where(rng.random(n) < outlier_rate,
                                                      outlier_factor, 1.0)
            lo = np.where(y > top, top, np.where(y < floor, 0.0, y))
            hi = np.where(y > top, math.inf, np.where(y < floor, floor, y))
            levels.append((lo, hi))
        out.append(levels)
    return out


def medians(study) -> tuple[np.ndarray, np.ndarray]:
    """(lowest, highest) of each level's censored median in one simulated study."""
    found = [censored.median(lo, hi) for lo, hi in study]
    return (np.array([m.lowest for m in found]), np.array([m.highest for m in found]))


def _fast_p(d_dot, lowest) -> float:
    """The F test's p of n* = d_dot over point medians (``censored.law`` without censoring)."""
    x, y = np.log(d_dot), np.log(lowest)
    k = len(x)
    u = x - x.mean()
    b = (u * (y - y.mean())).sum() / (u ** 2).sum()
    rss = float(((y - y.mean() - b * u) ** 2).sum())
    rss0 = float(((y - x) ** 2).sum())
    if rss <= 0:
        return 0.0 if rss0 > 0 else 1.0
    return float(stats.f.sf(((rss0 - rss) / 2) / (rss / (k - 2)), 2, k - 2))


def p_value(d_dot, lowest, highest) -> float:
    """The joint test's p (NaN: no test) on one study's level medians."""
    d_dot, lowest, highest = (np.asarray(v, float) for v in (d_dot, lowest, highest))
    if np.array_equal(lowest, highest):
        return _fast_p(d_dot, lowest) if len(d_dot) >= censored.MIN_POINTS else math.nan
    found = censored.law(d_dot, lowest, highest)
    return math.nan if found is None else found.p_identity


def _fast_p_many(d_dot, lowest: np.ndarray) -> np.ndarray:
    """``_fast_p`` of each row of ``lowest`` (studies x levels of point medians)."""
    x = np.log(np.asarray(d_dot, float))
    y = np.log(lowest)
    k = len(x)
    u = x - x.mean()
    ym = y.mean(axis=1, keepdims=True)
    b = ((y - ym) * u).sum(axis=1, keepdims=True) / (u ** 2).sum()
    rss = ((y - ym - b * u) ** 2).sum(axis=1)
    rss0 = ((y - x) ** 2).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = stats.f.sf(((rss0 - rss) / 2) / (rss / (k - 2)), 2, k - 2)
    return np.where(rss > 0, p, np.where(rss0 > 0, 0.0, 1.0))


def _uncensored_power(rng, design: LawDesign, studies: int, a: float) -> float:
    """``law_power`` where no probe censors a seed: the same draws as ``simulate``, the level
    medians and the F test taken over all studies at once."""
    if len(design.d_dot) < censored.MIN_POINTS:
        return 0.0
    ys = [[] for _ in design.d_dot]
    for _ in range(studies):
        for j, (d, n) in enumerate(zip(design.d_dot, design.seeds)):
            noise = rng.normal(0, design.between) + rng.normal(0, design.within, n)
            rng.random(n)  # simulate's outlier draw (rate 0 here): the streams stay one
            ys[j].append(a * d * np.exp(noise))
    medians_ = np.stack([np.median(np.array(v), axis=1) for v in ys], axis=1)
    return float((_fast_p_many(design.d_dot, medians_) < censored.REJECT).mean())


def law_power(design: LawDesign, ratio: float = RATIO, studies: int = STUDIES,
              seed: int = 0) -> float:
    """Share of simulated studies (truth n* = ``ratio`` d_dot) whose test rejects n* = d_dot."""
    if not math.isfinite(design.within):
        return math.nan
    rng = np.random.default_rng(seed)
    if all(t == math.inf for t in design.top) and not any(design.floor):
        return _uncensored_power(rng, design, studies, ratio)
    rejected = 0
    for study in simulate(rng, design, studies, a=ratio):
        p = p_value(design.d_dot, *medians(study))
        rejected += bool(p < censored.REJECT)
    return rejected / studies


def design(levels: list[tuple[float, np.ndarray, np.ndarray]], law_sd: float) -> LawDesign:
    """The design of one family in one view from its levels (d_dot, lo, hi of the seeds:
    ``censored.seed_intervals``) and the law's residual sd (NaN: none): the module docstring's
    spreads; levels without seeds are left out."""
    levels = [level for level in levels if len(level[1])]
    ss, dof, per_level = 0.0, 0, []
    for _, lo, hi in levels:
        y = np.log(lo[lo == hi])
        if len(y) >= 2:
            ss += float(((y - y.mean()) ** 2).sum())
            dof += len(y) - 1
        per_level.append(len(lo))
    within = math.sqrt(ss / dof) if dof else math.nan
    n = float(np.mean(per_level))
    noise = math.pi / 2 * within ** 2 / n if math.isfinite(within) else math.nan
    between = math.sqrt(max(0.0, law_sd ** 2 - noise)) if math.isfinite(law_sd * noise) else 0.0
    top = tuple(float(lo[hi == math.inf].min()) if (hi == math.inf).any() else math.inf
                for _, lo, hi in levels)
    floor = tuple(float(hi[lo == 0].max()) if (lo == 0).any() else 0.0 for _, lo, hi in levels)
    return LawDesign(tuple(float(d) for d, _, _ in levels), tuple(per_level), top, floor,
                     within, between)
