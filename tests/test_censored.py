"""Bounds as censored values (kernelzoo.analysis.censored) and the power of the d_dot law's test
(kernelzoo.analysis.power): the censored median and its interval, the censored law, which is
least squares without censoring, and its size and coverage in simulated studies with known truth
in which seeds are bounds, levels deviate from the law and some seeds are outliers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kernelzoo.analysis import censored, power
import least_squares

LEVELS = np.array([16.0, 32, 64, 128, 256])


def test_a_bound_is_an_interval_and_a_seed_without_data_is_none():
    lo, hi = censored.seed_intervals(["fails_at", "never_fails", "fails_everywhere", "no_data"],
                                     [10.0, 264.0, 8.0, math.nan])
    assert lo.tolist() == [10.0, 264.0, 0.0] and hi.tolist() == [10.0, math.inf, 8.0]


def test_lower_bounds_above_the_points_leave_the_median_a_point_and_open_its_interval():
    # 3 seeds fail at 200, 210, 220; 2 never fail up to 264: the median is 220, not dropped
    m = censored.median(*censored.seed_intervals(["fails_at"] * 3 + ["never_fails"] * 2,
                                                 [200.0, 210, 220, 264, 264]))
    assert m.point and m.value == 220.0 and (m.low, m.high) == (200.0, math.inf)
    assert m.level == pytest.approx(0.9375) and (m.n, m.bounds) == (5, 2)
    assert m.scaled(256).words() == "0.86 [0.78, inf)"
    # 3 of 5 bounds: the median is a half-line
    m = censored.median(*censored.seed_intervals(["fails_at"] * 2 + ["never_fails"] * 3,
                                                 [200.0, 210, 264, 264, 264]))
    assert not m.point and math.isnan(m.value) and m.words(".0f") == ">= 264 [200, inf)"
    # an upper bound below the points: at most its bound
    m = censored.median(*censored.seed_intervals(["fails_everywhere"] * 2 + ["fails_at"],
                                                 [8.0, 8.0, 30.0]))
    assert m.words(".0f") == "<= 8 (0, 30]"
    # a bound among the points: the median lies between
    m = censored.median(*censored.seed_intervals(["fails_at"] * 4 + ["never_fails"],
                                                 [180.0, 190, 250, 260, 200]))
    assert (m.lowest, m.highest) == (200.0, 250.0) and m.words(".0f").startswith("in [200, 250]")


def test_without_censoring_the_law_is_least_squares():
    y = 0.8 * LEVELS ** 0.9 * np.exp([0.01, -0.02, 0.015, 0.0, -0.01])
    got, want = censored.law(LEVELS, y, y), least_squares.level_law(LEVELS, y)
    for key in ("a", "b", "a_low", "a_high", "b_low", "b_high", "p_identity"):
        assert getattr(got, key) == pytest.approx(getattr(want, key), rel=1e-9), key
    assert got.censored == 0 and np.allclose(got.band(LEVELS), want.band(LEVELS))


def test_a_censored_level_enters_the_law_as_its_interval():
    y = LEVELS * np.exp([0.03, -0.02, 0.01, -0.01, 0.02])
    top = y.copy()
    hi = y.copy()
    top[-1], hi[-1] = 264.0, math.inf  # the last level's median is a lower bound at 264
    law = censored.law(LEVELS, top, hi)
    assert law.censored == 1 and law.levels == 5 and law.follows
    assert law.b_low < 1 < law.b_high and law.a_low < 1 < law.a_high
    # at 0.8 d_dot, the last level an upper bound (<= 0.85 d_dot): n* = d_dot is rejected
    low, top = 0.8 * y, 0.8 * y
    low[-1], top[-1] = 0.0, 0.85 * LEVELS[-1]
    assert censored.law(LEVELS, low, top).p_identity < 0.05
    assert censored.law(LEVELS[:3], [0, 0, 0], [10.0, 20, 40]) is None  # bounds alone


def _studies(n: int, a: float, seed: int):
    """``n`` studies of 5 levels x 5 seeds, 5% level deviations, 10% seed noise, 1 in 10 seeds
    at half its value (an outlier), the search's top probe at 1.03 d_dot (seeds above it are
    lower bounds: about a third of them under n* = d_dot)."""
    design = power.LawDesign(tuple(LEVELS), (5,) * 5, tuple(1.03 * LEVELS), (0.0,) * 5, 0.1, 0.05)
    return power.simulate(np.random.default_rng(seed), design, n, a=a, outlier_rate=0.1)


def _a_median(a: float) -> float:
    """The law of the medians under ``_studies``' noise: a times the median seed factor."""
    rng = np.random.default_rng(1)
    f = np.exp(rng.normal(0, 0.1, 200_000)) * np.where(rng.random(200_000) < 0.1, 0.5, 1.0)
    return a * float(np.median(f))


