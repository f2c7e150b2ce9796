"""``report.md`` of one experiment, written from the tables that ``analyze`` builds.

Sections: what was run (runs, steps, wall time, machine, sweep invocations), the failure-point
rule, the capacity table in three views (loss, accuracy, keys retrieved: each with its bracket or
interval over seeds; the rank bound; for the authors' own configurations the failure point of
their published losses), the comparison with the paper (loss view), capacity efficiency per view
and how far the views' rankings agree (per size, each disagreement's cause: ``rankings.py``;
between sizes, each family's move: ``between_sizes.py``), the update rules compared (``update_rules.py``), capacity or optimisation: the learning rates
and stopping rules compared (``optimisation.py``), capacity against d_dot per family and view (``scaling.py``), the
memory's sections (``sections.py``: the rank bound and the features a query reads, the feature
rank during training, the prediction from the n_keys = d_dot probe, the stalls and their
checks), the factorial effects (``factorial.py``), the search's probes (for
``search=bisect``: which n_keys were trained and why), what is missing or was treated as noise
or set aside, and the figures (PNG embedded, SVG linked, one caption each).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pandas as pd

from kernelzoo.analysis import between_sizes, factorial, optimisation, scaling, update_rules
from kernelzoo.analysis.capacity import SUFFIX, VIEWS
from kernelzoo.analysis.intervals import MEDIAN_WORDS
from kernelzoo.analysis.labels import bound, cell, natural_key
from kernelzoo.analysis.pipeline import Analysis
from kernelzoo.analysis.rankings import efficiency_table
from kernelzoo.records.files import atomic_write_text
from kernelzoo.records.history import experiment_points, finished_points, trained_points
from kernelzoo.report.sections import (prediction_section, rank_bound_section, rank_changes,
                                       stall_section)
from kernelzoo.words import plural


def observed(r, view: str = "loss") -> str:
    """A failure point in one view as read: one seed with its bracket ("57.1 (between 40 and
    60)"), bounds as inequalities, several seeds as the median with its interval."""
    s = SUFFIX[view]
    value, outcome = getattr(r, f"observed_capacity{s}"), getattr(r, f"outcome{s}")
    low, high = getattr(r, f"ci_low{s}"), getattr(r, f"ci_high{s}")
    if outcome == "no_data":
        return "–"
    if r.n_seeds == 1:
        if outcome == "fails_at" and view != "keys_retrieved":
            return f"{cell(value)} (between {cell(low)} and {cell(high)})"
        return bound(value, outcome)
    shown = bound(value, outcome) if outcome != "fails_at" else cell(value)
    return f"{shown} [{cell(low)}, {cell(high)}]"


def published(r) -> str:
    """The failure point of the authors' published losses ("–": not one of theirs)."""
    return bound(r.published_capacity, r.published_outcome)


def has_published(capacity: pd.DataFrame) -> bool:
    """True when some configuration is one of the authors' (its published column is filled)."""
    return bool(capacity["published_outcome"].notna().any())


def has_reference(capacity: pd.DataFrame) -> bool:
    """True when the committed reference runs of this experiment have some configuration."""
    return "reference_outcome" in capacity and bool(capacity["reference_outcome"].notna().any())


