"""Factorial effects (analysis/factorial.py): the design found among configurations, the
effects' values on constructed seed tables, and the intervals' coverage by simulation with
known truth (unequal spreads between cells, stall-like outliers)."""

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from kernelzoo.analysis import factorial
from kernelzoo.analysis.capacity import SUFFIX
from kernelzoo.report.studies import factorial_section, simple_words
import simulations


def favor_params(redraw: str, scale: str, stabilize: str, m: int = 64) -> str:
    extra = {"eval_redraw": "per_chunk"} if redraw == "every_call" else {}
    items = {"input_scale": scale, "m": str(m), "redraw": redraw, "stabilize": stabilize,
             "variant": "hyperbolic", **extra}
    return ",".join(f"{k}={v}" for k, v in sorted(items.items()))


def capacity_of(rows):
    return pd.DataFrame([{"feature_map": "favor", "d_key": 64, "d_dot": 2 * m,
                          "update_rule": "sum", "lr": "0.001", "params": p, "label": label}
                         for label, p, m in rows])


CELLS = list(itertools.product(("every_call", "never"), ("1", "performer"), ("false", "true")))


def test_design_found_with_aliased_and_third_levels():
    rows = [(f"cell {i}", favor_params(*c), 64) for i, c in enumerate(CELLS)]
    rows += [("every 1000", favor_params("every_n_steps", "1", "false"), 64),
             ("m16", favor_params("never", "performer", "true", 16), 16)]
    found = factorial.designs(capacity_of(rows))
    assert len(found) == 1
    design = found[0]
    assert design.title == "favor d_key=64 d_dot=128"
    # eval_redraw follows redraw: one factor; every_n_steps is a third level, left out
    assert design.factors == (("input_scale", ("1", "performer")),
                              ("redraw", ("every_call", "never")),
                              ("stabilize", ("false", "true")))
    assert len(design.cells) == 8 and "every 1000" not in design.cells.values()
    assert design.cells[(0, 0, 0)] == "cell 0" and design.cells[(1, 1, 1)] == "cell 7"


def test_incomplete_design_is_none():
    rows = [(f"cell {i}", favor_params(*c), 64) for i, c in enumerate(CELLS[:7])]
    assert factorial.designs(capacity_of(rows)) == []
    assert factorial.table(capacity_of(rows), pd.DataFrame()).empty
    assert factorial_section(pd.DataFrame()) == []


def seeds_for(design, value_of, outcome="fails_at"):
    rows = []
    for cell, label in design.cells.items():
        for seed, noise in zip((1, 2, 3), (0.9, 1.0, 1.1)):
            v = value_of(cell) * noise
            rows.append({"label": label, "seed": seed, "value": v, "outcome": outcome,
                         "value_acc": v, "outcome_acc": outcome, "value_keys": v,
                         "outcome_keys": outcome})
    return pd.DataFrame(rows)


def test_effects_recover_constructed_ratios():
    rows = [(f"cell {i}", favor_params(*c), 64) for i, c in enumerate(CELLS)]
    design = factorial.designs(capacity_of(rows))[0]
    # factors (input_scale, redraw, stabilize): redraw fixed x4, input scaled x1.5, no
    # stabilisation effect, and scaling helps twice as much (log) with a fixed projection
    table = factorial.effects(design, seeds_for(design, lambda c: 20 * 4 ** c[1] * 1.5 ** c[0]
                                               * 1.5 ** (c[0] * c[1])))
    loss = table[table["view"] == "loss"].set_index("effect")
    assert list(loss.index[:3]) == ["input_scale", "redraw", "stabilize"]
    assert loss.loc["redraw", "ratio"] == pytest.approx(4 * 1.5 ** 0.5)
    assert loss.loc["input_scale", "ratio"] == pytest.approx(1.5 * 1.5 ** 0.5)
    assert loss.loc["stabilize", "ratio"] == pytest.approx(1.0)
    assert loss.loc["input_scale x redraw", "ratio"] == pytest.approx(1.5 ** 0.5)
    assert loss.loc["input_scale x redraw x stabilize", "ratio"] == pytest.approx(1.0)
    # the same noise in every cell: every interval has width, centred on the ratio in logs
    r = loss.loc["redraw"]
    assert r.ci_low < r.ratio < r.ci_high
    assert math.log(r.ratio / r.ci_low) == pytest.approx(math.log(r.ci_high / r.ratio))
    assert (table["seeds"] == 24).all() and (table["bounds"] == 0).all()
    assert len(table) == 3 * 7


