"""Factorial effects: what each change of a map's settings does to its failure point, alone and
in combination (the ``favor_diagnosis`` design). Pure: it reads no file.

Its rule is stated once, in docs/analysis.md ("Factorial effects").
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import optimize, stats

from kernelzoo.analysis import censored
from kernelzoo.analysis.capacity import SUFFIX, VIEWS
from kernelzoo.analysis.labels import natural_key

LEVEL = 0.95
GROUP_KEYS = ("feature_map", "d_key", "d_dot", "update_rule", "lr")


@dataclass(frozen=True)
class Design:
    """A 2^k factorial: its ``factors`` (name, (low, high)) and per cell (a tuple of 0/1 per
    factor) the configuration's label."""

    title: str
    factors: tuple[tuple[str, tuple[str, str]], ...]
    cells: dict[tuple[int, ...], str]


def parse_params(params: str) -> dict[str, str]:
    """``capacity.params`` ("k=v,k=v") as a dict."""
    return dict(item.split("=", 1) for item in params.split(",") if "=" in item) \
        if isinstance(params, str) else {}


def _group_design(title: str, configs: pd.DataFrame) -> Design | None:
    params = [parse_params(p) for p in configs["params"]]
    keys = sorted({k for p in params for k in p})
    levels = {k: Counter(p.get(k, "-") for p in params) for k in keys}
    chosen = {k: tuple(sorted((v for v, _ in c.most_common(2)), key=natural_key))
              for k, c in levels.items() if len(c) >= 2}
    rows = [i for i, p in enumerate(params)
            if all(p.get(k, "-") in two for k, two in chosen.items())]
    factors, patterns = [], set()
    for k in sorted(chosen, key=lambda k: (any(k not in params[i] for i in rows), k)):
        pattern = tuple(params[i].get(k, "-") == chosen[k][1] for i in rows)
        if pattern in patterns or tuple(not x for x in pattern) in patterns:
            continue  # the same split of the configurations as a factor already kept
        patterns.add(pattern)
        factors.append(k)
    if len(factors) < 2:
        return None
    cells = {}
    for i in rows:
        cell = tuple(int(params[i].get(k, "-") == chosen[k][1]) for k in factors)
        if cell in cells:
            return None  # two configurations in one cell: the parameters left out differ
        cells[cell] = configs["label"].iloc[i]
    if len(cells) != 2 ** len(factors):
        return None
    return Design(title, tuple((k, chosen[k]) for k in factors), cells)


def designs(capacity: pd.DataFrame) -> list[Design]:
    """The 2^k factorials among ``capacity``'s configurations (module docstring)."""
    found = []
    for key, group in capacity.groupby(list(GROUP_KEYS), dropna=False, sort=True):
        if len(group) < 4:
            continue
        fmap, d_key, d_dot = key[0], key[1], key[2]
        title = f"{fmap} d_key={d_key}" + ("" if pd.isna(d_dot) else f" d_dot={int(d_dot)}")
        design = _group_design(title, group.reset_index(drop=True))
        if design is not None:
            found.append(design)
    return found


def contrast_names(k: int) -> list[tuple[int, ...]]:
    """Every non-empty subset of the k factors, main effects first."""
    return [s for r in range(1, k + 1) for s in itertools.combinations(range(k), r)]


@functools.cache
def _t(level: float, dof: int) -> float:
    return float(stats.t.ppf(0.5 + level / 2, dof))


BOUNDED = "cannot tell: bounded"  # a view whose cells are mostly bounds


@dataclass(frozen=True)
class CellMeans:
    """The cells' mean ln n* with their covariance and degrees of freedom (N - 2^k), and how
    they were found: "least squares" (every value a point), "censored" (a bound as the
    interval it allows, ``censored.loglik``) or BOUNDED (some cell's seeds are half or more
    bounds: no effect of the view can be told)."""

    means: np.ndarray
    cov: np.ndarray
    dof: int
    fit: str
    seeds: int
    bounds: int
    sd: float = math.nan  # least squares: the pooled sd ...
    n: np.ndarray | None = None  # ... and the cells' seeds (the same cov, written as before)

    def contrast(self, c: np.ndarray, level: float = LEVEL) -> tuple[float, float, float]:
        """(estimate, low, high) of the contrast ``c`` of the cell means; NaN without residual
        degrees of freedom or where the view is BOUNDED."""
        if self.fit == BOUNDED:
            return math.nan, math.nan, math.nan
        e = float(c @ self.means)
        if self.dof <= 0:
            return e, math.nan, math.nan
        if self.n is not None:  # least squares: t s sqrt(sum c^2 / n_c)
            half = _t(level, self.dof) * self.sd * math.sqrt(float((c ** 2 / self.n).sum()))
        else:
            half = _t(level, self.dof) * math.sqrt(max(float(c @ self.cov @ c), 0.0))
        return e, e - half, e + half


