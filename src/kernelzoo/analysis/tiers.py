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
from kernelzoo.analysis.compare import fewest_seeds
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


@functools.lru_cache(maxsize=1024)
def _critical(k: int, dof: int, alpha: float = ALPHA) -> float:
    """The studentized range's upper ``alpha`` point for ``k`` means and ``dof`` degrees of
    freedom (the one slow step of HSD, kept for the next family of that shape)."""
    return float(stats.studentized_range.ppf(1 - alpha, k, dof))


def _pooled(samples: dict[str, np.ndarray]) -> tuple[float, int]:
    """The samples' spread pooled (the mean square within them) and its degrees of freedom."""
    dof = int(sum(len(v) for v in samples.values()) - len(samples))
    if dof < 1:
        return math.nan, dof
    return sum(float(((v - v.mean()) ** 2).sum()) for v in samples.values()) / dof, dof


def separated(samples: dict[str, np.ndarray], alpha: float = ALPHA
              ) -> dict[tuple[str, str], bool] | None:
    """Which pairs of ``samples`` Tukey's HSD separates at ``alpha`` familywise (every pair at
    once, the seeds' spread pooled; Tukey-Kramer for unequal seeds: the test of
    ``scipy.stats.tukey_hsd``, its p below alpha exactly where the statistic passes the
    critical value); None where the pairs cannot be tested (no spread in any sample)."""
    labels = list(samples)
    if len(labels) < 2:
        return {}  # one configuration: no pair to test
    n = np.array([len(v) for v in samples.values()], float)
    means = np.array([v.mean() for v in samples.values()])
    mse, dof = _pooled(samples)
    if not mse > 0:
        return None
    se = np.sqrt(mse / 2 * (1 / n[:, None] + 1 / n[None, :]))
    beyond = np.abs(means[:, None] - means[None, :]) / se > _critical(len(labels), dof, alpha)
    return {(a, b): bool(beyond[i, j]) for i, a in enumerate(labels)
            for j, b in enumerate(labels) if i != j}


def seeds_to_separate(difference: float, mse: float, k: int, alpha: float = ALPHA
                      ) -> int | None:
    """The fewest seeds n per configuration at which Tukey's HSD at ``alpha`` over ``k``
    configurations (their spread pooled: ``mse``, k (n - 1) degrees of freedom) separates two
    whose true difference is ``difference`` with probability ``compare.DECIDE``: the pair is
    separated when |T| > q / sqrt(2), T noncentral t with noncentrality |difference| /
    sqrt(2 mse / n) (exact for that pair below 64 degrees of freedom; above, q is taken at the
    power of 2 below: lr_robustness' estimates moved by up to a fifth either way against the
    exact quantile, their medians by at most 1.5 seeds); None when no n up to
    ``compare.MOST_SEEDS`` does, or nothing spreads. A sample-size estimate: it takes the
    observed difference and spread as true."""
    if difference == 0 or not mse > 0 or k < 2:
        return None

    def power(n: int) -> float:
        dof = k * (n - 1)
        # from 64 degrees of freedom the critical value is taken at the power of 2 below (a
        # slightly larger q), so a few values serve every estimate: the studentized range's
        # quantile is the slow step
        c = _critical(k, dof if dof < 64 else 2 ** int(math.log2(dof)), alpha) / math.sqrt(2)
        nc = abs(difference) / math.sqrt(2 * mse / n)
        found = stats.nct.sf(c, dof, nc) + stats.nct.cdf(-c, dof, nc)
        return found if np.isfinite(found) else 1.0  # scipy's nct: nan where nc is huge
    return fewest_seeds(power)


def samples(capacity: pd.DataFrame, seeds: pd.DataFrame, levels, view: str,
            long: pd.DataFrame | None = None) -> tuple[pd.DataFrame, dict, dict]:
    """The configurations of one size (``levels``: its d_dot values) in one view, in efficiency
    order, split into those HSD tests (label -> the seeds' failure point / d_dot) and those
    apart (label -> why: "bound", "a seed is a bound", "one seed")."""
    mine = capacity[capacity["predicted_capacity"].isin(levels)]
    d_dot = mine.set_index("label")["predicted_capacity"].astype(float)
    own = dict(tuple(seeds[seeds["label"].isin(mine["label"])].groupby("label")))
    order = efficiency_order(mine, view, by_view(mine) if long is None else long)
    s = SUFFIX[view]
    apart, tested = {}, {}
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
            tested[r.label] = rows[f"value{s}"].to_numpy(float) / d_dot[r.label]
    return order, tested, apart


def pooled(tested: dict[str, np.ndarray]) -> float:
    """The tested configurations' spread pooled, as HSD pools it (NaN without one)."""
    return _pooled(tested)[0]


def tiers(capacity: pd.DataFrame, seeds: pd.DataFrame) -> list[Placed]:
    """Every configuration with a bounded d_dot placed in each view (module docstring):
    ``seeds`` is ``capacity.seed_table``."""
    found = []
    for size, levels in sizes(capacity).items():
        long = by_view(capacity[capacity["predicted_capacity"].isin(levels)])
        for view in VIEWS:
            order, tested, apart = samples(capacity, seeds, levels, view, long)
            split = separated(tested)
            if split is None:
                apart.update({label: "no spread" for label in tested})
            tier, members = 0, []
            for r in order.itertuples():
                low, high = r.efficiency_low, r.efficiency_high
                if r.label in apart:
                    found.append(Placed(r.label, size, view, None, r.ratio, low, high,
                                        r.outcome, apart[r.label]))
                    continue
                if tier == 0 or any(split[r.label, m] for m in members):
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