def test_cells_mostly_bounds_cannot_tell():
    """Half the cells fail at their first probe in the loss view (every seed an upper bound):
    no loss-view effect is told; the accuracy view, all points, is."""
    rows = [(f"cell {i}", favor_params(*c), 64) for i, c in enumerate(CELLS)]
    capacity = capacity_of(rows)
    design = factorial.designs(capacity)[0]
    seeds = seeds_for(design, lambda c: 10.0 + 50 * c[1])
    every = seeds["label"].isin([design.cells[c] for c in design.cells if c[1] == 0])
    seeds.loc[every, "outcome"] = "fails_everywhere"
    table = factorial.table(capacity, seeds)
    loss = table[table["view"] == "loss"]
    assert (loss["fit"] == factorial.BOUNDED).all() and loss["ratio"].isna().all()
    assert (table.loc[table["view"] == "accuracy", "fit"] == "least squares").all()
    lines = factorial_section(table)
    assert lines[0] == "## Factorial"
    row = next(line for line in lines if line.startswith("| redraw |"))
    assert row.split("|")[2].strip() == "cannot tell: bounded (12 of 24 seeds bounds)"
    assert "bounds" not in row.split("|")[3]
    assert factorial.simple_table(capacity, seeds) == [] or all(
        e.view != "loss" for e in factorial.simple_table(capacity, seeds))


def test_a_few_bounds_enter_as_the_intervals_they_allow():
    """Redraw x4 (log 1.386), no other effect; in the four cells with a fixed projection the
    largest seed is a lower bound at 0.8 of its value (its search stopped there): the censored
    fit keeps the effect near x4 and covers it, where the bounds taken as values pull it down."""
    rows = [(f"cell {i}", favor_params(*c), 64) for i, c in enumerate(CELLS)]
    capacity = capacity_of(rows)
    design = factorial.designs(capacity)[0]
    seeds = seeds_for(design, lambda c: 20.0 * 4 ** c[1])
    top = seeds["label"].isin([design.cells[c] for c in design.cells if c[1] == 1]) & \
        (seeds["seed"] == 3)
    seeds.loc[top, ["value", "value_acc"]] *= 0.8
    seeds.loc[top, "outcome"] = "never_fails"
    table = factorial.table(capacity, seeds).set_index(["view", "effect"])
    censored, as_values = table.loc[("loss", "redraw")], table.loc[("accuracy", "redraw")]
    assert censored.fit == "censored" and censored.bounds == 4 and censored.seeds == 24
    assert censored.ci_low <= 4.0 <= censored.ci_high
    assert abs(math.log(censored.ratio / 4)) < abs(math.log(as_values.ratio / 4))
    assert as_values.fit == "least squares"  # the accuracy view's outcomes are points here


def test_coverage_with_bounds_among_the_factorials_that_tell():
    """200 simulated factorials whose values above e^4.5 are lower bounds there (a search's top
    probe; about 12% of the values): the censored fit's intervals cover the true effects in
    about 95% of the factorials whose cells are mostly points; the rest cannot tell."""
    got = simulations.factorial_coverage(200, seed=11, cap=4.5)
    assert 0.4 <= got.pop("told") <= 0.8, got
    for key, share in got.items():
        assert 0.91 <= share <= 0.98, (key, got)


