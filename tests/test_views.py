"""The three views of capacity (kernelzoo.analysis.capacity) on constructed series with known answers:
a rank-bound series, a diluted series, and injected stalls, counted by default and moved only
by a passing check (no training)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from synthetic import analyze_store, write_run

from kernelzoo.analysis import rank_bound
from kernelzoo.analysis.capacity import (PLATEAU_FLAT, PLATEAU_PROBES, capacity_table,
                                         keys_failure, plateau, seed_table)
from kernelzoo.analysis import pipeline
from kernelzoo.analysis.runs import load_runs

TAU = 0.01


def rank_series(exp, seed: int = 1) -> None:
    """ELU+1 at d_key = d_dot = 16: every key right up to 16, then exactly 16 right (a rank-16
    memory), the loss on the floor; at 32 keys it holds 12."""
    for n in (8, 12, 16, 18, 20, 24, 32):
        r = 16 if n <= 24 else 12
        loss = 1e-4 if n <= 16 else max(rank_bound.loss_floor(n, 16), 0.5 * (n - r) / n)
        write_run(exp, n_keys=n, loss=loss, accuracy=min(1.0, r / n), seed=seed, d_key=16,
                  d_dot=16)


def test_a_rank_bound_series_fails_at_exactly_d_dot_in_the_loss_and_keys_views(tmp_path):
    rank_series(tmp_path / "r")
    runs, _, _ = load_runs(tmp_path / "r")
    runs["rank_bound"] = pipeline.rank_bounds(runs, TAU)
    assert runs["rank_bound"].unique().tolist() == [16]
    seed = seed_table(runs, TAU, 0.99).iloc[0]
    # log interpolation between 16 (1e-4) and 18 (0.0556) would say 17.4: beyond the bound
    assert seed["outcome"] == "fails_at" and seed["value"] == 16.0
    assert seed["outcome_acc"] == "fails_at" and seed["value_acc"] == pytest.approx(16.18, abs=0.01)
    assert (seed["outcome_keys"], seed["value_keys"]) == ("fails_at", 16.0)
    row = capacity_table(runs, seed_table(runs, TAU, 0.99)).iloc[0]
    assert row["observed_capacity"] <= row["rank_bound"] == 16
    assert row["ratio_keys"] == 1.0


def test_no_reported_loss_view_failure_point_lies_beyond_the_bound(tmp_path):
    """Even from losses no rank-64 memory can reach (a pass at 65, a failure at 80): n* stays
    at or below the bound of 65."""
    for n, loss in ((40, 1e-4), (65, 1e-4), (80, 0.3)):
        write_run(tmp_path / "b", n_keys=n, loss=loss)
    exp = analyze_store(tmp_path, "b", TAU)
    row = pd.read_csv(exp / "capacity.csv").iloc[0]
    assert row["rank_bound"] == 65 and row["observed_capacity"] == 65


def test_a_diluted_series_fails_the_loss_view_early_and_not_the_others(tmp_path):
    """The loss rises above tau from 14 keys while every key is answered right up to 64."""
    for n in (8, 12, 14, 16, 24, 32, 48, 64, 96):
        acc = 1.0 if n <= 64 else 0.6
        write_run(tmp_path / "d", n_keys=n, loss=0.002 * 2 ** (n / 6), accuracy=acc,
                  feature_map="taylor", d_key=10, d_dot=66)
    runs, _, _ = load_runs(tmp_path / "d")
    runs["rank_bound"] = pipeline.rank_bounds(runs, TAU)
    seed = seed_table(runs, TAU, 0.99).iloc[0]
    assert seed["outcome"] == "fails_at" and 12 < seed["value"] < 14
    assert seed["outcome_acc"] == "fails_at" and 64 < seed["value_acc"] < 96
    assert (seed["outcome_keys"], seed["value_keys"]) == ("fails_at", 64.0)  # 57.6 at 96
    exp = analyze_store(tmp_path, "d", TAU)
    row = pd.read_csv(exp / "capacity.csv").iloc[0]
    assert row["ratio"] < 0.25 and row["ratio_acc"] > 0.95


def stalled_store(exp, check_loss: float | None) -> str:
    """ELU+1 d_dot 64, two seeds: seed 1 passes to 48 and fails from 56; seed 2 passes to 28,
    stalls at 31 and 32 (one dead key, loss above tau) and passes at 40 and 48 again, failing
    from 56. A check of the stall at 32 (``check_loss``: its final loss; None: no check).
    Returns the stalled run's id at 32."""
    stall = dict(status="plateau", diagnostics={"dead_keys": 1}, dead=[
        {"key": 3, "confused_with": 7}])
    for n in (16, 28, 40, 48, 56, 64):
        write_run(exp, n_keys=n, loss=1e-4 if n <= 48 else 0.3, seed=1,
                  diagnostics={"dead_keys": 0 if n <= 48 else 9})
        if n != 40:
            write_run(exp, n_keys=n, loss=1e-4 if n <= 48 else 0.3, seed=2,
                      diagnostics={"dead_keys": 0 if n <= 48 else 9})
    write_run(exp, n_keys=31, loss=0.016, accuracy=30 / 31, seed=2, **stall)
    stalled = write_run(exp, n_keys=32, loss=0.0155, accuracy=31 / 32, seed=2, **stall).name
    write_run(exp, n_keys=40, loss=1e-4, seed=2, diagnostics={"dead_keys": 0})
    if check_loss is not None:  # the same run with a longer stopping rule, under its own id
        check = write_run(exp.parent / "checks", n_keys=32, loss=check_loss, seed=2,
                          accuracy=1.0 if check_loss <= TAU else 31 / 32,
                          diagnostics={"dead_keys": 0, "stall_check_of": stalled})
        summary = json.loads((check / "summary.json").read_text())
        (check / "summary.json").write_text(json.dumps({**summary, "run_id": f"{stalled}-check"}))
        check.rename(exp / "runs" / f"{stalled}-check")
    return stalled


