"""The report's comparison studies: the update rules (``update_rule_section``, rules of
``analysis.update_rules``), capacity or optimisation (``optimisation_section``,
``analysis.optimisation``) and the factorial effects (``factorial_section``,
``analysis.factorial``), each as markdown lines, with the words the verdicts quote."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from kernelzoo.analysis import factorial, optimisation, update_rules
from kernelzoo.analysis.capacity import VIEW_WORDS, VIEWS
from kernelzoo.analysis.labels import bound, cell, natural_key
from kernelzoo.analysis.published import PUBLISHED_STOPPING
from kernelzoo.config.words import plural


def _accuracy_point(r) -> str:
    """A failure point under the accuracy criterion, bounds as inequalities."""
    return bound(r.observed_capacity_acc, r.outcome_acc)


def _distinct_at_failure(r, runs: pd.DataFrame) -> str:
    """The distinct keys of an evaluation sequence at the failure point (accuracy criterion),
    and their ratio to d_dot; "–" when the runs' evaluation lengths differ in kind."""
    mine = runs[runs["label"] == r.label]
    n = r.observed_capacity_acc
    if mine.empty or pd.isna(n):
        return "–"
    if (mine["eval_seq_len"] == mine["n_keys"]).all():
        length = n  # the default: evaluation sequences of n_keys writes
    elif mine["eval_seq_len"].nunique() == 1:
        length = float(mine["eval_seq_len"].iloc[0])
    else:
        return "–"
    distinct = update_rules.distinct_keys(n, length, bool((mine["task"] == "update").all()))
    text = bound(distinct, r.outcome_acc)
    return text + (f" ({distinct / r.d_dot:.2f})" if pd.notna(r.d_dot) else "")


def sum_rule_lines(capacity: pd.DataFrame, runs: pd.DataFrame) -> list[str]:
    """Per sum-rule configuration trained with replacement: does it retrieve at all?"""
    replaced = runs[runs["task"] == "update"]
    lines = []
    for r in capacity[update_rules.only_adds(capacity["update_rule"])].itertuples():
        if r.label not in set(replaced["label"]):
            continue
        if r.outcome_acc == "fails_everywhere":
            verdict = (f"fails at every n_keys tried ({_accuracy_point(r)}): with replacement it cannot "
                       "retrieve, since it adds each write to the old value instead of "
                       "replacing it")
        elif r.outcome_acc == "never_fails":
            verdict = f"never fails ({_accuracy_point(r)}): it handles replacement at every size tried"
        else:
            ratio = "" if pd.isna(r.d_dot) else f", {r.observed_capacity_acc / r.d_dot:.2f} d_dot"
            verdict = f"holds up to {_accuracy_point(r)} keys with replacement{ratio}"
        lines.append(f"- {r.label}: {verdict}.")
    return lines


def diverged_lines(runs: pd.DataFrame) -> list[str]:
    """One line per configuration with diverged runs: where, and the reason recorded."""
    lines = []
    for label, group in runs[runs["status"] == "diverged"].groupby("label"):
        total = int((runs["label"] == label).sum())
        keys = ", ".join(str(n) for n in sorted(group["n_keys"].unique()))
        reasons = sorted(set(group["reason"].dropna()), key=natural_key)
        lines.append(f"- {label}: {len(group)} of {total} runs, at n_keys {keys}. "
                     + (f"First reason: {reasons[0]}" if reasons else "No reason recorded.")
                     + (f" ({len(reasons) - 1} more)" if len(reasons) > 1 else ""))
    return lines