@pytest.mark.parametrize("truth", [{}, {"spread_ratio": 3.0}, {"outlier_rate": 0.1},
                                   {"outlier_rate": 0.1, "spread_ratio": 3.0}])
def test_coverage_near_nominal(truth):
    """The effects' 95% intervals cover the truth in 600 simulated factorials (3 seeds per
    cell): normal noise, cell spreads growing threefold, 10% stall-like outliers, both."""
    got = simulations.factorial_coverage(600, seed=11, **truth)
    assert got.pop("told") == 1.0  # no bounds: every factorial tells
    for key, share in got.items():
        assert 0.92 <= share <= 0.98, (key, got)


@pytest.mark.slow
def test_analyze_writes_factorial_csv_and_section(tmp_path):
    """A 2x2 store (favor m=16: redraw x stabilize, 2 seeds): analyze writes factorial.csv, the
    report its section, and docs' lines read the csv (figures drawn too: make test-slow)."""
    from synthetic import analyze_store, write_series

    grid = [8, 16, 24, 32, 40, 48]
    for redraw, stabilize, last in (("every_call", False, 8), ("every_call", True, 8),
                                    ("never", False, 24), ("never", True, 32)):
        for seed in (1, 2):
            write_series(tmp_path / "fd", {n: 1e-4 if n <= last + 8 * (seed - 1) else 0.3
                                           for n in grid}, seed=seed, feature_map="favor",
                         params={"m": 16, "redraw": redraw, "stabilize": stabilize}, d_dot=32)
    exp = analyze_store(tmp_path, "fd")
    table = pd.read_csv(exp / "factorial.csv")
    assert set(table["effect"]) == {"redraw", "stabilize", "redraw x stabilize"}
    assert set(table["view"]) == {"loss", "accuracy", "keys_retrieved"}
    assert table["factors"].iloc[0] == "redraw every_call -> never; stabilize false -> true"
    redraw = table[(table["effect"] == "redraw") & (table["view"] == "loss")].iloc[0]
    assert redraw.ratio > 2 and redraw.ci_low <= redraw.ratio <= redraw.ci_high
    assert "## Factorial" in (exp / "report.md").read_text()


def test_an_interaction_that_excludes_1_gives_each_fix_at_each_level_of_the_other():
    """A 2^2 design in which A multiplies the failure point by 1 at B low and by 4 at B high:
    the main effect (x2) averages them; the simple effects give both."""
    rng = np.random.default_rng(0)
    rows, capacity = [], []
    for a, b, mean in ((0, 0, 100.0), (1, 0, 100.0), (0, 1, 50.0), (1, 1, 200.0)):
        label = f"favor A={a + 1} B={b + 1}"
        capacity.append({"label": label, "feature_map": "favor", "d_key": 16, "d_dot": 64,
                         "update_rule": "sum", "lr": 0.001, "params": f"A={a + 1},B={b + 1}"})
        for seed, v in enumerate(mean * np.exp(rng.normal(0, 0.02, 3)), 1):
            rows.append({"label": label, "seed": seed, **{f"value{s}": v for s in SUFFIX.values()},
                         **{f"outcome{s}": "fails_at" for s in SUFFIX.values()}})
    design, = factorial.designs(pd.DataFrame(capacity))
    found = [e for e in factorial.simple_effects(design, pd.DataFrame(rows)) if e.view == "loss"]
    got = {(e.factor, e.at): e.ratio for e in found}
    assert got == pytest.approx({("A", "B=2"): 4.0, ("A", "B=1"): 1.0, ("B", "A=2"): 2.0,
                                 ("B", "A=1"): 0.5}, rel=0.05)
    words, = simple_words(found, "loss")
    assert words.startswith("interaction A x B x1.98 [") and "(its interval excludes 1)" in words
    assert "A x0.995 [" in words and "at B=1, x3.91 [" in words