def test_injected_stalls_count_as_they_ended(tmp_path):
    stalled_store(tmp_path / "s", None)
    exp = analyze_store(tmp_path, "s", TAU)
    runs = pd.read_parquet(exp / "runs.parquet")
    assert runs["stalled"].sum() == 2  # the runs at 31 and 32 of seed 2, diagnosed
    table = pd.read_csv(exp / "capacity.csv").iloc[0]
    assert table["stalled_runs"] == 2 and table["stalls_checked"] == 0
    seeds = seed_table(runs.assign(rank_bound=65), TAU, 0.99)
    seed2 = seeds[seeds["seed"] == 2].iloc[0]
    assert seed2["outcome"] == "fails_at" and 28 < seed2["value"] < 31  # the stall counts
    assert table["observed_capacity_verified"] == table["observed_capacity"]
    report = (exp / "report.md").read_text()
    assert "No stall was checked" in report


@pytest.mark.parametrize("check_loss, moves", [(1e-4, True), (0.02, False)])
def test_a_stall_moves_a_number_only_where_its_check_passes(tmp_path, check_loss, moves):
    stalled = stalled_store(tmp_path / "s", check_loss)
    exp = analyze_store(tmp_path, "s", TAU)
    table = pd.read_csv(exp / "capacity.csv").iloc[0]
    assert table["stalls_checked"] == 1 and table["stalls_cleared"] == int(moves)
    headline = table["observed_capacity"]
    # the headline never moves; the verified column moves only with a passing check (and only
    # the checked stall at 32: the unchecked one at 31 still counts, so seed 2 fails from 31)
    assert table["observed_capacity_verified"] == headline or moves
    runs = pd.read_parquet(exp / "runs.parquet")
    assert runs["stall_check_of"].eq(stalled).sum() == 1  # the check is stored, not a point
    assert len(pd.read_csv(exp / "capacity.csv")) == 1
    report = (exp / "report.md").read_text()
    assert (f"In the loss view 1 of them failed; their checks cleared {int(moves)} (the run had "
            f"stopped too soon: its check passes) and confirmed {1 - int(moves)}") in report


