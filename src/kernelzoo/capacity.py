"""The failure-point rule: each (configuration, seed) series' failure point and its aggregate
over seeds, on the runs table that ``analyze.load_runs`` reads. Pure: it reads no file.

Failure-point rule (stated again in report.md)
----------------------------------------------
A configuration is (feature_map, params, d_key, d_dot, update_rule). For each configuration and
seed, over n_keys ascending, a grid point fails when its final eval loss is above tau
(``threshold``) or missing, or when the run diverged; infeasible runs are left out. The failure
point is the first failing n whose next grid point fails too (a failure followed by a pass is
noise; a failing last point counts alone). Between the last passing point n_a (loss l_a) and the
failing one n_b (loss l_b), n* = n_a + (log tau - log l_a) / (log l_b - log l_a) * (n_b - n_a),
clamped to [n_a, n_b]; losses are floored at 1e-12 and, when l_b is not finite, n* is the
midpoint. Outcomes: "fails_at" (n*), "never_fails" (lower bound: the largest n tried),
"fails_everywhere" (the first point already fails; upper bound: the smallest n tried) and
"no_data". Failures below the failure point (each followed by a pass) are listed as noise.
The accuracy criterion is the same rule with accuracy < ``accuracy_threshold``, interpolated
linearly in accuracy. A stalled run (a few keys never learned where the configuration holds as
many keys in some run: the stall rule, ``stalls.py``) is left out of its seed's series wherever
it would fail: a failure point is never set by a stall. Seeds aggregate to the median of their
numbers (bounds included) with a min-max interval below 5 seeds, else a bootstrap 95% percentile
interval (RNG seed 0); a single seed's interval is its bracket [n_a, n_b] (a bound's, the bound
itself); a configuration's outcome is its most common seed outcome (ties: fails_at, then
fails_everywhere). Predicted capacity = the map's d_dot (null: unbounded); ratio = observed /
predicted.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kernelzoo.search import LOSS_FLOOR, candidate, failing
from kernelzoo.style import natural_key

CONFIG_KEYS = ("feature_map", "params", "d_key", "d_dot", "update_rule", "lr")
CAPACITY_COLUMNS = CONFIG_KEYS + (
    "predicted_capacity", "n_seeds", "observed_capacity", "ci_low", "ci_high", "first_failure",
    "ratio", "outcome",
)
EXTRA_COLUMNS = ("observed_capacity_acc", "ci_low_acc", "ci_high_acc", "first_failure_acc",
                 "outcome_acc", "label")
OUTCOMES = ("fails_at", "fails_everywhere", "never_fails")  # tie-break order
BOOTSTRAP_SAMPLES = 2000
RULE = __doc__.partition("---\n")[2].strip()


@dataclass(frozen=True)
class SeedResult:
    """Failure point of one (configuration, seed) series."""

    outcome: str
    value: float          # n* for fails_at, else the bound (NaN for no_data)
    first_failure: float  # the grid n where the rule fires (NaN if it never does)
    last_pass: float      # the passing grid n just before it (fails_at only)
    noise: tuple = ()     # failing n below the failure point, each followed by a pass


def failure_point(n: np.ndarray, failing: np.ndarray, cross) -> SeedResult:
    """The rule on one series sorted by n; ``cross(i)`` interpolates between points i-1 and i."""
    if len(n) == 0:
        return SeedResult("no_data", math.nan, math.nan, math.nan)
    i = candidate(list(failing))
    noise = tuple(float(x) for x, f in zip(n[:len(n) if i is None else i], failing) if f)
    if i is None:
        return SeedResult("never_fails", float(n[-1]), math.nan, math.nan, noise)
    if i == 0:
        return SeedResult("fails_everywhere", float(n[0]), float(n[0]), math.nan)
    value = min(max(cross(i), n[i - 1]), n[i])
    return SeedResult("fails_at", float(value), float(n[i]), float(n[i - 1]), noise)


def loss_failure(n, loss, diverged, threshold: float) -> SeedResult:
    """Loss criterion: fails when loss > threshold, missing, or diverged; log-linear crossing."""
    n, loss = np.asarray(n, float), np.asarray(loss, float)

    def cross(i):
        if not np.isfinite(loss[i]):
            return (n[i - 1] + n[i]) / 2
        la, lb = np.log10(max(loss[i - 1], LOSS_FLOOR)), np.log10(loss[i])
        return n[i - 1] + (np.log10(threshold) - la) / (lb - la) * (n[i] - n[i - 1])

    return failure_point(n, failing(loss, diverged, threshold), cross)


def accuracy_failing(accuracy, diverged, threshold: float) -> np.ndarray:
    """The accuracy criterion for points: fails when diverged, or accuracy missing or below."""
    return np.asarray(diverged, bool) | ~(np.asarray(accuracy, float) >= threshold)


def accuracy_failure(n, accuracy, diverged, threshold: float) -> SeedResult:
    """Accuracy criterion: fails when accuracy < threshold, missing, or diverged; linear."""
    n, acc = np.asarray(n, float), np.asarray(accuracy, float)

    def cross(i):
        if not np.isfinite(acc[i]):
            return (n[i - 1] + n[i]) / 2
        return n[i - 1] + (acc[i - 1] - threshold) / (acc[i - 1] - acc[i]) * (n[i] - n[i - 1])

    return failure_point(n, accuracy_failing(acc, diverged, threshold), cross)


def aggregate(values) -> tuple[float, float, float]:
    """(median, low, high): min-max below 5 values, else a bootstrap 95% percentile interval."""
    values = np.asarray([v for v in values if not math.isnan(v)], float)
    if len(values) == 0:
        return math.nan, math.nan, math.nan
    if len(values) < 5:
        return float(np.median(values)), float(values.min()), float(values.max())
    draws = np.random.default_rng(0).choice(values, size=(BOOTSTRAP_SAMPLES, len(values)))
    low, high = np.percentile(np.median(draws, axis=1), [2.5, 97.5])
    return float(np.median(values)), float(low), float(high)


def combine(outcomes) -> str:
    """The most common seed outcome (ties in the order of OUTCOMES); no_data if none has data."""
    counts = Counter(o for o in outcomes if o != "no_data")
    if not counts:
        return "no_data"
    return max(OUTCOMES, key=lambda o: (counts[o], -OUTCOMES.index(o)))


def seed_table(runs: pd.DataFrame, threshold: float, accuracy_threshold: float) -> pd.DataFrame:
    """One row per (label, seed): both criteria's SeedResults. Infeasible points are left out,
    and stalled runs (column ``stalled``, ``stalls.py``) wherever they fail the criterion."""
    rows = []
    for (label, seed), group in runs.groupby(["label", "seed"], sort=True):
        series = group[group["status"] != "infeasible"].sort_values("n_keys")
        n, loss, acc = (series[k].to_numpy(float) for k in
                        ("n_keys", "final_eval_loss", "final_eval_accuracy"))
        diverged = series["status"].eq("diverged").to_numpy()
        stalled = series["stalled"].to_numpy(bool) if "stalled" in series else False
        keep = ~(stalled & failing(loss, diverged, threshold))
        by_loss = loss_failure(n[keep], loss[keep], diverged[keep], threshold)
        keep = ~(stalled & accuracy_failing(acc, diverged, accuracy_threshold))
        by_acc = accuracy_failure(n[keep], acc[keep], diverged[keep], accuracy_threshold)
        rows.append({"label": label, "seed": seed, **vars(by_loss),
                     **{f"{k}_acc": v for k, v in vars(by_acc).items()}})
    return pd.DataFrame(rows)


def capacity_table(runs: pd.DataFrame, seeds: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration with the columns of CAPACITY_COLUMNS + EXTRA_COLUMNS."""
    rows = []
    for label, group in seeds.groupby("label"):
        first = runs[runs["label"] == label].iloc[0]
        observed, low, high = aggregate(group["value"])
        if len(group) == 1 and group["outcome"].iloc[0] == "fails_at":  # its bracket
            low, high = group["last_pass"].iloc[0], group["first_failure"].iloc[0]
        observed_acc, low_acc, high_acc = aggregate(group["value_acc"])
        predicted = first["predicted_capacity"]
        rows.append({
            **{k: first[k] for k in CONFIG_KEYS}, "predicted_capacity": predicted,
            "n_seeds": int((group["outcome"] != "no_data").sum()),
            "observed_capacity": observed, "ci_low": low, "ci_high": high,
            "first_failure": aggregate(group["first_failure"])[0],
            "ratio": math.nan if pd.isna(predicted) else observed / predicted,
            "outcome": combine(group["outcome"]),
            "observed_capacity_acc": observed_acc, "ci_low_acc": low_acc, "ci_high_acc": high_acc,
            "first_failure_acc": aggregate(group["first_failure_acc"])[0],
            "outcome_acc": combine(group["outcome_acc"]), "label": label,
        })
    table = pd.DataFrame(rows, columns=list(CAPACITY_COLUMNS + EXTRA_COLUMNS))
    for key in ("d_dot", "predicted_capacity"):
        table[key] = table[key].astype("Int64")
    order = sorted(range(len(table)), key=lambda i: natural_key(table["label"].iloc[i]))
    return table.iloc[order].reset_index(drop=True)
