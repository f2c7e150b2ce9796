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

The section also says, per sum-rule configuration, whether the sum rule retrieves at all when
keys are written again (Setting 2: a key's answer is the LAST value written, and the sum rule
only adds), and lists the runs that diverged with the reason their summary gives.
"""

from __future__ import annotations

import math

import pandas as pd

from kernelzoo.analysis import rank_bound
from kernelzoo.analysis.labels import bound, cell, natural_key

ORDER = {"never_fails": 2, "fails_at": 1, "plateau": 1, "fails_everywhere": 0, "no_data": -1}


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


def _value(r) -> str:
    """A failure point under the accuracy criterion, bounds as inequalities."""
    return bound(r.observed_capacity_acc, r.outcome_acc)


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


def _distinct_at_failure(r, runs: pd.DataFrame) -> str:
    """The distinct keys of an evaluation sequence at the failure point (accuracy criterion),
    and their ratio to d_dot; "–" when the runs' evaluation lengths differ in kind."""
    mine = runs[runs["label"] == r.label]
    n = r.observed_capacity_acc
    if mine.empty or pd.isna(n):
        return "–"
    if (mine["eval_seq_len"] == mine["n_keys"]).all():
        length = n  # the default: evaluation sequences of n_keys writes
    elif mine["eval_seq_len"].nunique() == 1:
        length = float(mine["eval_seq_len"].iloc[0])
    else:
        return "–"
    distinct = distinct_keys(n, length, bool((mine["task"] == "update").all()))
    text = bound(distinct, r.outcome_acc)
    return text + (f" ({distinct / r.d_dot:.2f})" if pd.notna(r.d_dot) else "")


def sum_rule_lines(capacity: pd.DataFrame, runs: pd.DataFrame) -> list[str]:
    """Per sum-rule configuration trained with replacement: does it retrieve at all?"""
    replaced = runs[runs["task"] == "update"]
    lines = []
    for r in capacity[capacity["update_rule"] == "sum"].itertuples():
        if r.label not in set(replaced["label"]):
            continue
        if r.outcome_acc == "fails_everywhere":
            verdict = (f"fails at every n_keys tried ({_value(r)}): with replacement it cannot "
                       "retrieve, since it adds each write to the old value instead of "
                       "replacing it")
        elif r.outcome_acc == "never_fails":
            verdict = f"never fails ({_value(r)}): it handles replacement at every size tried"
        else:
            ratio = "" if pd.isna(r.d_dot) else f", {r.observed_capacity_acc / r.d_dot:.2f} d_dot"
            verdict = f"holds up to {_value(r)} keys with replacement{ratio}"
        lines.append(f"- {r.label}: {verdict}.")
    return lines


def diverged_lines(runs: pd.DataFrame) -> list[str]:
    """One line per configuration with diverged runs: where, and the reason recorded."""
    lines = []
    for label, group in runs[runs["status"] == "diverged"].groupby("label"):
        total = int((runs["label"] == label).sum())
        keys = ", ".join(str(n) for n in sorted(group["n_keys"].unique()))
        reasons = sorted(set(group["reason"].dropna()), key=natural_key)
        lines.append(f"- {label}: {len(group)} of {total} runs, at n_keys {keys}. "
                     + (f"First reason: {reasons[0]}" if reasons else "No reason recorded.")
                     + (f" ({len(reasons) - 1} more)" if len(reasons) > 1 else ""))
    return lines


def section(capacity: pd.DataFrame, runs: pd.DataFrame) -> list[str]:
    """The report's "Update rules" section; [] unless the experiment has several rules."""
    found = table(capacity)
    if found.empty:
        return []
    lines = ["## Update rules", "", "| map | rank | update rule | d_dot | failure point (accuracy) | outcome | "
             "ratio to d_dot | distinct keys there (/ d_dot) | failure point (loss) | keys "
             "retrieved |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in found.itertuples():
        loss = f"{cell(r.observed_capacity)} ({r.outcome})" + (
            " (LayerNorm output: at least 0.5 / S)" if r.update_rule == "fwm" else "")
        ratio = r.observed_capacity_acc / r.d_dot if pd.notna(r.d_dot) else math.nan
        lines.append(f"| {r.map} | {r.rank} | {r.update_rule} | {cell(r.d_dot)} | {_value(r)} "
                     f"| {r.outcome_acc} | {cell(ratio, 2)} | {_distinct_at_failure(r, runs)} "
                     f"| {loss} | {bound(r.observed_capacity_keys, r.outcome_keys)} |")
    ranked = [f"{name}: " + " > ".join(f"{r.update_rule} {_value(r)}" for r in g.itertuples())
              for name, g in found.groupby("map", sort=False) if len(g) > 1]
    if ranked:
        lines += ["", "Ranking (most keys first): " + "; ".join(ranked) + "."]
    sums = sum_rule_lines(capacity, runs)
    if sums:
        lines += ["", "The sum rule with replacement:", "", *sums]
    diverged, n = diverged_lines(runs), int((runs["status"] == "diverged").sum())
    lines += ["", f"Runs that diverged: {n}" + (" (a non-finite loss; the failure-point rule "
                                               "counts them as failures):" if n else "."),
              *diverged, ""]
    return lines