# The quick store's DPFP-1 (d_dot 32) and fixed FAVOR+ m=32 at d_key 16: n_keys, final eval
# accuracy, final eval loss of their runs
DPFP1 = ((8, 1.0, 3.2e-4), (16, 1.0, 1.6e-4), (24, 22 / 24, 0.042), (32, 31 / 32, 0.0157),
         (48, 31 / 48, 0.176), (64, 0.5, 0.251))
FAVOR32 = ((8, 7 / 8, 0.063), (16, 15 / 16, 0.031), (24, 22 / 24, 0.044), (32, 23 / 32, 0.147),
           (48, 26 / 48, 0.227), (64, 29 / 64, 0.285))


def series(points):
    n, acc, _ = zip(*points)
    return keys_failure(n, acc, [False] * len(n))


def test_a_flat_keys_retrieved_count_is_a_plateau_at_its_level():
    """DPFP-1 retrieves 31, 31, 32 keys at n_keys 32, 48, 64: a plateau at 32, not ">= 32";
    FAVOR+ m=32 still rises (23, 26, 29): a lower bound."""
    assert (series(DPFP1).outcome, series(DPFP1).value) == ("plateau", 32.0)
    assert (series(FAVOR32).outcome, series(FAVOR32).value) == ("never_fails", 29.0)
    # every key right at the top probe: the probes, not the memory, stopped the count
    assert series(((62, 1.0, 0), (63, 1.0, 0), (64, 1.0, 0))).outcome == "never_fails"
    # flat within PLATEAU_FLAT of the largest count over fewer probes than PLATEAU_PROBES: a bound
    assert series(DPFP1[-PLATEAU_PROBES + 1:]).outcome == "never_fails"
    edge = (1 - PLATEAU_FLAT) * 40  # 38 of 40: flat at the edge; just under it: not
    assert plateau([40, 60, 80], [edge, 39, 40]) and not plateau([40, 60, 80], [edge - 0.01, 39, 40])
    # flat over close probes (softmax on the authors' 20-key grid: 540, 543, 545, 546 at 540 to
    # 600 keys) spans 1.11 x, under PLATEAU_SPAN: still rising, for all they show
    grid = ((540, 1.0, 0), (560, 543.2 / 560, 0), (580, 545.2 / 580, 0), (600, 0.91, 0))
    assert series(grid).outcome == "never_fails"
    assert plateau([600, 900, 1200], [540, 543, 546])  # the same counts over a doubling


def test_views_apart_carry_the_measured_flag_that_bears_on_them(tmp_path):
    """FAVOR+ m=32 fails the loss view at its first probe (<= 8) and retrieves >= 29 keys: the
    two views lie apart, and its flags say so with partial retrieval (29 keys against no
    n_keys passing the accuracy view); DPFP-1 is a plateau at 32 beside a loss view of 21.9."""
    for fmap, params, d_dot, points in (("favor", {"m": 32}, 32, FAVOR32),
                                        ("dpfp", {"nu": 1}, 32, DPFP1)):
        for n, acc, loss in points:
            write_run(tmp_path / "v", n_keys=n, loss=loss, accuracy=acc, feature_map=fmap,
                      params=params, d_key=16, d_dot=d_dot)
    exp = analyze_store(tmp_path, "v", TAU)
    long = pd.read_csv(exp / "capacity_long.csv").set_index(["label", "view"])
    favor, dpfp = (next(label for label in long.index.get_level_values(0) if label.startswith(h))
                   for h in ("FAVOR+", "DPFP"))
    assert long.loc[(favor, "loss"), "outcome"] == "fails_everywhere"
    assert (long.loc[(favor, "keys_retrieved"), ["outcome", "failure_point"]].tolist()
            == ["never_fails", 29.0])
    assert "views apart (loss < keys retrieved, accuracy < keys retrieved): partial retrieval" \
        in long.loc[(favor, "loss"), "flags"]
    assert (long.loc[(dpfp, "keys_retrieved"), ["outcome", "failure_point"]].tolist()
            == ["plateau", 32.0])
    assert "partial retrieval" in long.loc[(dpfp, "loss"), "flags"]
    capacity = pd.read_csv(exp / "capacity.csv").set_index("label")
    assert capacity.loc[dpfp, "outcome_keys"] == "plateau"
    report = (exp / "report.md").read_text()
    assert f"| {dpfp} | 32 | 1 | " in report and "| plateau 32 |" in report
    assert "| >= 29 |" in report