def cell_means(lo: list[np.ndarray], hi: list[np.ndarray]) -> CellMeans:
    """``CellMeans`` of the cells' seeds, each the interval [lo, hi] of ln n* (equal: a point;
    -inf / inf: a bound's open end). Without bounds: the cell means and the pooled variance
    over N - 2^k degrees of freedom. With bounds, each cell's seeds more than half points:
    the censored normal likelihood of the cell means and one sd, its covariance from the
    likelihood's curvature scaled by N / (N - 2^k) (least squares' variance where no value is a
    bound)."""
    n = np.array([len(v) for v in lo], float)
    seeds, cells = int(n.sum()), len(lo)
    bounds = int(sum((a != b).sum() for a, b in zip(lo, hi)))
    dof = seeds - cells
    if not bounds:
        means = np.array([v.mean() for v in lo])
        s2 = sum(((v - v.mean()) ** 2).sum() for v in lo) / dof if dof > 0 else math.nan
        return CellMeans(means, np.diag(s2 / n), dof, "least squares", seeds, bounds,
                         math.sqrt(s2), n)
    if any(2 * (a != b).sum() >= len(a) for a, b in zip(lo, hi)) or dof <= 0:
        return CellMeans(np.full(cells, math.nan), np.full((cells, cells), math.nan), dof,
                         BOUNDED, seeds, bounds)
    which = np.repeat(np.arange(cells), n.astype(int))
    flat_lo, flat_hi = np.concatenate(lo), np.concatenate(hi)

    def nll(theta):
        value, g_mu, g_s = censored.loglik(theta[which], float(theta[-1]), flat_lo, flat_hi)
        return -value, -np.append(np.bincount(which, g_mu, cells), g_s)

    points = [a[a == b] for a, b in zip(lo, hi)]
    start = np.array([v.mean() for v in points] + [math.log(max(float(np.sqrt(np.mean(
        np.concatenate([v - v.mean() for v in points]) ** 2))), 1e-3))])
    found = optimize.minimize(nll, start, jac=True, method="BFGS", options={"gtol": 1e-8})
    try:
        cov = np.linalg.inv(censored.hessian(lambda th: nll(th)[0], found.x))[:cells, :cells]
    except np.linalg.LinAlgError:
        cov = np.full((cells, cells), math.nan)
    return CellMeans(found.x[:cells], cov * seeds / dof, dof, "censored", seeds, bounds)


def coefficients(cells: list[tuple[int, ...]]) -> list[np.ndarray]:
    """Each contrast of ``contrast_names`` as coefficients on the cell means, in ``cells``'
    order."""
    k = len(cells[0])
    return [np.array([np.prod([2 * cell[j] - 1 for j in subset]) for cell in cells], float)
            / 2 ** (k - 1) for subset in contrast_names(k)]


def estimate(cells: list[tuple[int, ...]], y: list[np.ndarray], level: float = LEVEL,
             hi: list[np.ndarray] | None = None):
    """(effect, low, high) per contrast of ``contrast_names`` on the log scale, from the values
    ``y[i]`` of cell ``cells[i]`` (with ``hi``: each value the interval [y, hi], ``cell_means``);
    NaN intervals without residual degrees of freedom."""
    found = cell_means(y, y if hi is None else hi)
    return [found.contrast(c, level) for c in coefficients(cells)]


