"""Where the authors' one published run lies against this suite's seeds (``published.verdict``)."""

import math

import pandas as pd

from kernelzoo.analysis.published import verdict


def seeds(values, outcome="fails_at"):
    return pd.DataFrame({"value": values, "outcome": [outcome] * len(values)})


def test_inside_the_medians_interval_the_range_or_outside():
    five = seeds([40.0, 44.0, 46.0, 50.0, 57.0])
    # the interval of the median of 5 seeds is [x(1), x(5)] (93.75%); here a narrower one is given
    assert verdict(47.0, "fails_at", five, 44.0, 50.0) == "inside the interval"
    assert verdict(55.0, "fails_at", five, 44.0, 50.0) == "inside the range"
    assert verdict(57.0, "fails_at", five, 44.0, 50.0) == "inside the range"
    assert verdict(58.0, "fails_at", five, 44.0, 50.0) == "outside"
    assert verdict(39.9, "fails_at", five, 44.0, 50.0) == "outside"


def test_bounds_agree_only_when_every_seed_ends_in_the_same_bound():
    assert verdict(20.0, "fails_everywhere", seeds([20.0] * 3, "fails_everywhere"),
                   20.0, 20.0) == "same bound"
    mixed = pd.DataFrame({"value": [20.0, 31.0], "outcome": ["fails_everywhere", "fails_at"]})
    assert verdict(20.0, "fails_everywhere", mixed, 20.0, 31.0) == "other outcome"
    assert verdict(55.0, "fails_at", seeds([600.0] * 2, "never_fails"), 600, 600) == \
        "other outcome"


def test_no_verdict_without_a_published_point_or_with_one_seed():
    assert verdict(math.nan, None, seeds([40.0, 50.0]), 40, 50) is None
    assert verdict(math.nan, math.nan, seeds([40.0, 50.0]), 40, 50) is None
    assert verdict(45.0, "fails_at", seeds([40.0]), 32, 47) == "one seed"
    no_data = pd.DataFrame({"value": [math.nan, 44.0], "outcome": ["no_data", "fails_at"]})
    assert verdict(45.0, "fails_at", no_data, 32, 47) == "one seed"
