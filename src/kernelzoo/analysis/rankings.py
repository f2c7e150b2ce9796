"""Maps ranked by capacity efficiency in each view: the sizes a store's configurations group
into (``sizes``), their ranks per view (``ranks``, which ``between_sizes.py`` compares between
sizes), what limits a map in every view (``limits``), the view whose order lists a size's rows
(``HEADLINE``) and the views' rank correlations (``view_rhos``). Within a size the report shows
tiers, not ranks (``tiers.py``). Pure: it reads no file.

Its rules are stated once, in docs/analysis.md ("What each view measures", "Sizes and what
limits a map").
"""

from __future__ import annotations

import math

import pandas as pd
from scipy import stats

from kernelzoo.analysis.capacity import POINTS, VIEWS, by_view
from kernelzoo.analysis.efficiency import efficiency_order
from kernelzoo.analysis.labels import size_groups

GAP = 2          # places a family's rank moves between sizes that count (between_sizes.py)
LOSS_FIRST = 1.5  # accuracy-view over loss-view failure point at which the loss view fails first
COLLAPSE = 0.2   # relative fall of the effective rank at n_keys = d_dot
HEADLINE = "accuracy"  # the view whose order lists the rows of a size's tables (no headline)


def sizes(capacity: pd.DataFrame) -> dict[int, list[int]]:
    """Size (the smallest d_dot of its group, ``style.size_groups``) -> the d_dot levels it
    holds."""
    return size_groups(capacity["predicted_capacity"].dropna().unique())


def ranks(capacity: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration with a bounded d_dot and view: label, its size, the view and
    its rank within the size in that view (NaN: no result in that view)."""
    frames = []
    for size, levels in sizes(capacity).items():
        mine = capacity[capacity["predicted_capacity"].isin(levels)]
        for view in VIEWS:
            order = efficiency_order(mine, view)
            rank = pd.Series(range(1, len(order) + 1), index=order["label"].to_numpy())
            frames.append(pd.DataFrame({"label": mine["label"].to_numpy(), "size": size,
                                        "view": view,
                                        "rank": mine["label"].map(rank).to_numpy(float)}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def loss_first(r):
    """Whether capacity row ``r`` (or each row of a capacity table) fails the loss view first:
    the loss view fails (fails_at) and the accuracy view's failure point is above
    ``LOSS_FIRST`` x the loss view's."""
    return (r["outcome"] == "fails_at") & (r["observed_capacity_acc"]
                                           > LOSS_FIRST * r["observed_capacity"])


def limits(r) -> list[str]:
    """What limits capacity row ``r`` in every view (module docstring)."""
    found = []
    before = getattr(r, "effective_rank_at_d_dot_initial", math.nan)
    after = getattr(r, "effective_rank_at_d_dot", math.nan)
    if before > 0 and after < (1 - COLLAPSE) * before:
        found.append(f"rank collapse (effective rank {before:.3g} -> {after:.3g} in training)")
    read, d_dot = getattr(r, "rank_bound", math.nan), r.predicted_capacity
    if not pd.isna(read) and read < 0.9 * d_dot:
        found.append(f"fewer features read than written (rank bound {int(read)} of d_dot "
                     f"{int(d_dot)})")
    return found


def efficiency_cell(r) -> str:
    """Efficiency of a row of ``efficiency_order``: median [interval], or a bound."""
    ratio, outcome = r["ratio"], r["outcome"]
    if outcome not in POINTS:
        return f"{'>=' if outcome == 'never_fails' else '<='} {ratio:.2f}"
    return f"{ratio:.2f} [{r['efficiency_low']:.2f}, {r['efficiency_high']:.2f}]"


def view_rhos(capacity: pd.DataFrame) -> list[tuple[str, str, float | None, int]]:
    """(view, other view, Spearman's rho of their failure point / d_dot, configurations) for
    each pair of views over the configurations with a bounded d_dot ranked in both (3 or more);
    rho None where a view's ratios are all equal (no order to compare)."""
    rows = by_view(capacity[capacity["predicted_capacity"].notna()])
    ratios, found = rows.pivot(index="label", columns="view", values="ratio"), []
    ratios = ratios.reindex(rows["label"].drop_duplicates())  # in the capacity table's order
    for i, v in enumerate(VIEWS):
        for w in VIEWS[i + 1:]:
            both = ratios[[v, w]].dropna()
            if len(both) >= 3:
                flat = (both.nunique() < 2).any()
                found.append((v, w, None if flat else
                              stats.spearmanr(both.iloc[:, 0], both.iloc[:, 1]).statistic,
                              len(both)))
    return found
