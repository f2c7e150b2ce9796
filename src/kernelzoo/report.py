"""``report.md`` of one experiment, written from the tables that ``analyze`` builds.

Sections: what was run (runs, steps, wall time, machine, sweep invocations), the failure-point
rule, the capacity table (each failure point with its honest bracket or interval), the
comparison with the paper, the search's probes (for ``search=bisect``: which n_keys were
trained and why), what is missing or was treated as noise, and the figures.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from kernelzoo.plots import natural_key
from kernelzoo.files import StoreError, atomic_write_text
from kernelzoo.store import read_sweep, trained_points


def _cell(value, digits: int = 3) -> str:
    if value is None or pd.isna(value):
        return "–"
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def observed(r) -> str:
    """A failure point as read: one seed with its bracket ("57.1 (between 40 and 60)"),
    bounds as inequalities, several seeds as the median with its interval."""
    value, outcome = r.observed_capacity, r.outcome
    if outcome == "no_data":
        return "–"
    if r.n_seeds == 1:
        if outcome == "never_fails":
            return f">= {_cell(value)}"
        if outcome == "fails_everywhere":
            return f"<= {_cell(value)}"
        return f"{_cell(value)} (between {_cell(r.ci_low)} and {_cell(r.ci_high)})"
    return f"{_cell(value)} [{_cell(r.ci_low)}, {_cell(r.ci_high)}] over {r.n_seeds} seeds"


def markdown_table(capacity: pd.DataFrame) -> list[str]:
    head = ["configuration", "d_dot", "predicted", "seeds", "observed", "first failure", "ratio",
            "outcome", "accuracy criterion"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in capacity.itertuples():
        seeds = f"{r.n_seeds} seed" + ("" if r.n_seeds == 1 else "s")
        lines.append("| " + " | ".join([
            r.label, _cell(r.d_dot), _cell(r.predicted_capacity) if pd.notna(r.predicted_capacity)
            else "unbounded", seeds, observed(r), _cell(r.first_failure), _cell(r.ratio),
            r.outcome, f"{_cell(r.observed_capacity_acc)} ({r.outcome_acc})"]) + " |")
    return lines


def probe_tables(runs: pd.DataFrame, capacity: pd.DataFrame, threshold: float) -> list[str]:
    """One small table per configuration: every probe of the search, in the order asked."""
    probes = runs[runs["probe_round"].notna()]
    lines = ["## Search probes", "",
             f"{len(probes)} probes over {probes.groupby(['label', 'seed']).ngroups} "
             "configuration x seed series; the strategy is in `src/kernelzoo/search.py`. "
             "A probe fails when its run diverged or its final eval loss is missing or above "
             f"tau = {threshold:g}.", ""]
    for label in sorted(probes["label"].unique(), key=natural_key):
        group = probes[probes["label"] == label].sort_values(["seed", "probe_round", "n_keys"])
        row = capacity[capacity["label"] == label].iloc[0]
        lines += [f"**{label}** (d_dot {_cell(row.d_dot) if pd.notna(row.d_dot) else 'unbounded'}"
                  f"): {row.outcome}, {observed(row)}", "",
                  "| seed | round | n_keys | why | final eval loss | result |",
                  "|---|---|---|---|---|---|"]
        for r in group.itertuples():
            if r.status == "infeasible":
                result = "infeasible"
            else:
                result = "fails" if r.status == "diverged" or not r.final_eval_loss <= threshold \
                    else "passes"
            lines.append(f"| {r.seed} | {int(r.probe_round)} | {r.n_keys} | {r.probe_why} | "
                         f"{_cell(r.final_eval_loss, 4)} | {result} |")
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
                         f"{_cell(run['final_eval_loss'], 4)} ({run['status']})")
    return items


def sweep_lines(history: dict, n_runs: int) -> list[str]:
    """The sweep record's lines of "What was run": wall clock per invocation, planned points."""
    parts = [f"{float(i['wall_seconds']):.0f} s for {i['points']} points"
             + (f" ({trained_points(i)} trained)" if "outcomes" in i else "")
             + (f" in {i['search']['rounds']} search rounds" if "search" in i else "")
             + (f", interrupted by {i['interrupted']}" if i.get("interrupted") else "")
             for i in history["invocations"]]
    lines = [f"- Sweep wall clock: {float(history['wall_seconds']):.0f} s "
             f"({float(history['wall_seconds']) / 60:.1f} min) over {len(parts)} "
             f"invocation(s): {'; '.join(parts)}."]
    planned = max(i["points"] for i in history["invocations"])
    lines.append(f"- Points planned by the largest invocation: {planned}; with a summary: "
                 f"{n_runs}" + ("" if n_runs >= planned else " (partial sweep)") + ".")
    last = history["invocations"][-1]
    if "machine" in last:
        lines.append(f"- Sweep machine: {last['machine']}; launcher {last['launcher']}.")
    return lines