def update_rule_section(capacity: pd.DataFrame, runs: pd.DataFrame) -> list[str]:
    """The report's "Update rules" section (``update_rules.table``); [] unless the experiment has
    several rules."""
    found = update_rules.table(capacity)
    if found.empty:
        return []
    lines = ["## Update rules", "", "| map | rank | update rule | d_dot | failure point (accuracy) | outcome | "
             "ratio to d_dot | distinct keys there (/ d_dot) | failure point (loss) | keys "
             "retrieved |", "|---|---|---|---|---|---|---|---|---|---|"]
    normed = set(found.loc[update_rules.layer_norm(found["update_rule"]), "update_rule"])
    for r in found.itertuples():
        loss = f"{cell(r.observed_capacity)} ({r.outcome})" + (
            " (LayerNorm output: at least 0.5 / S)" if r.update_rule in normed else "")
        ratio = r.observed_capacity_acc / r.d_dot if pd.notna(r.d_dot) else math.nan
        lines.append(f"| {r.map} | {r.rank} | {r.update_rule} | {cell(r.d_dot)} | {_accuracy_point(r)} "
                     f"| {r.outcome_acc} | {cell(ratio, 2)} | {_distinct_at_failure(r, runs)} "
                     f"| {loss} | {bound(r.observed_capacity_keys, r.outcome_keys)} |")
    ranked = [f"{name}: " + " > ".join(f"{r.update_rule} {_accuracy_point(r)}" for r in g.itertuples())
              for name, g in found.groupby("map", sort=False) if len(g) > 1]
    if ranked:
        lines += ["", "Ranking (most keys first): " + "; ".join(ranked) + "."]
    sums = sum_rule_lines(capacity, runs)
    if sums:
        lines += ["", "The sum rule with replacement:", "", *sums]
    diverged, n = diverged_lines(runs), int((runs["status"] == "diverged").sum())
    lines += ["", f"Runs that diverged: {n}" + (" (a non-finite loss; the failure-point rule "
                                               "counts them as failures):" if n else "."),
              *diverged, ""]
    return lines


TEST_WORDS = {"welch": "Welch's test", "paired": "the paired test"}
WHAT_D = {"welch": f"Differences of mean failure points over seeds ({TEST_WORDS['welch']})",
          "paired": f"Mean over seeds of each seed's difference ({TEST_WORDS['paired']})"}
BOUND_WORDS = {"never_fails": "lower bounds", "fails_everywhere": "upper bounds"}


def _seeds_cell(n: list[int]) -> str:
    return f"{n[0]} each" if len(set(n)) == 1 else ", ".join(map(str, n))


def verdict_words(r) -> str:
    """A row's verdict with what it rests on: "does not move (power 62% at the pooled spread;
    detects +4.1 keys at 80%)", "cannot tell: bounded at 264", "rises, size not pinned down (+33.1 [1.1, 51.9])":
    the rise d with its lower end and its upper bound."""
    if r.verdict in optimisation.RISES:
        _, d, low, high = max(r.differences, key=lambda x: x[2])
        return (f"{r.verdict} ({'bounds' if pd.isna(d) else f'{d:+.3g}'} [{cell(low)}, "
                f"{cell(high)}])")
    if getattr(r, "grid", False):
        return (f"{r.verdict}: uncalibrated on a grid's readings (docs/analysis.md, "
                "Calibration)")
    if r.verdict == optimisation.VERDICTS[3] and r.bounded_at:
        return f"{r.verdict}: bounded at {r.bounded_at}"
    if r.verdict == optimisation.VERDICTS[3] and any(pd.isna(low) for _, _, low, _ in
                                                     r.differences):
        return f"{r.verdict}: no interval (fewer than 2 seeds, or seeds that do not spread)"
    power = "" if pd.isna(r.power) else f"power {r.power:.0%} at the pooled spread; "
    detect = (f"detects +{r.detectable:.3g} keys at {optimisation.DETECT:.0%}"
              if np.isfinite(r.detectable) else "no rise detectable")
    return f"{r.verdict} ({power}{detect})"


