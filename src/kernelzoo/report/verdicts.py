"""The study's headlines on report.md's first screen (headlines.csv): one line each, with a stable
id, the numbers that carry it and what bounds its power (seeds, interval levels, the margin a
test decides above). Each reads the analysis' tables and facts (``Analysis.verdicts``,
verdicts.csv); a headline that does not apply to the study is left out."""

from __future__ import annotations

import numpy as np
import pandas as pd

from kernelzoo.analysis import (factorial, optimisation, published, rankings, scaling, stalls,
                                update_rules)
from kernelzoo.analysis.capacity import VIEW_WORDS, VIEWS
from kernelzoo.analysis.labels import bound, cell, rho_words
from kernelzoo.analysis.pipeline import Analysis
from kernelzoo.config.words import plural
from kernelzoo.report.scaling import law_words, short_verdict
from kernelzoo.report.studies import TEST_WORDS, effect_cell, simple_words

COLUMNS = ("id", "title", "evidence")  # headlines.csv: its stable id, its heading, its line
Line = tuple[str, str]  # (id, the line as report.md lists it)


def _ratio(r) -> str:
    """A loss-view ratio to d_dot with its interval: "0.94 [0.75, 1]", a bound as such."""
    if r.outcome != "fails_at":
        return bound(r.ratio, r.outcome)
    return f"{r.ratio:.2f} [{r.ci_low / r.predicted_capacity:.2f}, " \
           f"{r.ci_high / r.predicted_capacity:.2f}]"


def paper_bound(facts: pd.DataFrame, capacity: pd.DataFrame) -> list[Line]:
    """The paper's prediction n* <= d_dot in the loss view, counted from its facts
    (``verdicts.paper_bound``: below, at, above or cannot tell per configuration), each
    configuration above or undecided named with its ratio [interval] from ``capacity``."""
    rows = facts[facts["kind"] == "n* <= d_dot"]
    if rows.empty:
        return []
    count = rows["outcome"].value_counts()
    parts = [f"{count.get('below', 0)} fail before d_dot, {count.get('at', 0)} at it, "
             f"{count.get('above', 0)} above it"
             + (f", {count['cannot tell']} cannot tell (bounded)" if "cannot tell" in count
                else "")]
    by_label = capacity.set_index("label", drop=False)
    for word in ("above", "cannot tell"):
        if word in count:
            parts.append(f"{word}: " + ", ".join(
                f"{label} {_ratio(by_label.loc[label])}"
                for label in rows.loc[rows["outcome"] == word, "subject"]))
    return [("n_le_d_dot", f"- **n* <= d_dot** (the paper's bound, loss view; failure point / "
             f"d_dot [interval]), {plural(len(rows), 'configuration')}: " + "; ".join(parts)
             + ".")]


def published_verdict(capacity: pd.DataFrame) -> list[Line]:
    """The authors' one published run against one new seed's prediction interval (95% for a
    seed that does not stall), at the resolution of their 20-key grid, with its rank among the
    seeds (``published.verdict``)."""
    theirs = capacity[capacity["published_outcome"].notna()]
    if theirs.empty:
        return []
    return [("published", "- **Against the authors' published losses** (loss view, ours "
             "against theirs; their "
            "one run consistent with one new seed's prediction interval or not, "
            f"{published.LEVEL_WORDS}): "
            + "; ".join(f"{r.label} {bound(r.observed_capacity, r.outcome)} against "
                        f"{bound(r.published_capacity, r.published_outcome)}"
                        + (f", {r.published_verdict}" if r.published_verdict != "one seed"
                           else "") for r in theirs.itertuples()) + ".")]


def law(families) -> list[Line]:
    """Per view, the families whose law n* = a d_dot^b was fitted, or that cannot tell on their
    bounds: rejects n* = d_dot, consistent with it (power 50% or more against n* = 0.9 d_dot)
    or cannot tell, with b [95%] and the F test's p."""
    table = scaling.table(list(families))
    if table.empty:
        return []
    fits = table.drop_duplicates(["family", "view"])
    fits = fits[fits["b"].notna() | fits["verdict"].eq(scaling.VERDICTS[2])]
    lines = []

    def words(r) -> str:
        if pd.isna(r.b):  # a verdict on bounds alone
            mine = table[(table["family"] == r.family) & (table["view"] == r.view)]
            return f"{r.family} {law_words(r, mine)}"
        return (f"{r.family} b = {r.b:.2f} [{r.b_low:.2f}, {r.b_high:.2f}], p = "
                f"{r.p_identity:.2g}, {short_verdict(r)} ({r.n_d_dot} levels)")

    for view, rows in fits.groupby("view", sort=False):
        lines.append((f"law.{view}", f"- **n* = d_dot, {VIEW_WORDS[view]} view** ("
                     + ("" if view == "loss" else "argmax, not bounded by d_dot: the rank "
                        "theory does not predict n* = d_dot here; ")
                     + "law fitted over the d_dot levels; b [95%], F test p): "
                     + "; ".join(map(words, rows.itertuples())) + "."))
    return lines