def markdown_table(capacity: pd.DataFrame) -> list[str]:
    """The capacity table, the three views side by side (each: median over seeds [interval],
    or one seed's bracket; bounds as inequalities) and their ratios to d_dot; "reference" (the
    committed runs of this experiment) and "published" (the authors') loss-view columns where
    any configuration has one."""
    extra, ref = has_published(capacity), has_reference(capacity)
    checked = "stalled_runs" in capacity
    head = ["configuration", "d_dot", "seeds (interval level)", "loss view",
            *(["reference (loss)"] if ref else []), *(["published (loss)"] if extra else []),
            "rank bound", "accuracy view", "keys retrieved", "ratio loss / acc / keys",
            *(["stalled runs (cleared)", "loss view, verified stalls set aside"] if checked
              else [])]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in capacity.itertuples():
        level = "" if pd.isna(r.ci_level) else f" ({r.ci_level:.0%})"
        ratios = " / ".join(cell(getattr(r, f"ratio{SUFFIX[v]}"), 2) for v in VIEWS)
        lines.append("| " + " | ".join([
            r.label, cell(r.d_dot) if pd.notna(r.predicted_capacity) else "unbounded",
            f"{r.n_seeds}{level}", observed(r),
            *([bound(r.reference_capacity, r.reference_outcome)] if ref else []),
            *([published(r)] if extra else []),
            cell(r.rank_bound), observed(r, "accuracy"), observed(r, "keys_retrieved"), ratios,
            *([f"{r.stalled_runs} ({r.stalls_cleared} of {r.stalls_checked} checked)"
               if r.stalled_runs else "0",
               cell(r.observed_capacity_verified) if r.stalls_cleared else "same"]
              if checked else [])]) + " |")
    return lines


PUBLISHED_NOTE = (
    "published: the same rule over the final eval losses the authors released (Schlag et al. "
    "2021, Figure 2, one run per point, seed 1; `src/kernelzoo/data/published_figure2.csv`, "
    "provenance in `data/README.md`), for the configurations that are theirs (Setting 1, same "
    "d_key, update rule, map and the parameters that define it: see `published.py`); – for the "
    "others.")
REFERENCE_NOTE = (
    "reference: the failure point of the same configuration in the committed reference runs "
    "of this experiment (`results/reference/<experiment>/`, made by the maintainers on the "
    "machine their report names; `reference_dir=` to choose another); – where they have none.")
