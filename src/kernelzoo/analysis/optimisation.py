"""Is a failure point capacity, or optimisation? It is tested against the training settings
that could set it: the learning rate (experiment ``lr_robustness``) and the stopping rule's
patience (``lr_patience``). The step cap only stops a run, so a larger cap changes only the runs
that reached it: the report counts them (``report.studies``). Pure: it reads no file.

Its rule is stated once, in docs/analysis.md ("Capacity or optimisation: the learning rate
and the stopping rule").
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from kernelzoo.analysis import censored
from kernelzoo.analysis.capacity import SUFFIX, VIEWS
from kernelzoo.analysis.published import PUBLISHED_LR, PUBLISHED_STOPPING
from kernelzoo.analysis.labels import natural_key

MARGIN = 0.1  # delta = MARGIN x d_dot keys
ALPHA = 0.025  # each one-sided bound's error rate: a 95% two-sided interval
VERDICTS = ("rises beyond the margin", "rises, size not pinned down", "does not move",
            "cannot tell")
RISES = VERDICTS[:2]
DETECT = 0.8  # the power at which the smallest detectable rise is given
BOUNDS = ("never_fails", "fails_everywhere")  # the outcomes whose seed values are bounds
MAX_CORNERS = 12  # bounded seeds in one comparison beyond which it cannot tell (2^12 corners)


def _spread(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(count, mean, variance of the mean) over the last axis, NaNs left out; NaN below 2."""
    ok = np.isfinite(x)
    n = ok.sum(-1)
    total = np.where(ok, x, 0.0).sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = total / n
        ss = np.where(ok, (x - mean[..., None]) ** 2, 0.0).sum(-1)
        return n, mean, np.where(n >= 2, ss / (n - 1) / n, np.nan)


def welch(base, other) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(d, se, dof): the difference of means mean(other) - mean(base) over the last axis (NaNs
    left out), its standard error and Welch-Satterthwaite degrees of freedom; se is NaN where
    either side has fewer than 2 values."""
    n0, m0, v0 = _spread(np.asarray(base, float))
    n1, m1, v1 = _spread(np.asarray(other, float))
    with np.errstate(invalid="ignore", divide="ignore"):
        dof = (v0 + v1) ** 2 / (v0 ** 2 / (n0 - 1) + v1 ** 2 / (n1 - 1))
    return m1 - m0, np.sqrt(v0 + v1), dof


def paired(base, other) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(d, se, dof) of the seeds' differences other - base, seed for seed along the last axis
    (a seed missing, NaN, at either level left out): their mean, its standard error and n - 1
    degrees of freedom; se is NaN below 2 pairs."""
    base, other = np.broadcast_arrays(np.asarray(base, float), np.asarray(other, float))
    n, d, v = _spread(other - base)
    return d, np.sqrt(v), n - 1.0


TESTS = {"welch": welch, "paired": paired}