def optimisation_section(moves: tuple, runs: pd.DataFrame) -> list[str]:
    """The report's sections of the optimisation test (``moves``: ``optimisation.tables``), one
    per setting that varies ("Learning rate", "Stopping rule", which also counts the ``runs``
    that reached the step cap); [] without configurations run at several levels of one."""
    out = []
    for setting, found in moves:
        published = setting.words(setting.base)
        out += [f"### {setting.heading}", "",
                f"{WHAT_D[setting.test]}, each level minus the published one ({published}), in "
                f"keys: d [one-sided (1 - {optimisation.ALPHA:g}/m) lower bound, one-sided "
                f"{1 - optimisation.ALPHA:.1%} upper bound]; \"bounds\" where a seed is a bound "
                "(the ends then hold for every value it allows).", "",
                f"| configuration | view | levels | seeds per level | median at {published} | "
                f"difference from {published} | margin delta (keys) | verdict | largest upper "
                "bound: the margin it decides above (keys) | seed values that are bounds |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        for r in found.itertuples():
            diffs = "; ".join(f"{lv}: {'bounds' if pd.isna(d) else f'{d:+.3g}'} "
                              f"[{cell(low)}, {cell(high)}]"
                              for lv, d, low, high in r.differences)
            bound_cell = (", ".join(f"{n} of {r.values} {o} ({BOUND_WORDS[o]})"
                                    for o, n in r.bounds.items())
                          + ", as intervals") if r.bounds else "none"
            out.append(f"| {r.label} | {VIEW_WORDS[r.view]} | {r.levels} | {_seeds_cell(r.n)} | "
                       f"{r.base} | {diffs} | {cell(r.margin)} | {verdict_words(r)} | "
                       f"{cell(r.decided_at)} | {bound_cell} |")
        out.append("")
        for view in VIEWS:
            counts, moved = optimisation.counts(found, view)
            out.append(f"- {VIEW_WORDS[view]} view, {plural(sum(counts.values()), 'configuration')}"
                       ": " + "; ".join(f"{v}: {n}" for v, n in counts.items())
                       + (f" (rises: {', '.join(moved)})" if moved else "") + ".")
        if setting is optimisation.STOPPING_RULE:
            out.append(cap_line(runs))
        out.append("")
    return ["## Capacity or optimisation?", "", *out] if out else []


def cap_line(runs: pd.DataFrame) -> str:
    """The step cap's check: a run that stopped before the cap trains the same steps under any
    larger cap, so doubling it can change only the runs that reached it."""
    capped = int((runs["status"] == "max_steps").sum())
    cap = PUBLISHED_STOPPING["trainer.max_steps"]
    return (f"- Step cap: {capped} of {plural(len(runs), 'run')} reached it (status max_steps; "
            f"published cap {int(cap):,} steps). A run that stops before the cap trains the same "
            "steps under any larger cap, so doubling it changes "
            + ("no run here." if capped == 0 else
               f"only the {plural(capped, 'run')} that reached it."))


def simple_words(found: list[factorial.SimpleEffect], view: str) -> list[str]:
    """Per interaction in ``view``: "interaction input_scale x redraw x1.91 [1.62, 2.25] (its
    interval excludes 1), each at each level of the other: input_scale x1.13 [0.896, 1.42] at
    redraw=every_call, x4.13 [3.28, 5.21] at redraw=never; ..."."""
    by: dict[str, dict[str, list[factorial.SimpleEffect]]] = {}
    for e in found:
        if e.view == view:
            by.setdefault(e.interaction, {}).setdefault(e.factor, []).append(e)
    return [f"interaction {interaction} (its interval excludes 1), each at each level of the "
            "other: " + "; ".join(
        f"{factor} " + ", ".join(f"x{e.ratio:.3g} [{e.low:.3g}, {e.high:.3g}] at {e.at}"
                                 for e in mine) for factor, mine in factors.items())
            for interaction, factors in by.items()]


def factorial_section(found: pd.DataFrame) -> list[str]:
    """The report's "Factorial" section from ``factorial.table``'s rows; [] without a design."""
    if found.empty:
        return []
    lines = ["## Factorial", ""]
    for title, rows in found.groupby("design", sort=False):
        lines += [f"### {title}", "", f"Factors (low -> high): {rows['factors'].iloc[0]}; "
                  f"{rows['seeds'].iloc[0]} seeds in all.", "",
                  "| effect | " + " | ".join(VIEW_WORDS[v] for v in VIEWS) + " |",
                  "|---|" + "---|" * len(VIEWS)]
        for effect, of_effect in rows.groupby("effect", sort=False):
            cells = []
            for view in VIEWS:
                r = of_effect[of_effect["view"] == view]
                if r.empty:
                    cells.append("-")
                    continue
                cells.append(effect_cell(r.iloc[0]))
            lines.append(f"| {effect} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def effect_cell(r) -> str:
    """One effect in one view: its ratio on the failure point, 95% interval, bound seeds (a
    censored fit), or that its cells are mostly bounds."""
    if getattr(r, "fit", "") == factorial.BOUNDED:
        return f"{factorial.BOUNDED} ({r.bounds} of {r.seeds} seeds bounds)"
    return (f"x{r.ratio:.3g} [{r.ci_low:.3g}, {r.ci_high:.3g}]"
            + (f" ({r.bounds} bounds, censored fit)" if r.bounds else ""))