def per_d_dot(view: str) -> str:
    """What a view's failure point / d_dot is (docs/analysis.md, "What each view measures"):
    the rank theory's ratio, bounded by 1, in the loss view; keys per feature, argmax decoding
    and not bounded by d_dot, in the others."""
    return "n* / d_dot" if view == "loss" else "keys / d_dot, argmax: not bounded by 1"


def ranking(capacity: pd.DataFrame, placed: tuple) -> list[Line]:
    """Per view and size, the first tier (``placed``: ``tiers.tiers``, the configurations that
    Tukey's HSD separates from no other member) with the rest apart, and how far the views'
    orders agree (Spearman's rho); no view headlines the others."""
    lines = []
    for view in VIEWS:
        parts = []
        for size, levels in rankings.sizes(capacity).items():
            mine = [p for p in placed if p.view == view and p.size == size]
            if len(mine) < 3:
                continue
            top = [p for p in mine if p.tier == 1]
            bounded = [p for p in mine if p.apart == "bound"]
            untested = [p for p in mine if p.tier is None and p.apart != "bound"]
            parts.append(f"at d_dot {size} ({len(mine)}): " + ("; ".join(
                f"{p.label} {'plateau ' if p.outcome == 'plateau' else ''}{p.efficiency:.3g}"
                for p in top) or "none tested")
                + ("; bounds apart: " + "; ".join(
                    f"{p.label} {'>=' if p.outcome == 'never_fails' else '<='} "
                    f"{p.efficiency:.3g}" for p in bounded) if bounded else "")
                + ("; untested: " + "; ".join(
                    f"{p.label} {p.efficiency:.3g} ({p.apart})" for p in untested)
                   if untested else ""))
        if parts:
            lines.append((f"first_tier.{view}", f"- **First tier, {VIEW_WORDS[view]} view** ("
                          f"{per_d_dot(view)}; the configurations that Tukey's HSD (2.5% "
                          "familywise, over the seeds) separates from none of the others, no "
                          "order within it): " + " | ".join(parts) + "."))
    rhos = rankings.view_rhos(capacity)
    if rhos:
        lines.append(("views_agree", "- **Views agree** (Spearman rho of failure point / "
                      "d_dot): " + "; ".join(
                          f"{VIEW_WORDS[v]} / {VIEW_WORDS[w]} {rho_words(rho)} ({n} "
                          "configurations)" for v, w, rho, n in rhos) + "."))
    return lines


def sizes(size_pairs) -> list[Line]:
    """Per pair of sizes (``between_sizes.pairs``), the families' rank agreement and those
    moved by their own change."""
    return [(f"between_sizes.{p.small}-{p.large}",
             f"- **Between d_dot {p.small} and {p.large}** ({len(p.families)} families, "
            "Spearman rho of their ranks): "
            + ", ".join(f"{VIEW_WORDS[v]} {r:.2f}" for v, (r, _) in p.rho.items())
            + "; moved by their own efficiency change: "
            + ("; ".join(f"{name} ({', '.join(views)})" for name, views in p.moved.items())
               or "none") + ".") for p in size_pairs]


def optimisation_verdicts(a: Analysis) -> list[Line]:
    """Per setting the test varies: in each view, how many configurations rise beyond the
    margin, within it, do not move or cannot tell (with the margin they would decide above)."""
    lines = []
    for setting, found in a.moves:
        parts = []
        for view in VIEWS:
            counts, moved = optimisation.counts(found, view)
            parts.append(f"{VIEW_WORDS[view]}: " + ", ".join(f"{v} {n}" for v, n in counts.items())
                         + (f" ({', '.join(moved)})" if moved else ""))
        undecided = found[found["verdict"] == optimisation.VERDICTS[3]]["decided_at"]
        undecided = undecided[undecided.map(lambda v: pd.notna(v) and v != float("inf"))]
        lines.append((f"optimisation.{setting.keys[0]}",
                      f"- **Does the failure point move with the {setting.heading.lower()}?** "
                     f"({TEST_WORDS[setting.test]}, margin "
                     f"{optimisation.MARGIN:g} d_dot keys, "
                     f"{found['label'].nunique()} configurations) " + "; ".join(parts)
                     + (f"; those that cannot tell would decide above a margin of "
                        f"{cell(undecided.median())} keys (median)" if len(undecided) else "")
                     + "."))
    return lines


