"""Calibration with known truth (docs/analysis.md, "Calibration: the error bound of every verdict
kind"): every verdict kind of ``calibrate.KINDS`` run on simulated stores shaped like the
committed ones, its error rates and coverage against the bounds stated there before any of this
ran. The quick version (R = 100 in ``calibrate.QUICK``'s scenarios) runs in ``make test`` with
the stated allowance of 2 binomial standard errors; ``make test-slow`` runs every scenario at
that R; the full one (R = 500, every scenario) is ``make calibrate``, and a test checks the table
it committed."""

from __future__ import annotations

import math
from pathlib import Path

import calibrate
import numpy as np
import pandas as pd
import pytest
from scipy import stats

from kernelzoo.analysis.compare import LEVEL, difference

@pytest.mark.parametrize("kind", [pytest.param(k, marks=pytest.mark.slow) if k in calibrate.SLOW
                                  else k for k in calibrate.KINDS])
def test_each_verdict_kind_meets_its_bounds_quick(kind):
    """R = 100 simulated stores in each of the quick scenarios the kind's full run covers, within
    2 binomial standard errors of the bounds (docs/analysis.md)."""
    quick = [sc for sc in calibrate.QUICK if sc in calibrate.covered(kind)]
    table = calibrate.calibrate(100, quick, kinds=[kind])
    print("\n" + calibrate.markdown(table))
    assert table["met"].all(), table


@pytest.mark.slow  # R = 100 in every scenario of each kind's full run: ~6 CPU-minutes in all
@pytest.mark.parametrize("kind", list(calibrate.KINDS))
def test_each_verdict_kind_meets_its_bounds_in_every_scenario(kind):
    """The full run's scenarios (``calibrate.covered``) at the quick run's R = 100, within its
    allowance of 2 binomial standard errors: the code as it is now, where the committed table
    (below) is the code as it was when ``make calibrate`` last ran."""
    table = calibrate.calibrate(100, calibrate.covered(kind), kinds=[kind])
    print("\n" + calibrate.markdown(table))
    assert table["met"].all() or kind in {k for k, _ in calibrate.MISSED}, table


def test_the_committed_table_is_the_full_run_of_every_kind():
    """results/calibration.csv, written by ``make calibrate`` (R = 500, too slow for any test
    run: about 30 CPU-minutes), holds every kind over every scenario its run covers, against the
    bounds stated in docs/analysis.md, and misses exactly ``calibrate.MISSED``."""
    table = pd.read_csv(Path(__file__).parents[1] / "results" / "calibration.csv")
    assert set(table["kind"]) == set(calibrate.KINDS)
    assert (table["runs"] == calibrate.FULL_RUNS).all()
    for r in table.itertuples():
        assert r.scenarios == len(calibrate.covered(r.kind)), r
        op, b = calibrate.bound(r.rate)
        assert r.bound == f"{op} {b:g}" and r.allowance == 0.0, r
        assert r.met == (r.worst <= b if op == "<=" else r.worst >= b), r
    missed = {(r.kind, r.rate) for r in table.itertuples() if not r.met}
    assert missed == calibrate.MISSED


def seeds(rng, n: int, mean: float, noise: str, reading: str, stall: float):
    """n seeds' failure points read as a store reads them (``calibrate.read``)."""
    sc = calibrate.Scenario(n, noise, reading, stall, False)
    return calibrate.read(rng, mean + calibrate.SD * calibrate.noise(rng, n, noise), sc,
                          math.inf)[0]


def test_a_bounded_seed_never_separates():
    """A configuration whose seed is a bound in the view cannot be separated by a mean."""
    rng = np.random.default_rng(1)
    mean = calibrate.MEAN
    a, b = seeds(rng, 3, mean, "normal", "bisect", 0.0), seeds(rng, 3, mean - 30, "normal",
                                                                "bisect", 0.0)
    d = difference(a, b, ["fails_at", "fails_at", "never_fails"], ["fails_at"] * 3, "loss")
    assert d.verdict == "cannot tell" and d.why.startswith("bounded")


@pytest.mark.slow  # a power simulation: ~4 s
def test_the_seeds_needed_are_welchs_power_solved_for_n():
    """The estimate is the n at which the noncentral-t power of Welch's test first reaches
    80%: checked against a direct simulation at that n and one seed fewer."""
    from kernelzoo.analysis.compare import seeds_needed

    n = seeds_needed(6.0, 5.0, 5.0)
    rng = np.random.default_rng(2)

    def power(k: int) -> float:
        hits = 0
        for _ in range(2000):
            a, b = rng.normal(6.0, 5.0, k), rng.normal(0.0, 5.0, k)
            hits += stats.ttest_ind(a, b, equal_var=False).pvalue < 1 - LEVEL
        return hits / 2000
    assert power(n) >= 0.78 and power(n - 1) < 0.80
