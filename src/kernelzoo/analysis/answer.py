"""The answer a researcher came for, per size of state: which configurations hold the most keys,
how many (n* / d_dot in the loss view, the rank theory's ratio), and how sure the store is that
they differ. Facts, one row each (answer.csv, with a stable id); report.md's first section and
README's first screen only format them. Pure: it reads no file.

Per size (``rankings.sizes``), in the loss view:

- ``holds``: each configuration of the first tier (``tiers.tiers``: Tukey's HSD separates it
  from no other member) with n* / d_dot and its interval, and its seeds;
- ``pairs``: the first tier's pairs, every one tested by the tier's own test (Tukey's HSD at
  ``tiers.ALPHA`` familywise) and none separated: "cannot be told apart" (n: the pairs), or "one
  configuration";
- ``seeds``: over those pairs, the seeds per configuration at which the tier's own test would
  separate each (``tiers.seeds_to_separate``: Tukey's HSD over the size's tested
  configurations at ``tiers.ALPHA``, 80% power, the observed difference and pooled spread
  taken as true: a sample-size estimate, stated as such): the median, and the fewest and most,
  over how many pairs have one;
- ``bounds``: the configurations whose loss-view result is a bound (never failed: holds more
  than the grid asked; failed everywhere), listed apart, not ranked;
- ``untested``: the configurations with a point result that no test placed (``Placed.apart``:
  a seed is a bound, one seed, no spread), listed apart with the reason;
- ``rest``: the most efficient configuration below the first tier, and how many there are;
- ``unsized``: each configuration without a d_dot (softmax: its state grows with the keys), its
  failure point in keys with its interval and outcome (a bound said as such), no size.

Its rule is stated once, in docs/analysis.md ("The answer").
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd

from kernelzoo.analysis import tiers
from kernelzoo.analysis.rankings import sizes
from kernelzoo.analysis.tiers import Placed

COLUMNS = ("id", "size", "kind", "subject", "estimate", "low", "high", "n", "outcome")
VIEW = "loss"


def facts(capacity: pd.DataFrame, seeds: pd.DataFrame, placed: tuple[Placed, ...]
          ) -> pd.DataFrame:
    """The answer's facts (module docstring), sizes in order, members most efficient first;
    ``placed`` is ``tiers.tiers``."""
    placed = [p for p in placed if p.view == VIEW]
    n_seeds = capacity.set_index("label")["n_seeds"] if len(capacity) else pd.Series(dtype=int)
    rows = []

    def fact(size, kind, subject, estimate=math.nan, low=math.nan, high=math.nan, n=0,
             outcome=""):
        tag = subject if kind in ("holds", "bounds", "untested", "unsized") else kind
        where = "" if size is None else f"{size}."
        rows.append({"id": f"answer.{where}{kind}" + (f".{tag}" if tag != kind else ""),
                     "size": size, "kind": kind, "subject": subject, "estimate": estimate,
                     "low": low, "high": high, "n": n, "outcome": outcome})

    for size, levels in sizes(capacity).items():
        mine = [p for p in placed if p.size == size]
        top = [p for p in mine if p.tier == 1]
        if not top:
            continue
        for p in top:
            fact(size, "holds", p.label, p.efficiency, p.low, p.high, int(n_seeds[p.label]),
                 "first tier")
        pairs = len(top) * (len(top) - 1) // 2
        fact(size, "pairs", "first tier", 0.0, n=pairs,
             outcome="one configuration" if pairs == 0 else "cannot be told apart")
        _, tested, _ = tiers.samples(capacity, seeds, levels, VIEW)
        spread = tiers.pooled(tested)
        needed = []
        for a, b in itertools.combinations([p.label for p in top], 2):
            n = tiers.seeds_to_separate(tested[a].mean() - tested[b].mean(), spread,
                                        len(tested))
            needed.append(math.inf if n is None else n)
        if needed:
            known = [n for n in needed if math.isfinite(n)]
            fact(size, "seeds", "first tier", float(np.median(needed)),
                 min(needed), max(needed), len(known),
                 "seeds per configuration that would decide (a sample-size estimate)")
        for p in mine:
            if p.tier is None:
                fact(size, "bounds" if p.apart == "bound" else "untested", p.label,
                     p.efficiency, n=int(n_seeds[p.label]),
                     outcome=p.outcome if p.apart == "bound" else p.apart)
        below = [p for p in mine if p.tier is not None and p.tier > 1]
        if below:
            best = below[0]
            fact(size, "rest", best.label, best.efficiency, best.low, best.high, len(below),
                 "the most efficient below the first tier")
    if len(capacity):
        unsized = capacity[capacity["predicted_capacity"].isna()
                           & ~capacity["outcome"].isin(("no_data", "not_searched"))]
        for r in unsized.itertuples():
            fact(None, "unsized", r.label, r.observed_capacity, r.ci_low, r.ci_high,
                 int(r.n_seeds), r.outcome)
    out = pd.DataFrame(rows, columns=list(COLUMNS))
    out["size"] = out["size"].astype("Int64")
    return out