def test_a_loss_view_above_the_accuracy_view_carries_the_loss_passing_wrong_keys(tmp_path):
    """The loss stays under tau up to 48 keys while 3% to 5% of the keys are answered wrong
    from 32: the accuracy view fails by 32, the loss view between 48 and 64; the row says the
    two lie apart and that its loss passed runs with wrong keys."""
    for n, loss, acc in ((16, 1e-4, 1.0), (32, 1e-3, 0.97), (48, 0.005, 0.95), (64, 0.05, 0.9),
                         (96, 0.2, 0.6)):
        write_run(tmp_path / "l", n_keys=n, loss=loss, accuracy=acc)
    flags = pipeline.analyse(tmp_path / "l", "l", TAU, 0.99).long["flags"].iloc[0]
    assert "views apart (accuracy < loss, accuracy < keys retrieved): loss passes wrong keys, " \
        "partial retrieval" in flags, flags


def test_figures_draw_only_the_views_a_search_located():
    """``search.views=[loss]`` drew empty panels for the views it left out."""
    import pandas as pd

    from kernelzoo.report.figures import searched

    capacity = pd.DataFrame({"outcome": ["fails_at", "never_fails"],
                             "outcome_acc": ["not_searched"] * 2,
                             "outcome_keys": ["not_searched", "fails_at"]})
    assert searched(capacity) == ("loss", "keys_retrieved")
    assert searched(capacity.assign(outcome_keys="not_searched")) == ("loss",)


def test_the_answer_states_the_first_tier_and_tests_every_pair_of_it(tmp_path):
    """The grid store at size 64 (d_dot 64-66): ELU+1 (3 seeds) is the one configuration a test
    can place; ReLU and ReLU² (one seed each) are listed apart, untested, with the reason; each
    size's facts carry stable ids, and report.md's first section formats them."""
    from kernelzoo.analysis import answer
    from synthetic import write_grid_store

    write_grid_store(tmp_path / "g")
    exp = analyze_store(tmp_path, "g", TAU)
    facts = pd.read_csv(exp / "answer.csv")
    assert list(facts.columns) == list(answer.COLUMNS)
    at64 = facts[facts["size"] == 64].set_index("id")
    held = at64[at64["kind"] == "holds"]
    assert list(held["subject"]) == ["ELU+1"] and held["n"].iloc[0] == 3
    assert all(i == f"answer.64.holds.{s}" for i, s in zip(held.index, held["subject"]))
    pairs = at64.loc["answer.64.pairs"]
    assert pairs["n"] == 0 and pairs["outcome"] == "one configuration"
    untested = at64[at64["kind"] == "untested"]
    assert {"ReLU", "ReLU²"} <= set(untested["subject"]) and set(untested["outcome"]) == {"one seed"}
    report = (exp / "report.md").read_text()
    assert report.index("## Answer") < report.index("## Capacity")
    assert f"- **d_dot 64**: {held['subject'].iloc[0]} " in report
    assert "alone in the first tier" in report and "(one seed)" in report
