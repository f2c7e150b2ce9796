"""Is a failure point capacity, or optimisation? It is tested against the training settings
that could set it: the learning rate (experiment ``lr_robustness``) and the stopping rule's
patience (``lr_patience``). The step cap only stops a run, so a larger cap changes only the runs
that reached it: the report counts them (``report.studies``). Pure: it reads no file.

Its rule is stated once, in docs/analysis.md ("Capacity or optimisation: the learning rate
and the stopping rule").
"""

from __future__ import annotations

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
ALPHA = 0.05
VERDICTS = ("rises beyond the margin", "rises, size not pinned down", "does not move",
            "cannot tell")
RISES = VERDICTS[:2]
POWER = 0.5  # the power to say "does not move" below which it cannot tell
DETECT = 0.8  # the power at which the smallest detectable rise is given
BOUNDS = ("never_fails", "fails_everywhere")  # the outcomes whose seed values are bounds


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
    without a standard error, d itself where neither side spreads."""
    d, se, dof = test
    spread = np.isfinite(se) & (se > 0)
    half = np.where(spread, stats.t.ppf(level, np.where(spread, dof, 1.0)) * se,
                    np.where(np.isfinite(se), 0.0, np.nan))
    return d - half, d + half


def decide(lower, upper, delta, power=None) -> np.ndarray:
    """The verdict (module docstring) from each other level's Bonferroni ``lower`` bound and
    95% ``upper`` bound, the levels along the last axis; ``delta`` a number or one per
    leading index; ``power`` (the power to say "does not move", one per leading index; None:
    not asked) gates "does not move"."""
    lower, upper = np.asarray(lower, float), np.asarray(upper, float)
    delta = np.asarray(delta, float)
    beyond = (lower > delta[..., None]).any(-1)
    rises = (lower > 0).any(-1)
    holds = (upper < delta[..., None]).all(-1)
    if power is not None:
        holds &= np.asarray(power, float) >= POWER
    return np.where(beyond, VERDICTS[0], np.where(rises, VERDICTS[1],
                                                  np.where(holds, VERDICTS[2], VERDICTS[3])))


def hold_power(test, delta: float) -> float:
    """The chance that a level's one-sided 95% upper bound falls below ``delta`` when it does not
    rise, at its test's (d, se, dof): T((delta - min(d, 0)) / se - t_0.95); 1 without spread,
    NaN without an interval."""
    d, se, dof = test
    if not np.isfinite(se):
        return math.nan
    if se == 0:
        return 1.0 if delta > min(d, 0) else 0.0
    return float(stats.t.cdf((delta - min(d, 0)) / se - stats.t.ppf(1 - ALPHA, dof), dof))


def detectable(test, level: float) -> float:
    """The rise the one-sided ``level`` lower bound shows above 0 with 80% power, at the test's
    (d, se, dof): (t_level + t_0.8) se."""
    _, se, dof = test
    if not np.isfinite(se):
        return math.nan
    return float((stats.t.ppf(level, dof) + stats.t.ppf(DETECT, dof)) * se) if se > 0 else 0.0


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
          setting: Setting = LEARNING_RATE) -> pd.DataFrame:
    """One row per configuration (less ``setting``) and view, for the configurations at >= 2
    levels of it, the published one among them: label, view, levels, margin (keys), n (seeds
    per level), mean (at the published level), differences ([(level, d, lower, upper)], levels
    ascending, each as ``Setting.words`` writes it), verdict, decided_at (the largest upper
    bound: any margin above it says "does not move"), bounds ({outcome: seeds} of the seed
    values that are bounds) and values (seed values in all)."""
    if seeds.empty or capacity.empty:
        return pd.DataFrame()
    config = capacity[["label", "d_dot"]].assign(
        level=[setting.level(label) for label in capacity["label"]],
        group=[setting.without(label) for label in capacity["label"]])
    merged = seeds.merge(config[config["level"].notna()], on="label")
    base = setting.base
    rows = []
    for group, part in merged.groupby("group", sort=False):
        levels = sorted(set(part["level"]))
        if len(levels) < 2 or base not in levels:
            continue
        others = [r for r in levels if r != base]
        d_dot = pd.to_numeric(part["d_dot"], errors="coerce").iloc[0]
        for view in VIEWS:
            rows.append(_row(group, view, part, setting, base, others, d_dot))
    found = pd.DataFrame(rows)
    if found.empty:
        return found
    order = sorted(range(len(found)), key=lambda i: (natural_key(found["label"].iloc[i]),
                                                     VIEWS.index(found["view"].iloc[i])))
    return found.iloc[order].reset_index(drop=True)


def _row(group: str, view: str, part: pd.DataFrame, setting: Setting, base_level: tuple,
         others: list[tuple], d_dot) -> dict:
    """One configuration's test in one view (``table``): a bound as its interval, each test run
    with the bounds at their ends against the claim it makes (module docstring)."""
    s = SUFFIX[view]
    part = part[(part[f"outcome{s}"] != "no_data") & part[f"value{s}"].notna()]
    ends = {}
    for r in [base_level, *others]:
        rows = part[part["level"] == r]
        lo, hi = censored.seed_intervals(rows[f"outcome{s}"], rows[f"value{s}"].astype(float))
        ends[r] = (pd.Series(lo, index=rows["seed"]), pd.Series(hi, index=rows["seed"]))
    base_lo, base_hi = ends[base_level]
    points = base_lo[base_lo == base_hi]
    margin = MARGIN * (float(d_dot) if pd.notna(d_dot) else
                       (float(np.median(points)) if len(points) else math.nan))
    level = 1 - ALPHA / len(others)
    differences, lower, upper, holds, detect = [], [], [], [], []
    for r in others:
        other_lo, other_hi = ends[r]
        # seed by seed, NaN where a level lacks the seed: both tests leave NaNs out
        rise = TESTS[setting.test](*pd.concat([base_hi, other_lo], axis=1).to_numpy().T)
        hold = TESTS[setting.test](*pd.concat([base_lo, other_hi], axis=1).to_numpy().T)
        low = -math.inf if np.isinf(base_hi).any() else float(bounds(rise, level)[0])
        high = math.inf if np.isinf(other_hi).any() else float(bounds(hold, 1 - ALPHA)[1])
        exact = bool((base_lo == base_hi).all() and (other_lo == other_hi).all())
        differences.append((setting.words(r), float(rise[0]) if exact else math.nan, low, high))
        lower.append(low)
        upper.append(high)
        holds.append(math.nan if math.isinf(high) else hold_power(hold, margin))
        detect.append(math.inf if math.isinf(low) else detectable(rise, level))
    power = float(np.prod(holds))
    verdict = str(decide(lower, upper, margin, power))
    bound_values = sorted({v for lo, hi in ends.values() for v in
                           [*lo[hi == math.inf], *hi[lo == 0]]})
    return {"label": group, "view": view,
            "levels": ", ".join(setting.words(r) for r in sorted(ends)),
            "margin": margin, "n": [len(ends[r][0]) for r in sorted(ends)],
            "base": censored.median(base_lo, base_hi).words(".3g"),
            "differences": differences, "verdict": verdict,
            "decided_at": float(np.max(upper)),  # NaN when a level has no interval
            "power": power, "detectable": float(np.max(detect)),
            "bounded_at": (f"{bound_values[0]:.4g}" if len(bound_values) == 1 else
                           f"{bound_values[0]:.4g} to {bound_values[-1]:.4g}")
            if verdict == VERDICTS[3] and bound_values else "",
            "bounds": {o: int((part[f"outcome{s}"] == o).sum()) for o in BOUNDS
                       if (part[f"outcome{s}"] == o).any()}, "values": len(part)}


def tables(seeds: pd.DataFrame,
           capacity: pd.DataFrame) -> tuple[tuple[Setting, pd.DataFrame], ...]:
    """(setting, ``table``) for each setting some configurations ran at several levels of; both
    tests read each seed's failure point as its search located it (``seeds``: a paired seed's
    two failure points, each from its own probes)."""
    found = []
    for setting in SETTINGS:
        table_ = table(seeds, capacity, setting)
        if not table_.empty:
            found.append((setting, table_))
    return tuple(found)


def counts(found: pd.DataFrame, view: str) -> tuple[dict[str, int], list[str]]:
    """In ``view`` of ``found`` (a ``table``): how many configurations reached each of VERDICTS,
    and the labels of those that rise (beyond the margin, or by a size not pinned down)."""
    mine = found[found["view"] == view]
    return ({v: int((mine["verdict"] == v).sum()) for v in VERDICTS},
            list(mine.loc[mine["verdict"].isin(RISES), "label"]))
