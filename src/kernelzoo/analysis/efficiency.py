"""Capacity efficiency: a configuration's failure point / d_dot, the ratio the d_dot law
(``scaling.py``) states per level, here per configuration and view. ``efficiency_order`` ranks
the configurations by it in a view (the rankings of ``rankings.py`` and ``between_sizes.py``),
``efficiency_table`` is the table the dashboard logs, and ``capacity_efficiency`` the figure
that draws it beside each seed's own value.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kernelzoo.analysis.capacity import SUFFIX, VIEWS, interval_words


def efficiency_order(capacity: pd.DataFrame, view: str = "loss") -> pd.DataFrame:
    """The configurations with a bounded d_dot and a result in ``view``, most efficient first:
    efficiency = failure point / d_dot (its ``ratio`` column), its interval from its ci columns."""
    s = SUFFIX[view]
    rows = capacity[capacity["predicted_capacity"].notna() & capacity[f"ratio{s}"].notna()].copy()
    d_dot = rows["predicted_capacity"].astype(float)
    rows["efficiency_low"] = rows[f"ci_low{s}"] / d_dot
    rows["efficiency_high"] = rows[f"ci_high{s}"] / d_dot
    return rows.sort_values([f"ratio{s}", "label"], ascending=[False, True], kind="stable")


def efficiency_table(capacity: pd.DataFrame) -> pd.DataFrame:
    """Capacity efficiency, one row per configuration and view, most efficient first within a
    view (``efficiency_order``): feature_map, label, update_rule, view, rank, d_dot, efficiency
    = failure point / d_dot with its interval and what that is (``capacity.interval_words``),
    outcome and seeds."""
    frames = []
    for view in VIEWS:
        s, rows = SUFFIX[view], efficiency_order(capacity, view)
        frames.append(pd.DataFrame({
            "feature_map": rows["feature_map"], "label": rows["label"],
            "update_rule": rows["update_rule"], "view": view, "rank": np.arange(1, len(rows) + 1),
            "d_dot": rows["predicted_capacity"].astype(int), "efficiency": rows[f"ratio{s}"],
            "efficiency_low": rows["efficiency_low"], "efficiency_high": rows["efficiency_high"],
            "interval": [interval_words(view, n, o) for n, o in
                         zip(rows["n_seeds"], rows[f"outcome{s}"])],
            "outcome": rows[f"outcome{s}"], "n_seeds": rows["n_seeds"]}))
    return pd.concat(frames, ignore_index=True)
