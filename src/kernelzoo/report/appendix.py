"""The appendices of report.md: what was run in detail (the sweep record), what is missing or
was set aside, and the figures with their captions."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pandas as pd

from kernelzoo.analysis.labels import cell
from kernelzoo.records.history import experiment_points, finished_points, trained_points
from kernelzoo.config.words import plural


REFERENCE_NOTE = (
    "reference: the failure point of the same configuration in the committed reference runs "
    "of this experiment (`results/reference/<experiment>/`, made by the maintainers on the "
    "machine their report names; `reference_dir=` to choose another); – where they have none.")


PUBLISHED_NOTE = (
    "published: the same rule over the final eval losses the authors released (Schlag et al. "
    "2021, Figure 2, one run per point, seed 1; `src/kernelzoo/data/published_figure2.csv`, "
    "provenance in `data/README.md`), for the configurations that are theirs (Setting 1, same "
    "d_key, update rule, map and the parameters that define it: see `published.py`); – for the "
    "others. Their grid steps by 20 keys while this suite's searches bracket each seed near "
    "d_dot, so their point is compared by its bracket [last pass, first fail] "
    "(`published.verdict`).")


CAPTIONS = {
    "headline": "The headline: each view a panel, every configuration's failure point against "
                "its d_dot (log-log), one colour per family with its sizes joined, its interval "
                "over seeds or one seed's bracket as a bar; triangles are bounds; dotted: "
                "n* = d_dot.",
    "loss_panels": "Final eval loss against the number of keys, one panel per family (at most "
                   "8 configurations each): each seed thin, the median bold (line style by "
                   "d_dot), the failure point a star on the tau line, d_dot dashed, the loss "
                   "floor of the read-out dash-dotted.",
    "accuracy_panels": "Final eval accuracy against the number of keys, one panel per family: "
                       "each seed thin, the median bold, the accuracy-view failure point a star "
                       "on the threshold, d_dot dashed.",
    "keys_retrieved_panels": "Keys retrieved (number of keys x accuracy) against the number of "
                             "keys, one panel per family: each seed thin, the median bold, the "
                             "view's failure point (the most keys retrieved) a star, every key "
                             "retrieved dotted (y = x), d_dot dashed.",
    "loss_vs_keys": "Final eval loss against the number of keys, median over seeds: a star marks "
                    "each configuration's loss-view failure point n* on the tau line, a dashed "
                    "line each distinct predicted capacity d_dot, a dash-dotted curve the loss "
                    "floor of a rank-d_dot read-out (the rank bound); an x at the top a run "
                    "without a finite loss (diverged); hollow markers, for the authors' "
                    "configurations, their published losses. fwm configurations have a panel "
                    "of their own, against their floor 0.5 / S. Drawn beside the panels where "
                    "fwm ran, or where the authors' losses are shown on at most 8 lines.",
    "observed_vs_predicted": "The headline: each failure point against the capacity its map "
                             "predicts, with its order-statistic interval over seeds (solid) or "
                             "one seed's bracket (dashed); triangles are bounds, hollow markers "
                             "published values (the authors' configurations only).",
    "heatmap": "Median final eval loss per configuration and number of keys at their true "
               "S, on one colour scale centred on tau for all heatmaps. A map's heatmap is left "
               "out when no cell passes: it would show no boundary.",
    "capacity_efficiency": "Failure point / d_dot in each view, largest first: in the loss "
                           "view the rank theory's n* / d_dot (bounded by 1), in the argmax "
                           "views keys / d_dot (not bounded); the median over seeds (triangles: "
                           "bounds, squares: plateaus) with its order-statistic interval (solid, "
                           "its level in the legend) or one seed's bracket (dashed), each seed's "
                           "own value beside it.",
    "curves": "Eval loss during training of the runs just below and above each failure point, "
              "with tau and the trainer's stop threshold.",
    "capacity_scaling": "Per view and family, failure point / d_dot against d_dot: each seed "
                        "(dots), each level's median with its order-statistic interval, the law "
                        "n* = a d_dot^b fitted to the level medians with its 95% t band; the "
                        "dotted line is n* = d_dot.",
}


def figure_lines(figures: list[Path], omitted: list[str]) -> list[str]:
    """Each figure embedded (PNG) with its caption and a link to its SVG; then the figures
    left out, with why."""
    lines = ["## Figures", ""]
    for path in figures:
        caption = CAPTIONS["heatmap" if path.stem.startswith("heatmap_") else path.stem]
        lines += [f"![]({path.name})", "", f"{caption} ([SVG]({path.with_suffix('.svg').name}))",
                  ""]
    return lines + [f"- {line}" for line in omitted]


def listing(items: list[str], limit: int = 30) -> list[str]:
    shown = [f"  - {item}" for item in items[:limit]]
    return shown + ([f"  - ... and {len(items) - limit} more"] if len(items) > limit else [])


def noise(runs: pd.DataFrame, seeds: pd.DataFrame) -> list[str]:
    """The isolated failures the rule treated as noise (a failure followed by a pass)."""
    items = []
    for r in seeds.itertuples():
        for n in r.noise:
            run = runs[(runs["label"] == r.label) & (runs["seed"] == r.seed)
                       & (runs["n_keys"] == n)].iloc[0]
            items.append(f"{r.label}, seed {r.seed}, n_keys {int(n)}: final eval loss "
                         f"{cell(run['final_eval_loss'], 4)} ({run['status']})")
    return items


def _counted(invocation: dict) -> str:
    """The count after an invocation's points: (12 trained), or when it was interrupted
    (12 to train, 5 finished)."""
    if "outcomes" not in invocation:
        return ""
    if not invocation.get("interrupted"):
        return f" ({trained_points(invocation)} trained)"
    done = finished_points(invocation)
    return f" ({trained_points(invocation)} to train" + (f", {done} finished" if done else "") + ")"


def sweep_lines(history: dict, n_runs: int) -> list[str]:
    """The sweep record's lines of "What was run": wall clock per invocation, planned points."""
    parts = [f"{float(i['wall_seconds']):.0f} s for {plural(i['points'], 'point')}"
             + (f" of grids {i['grids']}" if "grids" in i else "")
             + _counted(i)
             + (f" in {plural(i['search']['rounds'], 'search round')}" if "search" in i else "")
             + (f", interrupted by {i['interrupted']}" if i.get("interrupted") else "")
             for i in history["invocations"]]
    lines = [f"- Sweep wall clock: {float(history['wall_seconds']):.0f} s "
             f"({float(history['wall_seconds']) / 60:.1f} min) over "
             f"{plural(len(parts), 'invocation')}: {'; '.join(parts)}."]
    grid = experiment_points(history)
    planned, what = (grid, "Points of the experiment") if grid is not None else \
        (max(i["points"] for i in history["invocations"]), "Points planned by the largest "
         "invocation")  # a search's probes, or a record older than experiment_points
    lines.append(f"- {what}: {planned}; with a summary: {n_runs}"
                 + ("" if n_runs >= planned else " (partial sweep)") + ".")
    for key, word in (("machine", "Sweep machine"), ("launcher", "Launcher")):
        used = Counter(i[key] for i in history["invocations"] if key in i)
        if used:
            lines.append(f"- {word}: " + "; ".join(
                name if len(used) == 1 else f"{name} ({n} invocation{'s' * (n > 1)})"
                for name, n in used.most_common()) + ".")
    return lines
