"""Rankings that the seeds can tell apart: tiers of capacity efficiency per size and view, and a
table of what the store measured about each configuration. Pure: it reads no file.

Its rule is stated once, in docs/analysis.md ("Tiers per view and measured flags").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kernelzoo.analysis.capacity import BOUNDS, POINTS, VIEW_WORDS, VIEWS, by_view
from kernelzoo.analysis.efficiency import efficiency_order
from kernelzoo.analysis.rankings import limits, sizes

PARTIAL = 1.5  # keys retrieved over the largest n_keys passing the accuracy view


@dataclass(frozen=True)
class Placed:
    """One configuration in one view at one size: its tier (None: a bound, shown apart), its
    efficiency with its interval, and its outcome."""

    label: str
    size: int
    view: str
    tier: int | None
    efficiency: float
    low: float
    high: float
    outcome: str


def tiers(capacity: pd.DataFrame) -> list[Placed]:
    """Every configuration with a bounded d_dot placed in each view (module docstring)."""
    found = []
    for size, levels in sizes(capacity).items():
        mine = capacity[capacity["predicted_capacity"].isin(levels)]
        for view in VIEWS:
            order = efficiency_order(mine, view)
            tier, members = 0, []
            for r in order.itertuples():
                outcome, ratio = r.outcome, r.ratio
                if outcome not in POINTS:
                    found.append(Placed(r.label, size, view, None, ratio, math.nan, math.nan,
                                        outcome))
                    continue
                low, high = r.efficiency_low, r.efficiency_high
                if tier == 0 or not all(high >= a and low <= b for a, b in members):
                    tier, members = tier + 1, []  # apart from some member: the next tier
                members.append((low, high))
                found.append(Placed(r.label, size, view, tier, ratio, low, high, outcome))
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
