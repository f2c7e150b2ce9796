"""The long capacity table (capacity_long.csv: one row per configuration and view) holds the same
numbers as capacity.csv (one row per configuration), one to one, in every committed store."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from kernelzoo.analysis.capacity import CAPACITY_COLUMNS, EXTRA_COLUMNS, SUFFIX, VIEWS

STORES = sorted(p for p in (Path(__file__).resolve().parents[1] / "results" / "reference").glob(
    "*/capacity_long.csv"))


@pytest.mark.parametrize("path", STORES, ids=[p.parent.name for p in STORES])
def test_the_long_table_maps_one_to_one_onto_the_wide_one(path):
    wide = pd.read_csv(path.parent / "capacity.csv").set_index("label")
    long = pd.read_csv(path).set_index(["label", "view"])
    assert len(long) == len(VIEWS) * len(wide) and set(long.index.get_level_values("view")) == \
        set(VIEWS)
    for view in VIEWS:
        s = SUFFIX[view]
        mine = long.xs(view, level="view").loc[wide.index]
        for long_column, wide_column in (("failure_point", "observed_capacity"),
                                         ("ci_low", "ci_low"), ("ci_high", "ci_high"),
                                         ("ratio", "ratio")):
            pd.testing.assert_series_equal(mine[long_column], wide[wide_column + s],
                                           check_names=False)
        assert (mine["outcome"] == wide["outcome" + s]).all()


def test_every_committed_store_has_its_long_table():
    assert len(STORES) == 10


def test_a_view_is_one_constant_its_wide_columns_follow_from_it():
    """capacity.csv's columns per view come from VIEWS and SUFFIX, so a view added there (and its
    rule in ``capacity.series_results``) reaches both tables, in the committed column order."""
    columns = CAPACITY_COLUMNS + EXTRA_COLUMNS
    for view in VIEWS:
        for name in ("observed_capacity", "ci_low", "ci_high", "ratio", "outcome"):
            assert f"{name}{SUFFIX[view]}" in columns, (view, name)
    committed = pd.read_csv(STORES[0].parent / "capacity.csv", nrows=0).columns
    assert list(committed[:len(columns) - 1]) == list(columns[:-1])
