"""Loss heatmaps: one per feature map run at two or more d_dot, all on one colour scale.

Each row is a configuration (ordered by d_dot), each cell the median final eval loss over seeds
at one number of keys, drawn at its true S: a row's cells span the midpoints between its own
n_keys, so an uneven grid keeps its spacing. Every heatmap of an analysis shares one diverging
colour scale in log10 loss centred on tau: blue passes, red fails, white is tau itself. A black
bar marks S = d_dot; diverged or missing losses are drawn at the top of the scale and crossed;
grey is no run.

A heatmap is left out when no cell passes (every median final loss is above tau, diverged or
missing): it then shows no boundary between passing and failing, and ``loss_panels`` already
shows those losses. fwm configurations are never in a heatmap: their loss has a floor of 0.5 / S
(``update_rules``), so its colour against tau says nothing of retrieval. ``heatmaps`` returns one
line per map or rule left out, for the report.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure

from kernelzoo.analysis import update_rules
from kernelzoo.analysis.labels import dkey, natural_key
from kernelzoo.report.style import DISPLAY_FLOOR, save

CMAP = "RdBu_r"


def loss_table(group: pd.DataFrame) -> tuple[pd.DataFrame, pd.Series]:
    """(median final loss per configuration x n_keys, inf where diverged or missing, NaN where
    no run; rows ordered by d_dot), and each configuration's d_dot."""
    loss = group["final_eval_loss"].where(group["status"] != "diverged").astype(float)
    loss = loss.fillna(np.inf).clip(lower=DISPLAY_FLOOR)
    table = loss.groupby([group["label"], group["n_keys"]]).median().unstack()
    d_dot = group.groupby("label")["d_dot"].first()
    return table.loc[sorted(table.index, key=lambda lab: (d_dot[lab], natural_key(lab)))], d_dot


def shows_boundary(table: pd.DataFrame, threshold: float) -> bool:
    """True when some cell passes (median final loss at or below tau)."""
    return bool((table.to_numpy() <= threshold).any())


def shared_norm(tables: list[pd.DataFrame], threshold: float) -> TwoSlopeNorm:
    """One diverging norm over log10 loss for all ``tables``, centred on log10 tau and spanning
    their finite losses (at least half a decade either side of tau)."""
    values = np.concatenate([t.to_numpy().ravel() for t in tables])
    finite = np.log10(values[np.isfinite(values)])
    centre = math.log10(threshold)
    low = min(finite.min(initial=centre), centre - 0.5)
    high = max(finite.max(initial=centre), centre + 0.5)
    return TwoSlopeNorm(vcenter=centre, vmin=low, vmax=high)


def cell_edges(n: np.ndarray) -> np.ndarray:
    """Cell boundaries for points at ``n`` (ascending): midpoints between neighbours, the ends
    half a neighbouring gap out (one point: +-10%)."""
    n = np.asarray(n, float)
    if len(n) == 1:
        return np.array([n[0] * 0.9, n[0] * 1.1])
    middle = (n[:-1] + n[1:]) / 2
    return np.concatenate([[n[0] - (n[1] - n[0]) / 2], middle, [n[-1] + (n[-1] - n[-2]) / 2]])


def _draw(table: pd.DataFrame, d_dot: pd.Series, fmap: str, d_keys, norm: TwoSlopeNorm,
          threshold: float, path: Path) -> Path:
    fig = Figure(figsize=(9, 2.3 + 0.45 * len(table)))
    ax = fig.add_subplot()
    ax.set_facecolor("lightgrey")
    for i, label in enumerate(table.index):
        row = table.loc[label].dropna()
        n = np.asarray(row.index, float)
        values = np.log10(row.to_numpy())
        bad = np.isinf(values)
        mesh = ax.pcolormesh(cell_edges(n), [i, i + 1], np.where(bad, norm.vmax, values)[None],
                             cmap=CMAP, norm=norm, edgecolors="white", linewidth=0.3)
        ax.plot(n[bad], np.full(int(bad.sum()), i + 0.5), "x", color="black", ms=5)
        if n[0] <= d_dot[label] <= n[-1]:
            ax.plot([d_dot[label]] * 2, [i, i + 1], color="black", lw=2.5)
    ax.set_ylim(len(table), 0)
    ax.set_yticks(np.arange(len(table)) + 0.5,
                  [f"{lab} (d_dot={d_dot[lab]})" for lab in table.index])
    bar = fig.colorbar(mesh, ax=ax, label="median final eval loss (log)")
    decades = np.arange(math.ceil(norm.vmin), math.floor(norm.vmax) + 1)
    ticks = sorted({*decades.tolist(), norm.vcenter})
    bar.set_ticks(ticks, labels=[f"tau = {threshold:g}" if t == norm.vcenter else f"1e{t:.0f}"
                                 for t in ticks])
    ax.set_xlabel("number of keys S (cells at their true S)")
    ax.set_title(f"{fmap}: median final eval loss over d_dot and number of keys ({dkey(d_keys)})"
                 f"\nblue passes, red fails (white: tau = {threshold:g}); black bar: S = d_dot; "
                 "x: diverged or missing; grey: no run", fontsize=10)
    return save(fig, path)


def heatmaps(runs: pd.DataFrame, threshold: float, out_dir: Path) -> tuple[list[Path], list[str]]:
    """``heatmap_<map>.png`` (and .svg) for each map run at >= 2 values of d_dot whose cells
    show a boundary (see the module docstring), fwm left out, on one shared colour scale;
    returns the paths and one line per map or rule left out."""
    fwm = update_rules.layer_norm(runs["update_rule"])
    feasible = runs[(runs["status"] != "infeasible") & ~fwm]
    drawn, omitted = [], []
    if fwm.any():
        omitted.append("heatmaps: the fwm configurations are left out, as their loss is at least "
                       f"0.5 / S whatever is retrieved (tau = {threshold:g} does not apply); "
                       "loss_vs_keys draws them against that floor")
    for fmap, group in feasible.groupby("feature_map"):
        if group["d_dot"].nunique() < 2:
            continue
        table, d_dot = loss_table(group)
        if shows_boundary(table, threshold):
            drawn.append((fmap, group, table, d_dot))
        else:
            omitted.append(f"heatmap_{fmap}: left out, as no cell passes (every median final "
                           f"loss is above tau = {threshold:g}, diverged or missing): it would "
                           "show no boundary; its losses are in loss_panels")
    if not drawn:
        return [], omitted
    norm = shared_norm([table for _, _, table, _ in drawn], threshold)
    return [_draw(table, d_dot, fmap, group["d_key"], norm, threshold,
                  out_dir / f"heatmap_{fmap}.png")
            for fmap, group, table, d_dot in drawn], omitted