def _log_values(design: Design, seeds: pd.DataFrame, view: str) -> tuple[list, list]:
    """(lo, hi): per cell, cell by cell as ``design.cells``, the intervals of ln n* of its
    seeds in ``view`` (``censored.seed_intervals``: a point, or the half-line of a bound)."""
    s, lo, hi = SUFFIX[view], [], []
    for cell in design.cells:
        mine = seeds[seeds["label"] == design.cells[cell]]
        a, b = censored.seed_intervals(mine[f"outcome{s}"], mine[f"value{s}"])
        with np.errstate(divide="ignore"):
            lo.append(np.log(np.maximum(a, 0.0)))
            hi.append(np.log(b))
    return lo, hi


@dataclass(frozen=True)
class SimpleEffect:
    """One factor's effect at one level of another with which it interacts: the ratio on the
    failure point, its 95% interval, and the interaction that called for it."""

    design: str
    view: str
    factor: str
    change: str        # "1 -> performer"
    at: str            # the other factor at one level: "redraw=every_call"
    ratio: float
    low: float
    high: float
    interaction: str   # "input_scale x redraw x1.91 [1.62, 2.25]"
    bounds: int


def simple_effects(design: Design, seeds: pd.DataFrame,
                   level: float = LEVEL) -> list[SimpleEffect]:
    """The simple effects of the module docstring, for every two-factor interaction of
    ``design`` whose interval excludes 1, in every view whose cells can be told
    (``cell_means``)."""
    cells, names = list(design.cells), [name for name, _ in design.factors]
    k, found = len(names), []
    for view in VIEWS:
        lo, hi = _log_values(design, seeds, view)
        if min(len(v) for v in lo) < 1:
            continue
        means = cell_means(lo, hi)
        if means.dof <= 0 or means.fit == BOUNDED:
            continue
        named = dict(zip(contrast_names(k), (means.contrast(c, level)
                                             for c in coefficients(cells))))
        for (i, j), (e, low, high) in ((key, v) for key, v in named.items() if len(key) == 2):
            if low <= 0 <= high:
                continue
            words = (f"{names[i]} x {names[j]} x{math.exp(e):.3g} "
                     f"[{math.exp(low):.3g}, {math.exp(high):.3g}]")
            for a, b in ((i, j), (j, i)):
                for side in (0, 1):
                    c = np.array([(2 * cell[a] - 1) * (cell[b] == side) for cell in cells],
                                 float) / 2 ** (k - 2)
                    est, e_low, e_high = means.contrast(c, level)
                    lows, highs = design.factors[a][1], design.factors[b][1]
                    found.append(SimpleEffect(
                        design.title, view, names[a], f"{lows[0]} -> {lows[1]}",
                        f"{names[b]}={highs[side]}", math.exp(est), math.exp(e_low),
                        math.exp(e_high), words, means.bounds))
    return found


def simple_table(capacity: pd.DataFrame, seeds: pd.DataFrame) -> list[SimpleEffect]:
    """``simple_effects`` of every design of ``capacity``."""
    return [e for d in designs(capacity) for e in simple_effects(d, seeds)]


def effects(design: Design, seeds: pd.DataFrame) -> pd.DataFrame:
    """One row per view and effect of ``design``: the effect's name, ratio (exp of the log
    effect), interval, the seeds in all, how many of its values are bounds, and how the cell
    means were found (``fit``: ``CellMeans``; BOUNDED: ratio and interval NaN)."""
    rows = []
    names = [name for name, _ in design.factors]
    cells = list(design.cells)
    for view in VIEWS:
        lo, hi = _log_values(design, seeds, view)
        if min(len(v) for v in lo) < 1:
            continue
        means = cell_means(lo, hi)
        for subset, c in zip(contrast_names(len(names)), coefficients(cells)):
            e, low, high = means.contrast(c)
            rows.append({"design": design.title, "view": view,
                         "effect": " x ".join(names[j] for j in subset), "order": len(subset),
                         "ratio": math.exp(e), "ci_low": math.exp(low), "ci_high": math.exp(high),
                         "seeds": means.seeds, "bounds": means.bounds, "fit": means.fit})
    return pd.DataFrame(rows)


def table(capacity: pd.DataFrame, seeds: pd.DataFrame) -> pd.DataFrame:
    """``effects`` of every design of ``capacity`` in one table (``factorial.csv``), each row
    with its design's factors as "name low -> high; ..."; empty without a design."""
    frames = [effects(d, seeds).assign(factors="; ".join(f"{name} {low} -> {high}"
                                                         for name, (low, high) in d.factors))
              for d in designs(capacity)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
