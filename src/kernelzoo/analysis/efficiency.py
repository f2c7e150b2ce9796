"""Capacity efficiency: a configuration's failure point / d_dot, the ratio the d_dot law
(``scaling.py``) states per level, here per configuration and view. ``efficiency_order`` ranks
the configurations by it in a view (the rankings of ``rankings.py`` and ``between_sizes.py``),
``efficiency_table`` is the table the dashboard logs, and ``capacity_efficiency`` the figure
that draws it beside each seed's own value.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter

from kernelzoo.analysis.capacity import SUFFIX, VIEW_WORDS, VIEWS, interval_words
from kernelzoo.analysis.style import (OUTCOME_MARKERS, OUTCOME_WORDS, bar_handles, error_bar,
                                      natural, save)


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


def _seed_points(ax, i: int, values: pd.Series, outcomes: pd.Series, color) -> bool:
    """A configuration's seeds beside its median at x = i, when it has two or more: sorted by
    value, spread over [i + 0.2, i + 0.4], each marker its seed's outcome (gid "seeds").
    True when drawn."""
    ok = values.notna().to_numpy()
    if ok.sum() < 2:
        return False
    order = np.argsort(values[ok].to_numpy(), kind="stable")
    x = i + 0.2 + 0.2 * np.linspace(0, 1, int(ok.sum()))
    v, o = values[ok].to_numpy()[order], outcomes[ok].to_numpy()[order]
    for outcome in sorted(set(o)):
        ax.scatter(x[o == outcome], v[o == outcome], s=12, color=color, alpha=0.8,
                   marker=OUTCOME_MARKERS.get(outcome, "o"), linewidths=0, gid="seeds")
    return True


def capacity_efficiency(capacity: pd.DataFrame, seeds: pd.DataFrame, colors: dict,
                        out_dir: Path) -> Path:
    """One panel per view: failure point / d_dot per configuration (log scale where it spans
    more than a factor 4), most efficient first: the median over seeds (large marker, a triangle
    where it is a bound), its order-statistic interval (solid, its level in the legend) or one
    seed's bracket (dashed), and beside it each seed's own value (``seeds``:
    ``capacity.seed_table``). The loss view leaves fwm out (its loss is at least 0.5 / S:
    ``update_rules``), naming it."""
    table = efficiency_table(capacity)
    most = int(table.groupby("view").size().max())
    fig = Figure(figsize=(max(6.0, 0.5 * most + 2.5), 3.6 * len(VIEWS)), layout="constrained")
    kinds, outcomes, dotted = set(), set(), False
    for ax, view in zip(fig.subplots(len(VIEWS), 1), VIEWS):
        rows, s = table[table["view"] == view], SUFFIX[view]
        left_out = natural(rows.loc[rows["update_rule"].eq("fwm"), "label"]) \
            if view == "loss" else []
        rows = rows[~rows["label"].isin(left_out)]
        for i, r in enumerate(rows.itertuples()):
            kinds.add(r.interval)
            outcomes.add(r.outcome)
            error_bar(ax, i, r.efficiency, r.efficiency_low, r.efficiency_high, r.interval,
                      colors[r.label], fmt=OUTCOME_MARKERS[r.outcome], ms=8, mec="black",
                      mew=0.5, zorder=3)
            mine = seeds[seeds["label"] == r.label]
            dotted |= _seed_points(ax, i, mine[f"value{s}"] / r.d_dot, mine[f"outcome{s}"],
                                   colors[r.label])
        ax.axhline(1.0, color="black", ls=":", lw=1)
        spread = rows[["efficiency", "efficiency_low", "efficiency_high"]].stack()
        spread = spread[spread > 0]
        if len(spread) and spread.max() > 4 * spread.min():  # a wide range: log scale
            ax.set_yscale("log", base=2)
            ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
        ax.set_xticks(np.arange(len(rows)),
                      [f"{r.label} ({r.d_dot})" for r in rows.itertuples()],
                      rotation=60, ha="right", fontsize=7)
        ax.set_xlim(-0.6, len(rows) - 0.3)
        ax.set_ylabel("failure point / d_dot" + (" (log)" if ax.get_yscale() == "log" else ""))
        ax.set_title(f"{VIEW_WORDS[view]} view" + ("\n" + textwrap.fill(
            f"left out: {', '.join(left_out)} (fwm's loss is at least 0.5 / S)", 70)
            if left_out else ""), fontsize=8)
    handles = [Line2D([], [], ls="none", marker=OUTCOME_MARKERS[o], ms=7, color="grey",
                      mec="black", mew=0.5, label=f"median over seeds: {words}")
               for o, words in OUTCOME_WORDS.items() if o in outcomes]
    if dotted:
        handles.append(Line2D([], [], ls="none", marker="o", ms=3.5, color="grey",
                              label="each seed, right of its median (shapes alike)"))
    handles += [*bar_handles(kinds), Line2D([], [], color="black", ls=":", lw=1,
                                            label="1: failure point = d_dot")]
    fig.legend(handles=handles, loc="outside right center", fontsize=7, frameon=False)
    fig.suptitle("Capacity efficiency, failure point / d_dot, per view, most efficient first "
                 "(in parentheses: d_dot)", fontsize=9)
    return save(fig, out_dir / "capacity_efficiency.png")
