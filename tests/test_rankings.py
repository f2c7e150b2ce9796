"""Sizes, ranks per view and what limits a map (analysis/rankings.py), and the tiers section that
shows them (analysis/tiers.py), on constructed capacity tables."""

import math

import pandas as pd

from kernelzoo.analysis import rankings, tiers
from kernelzoo.report.rankings import tier_section
from synthetic import seeds_of_capacity


def row(label, d_dot, loss, acc, keys, outcome_acc="fails_at", outcome_keys="fails_at",
        spread=0.02, **extra):
    d_dot_or_nan = math.nan if d_dot is None else d_dot
    values = {"": loss, "_acc": acc, "_keys": keys}
    out = {"label": label, "predicted_capacity": d_dot_or_nan, "outcome": "fails_at",
           "outcome_acc": outcome_acc, "outcome_keys": outcome_keys, "rank_bound": d_dot_or_nan + 1,
           "effective_rank_at_d_dot": 50.0, "effective_rank_at_d_dot_initial": 50.0,
           "n_seeds": 3, "ci_level": 0.75}
    out["d_key"] = 16
    for s, v in values.items():
        out.update({f"observed_capacity{s}": v, f"ci_low{s}": v * (1 - spread),
                    f"ci_high{s}": v * (1 + spread), f"ratio{s}": v / d_dot_or_nan})
    return {**out, **extra}


def table():
    return pd.DataFrame([
        row("A", 64, 56, 52, 60),                    # the steady ones
        row("B", 64, 54, 50, 58),
        row("C", 66, 12, 120, 200, outcome_keys="never_fails"),  # diluted: loss last
        row("D", 64, 50, 46, 80),                    # partial retrieval: keys first
        row("E", 64, 30, 28, 30, rank_bound=33, effective_rank_at_d_dot_initial=40.0,
            effective_rank_at_d_dot=10.0),
        row("F", 128, 100, 100, 100), row("G", 128, 90, 90, 90),   # another size
        row("H", 135, 80, 80, 80),
        row("S", None, 500, 500, 500, outcome_keys="never_fails", d_key=64),  # softmax
    ])


def test_sizes_group_nearby_d_dot():
    assert rankings.sizes(table()) == {64: [64, 66], 128: [128, 135]}


def test_ranks_within_each_size():
    got = rankings.ranks(table()).set_index(["label", "view"])
    assert got.loc[("C", "loss"), "rank"] == 5 and got.loc[("C", "accuracy"), "rank"] == 1
    assert got.loc[("D", "keys_retrieved"), "rank"] == 2 and got.loc[("F", "loss"), "rank"] == 1
    assert got.loc[("H", "loss"), "size"] == 128 and "S" not in got.index.get_level_values(0)
    assert len(got) == 3 * 8  # every configuration with a d_dot in every view


def test_the_tiers_section_lists_limits_sizes_and_the_reference():
    """The tiers per size (``report.rankings.tier_section``) carry each configuration's limits and the rows
    without d_dot as a reference line."""
    capacity = table()
    runs = pd.DataFrame(columns=["label", "seed", "n_keys", "status", "final_eval_loss",
                                 "final_eval_accuracy"])
    placed = tuple(tiers.tiers(capacity, seeds_of_capacity(capacity)))
    lines = tier_section(capacity, placed, tiers.flags(capacity, runs, 0.01, 0.99))
    assert lines[0] == "## Tiers per view"
    assert "### d_dot 64" in lines and "### d_dot 128" in lines
    e = next(line for line in lines if line.startswith("| E |"))
    assert "rank collapse (effective rank 40 -> 10 in training)" in e
    assert "fewer features read than written (rank bound 33 of d_dot 64)" in e
    c = next(line for line in lines if line.startswith("| C |"))
    assert "bound: >= 3.03" in c and "bound in keys retrieved" in c
    assert ("Reference, no d_dot: S, failure point loss 500; accuracy 500; keys retrieved "
            ">= 500.") in lines
    assert tier_section(capacity, placed, None, level=3)[0] == "### Tiers per view"
    assert not math.isnan(rankings.COLLAPSE)
