"""Rankings that the seeds can tell apart: tiers of capacity efficiency per size and view, and a
table of what the store measured about each configuration. Pure: it reads no file.

Its rule is stated once, in docs/analysis.md ("Tiers per view and measured flags").
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from kernelzoo.analysis.capacity import BOUNDS, POINTS, SUFFIX, VIEW_WORDS, VIEWS, by_view
from kernelzoo.analysis.efficiency import efficiency_order
from kernelzoo.analysis.rankings import limits, sizes

PARTIAL = 1.5  # keys retrieved over the largest n_keys passing the accuracy view


ALPHA = 0.025  # the familywise level of the pairwise tests that cut tiers (compare.LEVEL's)


@dataclass(frozen=True)
class Placed:
    """One configuration in one view at one size: its tier (None: shown apart, ``apart`` says
    why: "bound", "a seed is a bound", "one seed", "no spread"), its efficiency with its
    interval, and its outcome."""

    label: str
    size: int
    view: str
    tier: int | None
    efficiency: float
    low: float
    high: float
    outcome: str
    apart: str = ""


@functools.lru_cache(maxsize=256)
def _critical(k: int, dof: int) -> float:
    """The studentized range's upper ALPHA point for ``k`` means and ``dof`` degrees of
    freedom (the one slow step of HSD, kept for the next family of that shape)."""
    return float(stats.studentized_range.ppf(1 - ALPHA, k, dof))


def _separated(samples: dict[str, np.ndarray]) -> dict[tuple[str, str], bool] | None:
    """Which pairs of ``samples`` Tukey's HSD separates at ALPHA familywise (every pair at once,
    the seeds' spread pooled; Tukey-Kramer for unequal seeds: the test of
    ``scipy.stats.tukey_hsd``, its p below ALPHA exactly where the statistic passes the
    critical value); None where the pairs cannot be tested (no spread in any sample)."""
    labels = list(samples)
    if len(labels) < 2:
        return {}  # one configuration: no pair to test
    n = np.array([len(v) for v in samples.values()], float)
    means = np.array([v.mean() for v in samples.values()])
    dof = int(n.sum() - len(n))
    mse = sum(float(((v - v.mean()) ** 2).sum()) for v in samples.values()) / dof
    if not mse > 0:
        return None
    se = np.sqrt(mse / 2 * (1 / n[:, None] + 1 / n[None, :]))
    beyond = np.abs(means[:, None] - means[None, :]) / se > _critical(len(labels), dof)
    return {(a, b): bool(beyond[i, j]) for i, a in enumerate(labels)
            for j, b in enumerate(labels) if i != j}


def tiers(capacity: pd.DataFrame, seeds: pd.DataFrame) -> list[Placed]:
    """Every configuration with a bounded d_dot placed in each view (module docstring):
    ``seeds`` is ``capacity.seed_table``."""
    found = []
    for size, levels in sizes(capacity).items():
        mine = capacity[capacity["predicted_capacity"].isin(levels)]
        d_dot = mine.set_index("label")["predicted_capacity"].astype(float)
        own = dict(tuple(seeds[seeds["label"].isin(mine["label"])].groupby("label")))
        long = by_view(mine)
        for view in VIEWS:
            order = efficiency_order(mine, view, long)
            s = SUFFIX[view]
            apart, samples = {}, {}
            for r in order.itertuples():
                rows = own.get(r.label, seeds.iloc[:0])
                rows = rows[rows[f"outcome{s}"] != "no_data"]
                if r.outcome not in POINTS:
                    apart[r.label] = "bound"
                elif not rows[f"outcome{s}"].isin(POINTS).all():
                    apart[r.label] = "a seed is a bound"
                elif len(rows) < 2:
                    apart[r.label] = "one seed"
                else:
                    samples[r.label] = rows[f"value{s}"].to_numpy(float) / d_dot[r.label]
            separated = _separated(samples)
            if separated is None:
                apart.update({label: "no spread" for label in samples})
            tier, members = 0, []
            for r in order.itertuples():
                low, high = r.efficiency_low, r.efficiency_high
                if r.label in apart:
                    found.append(Placed(r.label, size, view, None, r.ratio, low, high,
                                        r.outcome, apart[r.label]))
                    continue
                if tier == 0 or any(separated[r.label, m] for m in members):
                    tier, members = tier + 1, []  # separated from some member: the next tier
                members.append(r.label)
                found.append(Placed(r.label, size, view, tier, r.ratio, low, high, r.outcome))
    return found


def _share(seeds_with: pd.Series, seeds: pd.Series) -> pd.Series:
    """Per label: True when at least half its seeds are in ``seeds_with``."""
    return seeds_with.groupby(level=0).size().reindex(seeds.index, fill_value=0) * 2 >= seeds


def flags(capacity: pd.DataFrame, runs: pd.DataFrame, threshold: float,
          accuracy_threshold: float) -> pd.DataFrame:
    """One row per configuration of ``capacity``: label and each flag of the module docstring
    (diluted, partial, lenient: bool; retrieved_over: the median over seeds of keys retrieved
    over the largest n_keys passing the accuracy view, inf where none passes; bound: the views;
    limits: rankings' words; blew_up, learned_then_lost, never_learned: run counts, NA where
    the curves were not read)."""
    runs = runs[runs["label"].isin(capacity["label"])]
    seeds = runs.groupby("label")["seed"].nunique()
    ok = runs["status"] != "diverged"
    acc = runs["final_eval_accuracy"].astype(float)
    diluted_runs = runs[ok & (runs["final_eval_loss"] > threshold) & (acc >= accuracy_threshold)]
    diluted = _share(diluted_runs.drop_duplicates(["label", "seed"]).set_index("label")["seed"],
                     seeds)
    passing = runs[ok & (acc >= accuracy_threshold)].groupby(["label", "seed"])["n_keys"].max()
    keys = (runs["n_keys"] * acc).where(ok, 0.0).groupby([runs["label"], runs["seed"]]).max()
    partial_seeds = keys[keys > PARTIAL * passing.reindex(keys.index).fillna(0)]
    partial = _share(pd.Series(partial_seeds.index.get_level_values(1),
                               index=partial_seeds.index.get_level_values(0)), seeds)
    with np.errstate(divide="ignore"):
        over = (keys / passing.reindex(keys.index).fillna(0)).groupby(level=0).median()
    lenient_runs = runs[ok & (runs["final_eval_loss"] <= threshold) & (acc < accuracy_threshold)]
    lenient = _share(lenient_runs.drop_duplicates(["label", "seed"]).set_index("label")["seed"],
                     seeds)
    long = by_view(capacity)
    bounded = long[long["outcome"].isin(BOUNDS)].groupby("label", sort=False)["view"].agg(list)
    rows = []
    for r in capacity.itertuples():  # a configuration's bound views in the order of VIEWS
        rows.append({"label": r.label, "diluted": bool(diluted.get(r.label, False)),
                     "partial": bool(partial.get(r.label, False)),
                     "lenient": bool(lenient.get(r.label, False)),
                     "retrieved_over": float(over.get(r.label, math.nan)),
                     "bound": [VIEW_WORDS[v] for v in bounded.get(r.label, [])],
                     "limits": limits(r) if not pd.isna(r.predicted_capacity) else [],
                     **{k: getattr(r, k, pd.NA) for k in
                        ("blew_up", "learned_then_lost", "never_learned")}})
    return pd.DataFrame(rows)
