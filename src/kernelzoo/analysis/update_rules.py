"""Do update rules change capacity? (experiment ``figure3``: Schlag et al. 2021, Figure 3)

For every map run with several update rules (sum, delta, fwm; task-spec "Sweep of Figure 3"),
the rules are ranked by their failure points in the *accuracy view*, a view all rules share.
fwm's loss is on the scale of its LayerNorm output y = LayerNorm(W phi(q)), and two floors keep
it from being compared with the other rules': y has mean 0, so against a one-hot target (mean
1/S) its loss is at least 0.5 / S, whatever is retrieved (0.025 at 20 keys, above tau = 0.01 for
every S < 50: the loss view calls each such fwm run a failure); and while the read-out's
variance is well above the LayerNorm's eps (1e-5), y also has norm sqrt(S) and its loss is at
least 0.5 (1 + (sqrt(S - 1) - 1)^2), 6.1 at 20 keys. A trained read-out can leave that regime:
with variance near eps, LayerNorm(c onehot) is onehot - 1/S for one c, at loss 0.5 / S exactly
(the committed DPFP-1 + fwm run at 20 keys ends at 0.025, every key right). So fwm's loss view
is shown beside the others (the rank bound of ``rank_bound.py`` covers it, at rank d_dot + 1),
and fwm is compared in the accuracy and keys-retrieved views. On one grid of n_keys a
never_fails bound ranks above every failure point and a fails_everywhere bound below.

With replacement (Setting 2) only the distinct keys of a sequence occupy the state: L uniform
draws over S keys hold S (1 - (1 - 1/S)^L) distinct keys on average. Evaluation sequences have
L = S (the authors' quirk; training ones 2S), about 0.63 S distinct keys, so a state of d_dot is
expected to hold up to about d_dot / 0.63 = 1.58 d_dot keys. The table gives the distinct keys
of an evaluation sequence at each failure point against d_dot.

The report's section (``report.studies``) also says, per sum-rule configuration, whether the
sum rule retrieves at all when keys are written again (Setting 2: a key's answer is the LAST
value written, and the sum rule only adds), and lists the runs that diverged with the reason
their summary gives.
"""

from __future__ import annotations

import math

import pandas as pd

from kernelzoo.analysis import rank_bound
from kernelzoo.core import rules

ORDER = {"never_fails": 2, "fails_at": 1, "plateau": 1, "fails_everywhere": 0, "no_data": -1}


def layer_norm(update_rule: pd.Series) -> pd.Series:
    """Whether each row's rule reads out by a LayerNorm (``UpdateRule.layer_norm``: fwm), whose
    loss has a floor of 0.5 / S (module docstring)."""
    return update_rule.map(lambda n: n in rules.RULES and rules.RULES[n].layer_norm).astype(bool)


def only_adds(update_rule: pd.Series) -> pd.Series:
    """Whether each row's rule only adds to the state (``UpdateRule.erases`` false: sum)."""
    return update_rule.map(lambda n: n in rules.RULES and not rules.RULES[n].erases).astype(bool)


def fwm_floor(n_keys: int, d_dot=None, replacement: bool = True, max_queries: int = 200,
              query_batch: int | None = 32) -> float:
    """The lowest eval loss of an fwm read-out at ``n_keys`` keys: 0.5 / S, its LayerNorm output
    having mean 0 (module docstring; every query's loss is at least that, so any weighting of
    the queries is too), or, in Setting 1, the rank bound's floor at rank d_dot + 1
    (``rank_bound.floor_of``) where that is higher."""
    rank = math.nan if replacement else rank_bound.floor_of(n_keys, d_dot, "fwm", max_queries,
                                                              query_batch)
    return max(0.5 / n_keys, 0.0 if math.isnan(rank) else rank)


def _map_label(label: str, rule: str) -> str:
    return " ".join(t for t in label.split() if t != rule)


def table(capacity: pd.DataFrame) -> pd.DataFrame:
    """Every configuration of an experiment with two or more update rules: map label, rule and
    ``rank`` within the map (1 = holds the most keys, accuracy criterion); empty otherwise."""
    if capacity["update_rule"].nunique() < 2:
        return pd.DataFrame()
    rows = []
    for _, group in capacity.groupby(["feature_map", "params", "d_key"], dropna=False):
        group = group.assign(
            map=[_map_label(r.label, r.update_rule) for r in group.itertuples()],
            _outcome=group["outcome_acc"].map(ORDER),
            _value=group["observed_capacity_acc"].fillna(-math.inf))
        group = group.sort_values(["_outcome", "_value"], ascending=False)
        rows.append(group.assign(rank=range(1, len(group) + 1))
                    .drop(columns=["_outcome", "_value"]))
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()


def distinct_keys(n_keys: float, length: float, replacement: bool) -> float:
    """Expected distinct keys in a sequence of ``length`` writes over ``n_keys`` key symbols:
    n (1 - (1 - 1/n)^L) drawn with replacement, else min(n, L)."""
    if not replacement:
        return min(n_keys, length)
    return n_keys * (1 - (1 - 1 / n_keys) ** length)
