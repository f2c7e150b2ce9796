"""Small multiples, one panel per family (``scaling.families``), one colour per family in every
panel: ``loss_panels``, ``accuracy_panels`` and ``keys_retrieved_panels`` (each configuration's
final eval loss, accuracy or keys retrieved against n_keys: each seed a thin line, the median over
seeds bold, its failure point a star (on the threshold; in the keys-retrieved view at the most
keys retrieved, under the dotted y = x), its d_dot a dashed line, the loss floor of its read-out
dash-dotted), and ``headline``
(each view a panel: the failure point against d_dot per family, both sizes, with its interval).
Labels are horizontal; at most ``MAX_SERIES`` configurations share a panel."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from kernelzoo.analysis import rank_bound
from kernelzoo.analysis.capacity import POINTS, VIEW_WORDS, VIEWS, by_view
from kernelzoo.analysis.labels import natural, natural_key
from kernelzoo.report.style import DISPLAY_FLOOR, OUTCOME_MARKERS, family_colors, save, shades

MAX_SERIES = 8  # configurations on one panel at most; a larger family gets more panels
STYLES = ("-", "--", ":", "-.")  # a family's configurations, in d_dot order


def panels(families, capacity: pd.DataFrame) -> list[tuple[str, list[str]]]:
    """(family name, its configurations in natural order) per panel, families in natural order;
    a family of more than MAX_SERIES configurations split over several panels, and every
    configuration outside a family a panel of its own."""
    found, seen = [], set()
    for f in sorted(families, key=lambda f: natural_key(f.name)):
        labels = [x for x in natural(f.points["label"]) if x in set(capacity["label"])]
        seen |= set(labels)
        for i in range(0, len(labels), MAX_SERIES):
            found.append((f.name, labels[i:i + MAX_SERIES]))
    found += [(label, [label]) for label in natural(capacity["label"]) if label not in seen]
    return found


def palette(families, capacity: pd.DataFrame) -> dict[str, tuple]:
    """Each family's colour (``style.family_colors`` over every panel's name: a configuration
    outside a family is one), the same in every figure of the analysis."""
    return family_colors([name for name, _ in panels(families, capacity)])


def family_colors_of(capacity: pd.DataFrame, families) -> dict[str, tuple]:
    """Each configuration's colour: its family's hue (``palette``), a shade per configuration
    of the family in natural order, dark to light (``style.shades``)."""
    colors = palette(families, capacity)
    return {label: shade for name, labels in panels(families, capacity)
            for label, shade in zip(natural(labels), shades(colors[name], len(labels)))}


def _grid(n: int, width: float = 3.2, height: float = 2.6) -> tuple[Figure, np.ndarray]:
    cols = min(n, 4)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(width * cols + 0.6, height * rows + 0.8), layout="constrained")
    axes = np.atleast_1d(fig.subplots(rows, cols, sharex=False, squeeze=False).ravel())
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes


FLOOR_POINTS = 2048  # the most n_keys at which a floor is computed: each integer up to there


def _floor(ax, runs: pd.DataFrame, r, color) -> None:
    """The loss floor of configuration row ``r``'s read-out over its n_keys, dash-dotted: at
    every n_keys from its read rank to its largest, or at FLOOR_POINTS of them spread evenly
    (never as many values as a number read from the store says)."""
    if pd.isna(r.rank_bound):
        return
    first = runs[runs["label"] == r.label].iloc[0]
    rank = int(first["read_rank"])
    top = int(runs.loc[runs["label"] == r.label, "n_keys"].max())
    if top < rank:
        return
    n = np.unique(np.linspace(rank, top, min(top - rank + 1, FLOOR_POINTS)).round().astype(int))
    floor = np.array([rank_bound.floor_of(k, rank, r.update_rule, first["eval_max_queries"],
                                          first["eval_query_batch"]) for k in n])
    ax.plot(n[floor > 0], floor[floor > 0], ls="-.", lw=0.9, color=color, gid="rank-floor")


def _draw(ax, runs, capacity, labels, color, column, threshold, view) -> None:
    feasible = runs[(runs["status"] != "infeasible") & runs["label"].isin(labels)]
    order = sorted(labels, key=lambda x: capacity.set_index("label").loc[x, "d_dot"]
                   if pd.notna(capacity.set_index("label").loc[x, "d_dot"]) else math.inf)
    for k, label in enumerate(order):
        mine = feasible[feasible["label"] == label]
        y = mine[column].where(mine["status"] != "diverged")
        if view == "loss":
            y = y.clip(lower=DISPLAY_FLOOR)
        mine = mine.assign(y=y)
        for _, seed in mine.groupby("seed"):
            seed = seed.sort_values("n_keys")
            ax.plot(seed["n_keys"], seed["y"], lw=0.5, alpha=0.35, color=color, gid="seed")
        median = mine.groupby("n_keys")["y"].median()
        r = capacity[capacity["label"] == label].iloc[0]
        style = STYLES[k % len(STYLES)]
        ax.plot(median.index, median.to_numpy(), lw=2, ls=style, color=color, gid="median",
                label=f"d_dot {int(r.d_dot)}" if pd.notna(r.d_dot) else label)
        if pd.notna(r.d_dot):
            ax.axvline(int(r.d_dot), color=color, ls=style, lw=0.8, alpha=0.7, gid="d_dot")
        point = by_view(capacity[capacity["label"] == label]).set_index("view").loc[view]
        value = point["failure_point"]
        if point["outcome"] == "fails_at" and median.notna().any():
            at = (value, threshold) if threshold is not None else (median.idxmax(), value)
            ax.plot(*at, ls="none", marker="*", ms=11, color=color, mec="black", mew=0.5,
                    zorder=6, gid="failure-point")
        if view == "loss":
            _floor(ax, runs, r, color)
    if threshold is None:  # keys retrieved: every key right is y = x
        top = float(feasible["n_keys"].max())
        ax.plot([0, top], [0, top], color="black", ls=":", lw=1)
    else:
        ax.axhline(threshold, color="black", ls=":", lw=1)


COLUMNS = {"loss": "final_eval_loss", "accuracy": "final_eval_accuracy",
           "keys_retrieved": "keys_retrieved"}  # the runs' column each view draws
Y_LABELS = {"loss": "final eval loss (log)", "accuracy": "final eval accuracy",
            "keys_retrieved": "keys retrieved: S x accuracy"}


def key_panels(runs: pd.DataFrame, capacity: pd.DataFrame, families, threshold: float | None,
               out_dir: Path, view: str) -> Path:
    """``<view>_panels`` for a view of ``VIEWS``: the loss and accuracy views against their
    ``threshold``, the keys-retrieved view (``threshold`` None) against y = x."""
    column = COLUMNS[view]
    runs = runs.assign(keys_retrieved=runs["n_keys"] * runs["final_eval_accuracy"])
    found = panels(families, capacity)
    colors = palette(families, capacity)
    fig, axes = _grid(len(found))
    for ax, (name, labels) in zip(axes, found):
        _draw(ax, runs, capacity, labels, colors[name], column, threshold, view)
        ax.set_title(name, fontsize=9)
        ax.tick_params(labelsize=7)
        if view == "loss":
            ax.set_yscale("log")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6, frameon=False, loc="best")
    fig.supxlabel("number of keys S", fontsize=9)
    fig.supylabel(Y_LABELS[view], fontsize=9)
    if threshold is None:
        where = "at the most keys retrieved, dotted: every key retrieved (y = x)"
    else:
        where = (f"where it {'rises above' if view == 'loss' else 'falls below'} "
                 f"{threshold:g} (dotted)")
    fig.suptitle(f"Final eval {VIEW_WORDS[view]} against the number of keys, one panel per "
                 f"family: seeds thin, median bold, star: failure point {where}, dashed: d_dot"
                 + (", dash-dotted: the rank floor" if view == "loss" else ""), fontsize=9)
    fig.legend(handles=[Line2D([], [], color="grey", lw=0.5, label="each seed"),
                        Line2D([], [], color="grey", lw=2, label="median over seeds"),
                        Line2D([], [], ls="none", marker="*", ms=9, color="grey", mec="black",
                               mew=0.5, label="failure point")],
               loc="outside right center", fontsize=8, frameon=False)
    return save(fig, out_dir / f"{view}_panels.png")


DODGE = 0.3  # log2 units of d_dot over which the families at one d_dot stand side by side


def headline(capacity: pd.DataFrame, families, out_dir: Path) -> Path:
    """Each view a panel: every configuration's failure point against its d_dot (log-log), one
    colour per family, a family's sizes joined by a line, its interval as a bar (triangles:
    bounds), and the dotted n* = d_dot. The families at one d_dot stand side by side (each moved
    by at most DODGE / 2 in log2 d_dot) so their bars do not hide each other; the axes span the
    d_dots and the failure points found, not the diagonal."""
    bounded = capacity[capacity["predicted_capacity"].notna()]
    found = panels(families, bounded)
    colors = palette(families, capacity)
    fig = Figure(figsize=(4.2 * len(VIEWS) + 2.4, 4.4), layout="constrained")
    axes = fig.subplots(1, len(VIEWS), sharex=True, sharey=True)
    values, d_dots, long = [], [], by_view(bounded)
    shift = {name: 2 ** (DODGE * ((i + 0.5) / len(found) - 0.5)) for i, (name, _) in
             enumerate(found)}
    for ax, view in zip(axes, VIEWS):
        for name, labels in found:
            rows = long[(long["view"] == view) & long["label"].isin(labels)
                        & (long["outcome"] != "no_data")].sort_values("d_dot")
            if rows.empty:
                continue
            x = rows["d_dot"].astype(float).to_numpy() * shift[name]
            y = rows["failure_point"].to_numpy(float)
            values += [*y, *rows["ci_low"], *rows["ci_high"]]
            d_dots += list(x)
            ax.plot(x, y, lw=1, color=colors[name], alpha=0.6)
            for xi, r in zip(x, rows.itertuples()):
                outcome, low, high, value = r.outcome, r.ci_low, r.ci_high, r.failure_point
                marker = OUTCOME_MARKERS.get(outcome, "o")
                bar = outcome in POINTS and pd.notna(low) and pd.notna(high)
                ax.errorbar(xi, value, yerr=[[max(value - low, 0)], [max(high - value, 0)]]
                            if bar else None, fmt=marker, ms=5, capsize=2, lw=0.9,
                            color=colors[name], label=name if view == VIEWS[0] else None)
        ax.set_title(f"{VIEW_WORDS[view]} view", fontsize=10)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlabel("d_dot (log)", fontsize=9)
        ax.tick_params(labelsize=8)
    finite = [v for v in values if np.isfinite(v) and v > 0]
    if finite and d_dots:
        (x_low, x_high), (y_low, y_high) = ((min(d_dots) / 1.3, max(d_dots) * 1.3),
                                            (min(finite) / 1.3, max(finite) * 1.3))
        both = min(x_low, y_low), max(x_high, y_high)
        for ax in axes:
            ax.plot(both, both, "k:", lw=1)
            ax.set_xlim(x_low, x_high)
            ax.set_ylim(y_low, y_high)
    axes[0].set_ylabel("failure point (log)", fontsize=9)
    handles, labels = axes[0].get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    fig.legend(list(unique.values()) + [
        Line2D([], [], color="black", ls=":", lw=1, label="n* = d_dot"),
        Line2D([], [], ls="none", marker="^", color="grey", label="never failed: lower bound")],
        list(unique) + ["n* = d_dot", "never failed: lower bound"],
        loc="outside right center", fontsize=7, frameon=False)
    fig.suptitle("Failure point against d_dot per family, each view a panel (bars: interval "
                 "over seeds, or one seed's bracket)", fontsize=10)
    return save(fig, out_dir / "headline.png")