def bounds(test, level: float) -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper): the one-sided ``level`` bounds of d from a test's (d, se, dof); NaN
    without a standard error or where the seeds do not spread (se 0: no variance to test)."""
    d, se, dof = test
    spread = np.isfinite(se) & (se > 0)
    half = np.where(spread, stats.t.ppf(level, np.where(spread, dof, 1.0)) * se, np.nan)
    return d - half, d + half


def corners(base: tuple[np.ndarray, np.ndarray], other: tuple[np.ndarray, np.ndarray],
            test: str, level: float, upper_level: float | None = None
            ) -> tuple[float, float, float]:
    """(d, lower, upper) of ``test`` over every value the seeds' bounds allow, the lower bound
    one-sided at ``level`` and the upper at ``upper_level`` (None: ``level``): ``base`` and
    ``other`` are the (lo, hi) of the same seeds at two levels (NaN where a level lacks a seed).
    A one-sided lower bound d - t se is concave in the seed values (se is a norm of them) and
    the upper bound convex, so over the box of allowed values the lowest lower bound and the
    highest upper bound lie at its corners: each bounded seed at either end. An open end (a
    lower bound's inf) takes them to -inf and +inf. With a bound among Welch's seeds its degrees
    of freedom are the smaller sample's less one (the Welch-Satterthwaite count moves with the
    values; this one never exceeds it), so t is fixed and the corners are exact. d is NaN unless
    every seed is a point."""
    lo = np.concatenate([base[0], other[0]])
    hi = np.concatenate([base[1], other[1]])
    if np.isinf(hi).any():
        return math.nan, -math.inf, math.inf
    free = np.flatnonzero((lo != hi) & np.isfinite(lo))
    if len(free) > MAX_CORNERS:
        return math.nan, -math.inf, math.inf
    n = len(base[0])
    lowest, highest, d = math.inf, -math.inf, math.nan
    for pick in itertools.product((0, 1), repeat=len(free)):
        x = lo.copy()
        x[free] = np.where(np.asarray(pick, bool), hi[free], lo[free])
        found = TESTS[test](x[:n], x[n:])
        if test == "welch" and len(free):
            found = (*found[:2], min(np.isfinite(x[:n]).sum(), np.isfinite(x[n:]).sum()) - 1.0)
        low = float(bounds(found, level)[0])
        high = float(bounds(found, level if upper_level is None else upper_level)[1])
        if math.isnan(low):  # a corner without spread: no interval
            return (math.nan if len(free) else float(found[0])), math.nan, math.nan
        lowest, highest = min(lowest, low), max(highest, high)
        d = float(found[0]) if not len(free) else math.nan
    return d, lowest, highest


def decide(lower, upper, delta) -> np.ndarray:
    """The verdict (module docstring) from each other level's Bonferroni ``lower`` bound and
    (1 - ALPHA) ``upper`` bound, the levels along the last axis; ``delta`` a number or one per
    leading index."""
    lower, upper = np.asarray(lower, float), np.asarray(upper, float)
    delta = np.asarray(delta, float)
    beyond = (lower > delta[..., None]).any(-1)
    rises = (lower > 0).any(-1)
    holds = (upper < delta[..., None]).all(-1)
    return np.where(beyond, VERDICTS[0], np.where(rises, VERDICTS[1],
                                                  np.where(holds, VERDICTS[2], VERDICTS[3])))


def pooled_se(spread: tuple[float, float], test: str, n0: int, n1: int, d_dot: float) -> float:
    """The se of a level's difference at the store's pooled spread (``spread``: the pooled
    variance of failure point / d_dot within a configuration and level, or of a seed's paired
    difference / d_dot, and its degrees of freedom) for ``n0`` and ``n1`` seeds."""
    var, dof = spread
    if not (dof > 0 and math.isfinite(d_dot)):
        return math.nan
    if test == "paired":
        return d_dot * math.sqrt(var / min(n0, n1))
    return d_dot * math.sqrt(var * (1 / n0 + 1 / n1))


def hold_power(se: float, dof: float, delta: float) -> float:
    """The chance that a level's one-sided (1 - ALPHA) upper bound falls below ``delta`` when the level
    does not move the failure point, at a standard error ``se`` with ``dof`` degrees of freedom
    (the store's pooled spread, ``pooled_se``): T(delta / se - t_(1 - ALPHA)); NaN without one."""
    if not (se > 0 and dof > 0):
        return math.nan
    return float(stats.t.cdf(delta / se - stats.t.ppf(1 - ALPHA, dof), dof))


def detectable(se: float, dof: float, level: float) -> float:
    """The rise the one-sided ``level`` lower bound shows above 0 with 80% power, at the pooled
    ``se`` and ``dof``: (t_level + t_0.8) se."""
    if not (se > 0 and dof > 0):
        return math.nan
    return float((stats.t.ppf(level, dof) + stats.t.ppf(DETECT, dof)) * se)


@dataclass(frozen=True)
class Setting:
    """A training setting the test varies: its report heading, the label words that carry its
    levels (``key=value``), the published level, one value per key, and its test (a name in
    ``TESTS``: the module docstring says which and why)."""

    heading: str
    keys: tuple[str, ...]
    published: tuple[str, ...]
    test: str = "welch"

    def level(self, label: str) -> tuple[float, ...] | None:
        """The level ``label`` names (None when it names no value of some key)."""
        words = dict(w.split("=", 1) for w in label.split(" ") if "=" in w)
        try:
            return tuple(float(words[k]) for k in self.keys)
        except (KeyError, ValueError):
            return None

    def without(self, label: str) -> str:
        """``label`` less this setting's words: the configuration it is a level of."""
        return " ".join(w for w in label.split(" ") if w.split("=", 1)[0] not in self.keys)

    @property
    def base(self) -> tuple[float, ...]:
        """The published level, as ``level`` reads one."""
        return tuple(float(v) for v in self.published)

    def words(self, level: tuple[float, ...]) -> str:
        return " ".join(f"{k.rsplit('.', 1)[-1]} {v:g}" for k, v in zip(self.keys, level))


LEARNING_RATE = Setting("Learning rate", ("lr",), (PUBLISHED_LR,))
STOPPING_RULE = Setting("Stopping rule", ("trainer.patience",),
                        (PUBLISHED_STOPPING["trainer.patience"],), "paired")
SETTINGS = (LEARNING_RATE, STOPPING_RULE)


def table(seeds: pd.DataFrame, capacity: pd.DataFrame,
          setting: Setting = LEARNING_RATE, grid: bool = False) -> pd.DataFrame:
    """One row per configuration (less ``setting``) and view, for the configurations at >= 2
    levels of it, the published one among them: label, view, levels, margin (keys), n (seeds
    per level), mean (at the published level), differences ([(level, d, lower, upper)], levels
    ascending, each as ``Setting.words`` writes it), verdict, decided_at (the largest upper
    bound: any margin above it says "does not move"), bounds ({outcome: seeds} of the seed
    values that are bounds) and values (seed values in all). ``grid``: the failure points were
    read on a grid, not searched: no verdict but "cannot tell" (uncalibrated there)."""
    if seeds.empty or capacity.empty:
        return pd.DataFrame()
    config = capacity[["label", "d_dot"]].assign(
        level=[setting.level(label) for label in capacity["label"]],
        group=[setting.without(label) for label in capacity["label"]])
    merged = seeds.merge(config[config["level"].notna()], on="label")
    base = setting.base
    groups = []
    for group, part in merged.groupby("group", sort=False):
        levels = sorted(set(part["level"]))
        if len(levels) < 2 or base not in levels:
            continue
        d_dot = pd.to_numeric(part["d_dot"], errors="coerce").iloc[0]
        groups.append((group, {view: _ends(part, view, levels) for view in VIEWS}, d_dot,
                       part))
    rows = []
    for view in VIEWS:
        scales = [_scale(ends[view][base], d_dot) for _, ends, d_dot, _ in groups]
        spread = _pooled([ends[view] for _, ends, _, _ in groups], scales, base, setting.test)
        for (group, ends, _, part), scale in zip(groups, scales):
            rows.append(_row(group, view, part, ends[view], setting, base, scale, spread,
                             grid))
    found = pd.DataFrame(rows)
    if found.empty:
        return found
    order = sorted(range(len(found)), key=lambda i: (natural_key(found["label"].iloc[i]),
                                                     VIEWS.index(found["view"].iloc[i])))
    return found.iloc[order].reset_index(drop=True)


Ends = dict  # level -> (lo, hi): pd.Series of the seeds' intervals, indexed by seed


def _ends(part: pd.DataFrame, view: str, levels: list[tuple]) -> Ends:
    """Each level's seeds in ``view`` as the intervals they allow (seeds without data left
    out)."""
    s = SUFFIX[view]
    part = part[(part[f"outcome{s}"] != "no_data") & part[f"value{s}"].notna()]
    ends = {}
    for r in levels:
        rows = part[part["level"] == r]
        lo, hi = censored.seed_intervals(rows[f"outcome{s}"], rows[f"value{s}"].astype(float))
        ends[r] = (pd.Series(lo, index=rows["seed"]), pd.Series(hi, index=rows["seed"]))
    return ends


def _scale(base: tuple[pd.Series, pd.Series], d_dot) -> float:
    """The keys a margin is a share of: d_dot, or the median failure point at the published
    level for a map without one (NaN when none is a point)."""
    if pd.notna(d_dot):
        return float(d_dot)
    lo, hi = base
    points = lo[lo == hi]
    return float(np.median(points)) if len(points) else math.nan


def _pooled(ends: list[Ends], scales: list[float], base: tuple,
            test: str) -> tuple[float, float]:
    """(variance, degrees of freedom) pooled over the configurations of one view: of a seed's
    failure point / scale within a configuration and level (Welch), or of a seed's difference
    from its published level / scale within a configuration and level (paired); points only."""
    ss, dof = 0.0, 0
    for levels, scale in zip(ends, scales):
        if not math.isfinite(scale):
            continue
        lo0, hi0 = levels[base]
        for r, (lo, hi) in levels.items():
            if test == "paired":
                if r == base:
                    continue
                both = pd.concat([lo0[lo0 == hi0], lo[lo == hi]], axis=1).dropna()
                y = (both.iloc[:, 1] - both.iloc[:, 0]).to_numpy() / scale
            else:
                y = lo[lo == hi].to_numpy() / scale
            if len(y) >= 2:
                ss += float(((y - y.mean()) ** 2).sum())
                dof += len(y) - 1
    return (ss / dof if dof else math.nan), float(dof)


def _row(group: str, view: str, part: pd.DataFrame, ends: Ends, setting: Setting,
         base_level: tuple, scale: float, spread: tuple[float, float], grid: bool) -> dict:
    """One configuration's test in one view (``table``): each other level against the
    published one over every value the seeds' bounds allow (``corners``), the power to say
    "does not move" at the store's pooled ``spread`` (module docstring)."""
    s = SUFFIX[view]
    part = part[(part[f"outcome{s}"] != "no_data") & part[f"value{s}"].notna()]
    others = [r for r in ends if r != base_level]
    margin = MARGIN * scale
    level = 1 - ALPHA / len(others)
    base_lo, base_hi = ends[base_level]
    differences, lower, upper, holds, detect = [], [], [], [], []
    for r in others:
        other_lo, other_hi = ends[r]
        # seed by seed, NaN where a level lacks the seed: both tests leave NaNs out
        lo = pd.concat([base_lo, other_lo], axis=1).to_numpy().T
        hi = pd.concat([base_hi, other_hi], axis=1).to_numpy().T
        d, low, high = corners((lo[0], hi[0]), (lo[1], hi[1]), setting.test, level, 1 - ALPHA)
        differences.append((setting.words(r), d, low, high))
        lower.append(low)
        upper.append(high)
        n0, n1 = len(base_lo), len(other_lo)
        se = pooled_se(spread, setting.test, n0, n1, scale)
        own = min(n0, n1) - 1.0 if setting.test == "paired" else n0 + n1 - 2.0
        holds.append(hold_power(se, own, margin))
        detect.append(detectable(se, own, level))
    power = float(np.prod(holds))
    verdict = VERDICTS[3] if grid else str(decide(lower, upper, margin))
    bound_values = sorted({v for lo, hi in ends.values() for v in
                           [*lo[hi == math.inf], *hi[lo == 0]]})
    return {"label": group, "view": view,
            "levels": ", ".join(setting.words(r) for r in sorted(ends)),
            "margin": margin, "n": [len(ends[r][0]) for r in sorted(ends)],
            "base": censored.median(base_lo, base_hi).words(".3g"),
            "differences": differences, "verdict": verdict,
            "decided_at": float(np.max(upper)),  # NaN when a level has no interval
            "power": power, "detectable": float(np.max(detect)), "grid": grid,
            "bounded_at": (f"{bound_values[0]:.4g}" if len(bound_values) == 1 else
                           f"{bound_values[0]:.4g} to {bound_values[-1]:.4g}")
            if verdict == VERDICTS[3] and bound_values and
            not np.isfinite([*lower, *upper]).all() else "",
            "bounds": {o: int((part[f"outcome{s}"] == o).sum()) for o in BOUNDS
                       if (part[f"outcome{s}"] == o).any()}, "values": len(part)}


def tables(seeds: pd.DataFrame, capacity: pd.DataFrame,
           grid: bool = False) -> tuple[tuple[Setting, pd.DataFrame], ...]:
    """(setting, ``table``) for each setting some configurations ran at several levels of; both
    tests read each seed's failure point as its search located it (``seeds``: a paired seed's
    two failure points, each from its own probes; ``grid``: read on a grid instead)."""
    found = []
    for setting in SETTINGS:
        table_ = table(seeds, capacity, setting, grid)
        if not table_.empty:
            found.append((setting, table_))
    return tuple(found)


def counts(found: pd.DataFrame, view: str) -> tuple[dict[str, int], list[str]]:
    """In ``view`` of ``found`` (a ``table``): how many configurations reached each of VERDICTS,
    and the labels of those that rise (beyond the margin, or by a size not pinned down)."""
    mine = found[found["view"] == view]
    return ({v: int((mine["verdict"] == v).sum()) for v in VERDICTS},
            list(mine.loc[mine["verdict"].isin(RISES), "label"]))
