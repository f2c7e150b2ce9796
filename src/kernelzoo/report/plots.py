"""The figures against the number of keys on one axis: final eval loss (``loss_vs_keys``, with
the authors' published losses and fwm against its own floor), and the eval curves around each
failure point (``curves``).

Every function takes the analysis' tables (``runs``: one row per summary plus ``label``;
``capacity``: the capacity table with its published columns; ``published``: the authors' points
of the matching configurations) and an output directory, writes one figure as PNG and SVG
(``style.save``, atomically) and returns the PNG's path.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.transforms import blended_transform_factory

from kernelzoo.analysis import rank_bound, update_rules
from kernelzoo.analysis.labels import dkey, is_search, natural
from kernelzoo.report.style import DISPLAY_FLOOR, PUBLISHED_LABEL, legend, save


def _per_key(ax, runs: pd.DataFrame, colors: dict, column: str, edge: str = "top",
             floor: float | None = None) -> list:
    """Seeds as points, the median over seeds as a line, configurations in natural order. A run
    without a finite value (diverged, or missing) is an x at the ``edge`` of the axes ("top" or
    "bottom"), outside the data's scale, and lines break there (a median that is one is none);
    runs stopped by the step cap ringed in black. Infeasible runs are not drawn. Returns the
    legend entries for the x marks and rings that were drawn."""
    probes = is_search(runs)  # a search's probes are few: drawn large, edged
    dots = dict(s=30, alpha=0.9, edgecolors="black", linewidths=0.4) if probes else \
        dict(s=14, alpha=0.45, linewidths=0)
    at_edge = dict(transform=blended_transform_factory(ax.transData, ax.transAxes),
                   y=0.97 if edge == "top" else 0.03)
    feasible = runs[runs["status"] != "infeasible"]
    for label in natural(feasible["label"]):
        group = feasible[feasible["label"] == label]
        values = group[column].where(group["status"] != "diverged").astype(float)
        if floor is not None:
            values = values.clip(lower=floor)
        ok = np.isfinite(values)
        color = colors[label]
        ax.scatter(group["n_keys"][ok], values[ok], color=color, **dots)
        if (~ok).any():
            ax.plot(group["n_keys"][~ok], np.full(int((~ok).sum()), at_edge["y"]), ls="none",
                    marker="x", ms=5, mew=1.2, color=color, transform=at_edge["transform"],
                    gid="no-value")
        capped = group["status"].eq("max_steps").to_numpy() & ok.to_numpy()
        if capped.any():
            ax.scatter(group["n_keys"][capped], values[capped], s=48, facecolors="none",
                       edgecolors="black", linewidths=0.8, gid="step-cap")
        # no finite value: +-inf in the median (it fails), drawn as a break
        shown = values.where(ok, np.inf if edge == "top" else -np.inf)
        if group.groupby("seed")["n_keys"].apply(frozenset).nunique() > 1:
            # seeds probed different n_keys (a search): one thin line per seed, no median
            for i, (_, seed) in enumerate(shown.groupby(group["seed"])):
                order = group.loc[seed.index, "n_keys"].argsort().to_numpy()
                ax.plot(group.loc[seed.index, "n_keys"].to_numpy()[order],
                        _broken(seed.to_numpy()[order]), "-", lw=0.8, alpha=0.6, color=color,
                        label=None if i else label)
            continue
        median = shown.groupby(group["n_keys"]).median()
        y = _broken(median.to_numpy())
        ax.plot(median.index, y, "-", lw=1.6, color=color, label=label)
        alone = np.isfinite(y) & ~np.isfinite(np.r_[np.nan, y[:-1]]) \
            & ~np.isfinite(np.r_[y[1:], np.nan])  # no line reaches it: a marker
        ax.plot(median.index[alone], y[alone], ls="none", marker="o", ms=4, color=color)
    status = feasible["status"]
    bad = ~np.isfinite(feasible[column].where(status != "diverged").astype(float))
    notes = []
    if bad.any():
        diverged = int(status.eq("diverged").sum())
        notes.append(Line2D([], [], ls="none", marker="x", color="grey", label=(
            f"x at the {edge}: no finite value ({diverged} diverged, {int(bad.sum()) - diverged} "
            "missing);\n    counted as failing, lines break there")))
    if status.eq("max_steps").any():
        notes.append(Line2D([], [], ls="none", marker="o", ms=7, mfc="none", mec="black",
                            label="ringed: stopped by the step cap, not the stopping rule"))
    return notes


def _broken(values: np.ndarray) -> np.ndarray:
    """``values`` with the infinite ones NaN: a line breaks there."""
    return np.where(np.isfinite(values), values, np.nan)


def capacity_lines(capacity: pd.DataFrame) -> dict[int, list[str]]:
    """Each distinct predicted capacity (d_dot) with the configurations sharing it, in
    natural order: one dashed line per key in ``loss_vs_keys``."""
    bounded = capacity[capacity["predicted_capacity"].notna()]
    return {int(d): natural(group["label"])
            for d, group in bounded.groupby(bounded["predicted_capacity"].astype(int))}


def _draw_capacity_lines(ax, capacity: pd.DataFrame, colors: dict, x_max: float) -> str:
    """One dashed line per distinct d_dot within the x range, in the colour of its only
    configuration (grey when shared), its value written inside the axes at the top beside it
    (d_dots closer than 3% of the range share one label). Returns a note naming the d_dot
    beyond the x range ("" if none)."""
    lines = capacity_lines(capacity)
    shown = sorted(d for d in lines if d <= x_max)
    beyond = [f"{', '.join(lines[d])} at {d}" for d in lines if d > x_max]
    for d_dot in shown:
        labels = lines[d_dot]
        ax.axvline(d_dot, ls="--", lw=1, gid="capacity",
                   color=colors[labels[0]] if len(labels) == 1 else "0.3")
    groups: list[list[int]] = []
    for d_dot in shown:
        if groups and d_dot - groups[-1][-1] < 0.03 * x_max:
            groups[-1].append(d_dot)
        else:
            groups.append([d_dot])
    top = blended_transform_factory(ax.transData, ax.transAxes)
    for group in groups:
        right = group[-1] > 0.9 * x_max  # near the right edge: written to the left of its line
        ax.text(group[0] if right else group[-1], 0.985,
                f"d_dot {', '.join(map(str, group))}", transform=top, rotation=90, fontsize=7,
                ha="right" if right else "left", va="top", gid="d_dot-label", clip_on=True,
                bbox=dict(fc="white", ec="none", alpha=0.75, pad=1))
    return f"; d_dot beyond the axis: {'; '.join(beyond)}" if beyond else ""


def _published_overlay(ax, runs: pd.DataFrame, capacity: pd.DataFrame, published: pd.DataFrame,
                       colors: dict, threshold: float) -> None:
    """The authors' losses as hollow markers on a thin dashed line, each configuration's up to
    its own largest n_keys here (the authors probed further), their failure points as hollow
    stars on the tau line."""
    largest = runs.groupby("label")["n_keys"].max()
    for label in natural(published["label"]):
        series = published[(published["label"] == label)
                           & (published["n_keys"] <= largest.get(label, np.inf))]
        ax.plot(series["n_keys"], series["final_eval_loss"].clip(lower=DISPLAY_FLOOR), "--",
                lw=0.7, marker="o", ms=3.5, mfc="none", mew=0.7, alpha=0.8, color=colors[label],
                gid="published")
    for row in capacity[capacity["published_outcome"] == "fails_at"].itertuples():
        ax.plot(row.published_capacity, threshold, ls="none", marker="*", ms=14, mfc="none",
                mec=colors[row.label], mew=1.0, zorder=5, gid="published-failure-point")


def _draw_floors(ax, runs: pd.DataFrame, capacity: pd.DataFrame, colors: dict) -> bool:
    """Each bounded configuration's loss floor (``rank_bound.loss_floor``) over its n_keys
    range, dash-dotted in its colour; True when some floor was drawn."""
    drawn = False
    for r in capacity[capacity["rank_bound"].notna()].itertuples():
        first = runs[runs["label"] == r.label].iloc[0]
        rank = int(first["read_rank"])  # the features a query reads: d_dot but for cosFormer
        n = np.arange(rank, int(runs.loc[runs["label"] == r.label, "n_keys"].max()) + 1)
        floor = np.array([rank_bound.floor_of(k, rank, r.update_rule,
                                              first["eval_max_queries"], first["eval_query_batch"])
                          for k in n])
        if (floor > 0).any():
            ax.plot(n[floor > 0], floor[floor > 0], ls="-.", lw=0.9, color=colors[r.label],
                    gid="rank-floor")
            drawn = True
    return drawn


def draw_loss_vs_keys(ax, runs: pd.DataFrame, capacity: pd.DataFrame, published: pd.DataFrame,
                      colors: dict, threshold: float, x_max: float | None = None) -> None:
    """``loss_vs_keys`` on ``ax`` over (0, ``x_max``), by default the store's largest n_keys +
    5%: lines with gid "capacity", "failure-point", "published", "rank-floor", texts with gid
    "d_dot-label"."""
    notes = _per_key(ax, runs, colors, "final_eval_loss", "top", floor=DISPLAY_FLOOR)
    handles = ax.get_legend_handles_labels()[0]
    x_max = runs["n_keys"].max() * 1.05 if x_max is None else x_max
    beyond = _draw_capacity_lines(ax, capacity, colors, x_max)
    floors = _draw_floors(ax, runs, capacity, colors)
    ax.axhline(threshold, color="black", ls=":", lw=1)
    for row in capacity[capacity["outcome"] == "fails_at"].itertuples():
        ax.plot(row.observed_capacity, threshold, ls="none", marker="*", ms=13,
                color=colors[row.label], mec="black", mew=0.5, zorder=6, gid="failure-point")
    if len(published):
        _published_overlay(ax, runs, capacity, published, colors, threshold)
    ax.set_xlim(0, x_max)
    ax.set_yscale("log")
    ax.set_xlabel("number of keys S" + (" (points: the search's probes)" if is_search(runs)
                                        else "") + beyond)
    ax.set_ylabel("final evaluation loss (log scale)")
    ax.set_title(f"Retrieval loss against the number of keys ({dkey(runs['d_key'])})\n"
                 f"a configuration fails where its loss rises above tau = {threshold:g}",
                 fontsize=10)
    handles += [
        Line2D([], [], color="black", ls=":", lw=1, label=f"tau = {threshold:g}"),
        Line2D([], [], ls="none", marker="*", ms=10, color="grey", mec="black", mew=0.5,
               label="failure point n*"),
        Line2D([], [], color="grey", ls="--", lw=1,
               label="predicted capacity d_dot (labelled at the top;\n    in its configuration's "
                     "colour, grey: shared)")]
    if floors:
        handles.append(Line2D([], [], color="grey", ls="-.", lw=0.9,
                              label="loss floor of a rank-d_dot read-out (rank bound)"))
    elif capacity["predicted_capacity"].notna().any():
        why = ("keys drawn with replacement (Setting 2):\n    the rank bound does not hold"
               if runs.get("replacement", pd.Series([False])).all() else
               "no bounded configuration queries\n    more keys than its rank")
        handles.append(Line2D([], [], ls="none", label=f"no loss floor drawn: {why}"))
    if len(published):
        handles.append(Line2D([], [], color="grey", ls="--", lw=0.7, marker="o", ms=3.5,
                              mfc="none", label=f"{PUBLISHED_LABEL}; hollow star: its n*"))
    legend(ax, handles + notes)


def draw_fwm_loss(ax, runs: pd.DataFrame, colors: dict, x_max: float) -> None:
    """The fwm configurations' losses against their own floor (``update_rules.fwm_floor``,
    dash-dotted, gid "fwm-floor"): the loss of a LayerNorm output is at least 0.5 / S whatever is
    retrieved, so tau does not apply to it and no failure point is drawn."""
    notes = _per_key(ax, runs, colors, "final_eval_loss", "top", floor=DISPLAY_FLOOR)
    handles = ax.get_legend_handles_labels()[0]
    for label in natural(runs.loc[runs["status"] != "infeasible", "label"]):
        mine = runs[runs["label"] == label]
        first = mine.iloc[0]
        n = np.arange(max(int(mine["n_keys"].min()), 1), int(mine["n_keys"].max()) + 1)
        floor = [update_rules.fwm_floor(k, first["d_dot"], bool(first.get("replacement", True)),
                                        first.get("eval_max_queries", 200),
                                        first.get("eval_query_batch", 32)) for k in n]
        ax.plot(n, floor, ls="-.", lw=1.1, color=colors[label], gid="fwm-floor")
    ax.set_xlim(0, x_max)
    ax.set_yscale("log")
    ax.set_xlabel("number of keys S")
    ax.set_ylabel("final evaluation loss (log scale)")
    ax.set_title("fwm (a LayerNorm read-out) against its own floor, not tau: its output has mean "
                 "0,\nso its loss is at least 0.5 / S whatever is retrieved; fwm is compared in "
                 "the accuracy view", fontsize=9)
    ranked = "" if runs.get("replacement", pd.Series([True])).all() else \
        "\n    (or the rank bound's, where higher)"
    legend(ax, handles + [Line2D([], [], color="grey", ls="-.", lw=1.1,
                                 label=f"floor of fwm's loss: 0.5 / S{ranked}")] + notes)


def loss_vs_keys(runs: pd.DataFrame, capacity: pd.DataFrame, published: pd.DataFrame,
                 colors: dict, threshold: float, out_dir: Path) -> Path:
    """Figure 2 style: final eval loss (log) against the number of keys, one line per
    configuration in natural order; its failure point n* as a star on the tau line; one dashed
    line per distinct predicted capacity d_dot, labelled inside the axes; the loss floor of the
    rank bound; runs stopped by the step cap ringed; the authors' published losses and failure
    points of the matching configurations hollow, on thin dashed lines. The fwm configurations
    get a panel of their own below, against their own floor (``draw_fwm_loss``)."""
    fwm = update_rules.layer_norm(runs["update_rule"])
    x_max = runs["n_keys"].max() * 1.05
    if not fwm.any():
        fig = Figure(figsize=(9, 5.5))
        draw_loss_vs_keys(fig.add_subplot(), runs, capacity, published, colors, threshold)
        return save(fig, out_dir / "loss_vs_keys.png")
    others = runs[~fwm]
    fig = Figure(figsize=(9, 10 if len(others) else 5))
    axes = fig.subplots(2 if len(others) else 1, 1, squeeze=False,
                        gridspec_kw=dict(height_ratios=[3, 2] if len(others) else [1],
                                         hspace=0.45))[:, 0]
    if len(others):
        mine = capacity["label"].isin(others["label"])
        draw_loss_vs_keys(axes[0], others, capacity[mine],
                          published[published["label"].isin(others["label"])], colors,
                          threshold, x_max)
    draw_fwm_loss(axes[-1], runs[fwm], colors, x_max)
    return save(fig, out_dir / "loss_vs_keys.png")


def curves(curve_table: pd.DataFrame, colors: dict, threshold: float, out_dir: Path) -> Path:
    """One panel per configuration with a failure point inside the grid: the eval loss during
    training of the runs just below (solid: passes) and above (dashed: fails) it, with tau and
    the trainer's stop threshold (``stop_loss`` from the runs' config.yaml, where recorded)."""
    labels = [] if curve_table.empty else natural(curve_table["label"])
    ncols = min(3, max(len(labels), 1))
    nrows = max(math.ceil(len(labels) / ncols), 1)
    fig = Figure(figsize=(3.4 * ncols + 0.6, 2.6 * nrows + 0.9), layout="constrained")
    axes = fig.subplots(nrows, ncols, sharey=True, squeeze=False)
    for ax in axes.ravel()[len(labels):]:
        ax.set_visible(False)
    if not labels:
        axes[0, 0].set_visible(True)
        axes[0, 0].text(0.5, 0.5, "no configuration with a failure point inside the grid",
                        ha="center", va="center", transform=axes[0, 0].transAxes)
    unrecorded = False
    for ax, label in zip(axes.ravel(), labels):
        table = curve_table[curve_table["label"] == label]
        for (n, side), group in table.groupby(["n_keys", "side"]):
            ax.plot(group["step"], group["eval_loss"].where(group["eval_loss"] > 0),
                    "-" if side == "below" else "--", color=colors[label],
                    label=f"S={n} ({'passes' if side == 'below' else 'fails'})")
        ax.axhline(threshold, color="black", ls=":", lw=1, label=f"tau = {threshold:g}")
        stops = table["stop_loss"].dropna().unique()
        unrecorded |= len(stops) == 0
        for stop in stops:
            ax.axhline(stop, color="grey", ls="-.", lw=1, label=f"stop at {stop:g}")
        ax.set_yscale("log")
        ax.set_title(textwrap.fill(label, 44), fontsize=9)  # a panel's width at 9 pt
        ax.set_xlabel("training step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6.5, frameon=False)
    for ax in axes[:, 0]:
        ax.set_ylabel("evaluation loss (log)", fontsize=8)
    fig.suptitle("Evaluation loss during training just below (solid, passes) and above "
                 "(dashed, fails) each failure point"
                 + ("\nstop threshold not recorded in some runs' config.yaml" if unrecorded
                    else ""), fontsize=10)
    return save(fig, out_dir / "curves.png")
