"""``report.md`` of one experiment, written from the tables that ``analyze`` builds.

Sections: what was run (runs, steps, wall time, machine, sweep invocations), the failure-point
rule, the capacity table (each failure point with its honest bracket or interval and, for the
authors' own configurations, the failure point of their published losses), the comparison with
the paper, capacity efficiency, the update rules compared (``update_rules.py``, where the
experiment has several), the learning rates compared (``learning_rate.py``), capacity against
d_dot per family (``scaling.py``: n* = a d_dot^b with bootstrap intervals, where some family is
fitted), the feature rank during training, the refined prediction (effective rank at the
failure point against d_dot), the stalls, the search's probes (for ``search=bisect``: which
n_keys were trained and why), what is missing or was treated as noise or set aside, and the
figures (PNG embedded, SVG linked, one caption each).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pandas as pd

from kernelzoo import learning_rate, prediction, scaling, update_rules
from kernelzoo.files import StoreError, atomic_write_text
from kernelzoo.plots import efficiency_order
from kernelzoo.stalls import RULE as STALL_RULE
from kernelzoo.stalls import has_diagnostics, moved, stall_lines, stall_rates
from kernelzoo.store import experiment_points, finished_points, read_sweep, trained_points
from kernelzoo.style import bound, cell, natural, natural_key
from kernelzoo.words import plural


def observed(r) -> str:
    """A failure point as read: one seed with its bracket ("57.1 (between 40 and 60)"),
    bounds as inequalities, several seeds as the median with its interval."""
    value, outcome = r.observed_capacity, r.outcome
    if outcome == "no_data":
        return "–"
    if r.n_seeds == 1:
        if outcome != "fails_at":
            return bound(value, outcome)
        return f"{cell(value)} (between {cell(r.ci_low)} and {cell(r.ci_high)})"
    return f"{cell(value)} [{cell(r.ci_low)}, {cell(r.ci_high)}] over {r.n_seeds} seeds"


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
    """The capacity table; "reference" (the committed runs of this experiment) and "published"
    (the authors') columns beside "observed" where any configuration has one."""
    extra, ref = has_published(capacity), has_reference(capacity)
    head = ["configuration", "d_dot", "predicted", "seeds", "observed",
            *(["reference"] if ref else []), *(["published"] if extra else []),
            "first failure", "ratio", "outcome", "accuracy criterion"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in capacity.itertuples():
        seeds = f"{r.n_seeds} seed" + ("" if r.n_seeds == 1 else "s")
        lines.append("| " + " | ".join([
            r.label, cell(r.d_dot), cell(r.predicted_capacity) if pd.notna(r.predicted_capacity)
            else "unbounded", seeds, observed(r),
            *([bound(r.reference_capacity, r.reference_outcome)] if ref else []),
            *([published(r)] if extra else []),
            cell(r.first_failure), cell(r.ratio), r.outcome,
            f"{cell(r.observed_capacity_acc)} ({r.outcome_acc})"]) + " |")
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
                    "each configuration's failure point n* on the tau line, a dashed line each "
                    "distinct predicted capacity d_dot; hollow markers, for the authors' "
                    "configurations, their published losses.",
    "observed_vs_predicted": "The headline: each failure point against the capacity its map "
                             "predicts; triangles are bounds, hollow markers published values "
                             "(the authors' configurations only).",
    "heatmap": "Median final eval loss per configuration and number of keys at their true "
               "S, on one colour scale centred on tau for all heatmaps. A map's heatmap is left "
               "out when no cell passes: it would show no boundary.",
    "capacity_efficiency": "Capacity efficiency, failure point / d_dot, most efficient first, "
                           "with its bracket (one seed) or interval over seeds; hatched bars are "
                           "bounds.",
    "curves": "Eval loss during training of the runs just below and above each failure point, "
              "with tau and the trainer's stop threshold.",
    "accuracy_vs_keys": "Retrieval accuracy against the number of keys.",
    "capacity_scaling": "Per family, each seed's failure point against d_dot (spread sideways a "
                        "few percent by seed), the fitted n* = a d_dot^b with its 95% bootstrap "
                        "band over seeds; the dotted line is y = x.",
    "capacity_vs_rank": "Each failure point against d_dot (left) and against the effective rank "
                        "of the written keys' features at the failure point (right), with its "
                        "bracket or interval over seeds; the dotted line is y = x.",
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


def efficiency_table(capacity: pd.DataFrame) -> list[str]:
    """Configurations ranked by capacity efficiency = failure point / d_dot."""
    rows = efficiency_order(capacity)
    if len(rows) < 2:
        return []
    lines = ["## Capacity efficiency (failure point / d_dot)", "",
             "Keys held per dimension of the state, most efficient first: median over seeds "
             "with its bracket (one seed) or interval; bounds say at least / at most.", "",
             "| rank | configuration | d_dot | failure point | efficiency | outcome |",
             "|---|---|---|---|---|---|"]
    for rank, r in enumerate(rows.itertuples(), 1):
        value = (f"{r.ratio:.2f} [{r.efficiency_low:.2f}, {r.efficiency_high:.2f}]"
                 if r.outcome == "fails_at" else
                 f"{'>=' if r.outcome == 'never_fails' else '<='} {r.ratio:.2f}")
        lines.append(f"| {rank} | {r.label} | {r.predicted_capacity} | {observed(r)} | {value} "
                     f"| {r.outcome} |")
    return lines + [""]


RANK_CHANGE = 0.1  # a relative change of the effective rank worth noting


def rank_changes(runs: pd.DataFrame) -> list[str]:
    """Per configuration, the written keys' effective feature rank at initialisation and after
    training (diagnostics; median over its runs), for those where it moved by more than 10%."""
    columns = ("phi_effective_rank_initial", "phi_effective_rank")
    if not set(columns) <= set(runs):
        return []
    rows = runs.dropna(subset=list(columns))
    lines = []
    for label in natural(rows["label"]):
        group = rows[rows["label"] == label]
        before, after = group[columns[0]].median(), group[columns[1]].median()
        if before > 0 and abs(after - before) > RANK_CHANGE * before:
            lines.append(f"| {label} | {group['d_dot'].iloc[0]} | {before:.1f} | {after:.1f} | "
                         f"{after / before - 1:+.0%} | {len(group)} |")
    if not lines:
        return []
    return ["## Feature rank during training", "",
            "Configurations whose written keys' effective feature rank (diagnostics, median over "
            "their runs) moved by more than 10% between initialisation and the end of training: "
            "trained keys, and learned maps' own parameters, reshape the state's use.", "",
            "| configuration | d_dot | at initialisation | after training | change | runs |",
            "|---|---|---|---|---|---|", *lines, ""]


def probe_tables(runs: pd.DataFrame, capacity: pd.DataFrame, threshold: float) -> list[str]:
    """One small table per configuration: every probe of the search, in the order asked."""
    probes = runs[runs["probe_round"].notna()]
    lines = ["## Search probes", "",
             f"{len(probes)} probes over {probes.groupby(['label', 'seed']).ngroups} "
             "configuration x seed series; the strategy is in `src/kernelzoo/search.py`. "
             "A probe fails when its run diverged or its final eval loss is missing or above "
             f"tau = {threshold:g}; a stalled one (see Stalls) is set aside where it fails.", ""]
    for label in sorted(probes["label"].unique(), key=natural_key):
        group = probes[probes["label"] == label].sort_values(["seed", "probe_round", "n_keys"])
        row = capacity[capacity["label"] == label].iloc[0]
        lines += [f"**{label}** (d_dot {cell(row.d_dot) if pd.notna(row.d_dot) else 'unbounded'}"
                  f"): {row.outcome}, {observed(row)}", "",
                  "| seed | round | n_keys | why | final eval loss | result |",
                  "|---|---|---|---|---|---|"]
        for r in group.itertuples():
            if r.status == "infeasible":
                result = "infeasible"
            else:
                result = "fails" if r.status == "diverged" or not r.final_eval_loss <= threshold \
                    else "passes"
                result += " (stalled)" if r.stalled else ""
            lines.append(f"| {r.seed} | {int(r.probe_round)} | {r.n_keys} | {r.probe_why} | "
                         f"{cell(r.final_eval_loss, 4)} | {result} |")
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


def prediction_section(runs: pd.DataFrame, capacity: pd.DataFrame) -> list[str]:
    """Effective rank at the failure point against d_dot as the predictor (``prediction.py``)."""
    lines = ["## Refined prediction: the effective rank at the failure point", ""]
    if not has_diagnostics(runs):
        return lines + ["No diagnostics: these runs predate them (no effective rank in their "
                        "summaries), so only d_dot predicts the failure points.", ""]
    rows = prediction.compared(capacity)
    lines += ["Does the effective rank of the written keys' features (diagnostics), reached at the "
              "failure point, predict it better than d_dot? `effective_rank_at_failure` "
              "(capacity.csv): per seed that fails at a point, the effective rank of its runs at "
              "the last pass and the first failure, interpolated at its failure point; the mean "
              "over those seeds. It is measured on the n_keys written keys of the trained model, "
              "so it can exceed neither n_keys nor d_dot: at the failure point it sits at or "
              "below the failure point by construction (failure point / effective rank >= 1, "
              "up to the interpolation). A small |ln| says the written features are still "
              "spread evenly where the memory fails, not that the rank was known beforehand; "
              "a large one, that they collapsed well before.", "",
              f"Comparison {prediction.compare(capacity).words()}.", ""]
    if rows.empty:
        return lines
    lines += ["| configuration | d_dot | failure point | effective rank at failure | "
              "failure point / d_dot | failure point / effective rank |", "|---|---|---|---|---|---|"]
    lines += [f"| {r.label} | {r.predicted_capacity} | {r.observed_capacity:.3g} | "
              f"{r.effective_rank_at_failure:.3g} | {r.ratio:.2f} | {r.rank_ratio:.2f} |"
              for r in rows.itertuples()]
    return lines + [""]


def stall_section(runs: pd.DataFrame, capacity: pd.DataFrame, counted: pd.DataFrame) -> list[str]:
    """The stall rule, the stall rate of every point with a stalled run, and the failure points
    that setting stalls aside moved (``counted``: the capacity table with stalls as failures)."""
    lines = ["## Stalls", ""]
    if not has_diagnostics(runs):
        return lines + ["No diagnostics: these runs predate them (no dead_keys in their "
                        "summaries), so no run can be told stalled and every failure counts.", ""]
    rates = stall_rates(runs)
    lines += [STALL_RULE, ""]
    if rates.empty:
        return lines + ["No run stalled.", ""]
    lines += [f"{int(runs['stalled'].sum())} of {len(runs)} runs stalled, at "
              f"{plural(len(rates), 'point')} of {plural(rates['label'].nunique(), 'configuration')} "
              "(each run is listed under \"What is missing or was set aside\").", "",
              "| configuration | n_keys | stalled seeds | stall rate |", "|---|---|---|---|"]
    lines += [f"| {r.label} | {r.n_keys} | {r.stalled} of {r.seeds} | {r.stalled / r.seeds:.0%} |"
              for r in rates.itertuples()]
    shifted = moved(capacity, counted)
    return lines + ["", "Failure points that setting the stalls aside moved: "
                    + ("; ".join(shifted) if shifted else "none") + ".", ""]


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


def write_report(exp_dir: Path, experiment: str, runs: pd.DataFrame, seeds: pd.DataFrame,
                 capacity: pd.DataFrame, counted: pd.DataFrame, families: list[scaling.Family],
                 missing: list[str], damaged: list[str], holes: list[str], figures: list[Path],
                 omitted: list[str], threshold: float, accuracy_threshold: float,
                 rule: str, set_aside: list[str] = ()) -> tuple[Path, list[str]]:
    """``report.md``: what ran where, the rule, the table, the stalls, the probes, what is
    missing; with every damaged file listed (``damaged``, an unreadable sweep.json and
    diagnostics.json: returned too) and the runs left out or configurations split
    (``set_aside``: ``analyze.sort_out``). ``counted``: the capacity table with stalls as failures;
    ``families``: ``scaling.families``."""
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
    try:
        history = read_sweep(exp_dir)
    except StoreError as err:
        damaged, history = [*damaged, str(err)], None
    if history is not None and history["invocations"]:
        lines += sweep_lines(history, len(runs))
    lines += ["", "## Failure-point rule", "", f"tau = {threshold:g}, accuracy threshold = "
              f"{accuracy_threshold:g}.", "", rule, "",
              f"## Capacity (loss criterion: final eval loss > {threshold:g})", ""]
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
                  "authors' losses): " + "; ".join(f"{r.label} {observed(r)} against "
                                                    f"{published(r)}"
                                                    for r in theirs.itertuples()) + "."]
    lines += ["", *efficiency_table(capacity), *update_rules.section(capacity, runs),
              *learning_rate.section(capacity),
              *scaling.section(families),
              *rank_changes(runs), *prediction_section(runs, capacity),
              *stall_section(runs, capacity, counted)]
    if runs["probe_round"].notna().any():
        lines += probe_tables(runs, capacity, threshold)
    lines += ["## What is missing or was set aside", ""]
    planned = experiment_points(history)
    if planned is not None and planned > len(runs):  # grid holes (below) see only n_keys with runs
        lines.append(f"- Points of the experiment without a summary: {planned - len(runs)} "
                     f"(`python -m kernelzoo.sweep {experiment} dry_run=true "
                     f"results_dir={exp_dir.parent}` names each point, done or to train)")
    infeasible = runs[runs["status"] == "infeasible"]
    stalled, unreadable = stall_lines(runs, exp_dir / "runs")
    damaged = [*damaged, *unreadable]
    mixed = [f"{label}: " + ", ".join(f"seed {s.seed} {s.outcome}" for s in g.itertuples())
             for label, g in seeds.groupby("label") if g["outcome"].nunique() > 1]
    for title, items in (
            ("Run directories without summary.json (in progress or interrupted)", missing),
            ("Damaged files (skipped)", damaged),
            ("Infeasible points (excluded)", [f"{r.label}, seed {r.seed}, n_keys {r.n_keys}: "
                                               f"{r.reason}" for r in infeasible.itertuples()]),
            ("Isolated failures treated as noise (a failure followed by a pass)",
             noise(runs, seeds)),
            ("Runs that stalled (see Stalls: set aside where they fail)", stalled),
            ("Grid holes (each configuration's n_keys x the experiment's seeds)", holes),
            ("Configurations whose seeds disagree on the outcome", mixed),
            ("Runs left out and configurations split by their settings", list(set_aside))):
        if items is not None:
            lines += [f"- {title}: {len(items) or 'none'}"] + _listing(items)
    lines += [""] + figure_lines(figures, omitted)
    path = exp_dir / "report.md"
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path, damaged
