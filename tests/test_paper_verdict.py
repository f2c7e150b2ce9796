"""Where the authors' one published run lies against this suite's seeds (``published.verdict``):
a prediction interval for one new seed, the published value's rank among the seeds, and the
authors' bracket on their 20-key grid; the interval's coverage by simulation with known truth."""

import math

import numpy as np
import pandas as pd
import pytest

from kernelzoo.analysis.published import prediction_interval, verdict


def seeds(values, outcome="fails_at"):
    return pd.DataFrame({"value": values, "outcome": [outcome] * len(values)})


FIVE = [40.0, 44.0, 46.0, 50.0, 57.0]


def test_one_run_is_set_against_the_prediction_interval_of_one_new_seed():
    low, high = prediction_interval(FIVE)
    y = np.log(FIVE)
    half = 2.776445 * y.std(ddof=1) * math.sqrt(1.2)  # t(0.975, 4)
    assert (low, high) == pytest.approx((math.exp(y.mean() - half), math.exp(y.mean() + half)))
    assert 31 < low < 32 and 70 < high < 71  # wider than the seeds' range
    assert verdict(47.0, "fails_at", seeds(FIVE)) == \
        f"consistent (ranks 4 of 6; one new seed: {low:.3g} to {high:.3g}, 95%)"
    assert verdict(58.0, "fails_at", seeds(FIVE)).startswith("consistent (ranks 6 of 6;")
    assert verdict(80.0, "fails_at", seeds(FIVE)).startswith("differs (ranks 6 of 6;")
    assert verdict(44.0, "fails_at", seeds(FIVE)).startswith("consistent (ranks 2.5 of 6;")


def test_the_authors_bracket_on_their_grid_is_what_is_compared():
    """Published 80 interpolated between their probes 60 (pass) and 80 (fail): the bracket
    meets the interval, so the run is consistent with the seeds at the grid's resolution."""
    assert verdict(80.0, "fails_at", seeds(FIVE), (60.0, 80.0)).startswith("consistent")
    assert verdict(80.0, "fails_at", seeds(FIVE), (75.0, 80.0)).startswith("differs")


def test_bounds_agree_only_when_every_seed_ends_in_the_same_bound():
    assert verdict(20.0, "fails_everywhere", seeds([20.0] * 3, "fails_everywhere")) == \
        "same bound"
    mixed = pd.DataFrame({"value": [20.0, 31.0], "outcome": ["fails_everywhere", "fails_at"]})
    assert verdict(20.0, "fails_everywhere", mixed) == "other outcome"
    assert verdict(55.0, "fails_at", seeds([600.0] * 2, "never_fails")) == "other outcome"


def test_no_verdict_without_a_published_point_or_with_one_seed():
    assert verdict(math.nan, None, seeds([40.0, 50.0])) is None
    assert verdict(math.nan, math.nan, seeds([40.0, 50.0])) is None
    assert verdict(45.0, "fails_at", seeds([40.0])) == "one seed"
    no_data = pd.DataFrame({"value": [math.nan, 44.0], "outcome": ["no_data", "fails_at"]})
    assert verdict(45.0, "fails_at", no_data) == "one seed"


@pytest.mark.parametrize("n, outlier_rate, least", [(3, 0.0, 0.93), (5, 0.0, 0.93),
                                                    (5, 0.1, 0.89), (5, 0.2, 0.89)])
def test_the_prediction_interval_holds_one_new_seed(n, outlier_rate, least):
    """2000 studies of n seeds and one more, log-normal (sd 0.1) with stall-like outliers (a
    seed at half its value): the 95% interval holds the new seed in 94-95% of studies without
    outliers; with 10-20% outliers in 91-92%, the new seed being itself an outlier in that
    share of studies (such a published run differs, and is said to)."""
    rng = np.random.default_rng(0)
    x = np.exp(rng.normal(0, 0.1, (2000, n + 1))) * np.where(
        rng.random((2000, n + 1)) < outlier_rate, 0.5, 1.0)
    held = np.mean([low <= row[n] <= high
                    for row in x for low, high in [prediction_interval(row[:n])]])
    assert held >= least, held


def test_the_report_verdict_quotes_each_comparison_without_nesting_parentheses():
    """report.md's verdict on the published losses: "<label> <ours> against <theirs>, <verdict>",
    the verdict's own parentheses never inside another pair."""
    from kernelzoo.report.verdicts import published_verdict

    capacity = pd.DataFrame({
        "label": ["ELU+1", "FAVOR+"], "observed_capacity": [49.0, 5.91],
        "outcome": ["fails_at", "fails_at"], "published_capacity": [54.7, 20.0],
        "published_outcome": ["fails_at", "fails_everywhere"],
        "published_verdict": [verdict(54.7, "fails_at", seeds(FIVE)), "other outcome"]})
    line, = published_verdict(capacity)
    assert ("ELU+1 49 against 54.7, consistent (ranks 5 of 6; one new seed: 31.3 to 70.7, "
            "95%);") in line
    assert line.endswith("; FAVOR+ 5.91 against <= 20, other outcome.")
    depth = 0
    for char in line:
        depth += {"(": 1, ")": -1}.get(char, 0)
        assert depth <= 1, line