CAPTIONS = {
    "loss_vs_keys": "Final eval loss against the number of keys, median over seeds: a star marks "
                    "each configuration's loss-view failure point n* on the tau line, a dashed "
                    "line each distinct predicted capacity d_dot, a dash-dotted curve the loss "
                    "floor of a rank-d_dot read-out (the rank bound); an x at the top a run "
                    "without a finite loss (diverged); hollow markers, for the authors' "
                    "configurations, their published losses. fwm configurations have a panel "
                    "of their own, against their floor 0.5 / S.",
    "observed_vs_predicted": "The headline: each failure point against the capacity its map "
                             "predicts, with its order-statistic interval over seeds (solid) or "
                             "one seed's bracket (dashed); triangles are bounds, hollow markers "
                             "published values (the authors' configurations only).",
    "heatmap": "Median final eval loss per configuration and number of keys at their true "
               "S, on one colour scale centred on tau for all heatmaps. A map's heatmap is left "
               "out when no cell passes: it would show no boundary.",
    "capacity_efficiency": "Capacity efficiency, failure point / d_dot, in each view, most "
                           "efficient first: the median over seeds (triangles: bounds) with its "
                           "order-statistic interval (solid, its level in the legend) or one "
                           "seed's bracket (dashed), each seed's own value beside it.",
    "curves": "Eval loss during training of the runs just below and above each failure point, "
              "with tau and the trainer's stop threshold.",
    "accuracy_vs_keys": "The accuracy view (left: retrieval accuracy against the number of "
                        "keys, with the threshold) and the keys-retrieved view (right: number "
                        "of keys x accuracy, its maximum the view's value; dotted y = x).",
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


def probe_tables(runs: pd.DataFrame, capacity: pd.DataFrame, threshold: float) -> list[str]:
    """One small table per configuration: every probe of the search, in the order asked."""
    probes = runs[runs["probe_round"].notna()]
    lines = ["## Search probes", "",
             f"{len(probes)} probes over {probes.groupby(['label', 'seed']).ngroups} "
             "configuration x seed series; the strategy is in `src/kernelzoo/search.py`. "
             "A probe fails the loss view when its run diverged or its final eval loss is missing "
             f"or above tau = {threshold:g}; a stalled one (see Stalls) is marked.", ""]
    for label in sorted(probes["label"].unique(), key=natural_key):
        group = probes[probes["label"] == label].sort_values(["seed", "probe_round", "n_keys"])
        row = capacity[capacity["label"] == label].iloc[0]
        lines += [f"**{label}** (d_dot {cell(row.d_dot) if pd.notna(row.d_dot) else 'unbounded'}"
                  f"): loss view {row.outcome}, {observed(row)}; accuracy view "
                  f"{row.outcome_acc}, {observed(row, 'accuracy')}", "",
                  "| seed | round | n_keys | why | final eval loss | accuracy | loss view |",
                  "|---|---|---|---|---|---|---|"]
        for r in group.itertuples():
            if r.status == "infeasible":
                result = "infeasible"
            else:
                result = "fails" if r.status == "diverged" or not r.final_eval_loss <= threshold \
                    else "passes"
                result += " (stalled)" if r.stalled else ""
            lines.append(f"| {r.seed} | {int(r.probe_round)} | {r.n_keys} | {r.probe_why} | "
                         f"{cell(r.final_eval_loss, 4)} | {cell(r.final_eval_accuracy, 4)} | "
                         f"{result} |")
        lines.append("")
    return lines


def _listing(items: list[str], limit: int = 30) -> list[str]:
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


def write_report(a: Analysis, figures: list[Path], omitted: list[str], rule: str) -> Path:
    """``report.md`` of the analysis ``a``: what ran where, the rule, the table, the stalls, the
    probes, what is missing, with every damaged file listed and the runs left out or
    configurations split; ``figures`` and ``omitted``: ``figures.all_figures``."""
    runs, seeds, capacity, checked = a.runs, a.seeds, a.capacity, a.checked
    families, effects, history, damaged = a.families, a.effects, a.history, list(a.damaged)
    threshold, accuracy_threshold = a.threshold, a.accuracy_threshold
    experiment, exp_dir, holes = a.experiment, a.exp_dir, a.holes
    status = ", ".join(f"{k} {v}" for k, v in runs["status"].value_counts().items())
    wall, devices = runs["wall_seconds"], runs["device"].value_counts()
    steps = int(runs["steps"].fillna(0).sum())
    lines = [f"# Capacity analysis: `{experiment}`", "", "## What was run", "",
             f"- {plural(len(runs), 'run')} with a summary ({status}); "
             f"{plural(len(capacity), 'configuration')}.",
             f"- d_key: {', '.join(map(str, sorted(runs['d_key'].unique())))}; update rules: "
             f"{', '.join(sorted(runs['update_rule'].unique()))}; seeds: "
             f"{', '.join(map(str, sorted(runs['seed'].unique())))}.",
             f"- n_keys: {runs['n_keys'].min()} to {runs['n_keys'].max()} "
             f"({runs['n_keys'].nunique()} distinct values).",
             f"- Machine: {', '.join(f'{d} ({c} runs)' for d, c in devices.items())}; "
             f"kernelzoo {', '.join(sorted(map(str, runs['kernelzoo_version'].unique())))}.",
             f"- Wall time: {wall.sum():.0f} s summed over runs (a run trained in a pack counts "
             f"the pack's time until it stopped; median {wall.median():.1f} s, "
             f"max {wall.max():.1f} s per run); {steps:,} training steps"
             + (f" ({steps / wall.sum():.0f} per second of run time)." if wall.sum() > 0 else ".")]
    resumes = runs["resumes"].fillna(0) if "resumes" in runs else pd.Series(dtype=float)
    if (resumes > 0).any():
        lines.append(f"- Continued from checkpoints: {plural(int((resumes > 0).sum()), 'run')} "
                     f"({plural(int(resumes.sum()), 'resume')} in all); a resumed run's wall "
                     "time counts the work redone after a stop once.")
    capped = runs[runs["status"] == "max_steps"]
    if len(capped):
        lines.append(f"- {plural(len(capped), 'run')} stopped at the step cap "
                     f"({int(capped['steps'].max())} steps), not by the stopping rule: a failure "
                     "there may be slow learning rather than lack of capacity.")
    if history is not None and history["invocations"]:
        lines += sweep_lines(history, len(runs))
    lines += ["", "## Failure-point rule", "", f"tau = {threshold:g}, accuracy threshold = "
              f"{accuracy_threshold:g}.", "", rule, "",
              f"## Capacity in three views (loss: final eval loss > {threshold:g}; accuracy: "
              f"final eval accuracy < {accuracy_threshold:g}; keys retrieved)", "",
              "Intervals: median over seeds with the order-statistic interval of its level "
              "(beside the seed count; " + MEDIAN_WORDS + "); one seed: its bracket.", ""]
    lines += markdown_table(capacity)
    if has_reference(capacity):
        lines += ["", REFERENCE_NOTE]
    if has_published(capacity):
        lines += ["", PUBLISHED_NOTE]
    bounded = capacity[capacity["ratio"].notna()]
    lines += ["", "## Compared with the paper", "",
              "Schlag et al. (2021, Figure 2) predict that each deterministic map fails once the "
              "number of keys exceeds its d_dot. Observed / predicted ratios here: "
              + ("; ".join(f"{r.label} {r.ratio:.2f} ({r.outcome})" for r in bounded.itertuples())
                 or "none (no configuration with a bounded prediction has data)")
              + ". A never_fails ratio is a lower bound, a fails_everywhere ratio an upper bound."]
    theirs = capacity[capacity["published_outcome"].notna()]
    if len(theirs):
        lines += ["", "Observed against published failure points (the same rule over the "
                  "authors' losses; with seeds, where their one run lies: inside the median's "
                  "interval, inside the seeds' range, or outside, `published.verdict`): "
                  + "; ".join(f"{r.label} {observed(r)} against {published(r)}"
                              + (f" ({r.published_verdict})" if r.published_verdict != "one seed"
                                 else "") for r in theirs.itertuples()) + "."]
    family = {label: f.name for f in families for label in f.points["label"].unique()}
    lines += ["", *efficiency_table(capacity), *between_sizes.section(capacity, family),
              *update_rules.section(capacity, runs),
              *optimisation.section(seeds, capacity, runs),
              *scaling.section(list(families)), *rank_bound_section(capacity, runs),
              *rank_changes(runs), *prediction_section(runs, capacity),
              *stall_section(runs, capacity, checked)]
    lines += factorial.section(effects)
    if runs["probe_round"].notna().any():
        lines += probe_tables(runs, capacity, threshold)
    lines += ["## What is missing or was set aside", ""]
    planned = experiment_points(history)
    if planned is not None and planned > len(runs):  # grid holes (below) see only n_keys with runs
        lines.append(f"- Points of the experiment without a summary: {planned - len(runs)} "
                     f"(`python -m kernelzoo.sweep {experiment} dry_run=true "
                     f"results_dir={exp_dir.parent}` names each point, done or to train)")
    infeasible = runs[runs["status"] == "infeasible"]
    stalled = list(a.stall_lines)
    mixed = [f"{label}: " + ", ".join(f"seed {s.seed} {s.outcome}" for s in g.itertuples())
             for label, g in seeds.groupby("label") if g["outcome"].nunique() > 1]
    for title, items in (
            ("Run directories without summary.json (in progress or interrupted)", list(a.missing)),
            ("Damaged files (skipped)", damaged),
            ("Infeasible points (excluded)", [f"{r.label}, seed {r.seed}, n_keys {r.n_keys}: "
                                               f"{r.reason}" for r in infeasible.itertuples()]),
            ("Isolated failures treated as noise (a failure followed by a pass)",
             noise(runs, seeds)),
            ("Runs that stalled (see Stalls: counted as they ended)", stalled),
            ("Grid holes (each configuration's n_keys x the experiment's seeds)", holes),
            ("Configurations whose seeds disagree on the outcome", mixed),
            ("Runs left out and configurations split by their settings", list(a.set_aside))):
        if items is not None:
            lines += [f"- {title}: {len(items) or 'none'}"] + _listing(items)
    lines += [""] + figure_lines(figures, omitted)
    path = exp_dir / "report.md"
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path
