"""``report.md`` of one analysis. Its first screen answers: what ran (one line, with the
parameters), the capacity table (one row per configuration: each view's failure point with its
interval, the ratio to d_dot where the paper bounds the view, the flags) and the study's
verdicts (``verdicts.py``). The appendices follow: what was run in detail, the rankings, the
comparisons, the d_dot law, the memory's sections, the stalls, the search's probes
(probes.csv), what is missing, the figures. Rules are not restated: the report links to
docs/analysis.md.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from kernelzoo.analysis import protocol, tiers
from kernelzoo.analysis.capacity import VIEW_WORDS, VIEWS
from kernelzoo.analysis.labels import bound, cell, natural
from kernelzoo.analysis.pipeline import Analysis
from kernelzoo.records.files import atomic_write_text
from kernelzoo.records.history import experiment_points
from kernelzoo.report.answer import answer_lines
from kernelzoo.report.appendix import (PUBLISHED_NOTE, REFERENCE_NOTE, listing, figure_lines,
                                       noise, sweep_lines)
from kernelzoo.report.rankings import between_sizes_section, efficiency_section, tier_section
from kernelzoo.report.scaling import scaling_section
from kernelzoo.report.sections import (SHOWN, prediction_section, rank_bound_section, rank_changes,
                                       stall_section)
from kernelzoo.report.studies import factorial_section, optimisation_section, update_rule_section
from kernelzoo.report.verdicts import verdict_lines
from kernelzoo.config.words import plural

RULES = Path(__file__).resolve().parents[3] / "docs" / "analysis.md"



def protocol_line(runs: pd.DataFrame) -> str:
    """The report's first line: the protocol, and how many runs hit the step cap."""
    away = protocol.departures(runs)
    if away:
        what = "not the published one: " + "; ".join(
            f"{key.removeprefix('trainer.')} {', '.join(values)} (published "
            f"{protocol.format_value(protocol.PUBLISHED[key])})" for key, values in away.items())
    else:
        what = "the published one (trainer=paper)"
    hit, trained = protocol.capped(runs)
    return (f"**Protocol**: {what}. **Step cap**: {hit} of {plural(trained, 'run')} "
            "stopped at it" + (", not by the stopping rule: a failure there may be slow "
                               "learning rather than lack of capacity." if hit else "."))


def observed(r) -> str:
    """A failure point in one view as read, from its row of the long table
    (``capacity.by_view``): one seed with its bracket ("57.1 (between 40 and 60)"), bounds as
    inequalities, several seeds as the median with its interval."""
    value, outcome, low, high = r.failure_point, r.outcome, r.ci_low, r.ci_high
    if outcome in ("no_data", "not_searched"):
        return "–" if outcome == "no_data" else "not searched"
    if r.n_seeds == 1:
        if outcome == "fails_at" and r.view != "keys_retrieved":
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


def rules_link(exp_dir: Path) -> str:
    """docs/analysis.md as a link relative to the report where the report lies in this
    checkout, else its name."""
    here = exp_dir.resolve()
    if RULES.parents[1] not in here.parents:
        return "docs/analysis.md"
    return f"[docs/analysis.md]({os.path.relpath(RULES, here)})"


def what_ran(a: Analysis) -> str:
    """One line: runs, configurations, seeds, n_keys, machine, run time, the parameters."""
    runs = a.runs
    seconds = runs["wall_seconds"].sum()
    time = f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"
    machines = ", ".join(str(d) for d in runs["device"].value_counts().index)
    return (f"{plural(len(runs), 'run')} of {plural(len(a.capacity), 'configuration')} "
            f"(seeds {', '.join(map(str, sorted(runs['seed'].unique())))}; n_keys "
            f"{runs['n_keys'].min()} to {runs['n_keys'].max()}) on {machines}, {time} of run "
            f"time; tau = {a.threshold:g}, accuracy threshold = {a.accuracy_threshold:g}. Rules: "
            f"{rules_link(a.exp_dir)}.")


