"""Two configurations compared, view by view: which holds more keys, by how much, how sure, and
how many seeds would decide it.

In each view, each configuration's seeds give their failure points (``capacity.seed_table``).
The difference of their means, A - B in keys, has Welch's t interval at LEVEL, 97.5%
(``scipy.stats.ttest_ind`` with unequal variances, its ``confidence_interval``). The verdict
is "A holds more" when the interval lies above 0, "B holds more" when it lies below, else
"cannot tell". A view where either configuration has a seed that is a bound (never failed, or
failed everywhere) or no result, or has fewer than 2 seeds, or where no seed spreads, is
"cannot tell" with the reason. The seeds that would decide it (``seeds_needed``) are a
sample-size estimate, stated as one: the fewest seeds per configuration at which Welch's test
at 1 - LEVEL has DECIDE power, were the difference and the seeds' spread what these seeds show.
Rules and calibration: docs/analysis.md ("Comparing two configurations").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from scipy import stats

from kernelzoo.analysis.capacity import SUFFIX, VIEWS

BOUND_WORDS = {"never_fails": "never failed (a lower bound)",
               "fails_everywhere": "failed everywhere (an upper bound)"}
LEVEL = 0.975    # the difference's interval (docs/analysis.md: why not 0.95)
DECIDE = 0.8     # the power at which a seed count counts as deciding
MOST_SEEDS = 1000  # the largest seed count the estimate tries


@dataclass(frozen=True)
class Difference:
    """A - B in one view: the verdict ("A holds more", "B holds more", "cannot tell"), why where
    it cannot tell, the difference of means with its interval, each side's seeds, and the
    seeds per configuration that would decide it (None: none up to MOST_SEEDS, or no spread)."""

    view: str
    verdict: str
    why: str
    difference: float
    low: float
    high: float
    n_a: int
    n_b: int
    seeds_needed: int | None


def values(seeds: pd.DataFrame, label: str, view: str) -> tuple[np.ndarray, list[str]]:
    """The failure points of ``label``'s seeds in ``view`` and their outcomes."""
    mine = seeds[seeds["label"] == label]
    s = SUFFIX[view]
    return mine[f"value{s}"].to_numpy(float), mine[f"outcome{s}"].tolist()


def seeds_needed(difference: float, sd_a: float, sd_b: float) -> int | None:
    """The fewest seeds n per configuration at which Welch's two-sided test at 5% rejects a
    zero difference with probability DECIDE, were the true difference ``difference`` and the
    seeds' sds ``sd_a`` and ``sd_b`` (noncentral t, Welch-Satterthwaite degrees of freedom);
    None when no n up to MOST_SEEDS does, or nothing spreads."""
    if difference == 0 or not (sd_a > 0 or sd_b > 0):
        return None

    def power(n: int) -> float:
        va, vb = sd_a ** 2 / n, sd_b ** 2 / n
        dof = (va + vb) ** 2 / ((va ** 2 + vb ** 2) / (n - 1))
        nc = abs(difference) / math.sqrt(va + vb)
        t = stats.t.ppf(0.5 + LEVEL / 2, dof)
        found = stats.nct.sf(t, dof, nc) + stats.nct.cdf(-t, dof, nc)
        return found if np.isfinite(found) else 1.0  # scipy's nct: nan where nc is huge
    return fewest_seeds(power)


def fewest_seeds(power) -> int | None:
    """The first n from 2 to MOST_SEEDS at which ``power(n)`` reaches DECIDE (power grows with
    n: by bisection); None when MOST_SEEDS does not."""
    if power(MOST_SEEDS) < DECIDE:
        return None
    low, high = 2, MOST_SEEDS
    while low < high:
        mid = (low + high) // 2
        low, high = (low, mid) if power(mid) >= DECIDE else (mid + 1, high)
    return low


def difference(a: np.ndarray, b: np.ndarray, outcomes_a, outcomes_b, view: str) -> Difference:
    """The comparison of seeds ``a`` and ``b`` (failure points, their outcomes) in ``view``."""
    def told(why: str, d=math.nan, low=math.nan, high=math.nan) -> Difference:
        return Difference(view, "cannot tell", why, d, low, high, len(a), len(b), None)

    outcomes = {*outcomes_a, *outcomes_b}
    if outcomes & {"not_searched", "no_data"}:
        return told("not searched" if "not_searched" in outcomes else "a seed has no result")
    bounds = sorted(outcomes & set(BOUND_WORDS))
    if bounds:
        return told(f"bounded: a seed {' and a seed '.join(BOUND_WORDS[o] for o in bounds)}")
    if len(a) < 2 or len(b) < 2:
        return told(f"{min(len(a), len(b))} seed on one side: no spread to test against")
    d = float(a.mean() - b.mean())
    sd_a, sd_b = float(a.std(ddof=1)), float(b.std(ddof=1))
    if sd_a == 0 and sd_b == 0:
        return told("no seed spreads: no interval", d, d, d)
    test = stats.ttest_ind(a, b, equal_var=False)
    ci = test.confidence_interval(LEVEL)
    low, high = float(ci.low), float(ci.high)
    verdict = "A holds more" if low > 0 else "B holds more" if high < 0 else "cannot tell"
    return Difference(view, verdict, "", d, low, high, len(a), len(b), None)


def compare(seeds: pd.DataFrame, a: str, b: str) -> list[Difference]:
    """Configuration ``a`` against ``b`` (labels of ``seeds``, ``capacity.seed_table``) in
    every view."""
    found = []
    for view in VIEWS:
        (va, oa), (vb, ob) = values(seeds, a, view), values(seeds, b, view)
        d = difference(va, vb, oa, ob, view)
        if d.verdict == "cannot tell" and not d.why:
            d = replace(d, seeds_needed=seeds_needed(d.difference, float(va.std(ddof=1)),
                                                     float(vb.std(ddof=1))))
        found.append(d)
    return found