def write_report(exp_dir: Path, experiment: str, runs: pd.DataFrame, seeds: pd.DataFrame,
                 capacity: pd.DataFrame, missing: list[str], damaged: list[str],
                 holes: list[str], figures: list[Path], threshold: float,
                 accuracy_threshold: float, rule: str) -> tuple[Path, list[str]]:
    """``report.md``: what ran where, the rule, the table, the probes, what is missing; with
    every damaged file listed (``damaged`` and an unreadable sweep.json: returned too)."""
    status = ", ".join(f"{k} {v}" for k, v in runs["status"].value_counts().items())
    wall, devices = runs["wall_seconds"], runs["device"].value_counts()
    steps = int(runs["steps"].fillna(0).sum())
    lines = [f"# Capacity analysis: `{experiment}`", "", "## What was run", "",
             f"- {len(runs)} runs with a summary ({status}); {len(capacity)} configurations.",
             f"- d_key: {', '.join(map(str, sorted(runs['d_key'].unique())))}; update rules: "
             f"{', '.join(sorted(runs['update_rule'].unique()))}; seeds: "
             f"{', '.join(map(str, sorted(runs['seed'].unique())))}.",
             f"- n_keys: {runs['n_keys'].min()} to {runs['n_keys'].max()} "
             f"({runs['n_keys'].nunique()} distinct values).",
             f"- Machine: {', '.join(f'{d} ({c} runs)' for d, c in devices.items())}; "
             f"kernelzoo {', '.join(sorted(map(str, runs['kernelzoo_version'].unique())))}.",
             f"- Wall time: {wall.sum():.0f} s summed over runs (median {wall.median():.1f} s, "
             f"max {wall.max():.1f} s per run); {steps:,} training steps"
             + (f" ({steps / wall.sum():.0f} per second of run time)." if wall.sum() > 0 else ".")]
    capped = runs[runs["status"] == "max_steps"]
    if len(capped):
        lines.append(f"- {len(capped)} runs stopped at the step cap ({int(capped['steps'].max())} "
                     "steps), not by the stopping rule: a failure there may be slow learning "
                     "rather than lack of capacity.")
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
    bounded = capacity[capacity["ratio"].notna()]
    lines += ["", "## Compared with the paper", "",
              "Schlag et al. (2021, Figure 2) predict that each deterministic map fails once the "
              "number of keys exceeds its d_dot. Observed / predicted ratios here: "
              + ("; ".join(f"{r.label} {r.ratio:.2f} ({r.outcome})" for r in bounded.itertuples())
                 or "none (no configuration with a bounded prediction has data)")
              + ". A never_fails ratio is a lower bound, a fails_everywhere ratio an upper bound.",
              ""]
    if runs["probe_round"].notna().any():
        lines += probe_tables(runs, capacity, threshold)
    lines += ["## What is missing or was set aside", ""]
    infeasible = runs[runs["status"] == "infeasible"]
    mixed = [f"{label}: " + ", ".join(f"seed {s.seed} {s.outcome}" for s in g.itertuples())
             for label, g in seeds.groupby("label") if g["outcome"].nunique() > 1]
    for title, items in (
            ("Run directories without summary.json (in progress or interrupted)", missing),
            ("Damaged files (skipped)", damaged),
            ("Infeasible points (excluded)", [f"{r.label}, seed {r.seed}, n_keys {r.n_keys}: "
                                               f"{r.reason}" for r in infeasible.itertuples()]),
            ("Isolated failures treated as noise (a failure followed by a pass)",
             noise(runs, seeds)),
            ("Grid holes (each configuration's n_keys x the experiment's seeds)", holes),
            ("Configurations whose seeds disagree on the outcome", mixed)):
        if items is not None:
            lines += [f"- {title}: {len(items) or 'none'}"] + _listing(items)
    lines += ["", "## Figures", ""] + [f"![]({p.name})\n" for p in figures]
    path = exp_dir / "report.md"
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path, damaged