def capacity_lines(a: Analysis) -> list[str]:
    """The capacity table from the long table: one row per configuration, each view's failure
    point with its interval, the loss view's ratio to d_dot (the one view d_dot bounds), the reference and published loss
    views where any configuration has one, and the flags."""
    capacity, ref, theirs = a.capacity, has_reference(a.capacity), has_published(a.capacity)
    flags = a.long.drop_duplicates("label").set_index("label")["flags"]
    views = {label: rows for label, rows in a.long.groupby("label", sort=False)}
    head = ["configuration", "d_dot", "seeds", *(VIEW_WORDS[v] for v in VIEWS),
            "loss / d_dot", *(["reference (loss)"] if ref else []),
            *(["published (loss)"] if theirs else []), "flags"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in capacity.itertuples():
        lines.append("| " + " | ".join([
            r.label, cell(r.d_dot) if pd.notna(r.predicted_capacity) else "unbounded",
            str(r.n_seeds), *map(observed, views[r.label].itertuples()),
            bound(r.ratio, r.outcome, 2),
            *([bound(r.reference_capacity, r.reference_outcome)] if ref else []),
            *([published(r)] if theirs else []), flags.get(r.label, "")]) + " |")
    levels = sorted({f"{n} seeds {lv:.4g}%" for n, lv in
                     zip(capacity["n_seeds"], 100 * capacity["ci_level"]) if n > 1 and lv > 0},
                    key=lambda t: int(t.split()[0]))
    return lines + [
        "", "Each view: the median over seeds [order-statistic interval"
        + (f"; its coverage: {', '.join(levels)}" if levels else "") + "]; one seed: between its "
        "last pass and first failure; >= a lower bound (never failed), <= an upper bound (failed "
        "at the first point); plateau: keys retrieved flat over the last probes, at that level. "
        "Only the loss view is the rank theory's, bounded by d_dot (hence its ratio); accuracy "
        "and keys retrieved decode by argmax and can exceed d_dot (docs/analysis.md, \"What each "
        "view measures\"). Flags: docs/analysis.md, \"Flags\"."]


def probe_lines(a: Analysis) -> list[str]:
    """The search's probes in one line: how many, over how many series, where they are."""
    probes = a.runs[a.runs["probe_round"].notna()]
    if probes.empty:
        return []
    return ["## Search probes", "",
            f"{len(probes)} probes over {probes.groupby(['label', 'seed']).ngroups} configuration "
            f"x seed series in {int(probes['probe_round'].max())} rounds; each probe (round, "
            "n_keys, why it was asked, final eval loss and accuracy, stalled) is a row of "
            "`probes.csv`.", ""]


def missing_lines(a: Analysis) -> list[str]:
    """What is missing or was set aside, each list shortened (the rest: stalls.csv)."""
    runs, seeds = a.runs, a.seeds
    lines = ["## What is missing or was set aside", ""]
    planned = experiment_points(a.history)
    if planned is not None and planned > len(runs):
        lines.append(f"- Points of the experiment without a summary: {planned - len(runs)} "
                     f"(`python -m kernelzoo.sweep {a.experiment} dry_run=true "
                     f"results_dir={a.exp_dir.parent}` names each point, done or to train)")
    infeasible = runs[runs["status"] == "infeasible"]
    stalled = list(a.stall_lines)
    if len(stalled) > SHOWN:
        stalled = stalled[:SHOWN] + [f"... and {len(stalled) - SHOWN} more: `stalls.csv`"]
    mixed = [f"{label}: " + ", ".join(f"seed {s.seed} {s.outcome}" for s in g.itertuples())
             for label, g in seeds.groupby("label") if g["outcome"].nunique() > 1]
    for title, items, count in (
            ("Run directories without summary.json (in progress or interrupted)",
             list(a.missing), None),
            ("Damaged files (skipped)", list(a.damaged), None),
            ("Infeasible points (excluded)", [f"{r.label}, seed {r.seed}, n_keys {r.n_keys}: "
                                               f"{r.reason}" for r in infeasible.itertuples()],
             None),
            ("Isolated failures treated as noise (a failure followed by a pass)",
             noise(runs, seeds), None),
            ("Runs that stalled (see Stalls: counted as they ended)", stalled,
             len(a.stall_lines)),
            ("Grid holes (each configuration's n_keys x the experiment's seeds)",
             None if a.holes is None else list(a.holes), None),
            ("Configurations whose seeds disagree on the outcome", mixed, None),
            ("Runs left out and configurations split by their settings", list(a.set_aside),
             None)):
        if items is not None:
            n = len(items) if count is None else count
            lines += [f"- {title}: {n or 'none'}"] + listing(items, SHOWN + 1)
    return lines + [""]


def write_report(a: Analysis, heads: pd.DataFrame, figures: list[Path], omitted: list[str]
                 ) -> Path:
    """report.md of ``a``; ``heads``: its headlines (``verdicts.headlines``); ``figures`` and
    ``omitted``: ``figures.all_figures``."""
    runs, capacity = a.runs, a.capacity
    lines = [f"# Capacity analysis: `{a.experiment}`", "", protocol_line(runs), "", what_ran(a),
             "", *answer_lines(a.answer), "## Capacity", "",
             *capacity_lines(a), "", "## Verdicts", "", *verdict_lines(heads), "",
             "The sections below are the detail behind the table and the verdicts.", "",
             "## What was run", ""]
    status = ", ".join(f"{k} {v}" for k, v in runs["status"].value_counts().items())
    lines.append(f"- Runs by how they ended: {status}.")
    history = a.history
    if history is not None and history["invocations"]:
        lines += sweep_lines(history, len(runs))
    lines.append(f"- kernelzoo {', '.join(sorted(map(str, runs['kernelzoo_version'].unique())))};"
                 f" {int(runs['steps'].fillna(0).sum()):,} training steps; d_key "
                 f"{', '.join(map(str, sorted(runs['d_key'].unique())))}; update rules "
                 f"{', '.join(sorted(runs['update_rule'].unique()))}.")
    resumes = runs["resumes"].fillna(0) if "resumes" in runs else pd.Series(dtype=float)
    if (resumes > 0).any():
        lines.append(f"- Continued from checkpoints: {plural(int((resumes > 0).sum()), 'run')} "
                     f"({plural(int(resumes.sum()), 'resume')} in all); a resumed run's wall "
                     "time counts the work redone after a stop once.")
    capped = runs[runs["status"] == "max_steps"]
    if len(capped):
        lines.append(f"- {plural(len(capped), 'run')} stopped at the step cap "
                     f"({int(capped['steps'].max())} steps), not by the stopping rule.")
    if has_reference(capacity):
        lines += ["", REFERENCE_NOTE]
    if has_published(capacity):
        lines += ["", PUBLISHED_NOTE]
    flag_rows = tiers.flags(capacity, runs, a.threshold, a.accuracy_threshold)
    lines += ["", *efficiency_section(capacity), *tier_section(capacity, a.placed, flag_rows, level=3),
              *between_sizes_section(a.size_pairs), *update_rule_section(capacity, runs),
              *optimisation_section(a.moves, runs),
              *scaling_section(list(a.families)), *rank_bound_section(capacity, runs),
              *rank_changes(runs), *prediction_section(runs, capacity),
              *stall_section(runs, capacity, a.checked), *factorial_section(a.effects),
              *probe_lines(a), *missing_lines(a), *figure_lines(figures, omitted)]
    path = a.exp_dir / "report.md"
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path


def probes_table(a: Analysis) -> pd.DataFrame:
    """probes.csv: every probe of a search in the order asked, with its loss-view result."""
    probes = a.runs[a.runs["probe_round"].notna()]
    columns = ["label", "seed", "probe_round", "n_keys", "probe_why", "final_eval_loss",
               "final_eval_accuracy", "status", "stalled"]
    order = {label: i for i, label in enumerate(natural(probes["label"]))}
    return probes.assign(order=probes["label"].map(order)).sort_values(
        ["order", "seed", "probe_round", "n_keys"])[columns].reset_index(drop=True)
