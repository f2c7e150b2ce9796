"""Failure points in three views: each (configuration, seed) series' failure point per view and
their aggregate over seeds, on the runs table that ``runs.load_runs`` reads. Pure: it reads no
file.

Its rule is stated once, in docs/analysis.md ("The failure point in three views").
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kernelzoo.analysis.censored import median, seed_intervals
from kernelzoo.analysis.intervals import describe, median_interval
from kernelzoo.analysis.labels import natural_key
from kernelzoo.config.schema import VIEWS  # the views of capacity, as search.views names them

CONFIG_KEYS = ("feature_map", "params", "d_key", "d_dot", "update_rule", "lr")
SUFFIX = {"loss": "", "accuracy": "_acc", "keys_retrieved": "_keys"}  # column suffix per view
VIEW_WORDS = {"loss": "loss", "accuracy": "accuracy", "keys_retrieved": "keys retrieved"}
CAPACITY_COLUMNS = CONFIG_KEYS + (
    "predicted_capacity", "n_seeds", "observed_capacity", "ci_low", "ci_high", "first_failure",
    "ratio", "outcome",
)
EXTRA_COLUMNS = ("ci_level", "rank_bound",  # then each further view's columns, from VIEWS
                 *(f"{column}{SUFFIX[view]}" for view in VIEWS[1:]
                   for column in ("observed_capacity", "ci_low", "ci_high", "first_failure",
                                  "ratio", "outcome")
                   if column != "first_failure" or view != "keys_retrieved"),
                 "label")
OUTCOMES = ("fails_at", "plateau", "fails_everywhere", "never_fails")  # tie-break order
BOUNDS = ("never_fails", "fails_everywhere")  # outcomes whose value is a bound, not a point
POINTS = ("fails_at", "plateau")  # outcomes whose value is a point


LOSS_FLOOR = 1e-12  # losses are floored here before their log is taken
PLATEAU_PROBES = 3  # the last probes over which a keys-retrieved count that stays flat ...
PLATEAU_FLAT = 0.05  # ... within this share of its largest is a plateau, not a lower bound,
PLATEAU_SPAN = 2.0  # ... where its flat stretch spans at least this factor in n_keys


def failing(loss, diverged, threshold: float):
    """The loss view for points: fails when the run diverged or its final eval loss is missing
    (NaN) or above tau. Elementwise on arrays; a numpy bool for one point."""
    return np.asarray(diverged, bool) | ~(np.asarray(loss, float) <= threshold)


def candidate(fails: list[bool]) -> int | None:
    """Index of the first failing point whose next point fails too (or that is the last)."""
    for i, fails_here in enumerate(fails):
        if fails_here and (i == len(fails) - 1 or fails[i + 1]):
            return i
    return None


def value_column(view: str) -> str:
    """The capacity table's column of a view's failure point."""
    return "observed_capacity" + SUFFIX[view]


@dataclass(frozen=True)
class SeedResult:
    """Failure point of one (configuration, seed) series in one view."""

    outcome: str
    value: float          # n* for fails_at, else the bound (NaN for no_data)
    first_failure: float  # the grid n where the rule fires (NaN if it never does)
    last_pass: float      # the passing grid n just before it (fails_at only)
    noise: tuple = ()     # failing n below the failure point, each followed by a pass


NOT_SEARCHED = SeedResult("not_searched", math.nan, math.nan, math.nan)


def failure_point(n: np.ndarray, failing: np.ndarray, cross, cap: float = math.inf) -> SeedResult:
    """The rule on one series sorted by n; ``cross(i)`` interpolates between points i-1 and i;
    a fails_at value is kept within [n_a, n_b] and at most ``cap`` (never below n_a)."""
    if len(n) == 0:
        return SeedResult("no_data", math.nan, math.nan, math.nan)
    i = candidate(list(failing))
    noise = tuple(float(x) for x, f in zip(n[:len(n) if i is None else i], failing) if f)
    if i is None:
        return SeedResult("never_fails", float(n[-1]), math.nan, math.nan, noise)
    if i == 0:
        return SeedResult("fails_everywhere", float(n[0]), float(n[0]), math.nan)
    value = max(min(cross(i), n[i], cap), n[i - 1])
    return SeedResult("fails_at", float(value), float(n[i]), float(n[i - 1]), noise)


def loss_failure(n, loss, diverged, threshold: float, bound: float = math.inf) -> SeedResult:
    """Loss view: fails when loss > threshold, missing, or diverged; log-linear crossing,
    at most the rank ``bound``."""
    n, loss = np.asarray(n, float), np.asarray(loss, float)

    def cross(i):
        if not np.isfinite(loss[i]):
            return (n[i - 1] + n[i]) / 2
        la, lb = np.log10(max(loss[i - 1], LOSS_FLOOR)), np.log10(loss[i])
        return n[i - 1] + (np.log10(threshold) - la) / (lb - la) * (n[i] - n[i - 1])

    return failure_point(n, failing(loss, diverged, threshold), cross, bound)


def accuracy_failing(accuracy, diverged, threshold: float) -> np.ndarray:
    """The accuracy view for points: fails when diverged, or accuracy missing or below."""
    return np.asarray(diverged, bool) | ~(np.asarray(accuracy, float) >= threshold)


def accuracy_failure(n, accuracy, diverged, threshold: float) -> SeedResult:
    """Accuracy view: fails when accuracy < threshold, missing, or diverged; linear."""
    n, acc = np.asarray(n, float), np.asarray(accuracy, float)

    def cross(i):
        if not np.isfinite(acc[i]):
            return (n[i - 1] + n[i]) / 2
        return n[i - 1] + (acc[i - 1] - threshold) / (acc[i - 1] - acc[i]) * (n[i] - n[i - 1])

    return failure_point(n, accuracy_failing(acc, diverged, threshold), cross)


def keys_retrieved(n, accuracy, diverged) -> np.ndarray:
    """n_keys x accuracy per point, rounded to 1e-6 keys (a flat count, accuracy = c / n, stays
    flat rather than float noise: 16/18 x 18 is 16); 0 where the run diverged or has none."""
    k = np.asarray(n, float) * np.asarray(accuracy, float)
    return np.where(np.asarray(diverged, bool) | ~np.isfinite(k), 0.0, np.round(k, 6))


def keys_failure(n, accuracy, diverged) -> SeedResult:
    """Keys-retrieved view: the max of ``keys_retrieved`` over the series (n sorted), located
    ("fails_at", first_failure = the next probe above) when a probe above its n retrieves fewer;
    at the top probe, a "plateau" at that level when the count is flat (``plateau``), else
    "never_fails" (a lower bound)."""
    n = np.asarray(n, float)
    if len(n) == 0:
        return SeedResult("no_data", math.nan, math.nan, math.nan)
    k = keys_retrieved(n, accuracy, diverged)
    top = int(np.flatnonzero(k == k.max())[-1])
    if top == len(n) - 1:
        outcome = "plateau" if plateau(n, k) else "never_fails"
        return SeedResult(outcome, float(k[top]), math.nan, float(n[top]))
    return SeedResult("fails_at", float(k[top]), float(n[top + 1]), float(n[top]))


def plateau(n, k) -> bool:
    """Whether a keys-retrieved series (``keys_retrieved`` ``k`` at probes ``n``, sorted) ends on
    a plateau: each of its last PLATEAU_PROBES probes retrieves at least (1 - PLATEAU_FLAT) x its
    largest count, the top probes that do (its flat stretch) span at least PLATEAU_SPAN x in
    n_keys (close probes cannot tell flat from slowly rising), and the top probe retrieves under
    (1 - PLATEAU_FLAT) x its n_keys (it answers keys wrong: the count, not the probes, stopped
    rising)."""
    n, k = np.asarray(n, float), np.asarray(k, float)
    if len(k) < PLATEAU_PROBES:
        return False
    flat = k >= (1 - PLATEAU_FLAT) * k.max()
    if not flat[-PLATEAU_PROBES:].all():
        return False
    start = 0 if flat.all() else len(k) - int(np.argmin(flat[::-1]))  # the stretch's first probe
    return bool(n[-1] >= PLATEAU_SPAN * n[start]) and bool(k[-1] < (1 - PLATEAU_FLAT) * n[-1])


def series_results(series: pd.DataFrame, threshold: float, accuracy_threshold: float,
                   bound: float = math.inf) -> dict[str, SeedResult]:
    """The three views of one series (its feasible runs, any order)."""
    series = series[series["status"] != "infeasible"].sort_values("n_keys")
    n, loss, acc = (series[k].to_numpy(float) for k in
                    ("n_keys", "final_eval_loss", "final_eval_accuracy"))
    diverged = series["status"].eq("diverged").to_numpy()
    return {"loss": loss_failure(n, loss, diverged, threshold, bound),
            "accuracy": accuracy_failure(n, acc, diverged, accuracy_threshold),
            "keys_retrieved": keys_failure(n, acc, diverged)}


def seed_table(runs: pd.DataFrame, threshold: float, accuracy_threshold: float) -> pd.DataFrame:
    """One row per (label, seed): each view's SeedResult (loss unsuffixed, then ``_acc`` and
    ``_keys``). ``runs`` may carry ``rank_bound`` (the loss view's, NaN: none)."""
    rows = []
    for (label, seed), group in runs.groupby(["label", "seed"], sort=True):
        bound = group["rank_bound"].iloc[0] if "rank_bound" in group else math.nan
        views = series_results(group, threshold, accuracy_threshold,
                               math.inf if pd.isna(bound) else float(bound))
        asked = set(",".join(group.get("search_views", pd.Series(dtype=str)).dropna())
                    .split(",")) - {""} or set(VIEWS)  # a search's search.views; a grid: all
        views = {v: r if v in asked else NOT_SEARCHED for v, r in views.items()}
        row = {"label": label, "seed": seed}
        for view, result in views.items():
            row.update({f"{k}{SUFFIX[view]}": v for k, v in vars(result).items()})
        rows.append(row)
    return pd.DataFrame(rows)


def aggregate(values) -> tuple[float, float, float, float]:
    """(median, low, high, level) over seeds: ``intervals.median_interval``."""
    return median_interval(values)


def combine(outcomes) -> str:
    """The most common seed outcome (ties in the order of OUTCOMES); not_searched or no_data if
    none has data."""
    outcomes = list(outcomes)
    counts = Counter(o for o in outcomes if o not in ("no_data", "not_searched"))
    if not counts:
        return "not_searched" if "not_searched" in outcomes else "no_data"
    return max(OUTCOMES, key=lambda o: (counts[o], -OUTCOMES.index(o)))


def censored_median(outcomes, values) -> tuple[float, float, float, float, str]:
    """(median, low, high, level, outcome) over seeds, each bound the interval it allows
    (``censored.median``): a point when the bounds lie beyond the middle seed (outcome: that of
    the seeds whose point is the median, else the seeds' most common point outcome), else the
    bound it is: "never_fails" at its lowest value when its highest is open, "fails_everywhere"
    at its highest when its lowest is 0, and where both ends are finite the kind of bound most
    of the bounded seeds are (ties: a lower bound)."""
    outcomes, values = list(outcomes), list(values)
    m = median(*seed_intervals(outcomes, values))
    if m.n == 0:
        return math.nan, math.nan, math.nan, math.nan, combine(outcomes)
    if m.point:
        at = [o for o, v in zip(outcomes, values) if o in POINTS and v == m.value]
        points = at or [o for o in outcomes if o in POINTS]
        return m.value, m.low, m.high, m.level, combine(points) if points else "fails_at"
    lower = sum(o == "never_fails" for o in outcomes) >= sum(o == "fails_everywhere"
                                                             for o in outcomes)
    if m.highest == math.inf or (m.lowest > 0 and lower):
        return m.lowest, m.low, m.high, m.level, "never_fails"
    return m.highest, m.low, m.high, m.level, "fails_everywhere"


def _view(group: pd.DataFrame, view: str, predicted) -> dict:
    """One view's columns of a configuration's row from its seeds."""
    s = SUFFIX[view]
    value, low, high, level, outcome = censored_median(group[f"outcome{s}"],
                                                       group[f"value{s}"])
    if len(group) == 1 and group[f"outcome{s}"].iloc[0] == "fails_at" and view != "keys_retrieved":
        low, high = group[f"last_pass{s}"].iloc[0], group[f"first_failure{s}"].iloc[0]
    out = {f"observed_capacity{s}": value, f"ci_low{s}": low, f"ci_high{s}": high,
           f"ratio{s}": math.nan if pd.isna(predicted) else value / predicted,
           f"outcome{s}": outcome}
    if view != "keys_retrieved":
        out[f"first_failure{s}"] = aggregate(group[f"first_failure{s}"])[0]
    if view == "loss":
        out["ci_level"] = level
    return out


def capacity_table(runs: pd.DataFrame, seeds: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration with the columns of CAPACITY_COLUMNS + EXTRA_COLUMNS."""
    rows = []
    for label, group in seeds.groupby("label"):
        first = runs[runs["label"] == label].iloc[0]
        predicted = first["predicted_capacity"]
        row = {**{k: first[k] for k in CONFIG_KEYS}, "predicted_capacity": predicted,
               "n_seeds": int((group["outcome"] != "no_data").sum()), "label": label,
               "rank_bound": first["rank_bound"] if "rank_bound" in first else math.nan}
        for view in VIEWS:
            row.update(_view(group, view, predicted))
        rows.append(row)
    table = pd.DataFrame(rows, columns=list(CAPACITY_COLUMNS + EXTRA_COLUMNS))
    for key in ("d_dot", "predicted_capacity", "rank_bound"):
        table[key] = pd.to_numeric(table[key]).astype("Int64")
    order = sorted(range(len(table)), key=lambda i: natural_key(table["label"].iloc[i]))
    return table.iloc[order].reset_index(drop=True)


def interval_words(view: str, n_seeds: int, outcome: str) -> str:
    """What a configuration's interval in ``view`` is (``_view``): one seed's bracket [last
    pass, first fail], the order-statistic interval over its seeds with its level
    (``intervals.describe``), or none (one seed with a bound, or in the keys-retrieved view)."""
    if outcome == "no_data" or not n_seeds:
        return "none"
    if n_seeds == 1:
        return ("bracket: one seed's [last pass, first fail]"
                if outcome == "fails_at" and view != "keys_retrieved" else "one seed: no interval")
    return describe(int(n_seeds))


def by_view(capacity: pd.DataFrame) -> pd.DataFrame:
    """The long capacity table: one row per configuration and view, for filtering by map and
    view: the configuration (label, CONFIG_KEYS, predicted capacity, seeds, rank bound),
    ``view``, and the view's failure_point, ci_low, ci_high, level (the interval's coverage over
    seeds; NaN for one seed or a view without intervals), interval (``interval_words``), outcome
    and ratio; the authors' published failure point beside the loss view only, and the
    configuration's ``flags`` where ``capacity`` has them (``flags.py``)."""
    keep = [c for c in ("label", *CONFIG_KEYS, "predicted_capacity", "n_seeds", "rank_bound")
            if c in capacity]
    frames = []
    for view in VIEWS:
        s = SUFFIX[view]
        intervals = [interval_words(view, n, o) for n, o in
                     zip(capacity["n_seeds"], capacity[f"outcome{s}"])]
        part = capacity[keep].assign(
            view=view, failure_point=capacity[f"observed_capacity{s}"],
            ci_low=capacity[f"ci_low{s}"], ci_high=capacity[f"ci_high{s}"],
            level=[level if kind.endswith("%)") else math.nan
                   for level, kind in zip(capacity["ci_level"], intervals)],
            interval=intervals, outcome=capacity[f"outcome{s}"], ratio=capacity[f"ratio{s}"])
        for column in ("published_capacity", "published_outcome"):
            if column in capacity:
                part[column] = capacity[column] if view == "loss" else None
        if "flags" in capacity:
            part["flags"] = capacity["flags"]
        frames.append(part)
    return pd.concat(frames, ignore_index=True)