def update_rule_verdict(capacity: pd.DataFrame) -> list[Line]:
    """Per map run under several update rules, the rules in order of their accuracy-view
    failure points."""
    found = update_rules.table(capacity)
    if found.empty:
        return []
    ranked = [f"{name}: " + " > ".join(f"{r.update_rule} {bound(r.observed_capacity_acc, r.outcome_acc)}"
                                       for r in g.itertuples())
              for name, g in found.groupby("map", sort=False) if len(g) > 1]
    return [("update_rules", "- **Update rules** (accuracy view, most keys first): "
             + "; ".join(ranked) + ".")] \
        if ranked else []


def factorial_verdict(a: Analysis) -> list[Line]:
    """Each design's main effects in the loss view: the ratio on the failure point [95%]; a
    factor in an interaction whose interval excludes 1 is given at each level of the other
    (``factorial.simple_effects``) in place of its averaged main effect."""
    effects = a.effects
    if effects.empty:
        return []
    main = effects[(effects["view"] == "loss") & (effects["order"] == 1)]
    lines = []
    for design, rows in main.groupby("design", sort=False):
        simple = [e for e in factorial.simple_table(a.capacity, a.seeds)
                  if e.view == "loss" and e.design == design]
        interacting = {e.factor for e in simple}
        lines.append((f"factorial.{design}",
                      f"- **Factorial, {design}** (loss view, each change's ratio on the failure "
                     f"point [95%], {rows['seeds'].iloc[0]} seeds): " + "; ".join(
                         f"{r.effect} {effect_cell(r)}"
                         for r in rows.itertuples() if r.effect not in interacting)
                     + "".join(f"; {words}" for words in simple_words(simple, "loss"))
                     + "."))
    return lines


def stall_verdict(a: Analysis) -> list[Line]:
    """How many runs stalled, were checked and cleared, and how many seeds' loss-view failure
    points a stalled run sets that no check tested (``stalls.resting``): those verdicts rest on
    unchecked stalls. The headline counts each run as it ended."""
    stalled = int(a.runs["stalled"].sum())
    if not stalled:
        return []
    found = a.checked if len(a.checked) else None
    failed = int(found["fails_loss"].sum()) if found is not None else 0
    cleared = int(found["clears_loss"].sum()) if found is not None else 0
    points, set_by, unchecked = stalls.resting(a.runs, a.seeds, a.checked)
    return [("stalls", f"- **Stalls** (a few keys never learned under capacity): {stalled} of "
             f"{len(a.runs)} runs stalled; {len(a.checked)} checked, of which {failed} failed the "
             f"loss view and {cleared} of those were cleared; the table counts each run as it "
             f"ended. {set_by} of {points} seeds' loss-view failure points are set by a stalled "
             "run" + (f", {unchecked} of them unchecked: the verdicts on those configurations "
                      "rest on stalls no check has tested (`stall_check=true`)" if unchecked
                      else ", each checked" if set_by else "") + ".")]


def headlines(a: Analysis) -> pd.DataFrame:
    """Every headline that applies to the study (headlines.csv): its stable id, title and
    evidence, one row each in report order."""
    rows = []
    for key, line in (
            *paper_bound(a.verdicts, a.capacity), *published_verdict(a.capacity),
            *law(a.families), *ranking(a.capacity, a.placed), *sizes(a.size_pairs),
            *optimisation_verdicts(a), *update_rule_verdict(a.capacity), *factorial_verdict(a),
            *stall_verdict(a)):
        title, _, evidence = line.removeprefix("- **").partition("**")
        rows.append((key, title, evidence.removeprefix(":").strip()))
    return pd.DataFrame(rows, columns=list(COLUMNS))


def verdict_lines(found: pd.DataFrame) -> list[str]:
    """The headlines as report.md's first screen lists them (``headlines`` or headlines.csv)."""
    return [f"- **{r.title}** {r.evidence}" for r in found.itertuples()]
