"""Capacity efficiency: a configuration's failure point / d_dot, the ratio the d_dot law
(``scaling.py``) states per level, here per configuration and view. ``efficiency_order`` ranks
the configurations by it in a view (the rankings of ``rankings.py`` and ``between_sizes.py``),
``efficiency_table`` is the table the dashboard logs, and ``capacity_efficiency`` the figure
that draws it beside each seed's own value.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kernelzoo.analysis.capacity import VIEWS, by_view


def efficiency_order(capacity: pd.DataFrame, view: str = "loss",
                     long: pd.DataFrame | None = None) -> pd.DataFrame:
    """The configurations with a bounded d_dot and a result in ``view``, most efficient first:
    their rows of the long table (``capacity.by_view``: failure_point, ci_low, ci_high, outcome,
    interval, ratio, ... of that view; ``long``: that table where the caller has it), efficiency
    = failure point / d_dot (its ``ratio``) with its interval ``efficiency_low``,
    ``efficiency_high`` from its ci columns."""
    rows = by_view(capacity) if long is None else long
    rows = rows[(rows["view"] == view) & rows["predicted_capacity"].notna()
                & rows["ratio"].notna()].copy()
    d_dot = rows["predicted_capacity"].astype(float)
    rows["efficiency_low"] = rows["ci_low"] / d_dot
    rows["efficiency_high"] = rows["ci_high"] / d_dot
    return rows.sort_values(["ratio", "label"], ascending=[False, True], kind="stable")


def efficiency_table(capacity: pd.DataFrame) -> pd.DataFrame:
    """Capacity efficiency, one row per configuration and view, most efficient first within a
    view (``efficiency_order``): feature_map, label, update_rule, view, rank, d_dot, efficiency
    = failure point / d_dot with its interval and what that is (``capacity.interval_words``),
    outcome and seeds."""
    frames = []
    for view in VIEWS:
        rows = efficiency_order(capacity, view)
        frames.append(pd.DataFrame({
            "feature_map": rows["feature_map"], "label": rows["label"],
            "update_rule": rows["update_rule"], "view": view, "rank": np.arange(1, len(rows) + 1),
            "d_dot": rows["predicted_capacity"].astype(int), "efficiency": rows["ratio"],
            "efficiency_low": rows["efficiency_low"], "efficiency_high": rows["efficiency_high"],
            "interval": rows["interval"], "outcome": rows["outcome"],
            "n_seeds": rows["n_seeds"]}))
    return pd.concat(frames, ignore_index=True)
