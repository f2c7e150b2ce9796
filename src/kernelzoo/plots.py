"""Figures of the capacity analysis, drawn from the tables that ``analyze`` builds.

Every function takes DataFrames (``runs``: one row per summary plus ``label``; ``capacity``: the
capacity table) and an output directory, writes one PNG (atomically: the old figure or the new,
never a part) and returns its path. One colour per
configuration label throughout (``config_colors``: a fixed mapping in natural label order).
Figures use matplotlib's object API with the Agg canvas: no pyplot state, no display needed.
"""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from kernelzoo.files import atomic_write

DISPLAY_FLOOR = 1e-8  # losses are clipped here so that a loss of 0 still shows on a log axis
OUTCOME_MARKERS = {"fails_at": "o", "never_fails": "^", "fails_everywhere": "v"}


def natural_key(label: str) -> list:
    """Sort key that orders "FAVOR+ m=64" before "FAVOR+ m=128"."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", label)]


def config_colors(labels) -> dict[str, tuple]:
    """Fixed colour per configuration label, assigned in natural label order."""
    labels = sorted(set(labels), key=natural_key)
    if len(labels) <= 10:
        cmap = matplotlib.colormaps["tab10"]
        return {label: cmap(i) for i, label in enumerate(labels)}
    cmap = matplotlib.colormaps["tab20" if len(labels) <= 20 else "turbo"]
    return {label: cmap(i / max(len(labels) - 1, 1)) for i, label in enumerate(labels)}


def _dkey(values) -> str:
    keys = sorted({int(v) for v in values})
    return f"d_key={keys[0]}" if len(keys) == 1 else "d_key in {" + ", ".join(map(str, keys)) + "}"


def _save(fig: Figure, path: Path) -> Path:
    atomic_write(path, lambda f: fig.savefig(f, format=path.suffix[1:], dpi=110,
                                             bbox_inches="tight"))
    return path


def _legend(ax) -> None:
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)


def is_search(runs: pd.DataFrame) -> bool:
    """True for the runs of a failure-point search (``search=bisect``), which are its probes."""
    return "probe_round" in runs and bool(runs["probe_round"].notna().any())


def _per_key(ax, runs: pd.DataFrame, colors: dict, column: str, bad_value: float,
             floor: float | None = None) -> None:
    """Seeds as points, the median over seeds as a line; diverged or missing values as x marks
    at ``bad_value`` (they count as failing). Infeasible runs are not drawn."""
    probes = is_search(runs)  # a search's probes are few: drawn large, edged
    dots = dict(s=30, alpha=0.9, edgecolors="black", linewidths=0.4) if probes else \
        dict(s=14, alpha=0.45, linewidths=0)
    for label, group in runs[runs["status"] != "infeasible"].groupby("label"):
        values = group[column].where(group["status"] != "diverged").astype(float)
        if floor is not None:
            values = values.clip(lower=floor)
        ok = np.isfinite(values)
        color = colors[label]
        ax.scatter(group["n_keys"][ok], values[ok], color=color, **dots)
        if (~ok).any():
            ax.scatter(group["n_keys"][~ok], np.full(int((~ok).sum()), bad_value), marker="x",
                       s=24, color=color)
        shown = values.where(ok, bad_value)
        if group.groupby("seed")["n_keys"].apply(frozenset).nunique() > 1:
            # seeds probed different n_keys (a search): one thin line per seed, no median
            for i, (_, seed) in enumerate(shown.groupby(group["seed"])):
                order = group.loc[seed.index, "n_keys"].argsort().to_numpy()
                ax.plot(group.loc[seed.index, "n_keys"].to_numpy()[order],
                        seed.to_numpy()[order], "-", lw=0.8, alpha=0.6, color=color,
                        label=None if i else label)
            continue
        median = shown.groupby(group["n_keys"]).median()
        ax.plot(median.index, median.to_numpy(), "-", lw=1.6, color=color, label=label)


def loss_vs_keys(runs: pd.DataFrame, capacity: pd.DataFrame, colors: dict, threshold: float,
                 out_dir: Path) -> Path:
    """Figure 2 style: final eval loss (log) against n_keys, predicted capacities dashed."""
    fig = Figure(figsize=(8, 5))
    ax = fig.add_subplot()
    finite = runs["final_eval_loss"][np.isfinite(runs["final_eval_loss"])]
    top = max(finite.max() if len(finite) else 1.0, threshold, 1.0) * 2
    _per_key(ax, runs, colors, "final_eval_loss", top, floor=DISPLAY_FLOOR)
    for row in capacity[capacity["predicted_capacity"].notna()].itertuples():
        ax.axvline(float(row.predicted_capacity), ls="--", lw=1, color=colors[row.label])
    ax.axhline(threshold, color="black", ls=":", lw=1, label=f"tau = {threshold:g}")
    ax.set_xlim(0, runs["n_keys"].max() * 1.05)
    ax.set_yscale("log")
    ax.set_xlabel("number of keys S (dashed: predicted capacity d_dot; x: diverged"
                  + ("; points: the search's probes)" if is_search(runs) else ")"))
    ax.set_ylabel("final eval loss (log scale)")
    ax.set_title(f"Final eval loss vs number of keys ({_dkey(runs['d_key'])}; "
                 f"fails above tau = {threshold:g})")
    _legend(ax)
    return _save(fig, out_dir / "loss_vs_keys.png")


def accuracy_vs_keys(runs: pd.DataFrame, colors: dict, accuracy_threshold: float,
                     out_dir: Path) -> Path:
    """Retrieval accuracy against n_keys, with the accuracy threshold."""
    fig = Figure(figsize=(8, 5))
    ax = fig.add_subplot()
    _per_key(ax, runs, colors, "final_eval_accuracy", 0.0)
    ax.axhline(accuracy_threshold, color="black", ls=":", lw=1,
               label=f"threshold = {accuracy_threshold:g}")
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("number of keys S (x: diverged)")
    ax.set_ylabel("final eval retrieval accuracy")
    ax.set_title(f"Retrieval accuracy vs number of keys ({_dkey(runs['d_key'])}; "
                 f"fails below {accuracy_threshold:g})")
    _legend(ax)
    return _save(fig, out_dir / "accuracy_vs_keys.png")


def observed_vs_predicted(capacity: pd.DataFrame, colors: dict, threshold: float,
                          out_dir: Path) -> Path:
    """Observed against predicted capacity (log-log) with y = x; bounds as triangles."""
    fig = Figure(figsize=(6.5, 5.5))
    ax = fig.add_subplot()
    rows = capacity[capacity["predicted_capacity"].notna() & (capacity["outcome"] != "no_data")]
    for row in rows.itertuples():
        x, y = float(row.predicted_capacity), row.observed_capacity
        ax.errorbar(x, y, yerr=[[y - row.ci_low], [row.ci_high - y]],
                    fmt=OUTCOME_MARKERS[row.outcome], ms=8, capsize=3, color=colors[row.label],
                    label=f"{row.label} ({row.outcome})")
    if len(rows):
        values = pd.concat([rows["predicted_capacity"].astype(float), rows["ci_low"],
                            rows["ci_high"]])
        low, high = values.min() / 1.5, values.max() * 1.5
        ax.plot([low, high], [low, high], "k:", lw=1, label="y = x")
        ticks = 2.0 ** np.arange(np.floor(np.log2(low)), np.ceil(np.log2(high)) + 1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_ticks(ticks, [f"{t:g}" for t in ticks])
            axis.set_minor_formatter(NullFormatter())
        ax.set_xlim(low, high)
        ax.set_ylim(low, high)
        _legend(ax)
    else:
        ax.text(0.5, 0.5, "no configuration with a bounded prediction and data",
                ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("predicted capacity d_dot (log)")
    ax.set_ylabel(f"observed capacity: n where loss > {threshold:g} (log)")
    ax.set_title(f"Observed vs predicted capacity ({_dkey(capacity['d_key'])})\n"
                 "o: fails at, ^: never fails (lower bound), v: fails everywhere (upper bound)",
                 fontsize=10)
    return _save(fig, out_dir / "observed_vs_predicted.png")


def heatmaps(runs: pd.DataFrame, out_dir: Path) -> list[Path]:
    """``heatmap_<map>.png`` for each map run at >= 2 values of d_dot: median final loss per
    (configuration, n_keys), rows ordered by d_dot, a red bar where n_keys = d_dot, grey holes."""
    paths = []
    feasible = runs[runs["status"] != "infeasible"]
    for fmap, group in feasible.groupby("feature_map"):
        if group["d_dot"].nunique() < 2:
            continue
        loss = group["final_eval_loss"].where(group["status"] != "diverged").astype(float)
        loss = loss.fillna(np.inf).clip(lower=DISPLAY_FLOOR)
        table = loss.groupby([group["label"], group["n_keys"]]).median().unstack()
        d_dot = group.groupby("label")["d_dot"].first()
        table = table.loc[sorted(table.index, key=lambda lab: (d_dot[lab], natural_key(lab)))]
        finite = table.to_numpy()[np.isfinite(table.to_numpy())]
        vmin, vmax = (finite.min(), finite.max()) if len(finite) else (DISPLAY_FLOOR, 1.0)
        values = np.where(np.isinf(table.to_numpy()), vmax, table.to_numpy())
        fig = Figure(figsize=(max(7.0, 0.25 * table.shape[1] + 3), 2.2 + 0.45 * len(table)))
        ax = fig.add_subplot()
        ax.set_facecolor("lightgrey")
        image = ax.imshow(values, aspect="auto", interpolation="nearest", cmap="viridis",
                          norm=LogNorm(vmin=vmin, vmax=max(vmax, vmin * 1.0001)))
        columns = np.asarray(table.columns, float)
        step = max(1, len(columns) // 15)
        ax.set_xticks(range(0, len(columns), step), [str(int(n)) for n in columns[::step]])
        ax.set_yticks(range(len(table)), [f"{lab} (d_dot={d_dot[lab]})" for lab in table.index])
        for i, lab in enumerate(table.index):
            if columns[0] <= d_dot[lab] <= columns[-1]:
                x = np.interp(d_dot[lab], columns, np.arange(len(columns)))
                ax.plot([x, x], [i - 0.5, i + 0.5], color="red", lw=2.5)
        fig.colorbar(image, ax=ax, label="median final eval loss (log)")
        ax.set_xlabel("number of keys S")
        ax.set_title(f"{fmap}: median final eval loss over d_dot and number of keys "
                     f"({_dkey(group['d_key'])})\nred bar: S = d_dot; grey: no data; "
                     "diverged shown as the maximum", fontsize=10)
        paths.append(_save(fig, out_dir / f"heatmap_{fmap}.png"))
    return paths


def curves(curve_table: pd.DataFrame, colors: dict, out_dir: Path) -> Path:
    """Eval-loss curves of the runs just below (solid) and above (dashed) each failure point."""
    fig = Figure(figsize=(8, 5))
    ax = fig.add_subplot()
    if curve_table.empty:
        ax.text(0.5, 0.5, "no configuration with a failure point inside the grid",
                ha="center", va="center", transform=ax.transAxes)
    else:
        for (label, n, side), group in curve_table.groupby(["label", "n_keys", "side"]):
            loss = group["eval_loss"].where(group["eval_loss"] > 0)
            ax.plot(group["step"], loss, "-" if side == "below" else "--", color=colors[label],
                    label=f"{label}, S={n} ({'passes' if side == 'below' else 'fails'})")
        ax.set_yscale("log")
        _legend(ax)
    ax.set_xlabel("training step")
    ax.set_ylabel("eval loss (log scale)")
    ax.set_title("Eval loss during training just below (solid) and above (dashed) "
                 "each failure point", fontsize=10)
    return _save(fig, out_dir / "curves.png")


def all_figures(runs: pd.DataFrame, capacity: pd.DataFrame, curve_table: pd.DataFrame,
                out_dir: Path, threshold: float, accuracy_threshold: float,
                search: bool = False) -> list[Path]:
    """Every figure of the analysis, in report order, one colour per configuration. A search's
    sparse probes have no grid for the heatmaps to fill."""
    colors = config_colors(capacity["label"])
    return [
        loss_vs_keys(runs, capacity, colors, threshold, out_dir),
        observed_vs_predicted(capacity, colors, threshold, out_dir),
        *([] if search else heatmaps(runs, out_dir)),
        curves(curve_table, colors, out_dir),
        accuracy_vs_keys(runs, colors, accuracy_threshold, out_dir),
    ]