def _size_and_coverage(studies: int, seed: int) -> dict:
    a = 1 / _a_median(1.0)  # the medians follow n* = d_dot exactly: the null
    found = {"tests": 0, "rejected": 0, "b": 0, "a": 0, "dropped": 0, "censored": 0}
    for study in _studies(studies, a, seed):
        law = censored.law(LEVELS, *power.medians(study))
        kept = [(d, np.median(lo[lo == hi])) for d, (lo, hi) in zip(LEVELS, study)
                if (lo == hi).any()]  # the bounded seeds dropped, as the law did before
        if len(kept) >= 3:
            found["dropped"] += least_squares.level_law(*zip(*kept)).p_identity < 0.05
        if law is None:
            continue
        found["tests"] += 1
        found["censored"] += law.censored > 0
        found["rejected"] += law.p_identity < 0.05
        found["b"] += law.b_low <= 1.0 <= law.b_high
        found["a"] += law.a_low <= 1.0 <= law.a_high
    return {"size": found["rejected"] / studies, "b": found["b"] / found["tests"],
            "a": found["a"] / found["tests"], "dropped": found["dropped"] / studies,
            "tests": found["tests"], "censored": found["censored"]}


def test_with_bounded_seeds_the_law_keeps_its_size_and_its_intervals_cover():
    """300 studies under n* = d_dot with bounded seeds, level deviations and outliers: the test
    rejects at most 6% of them and the 95% intervals of a and b cover at least 93% of the studies
    it fits; dropping the bounded seeds instead rejects far more often."""
    got = _size_and_coverage(300, seed=7)
    assert got["censored"] > 100  # most fitted studies hold a level whose median is a bound
    assert got["size"] <= 0.06 and got["b"] >= 0.93 and got["a"] >= 0.93, got
    assert got["dropped"] >= 0.1, got


@pytest.mark.slow
def test_the_size_and_coverage_hold_over_2000_studies():
    got = _size_and_coverage(2000, seed=11)
    assert got["size"] <= 0.06 and got["b"] >= 0.93 and got["a"] >= 0.93, got


def test_the_power_against_a_ratio_of_0_9_is_what_the_simulation_shows():
    """The same design has little power with 3 levels and more with 5; a shortfall of 20% at
    small noise is found almost always."""
    three = power.LawDesign((64.0, 128, 256), (5,) * 3, (math.inf,) * 3, (0.0,) * 3, 0.1, 0.05)
    five = power.LawDesign(tuple(LEVELS), (5,) * 5, (math.inf,) * 5, (0.0,) * 5, 0.1, 0.05)
    low, high = power.law_power(three, studies=300), power.law_power(five, studies=300)
    assert low < 0.5 and low < high, (low, high)
    tight = power.LawDesign(tuple(LEVELS), (5,) * 5, (math.inf,) * 5, (0.0,) * 5, 0.02, 0.0)
    assert power.law_power(tight, ratio=0.8, studies=100) > 0.95


def test_the_uncensored_power_is_the_study_by_study_simulation():
    """Without a censoring probe the power takes every study's medians and F test at once; the
    draws are ``simulate``'s, so it equals the study-by-study count exactly."""
    rng = np.random.default_rng(3)
    for i in range(6):
        k = int(rng.integers(3, 7))
        design = power.LawDesign(tuple(16.0 * 2 ** j for j in range(k)),
                                 tuple(int(v) for v in rng.integers(1, 6, k)), (math.inf,) * k,
                                 (0.0,) * k, float(rng.uniform(0.02, 0.2)),
                                 float(rng.uniform(0, 0.1)))
        loop, rejected = np.random.default_rng(i), 0
        for study in power.simulate(loop, design, 100, a=power.RATIO):
            rejected += bool(power.p_value(design.d_dot, *power.medians(study))
                             < censored.REJECT)
        assert power.law_power(design, studies=100, seed=i) == rejected / 100
