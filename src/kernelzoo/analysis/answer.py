"""The answer a researcher came for, per size of state: which configurations hold the most keys,
how many (n* / d_dot in the loss view, the rank theory's ratio), and how sure the store is that
they differ. Facts, one row each (answer.csv, with a stable id); report.md's first section and
README's first screen only format them. Pure: it reads no file.

Per size (``rankings.sizes``), in the loss view:

- ``holds``: each configuration of the first tier (``tiers.tiers``: its interval overlaps the
  best's and every other member's) with n* / d_dot and its interval, and its seeds;
- ``pairs``: every pair of first-tier configurations compared by the two-configuration
  difference (``compare.difference``: Welch's interval at ``compare.LEVEL``): how many pairs
  it separates, of how many tested (outcome "cannot be told apart" only where every pair was
  tested and none separated; a pair without an interval — a bound, one seed, no spread — is
  not tested, and is named apart);
- ``seeds``: over the pairs it cannot tell, the seeds per configuration that would decide them
  at the spread these seeds show (``compare.seeds_needed``, a sample-size estimate, stated as
  such): the median, and the fewest and most, over how many pairs have one;
- ``bounds``: the configurations whose loss-view result is a bound (never failed: holds more
  than the grid asked; failed everywhere), listed apart, not ranked;
- ``rest``: the most efficient configuration below the first tier, and how many there are.

Its rule is stated once, in docs/analysis.md ("The answer").
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd

from kernelzoo.analysis import compare
from kernelzoo.analysis.rankings import sizes
from kernelzoo.analysis.tiers import tiers

COLUMNS = ("id", "size", "kind", "subject", "estimate", "low", "high", "n", "outcome")
VIEW = "loss"
# why a pair has no interval (``compare.difference``'s reason, its first words) -> the words
UNTESTED = {"bounded": "a bound", "a seed has": "a seed without a result",
            "not searched": "not searched", "1 seed": "one seed", "0 seed": "no seed",
            "no seed spreads": "no spread"}


def facts(capacity: pd.DataFrame, seeds: pd.DataFrame) -> pd.DataFrame:
    """The answer's facts (module docstring), sizes in order, members most efficient first."""
    placed = [p for p in tiers(capacity) if p.view == VIEW]
    n_seeds = capacity.set_index("label")["n_seeds"] if len(capacity) else pd.Series(dtype=int)
    rows = []

    def fact(size, kind, subject, estimate=math.nan, low=math.nan, high=math.nan, n=0,
             outcome=""):
        tag = subject if kind in ("holds", "bounds") else kind
        rows.append({"id": f"answer.{size}.{kind}" + (f".{tag}" if tag != kind else ""),
                     "size": size, "kind": kind, "subject": subject, "estimate": estimate,
                     "low": low, "high": high, "n": n, "outcome": outcome})

    for size in sizes(capacity):
        mine = [p for p in placed if p.size == size]
        top = [p for p in mine if p.tier == 1]
        if not top:
            continue
        for p in top:
            fact(size, "holds", p.label, p.efficiency, p.low, p.high, int(n_seeds[p.label]),
                 "first tier")
        separated = tested = 0
        needed, untested = [], set()
        for a, b in itertools.combinations([p.label for p in top], 2):
            d = next(d for d in compare.compare(seeds, a, b) if d.view == VIEW)
            if d.why:  # a bound, a seed without a result, one seed, no spread: no interval
                untested.add(next((w for k, w in UNTESTED.items() if d.why.startswith(k)), d.why))
                continue
            tested += 1
            if d.verdict != "cannot tell":
                separated += 1
            else:
                needed.append(math.inf if d.seeds_needed is None else d.seeds_needed)
        pairs = len(top) * (len(top) - 1) // 2
        why = ", ".join(sorted(untested))
        outcome = ("one configuration" if pairs == 0 else
                   "cannot be told apart" if separated == 0 and tested == pairs else
                   f"no pair tested ({why})" if tested == 0 else
                   f"{separated} of {tested} tested pairs separated" + (
                       f", {pairs - tested} not tested ({why})" if tested < pairs else ""))
        fact(size, "pairs", "first tier", separated, n=tested, outcome=outcome)
        if needed:
            known = [n for n in needed if math.isfinite(n)]
            fact(size, "seeds", "first tier", float(np.median(needed)),
                 min(needed), max(needed), len(known),
                 "seeds per configuration that would decide (a sample-size estimate)")
        for p in mine:
            if p.tier is None:
                fact(size, "bounds", p.label, p.efficiency, n=int(n_seeds[p.label]),
                     outcome=p.outcome)
        below = [p for p in mine if p.tier is not None and p.tier > 1]
        if below:
            best = below[0]
            fact(size, "rest", best.label, best.efficiency, best.low, best.high, len(below),
                 "the most efficient below the first tier")
    return pd.DataFrame(rows, columns=list(COLUMNS))
