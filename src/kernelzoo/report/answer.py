"""The answer's words: report.md's first section and README's first screen, formatted from the
answer's facts (``analysis.answer``, answer.csv) and nothing else."""

from __future__ import annotations

import math

import pandas as pd

from kernelzoo.analysis.compare import MOST_SEEDS
from kernelzoo.analysis.tiers import ALPHA
from kernelzoo.config.words import plural


def _held(r) -> str:
    return f"{r.subject} {r.estimate:.2f} [{r.low:.2f}, {r.high:.2f}]"


def _seeds(r) -> str:
    """The seeds that would decide: the median, and the range, infinite as "more than MOST"."""
    def n(value):
        return f"more than {MOST_SEEDS}" if not math.isfinite(value) else f"{value:.0f}"
    spread = f"{n(r.low)} to {n(r.high)}"
    if r.low == r.high:
        return (f"the seeds that would decide it: {n(r.estimate)} per configuration (by the "
                "tier's own test at 80% power: a sample-size estimate at these seeds' spread)")
    return (f"the seeds that would decide them: {n(r.estimate)} per configuration (median; "
            f"{spread}, by the tier's own test at 80% power: a sample-size estimate at these "
            "seeds' spread)")


def _unsized(r) -> str:
    """A configuration without a d_dot: its failure point in keys, a bound said as one."""
    seeds = plural(int(r.n), "seed")
    if r.outcome == "never_fails":
        return f"{r.subject} >= {r.estimate:.0f} (never failed up to the top probe; {seeds})"
    if r.outcome == "fails_everywhere":
        return f"{r.subject} <= {r.estimate:.0f} (failed at every probe; {seeds})"
    return f"{r.subject} {r.estimate:.0f} [{r.low:.0f}, {r.high:.0f}] ({seeds})"


def size_lines(facts: pd.DataFrame) -> list[str]:
    """One bullet per size: its first tier, how sure, what is apart and below."""
    lines = []
    for size, mine in facts.groupby("size", sort=False):
        kinds = {k: rows for k, rows in mine.groupby("kind", sort=False)}
        held = kinds["holds"]
        n = sorted(set(held["n"]))
        text = (f"- **d_dot {size:.0f}**: " + ", ".join(_held(r) for r in held.itertuples())
                + (f" ({plural(n[0], 'seed')} each)" if len(n) == 1
                   else f" ({n[0]} to {n[-1]} seeds)"))
        pairs = kinds["pairs"].iloc[0]
        if pairs.outcome == "one configuration":
            text += ": alone in the first tier"
        else:
            text += (": cannot be told apart, " + (
                "the pair not separated" if pairs.n == 1 else
                f"none of the {int(pairs.n)} pairs separated")
                + f" (Tukey's HSD, {ALPHA:.1%} familywise)")
        if "seeds" in kinds:
            text += "; " + _seeds(kinds["seeds"].iloc[0])
        if "bounds" in kinds:
            text += "; bounds apart: " + ", ".join(
                f"{r.subject} {'>=' if r.outcome == 'never_fails' else '<='} {r.estimate:.2f}"
                for r in kinds["bounds"].itertuples())
        if "untested" in kinds:
            text += "; untested: " + ", ".join(
                f"{r.subject} {r.estimate:.2f} ({r.outcome})"
                for r in kinds["untested"].itertuples())
        if "rest" in kinds:
            r = kinds["rest"].iloc[0]
            text += (f". Below the first tier ({plural(int(r.n), 'configuration')}) the best "
                     f"is {_held(r)}")
        lines.append(text + ".")
    unsized = facts[facts["kind"] == "unsized"]
    if len(unsized):
        lines.append("- **No d_dot** (its state grows with every key; failure point in keys): "
                     + ", ".join(map(_unsized, unsized.itertuples())) + ".")
    return lines


def protocol_line(facts: pd.DataFrame, capacity: pd.DataFrame, store: str) -> list[str]:
    """What the published stopping rule sets, from a store that trained configurations under
    it and under a longer patience (``store``: its verdicts.csv ``facts`` and capacity.csv): per
    configuration, its loss-view n* / d_dot at each patience and the paired test's verdict
    (optimisation facts); [] without such facts."""
    moves = facts[(facts["kind"] == "optimisation") & (facts["view"] == "loss")
                  & facts["id"].str.endswith(".trainer.patience")]
    if moves.empty:
        return []
    ratio = capacity.set_index("label")["ratio"]

    def at(label: str, patience: int) -> str:
        return f"{ratio.get(f'{label} trainer.patience={patience}', float('nan')):.2f}"
    rises = [f"{r.subject} {at(r.subject, 10)} -> {at(r.subject, 30)} (+{r.estimate:.3g} keys "
             f"[{r.low:.3g}, {r.high:.3g}], {r.outcome})"
             for r in moves[moves["outcome"].str.startswith("rises")].itertuples()]
    rest = {word: [r.subject for r in rows.itertuples()]
            for word, rows in moves[~moves["outcome"].str.startswith("rises")].groupby(
                "outcome", sort=False)}
    return [f"- **Under the published stopping rule** (patience 10; `{store}` trains these "
            "configurations under patience 10 and 30, each seed paired, loss view n* / d_dot): "
            "patience 30 "
            + ("raises " + "; ".join(rises) if rises else "raises none")
            + "".join(f"; {word}: {', '.join(labels)}" for word, labels in rest.items()) + "."]


def answer_lines(facts: pd.DataFrame) -> list[str]:
    """report.md's "Answer" section ([] without a first tier at any size)."""
    if facts.empty:
        return []
    return ["## Answer", "",
            "Which configurations hold the most keys, per size of state, in the loss view (the "
            "rank theory's n* / d_dot, median over seeds [interval]): each size's first tier "
            "(the configurations Tukey's HSD separates from none of the others), then how sure "
            "(docs/analysis.md, \"The answer\"):", "", *size_lines(facts), ""]
