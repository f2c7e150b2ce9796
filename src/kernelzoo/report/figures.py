"""The capacity figures: each failure point against d_dot (``observed_vs_predicted``), capacity
efficiency per configuration (``capacity_efficiency``), failure point / d_dot per d_dot level and
family (``capacity_scaling``), and ``all_figures``, every figure of an analysis in report order.
Each takes the analysis' tables, writes one figure as PNG and SVG (``style.save``) and returns
the PNG's path.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, NullFormatter

from kernelzoo.analysis import efficiency, scaling, update_rules
from kernelzoo.analysis.capacity import SUFFIX, VIEW_WORDS, VIEWS, interval_words
from kernelzoo.analysis.efficiency import efficiency_table
from kernelzoo.analysis.intervals import describe
from kernelzoo.analysis.labels import dkey, natural, size_groups
from kernelzoo.analysis.scaling import Family
from kernelzoo.report.heatmaps import heatmaps
from kernelzoo.report.panels import MAX_SERIES, family_colors_of, headline, key_panels, palette
from kernelzoo.report.plots import curves, loss_vs_keys
from kernelzoo.report.style import (OUTCOME_MARKERS, OUTCOME_WORDS, PUBLISHED_LABEL, bar_handles,
                                    config_colors, error_bar, legend, log_square, save)

def observed_vs_predicted(capacity: pd.DataFrame, colors: dict, threshold: float,
                          out_dir: Path) -> Path:
    """Observed against predicted capacity (log-log) with y = x: each configuration's loss-view
    failure point with its bracket (one seed, dashed) or order-statistic interval (solid, its
    level in the legend), bounds as triangles, the published failure points (same rule over the
    authors' losses) hollow. fwm configurations are left out (their loss has a floor of
    0.5 / S: ``update_rules``), with a note."""
    fig = Figure(figsize=(7, 5.5))
    ax = fig.add_subplot()
    fwm = update_rules.layer_norm(capacity["update_rule"])
    rows = capacity[capacity["predicted_capacity"].notna()
                    & ~capacity["outcome"].isin(("no_data", "not_searched")) & ~fwm]
    kinds = set()
    for row in rows.itertuples():
        x, y = float(row.predicted_capacity), row.observed_capacity
        kind = interval_words("loss", row.n_seeds, row.outcome)
        kinds.add(kind)
        error_bar(ax, x, y, row.ci_low, row.ci_high, kind, colors[row.label],
                   fmt=OUTCOME_MARKERS[row.outcome], ms=8, label=row.label)
        if pd.notna(row.published_capacity):
            ax.plot(x, row.published_capacity, ls="none", ms=13, mfc="none", mew=1.2,
                    marker=OUTCOME_MARKERS[row.published_outcome], mec=colors[row.label])
    ax.set_xlabel("predicted capacity d_dot (log)")
    ax.set_ylabel(f"observed failure point n*: loss crosses tau = {threshold:g} (log)")
    ax.set_title(f"Observed against predicted capacity ({dkey(capacity['d_key'])})", fontsize=10)
    if rows.empty:
        ax.text(0.5, 0.5, "no configuration with a bounded prediction and data",
                ha="center", va="center", transform=ax.transAxes)
        return save(fig, out_dir / "observed_vs_predicted.png")
    log_square(ax, pd.concat([rows["predicted_capacity"].astype(float), rows["ci_low"],
                               rows["ci_high"], rows["published_capacity"].dropna()]))
    handles = ax.get_legend_handles_labels()[0] + [
        Line2D([], [], ls="none", marker=OUTCOME_MARKERS[o], color="grey", label=words)
        for o, words in OUTCOME_WORDS.items() if (rows["outcome"] == o).any()]
    handles += bar_handles(kinds)
    handles.append(Line2D([], [], color="black", ls=":", lw=1, label="y = x: n* = d_dot"))
    if rows["published_capacity"].notna().any():
        handles.append(Line2D([], [], ls="none", marker="o", ms=10, mfc="none", mec="grey",
                              label=f"hollow: {PUBLISHED_LABEL}, same rule"))
    if fwm.any():
        handles.append(Line2D([], [], ls="none", label=(
            f"left out: {', '.join(natural(capacity.loc[fwm, 'label']))}\n    (fwm: its loss is "
            "at least 0.5 / S; see the accuracy view)")))
    legend(ax, handles)
    return save(fig, out_dir / "observed_vs_predicted.png")


def _seed_points(ax, i: int, values: pd.Series, outcomes: pd.Series, color) -> bool:
    """A configuration's seeds below its median at y = i, when it has two or more: sorted by
    value, spread over [i + 0.2, i + 0.4], each marker its seed's outcome (gid "seeds").
    True when drawn."""
    ok = values.notna().to_numpy()
    if ok.sum() < 2:
        return False
    order = np.argsort(values[ok].to_numpy(), kind="stable")
    x = i + 0.2 + 0.2 * np.linspace(0, 1, int(ok.sum()))
    v, o = values[ok].to_numpy()[order], outcomes[ok].to_numpy()[order]
    for outcome in sorted(set(o)):
        ax.scatter(v[o == outcome], x[o == outcome], s=12, color=color, alpha=0.8,
                   marker=OUTCOME_MARKERS.get(outcome, "o"), linewidths=0, gid="seeds")
    return True


LONG_LABEL = 32  # characters of a configuration's label beyond which the panels stack


def capacity_efficiency(capacity: pd.DataFrame, seeds: pd.DataFrame, colors: dict,
                        out_dir: Path, views: tuple[str, ...] = VIEWS) -> Path:
    """A horizontal dot plot, one panel per view: failure point / d_dot per configuration (log
    scale where it spans more than a factor 4), most efficient at the top, labels horizontal: the
    median over seeds (large marker, a triangle where it is a bound), its order-statistic
    interval (solid, its level in the legend) or one seed's bracket (dashed), and below it each
    seed's own value (``seeds``: ``capacity.seed_table``). The loss view leaves fwm out (its
    loss is at least 0.5 / S: ``update_rules``), naming it. Side by side, or one above the other
    where a label passes LONG_LABEL characters, so no label runs into the next panel."""
    table = efficiency_table(capacity)
    most = int(table.groupby("view").size().max())
    longest = max((len(f"{r.label} ({r.d_dot})") for r in table.itertuples()), default=0)
    height = max(3.0, 0.26 * most + 1.4)
    if longest > LONG_LABEL:  # long labels: the views one above the other, each its own order
        fig = Figure(figsize=(6.0 + 0.055 * longest + 2.5, height * len(views)),
                     layout="constrained")
        axes = fig.subplots(len(views), 1, squeeze=False).ravel()
    else:
        fig = Figure(figsize=(4.2 * len(views) + 2.0, height), layout="constrained")
        axes = fig.subplots(1, len(views), squeeze=False).ravel()
    kinds, outcomes, dotted = set(), set(), False
    for ax, view in zip(axes, views):
        rows, s = table[table["view"] == view], SUFFIX[view]
        left_out = natural(rows.loc[update_rules.layer_norm(rows["update_rule"]), "label"]) \
            if view == "loss" else []
        rows = rows[~rows["label"].isin(left_out)]
        for i, r in enumerate(rows.itertuples()):
            kinds.add(r.interval)
            outcomes.add(r.outcome)
            error_bar(ax, i, r.efficiency, r.efficiency_low, r.efficiency_high, r.interval,
                      colors[r.label], horizontal=True, fmt=OUTCOME_MARKERS[r.outcome], ms=7,
                      mec="black", mew=0.5, zorder=3)
            mine = seeds[seeds["label"] == r.label]
            dotted |= _seed_points(ax, i, mine[f"value{s}"] / r.d_dot, mine[f"outcome{s}"],
                                   colors[r.label])
        ax.axvline(1.0, color="black", ls=":", lw=1)
        spread = rows[["efficiency", "efficiency_low", "efficiency_high"]].stack()
        spread = spread[(spread > 0) & np.isfinite(spread)]
        if len(spread) and spread.max() > 4 * spread.min():  # a wide range: log scale
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:.3g}"))
        ax.set_yticks(np.arange(len(rows)),
                      [f"{r.label} ({r.d_dot})" for r in rows.itertuples()], fontsize=7)
        ax.set_ylim(len(rows) - 0.3, -0.6)  # the most efficient at the top
        ax.set_xlabel(("failure point / d_dot" if view == "loss" else
                       "failure point / d_dot (argmax: keys, not bounded by 1)")
                      + (" (log)" if ax.get_xscale() == "log" else ""), fontsize=8)
        ax.set_title(f"{VIEW_WORDS[view]} view" + ("\n" + textwrap.fill(
            f"left out: {', '.join(left_out)} (fwm's loss is at least 0.5 / S)", 70)
            if left_out else ""), fontsize=8)
    handles = [Line2D([], [], ls="none", marker=OUTCOME_MARKERS[o], ms=7, color="grey",
                      mec="black", mew=0.5, label=f"median over seeds: {words}")
               for o, words in OUTCOME_WORDS.items() if o in outcomes]
    if dotted:
        handles.append(Line2D([], [], ls="none", marker="o", ms=3.5, color="grey",
                              label="each seed, below its median (shapes alike)"))
    handles += [*bar_handles(kinds), Line2D([], [], color="black", ls=":", lw=1,
                                            label="1: failure point = d_dot")]
    fig.legend(handles=handles, loc="outside right center", fontsize=7, frameon=False)
    fig.suptitle("Failure point / d_dot per view, largest first (loss: bounded by 1; argmax "
                 "views: not bounded; in parentheses: d_dot)", fontsize=9)
    return save(fig, out_dir / "capacity_efficiency.png")


def _ticks(levels: list[int]) -> dict[int, str]:
    """One tick per size (``style.size_groups``: 64, 65 and 66 are one), at its smallest
    level, labelled with its range."""
    return {head: f"{head}-{g[-1]}" if len(g) > 1 else str(head)
            for head, g in size_groups(levels).items()}


def capacity_scaling(found: list[Family], out_dir: Path, colors: dict | None = None,
                     views: tuple[str, ...] = VIEWS) -> Path:
    """``capacity_scaling``: one panel per view, failure point / d_dot against d_dot (log x, the
    levels as ticks): each seed's ratio (small dots), each level's median with its
    order-statistic interval (bars, their levels in the legend; a level of one seed has none),
    the fitted law's ratio a d_dot^(b-1) with its 95% band where fitted, and 1 (dotted). The y
    range is the points' and intervals', so a wide band is cut at the edge. ``colors``: by family
    name (``panels.palette``); by default one per family shown."""
    shown = [f for f in found if f.points["d_dot"].nunique() >= 2]
    colors = config_colors([f.name for f in shown]) if colors is None else colors
    fig = Figure(figsize=(13 * len(views) / len(VIEWS), 4.8))
    axes = fig.subplots(1, len(views), sharey=True, squeeze=False).ravel()
    kinds, drawn = set(), [1.0]
    for ax, view in zip(axes, views):
        ax.set_title(f"{VIEW_WORDS[view]} view", fontsize=10)
        if not any(len(f.fitted(view)) for f in shown):
            ax.text(0.5, 0.5, "no seed fails at a point in this view", ha="center",
                    va="center", transform=ax.transAxes, fontsize=8)
            continue
        levels = set()
        for i, f in enumerate(shown):
            color, pts, lv = colors[f.name], f.fitted(view), f.departures(view)
            shift = 2.0 ** (0.03 * (i - (len(shown) - 1) / 2))
            ax.scatter(pts["d_dot"] * shift, pts["value"] / pts["d_dot"], s=9, alpha=0.5,
                       linewidths=0, color=color)
            lv = lv[lv["ratio"].notna()]
            levels |= set(lv["d_dot"])
            drawn += [*pts["value"] / pts["d_dot"], *lv["ratio_low"], *lv["ratio_high"]]
            for j, r in enumerate(lv.itertuples()):
                kind = describe(r.n_seeds + r.n_bounds)
                kinds.add(kind)
                high = r.ratio_high if math.isfinite(r.ratio_high) else r.ratio  # a half-line
                error_bar(ax, r.d_dot * shift, r.ratio, r.ratio_low, high, kind, color,
                          fmt="o", ms=4, lw=1, label=None if j else f.name)
            law = f.laws[view]
            if law is not None and not math.isnan(law.b_low):
                grid = np.geomspace(lv["d_dot"].min(), lv["d_dot"].max(), 50)
                low, high = law.band(grid)
                ax.plot(grid, law.curve(grid) / grid, lw=1.2, color=color)
                ax.fill_between(grid, low / grid, high / grid, color=color, alpha=0.15, lw=0)
        ax.axhline(1.0, color="black", ls=":", lw=1)
        ax.set_xscale("log")
        ticks = _ticks(sorted(levels))
        ax.set_xticks(list(ticks), list(ticks.values()), fontsize=8)
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("d_dot (log)")
    finite = [v for v in drawn if np.isfinite(v)]
    span = max(finite) - min(finite)
    axes[0].set_ylim(min(finite) - 0.08 * span, max(finite) + 0.08 * span)
    axes[0].set_ylabel("failure point / d_dot")
    fig.suptitle("Failure point / d_dot per d_dot level, per view", fontsize=10)
    families = {h.get_label(): h for ax in axes for h in ax.get_legend_handles_labels()[0]}
    legend(axes[-1], list(families.values()) + [
        Line2D([], [], ls="none", marker="o", ms=3, alpha=0.5, color="grey",
               label="each seed that fails at a point"),
        Line2D([], [], ls="none", marker="o", ms=4, color="grey",
               label="marker: the level's median over those seeds"),
        *bar_handles(kinds),
        Line2D([], [], color="grey", lw=1.2, label="line and band: n* = a d_dot^b fitted to the\n"
                                                  "    level medians, its 95% t band"),
        Line2D([], [], color="black", ls=":", lw=1, label="1: n* = d_dot")])
    return save(fig, out_dir / "capacity_scaling.png")


def searched(capacity: pd.DataFrame) -> tuple[str, ...]:
    """The views a figure draws: every view but those the search left out for every
    configuration (``search.views``: outcome not_searched), which would be empty panels."""
    return tuple(v for v in VIEWS
                 if not capacity[f"outcome{SUFFIX[v]}"].eq("not_searched").all()) or VIEWS


def all_figures(runs: pd.DataFrame, seeds: pd.DataFrame, capacity: pd.DataFrame,
                published: pd.DataFrame, curve_table: pd.DataFrame,
                families: list[scaling.Family], out_dir: Path,
                threshold: float, accuracy_threshold: float,
                search: bool = False) -> tuple[list[Path], list[str]]:
    """Every figure of the analysis in report order, one colour per family, and one line per
    figure left out (why). A search's sparse probes have no grid for heatmaps;
    ``capacity_scaling`` (``scaling.figure``) needs a family with runs at two d_dot levels. The
    views against n_keys are small multiples (``panels.key_panels``); ``loss_vs_keys``, every
    configuration on one axis, is drawn only beside them where it shows what they do not: fwm
    against its own floor, or the authors' published losses on at most MAX_SERIES lines."""
    colors = family_colors_of(capacity, families)
    one_axis = update_rules.layer_norm(runs["update_rule"]).any() or (
        len(published) > 0 and capacity["label"].nunique() <= MAX_SERIES)
    maps, omitted = ([], []) if search else heatmaps(runs, threshold, out_dir)
    scaled = any(f.points["d_dot"].nunique() >= 2 for f in families)
    if not scaled:
        omitted.append("capacity_scaling: left out, as no family has runs at two or more d_dot "
                       "values")
    bounded = capacity["predicted_capacity"].notna().any()
    views = searched(capacity)
    omitted += [f"{view}_panels: left out, as the search did not locate the {VIEW_WORDS[view]} "
                "view (search.views)" for view in VIEWS if view not in views]
    thresholds = {"loss": threshold, "accuracy": accuracy_threshold, "keys_retrieved": None}
    return [
        *([headline(capacity, families, out_dir)] if bounded else []),
        *(key_panels(runs, capacity, families, thresholds[view], out_dir, view)
          for view in views),
        *([loss_vs_keys(runs, capacity, published, colors, threshold, out_dir)]
          if one_axis else []),
        observed_vs_predicted(capacity, colors, threshold, out_dir),
        *([capacity_scaling(families, out_dir, palette(families, capacity), views)]
          if scaled else []),
        *([capacity_efficiency(capacity, seeds, colors, out_dir, views)]
          if any(len(efficiency.efficiency_order(capacity, v)) >= 2 for v in views) else []),
        *maps,
        curves(curve_table, colors, threshold, out_dir),
    ], omitted
