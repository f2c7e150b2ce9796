"""Predicting the failure point (kernelzoo.analysis.prediction): the diagnostics at the n_keys =
d_dot probe, the calibrated predictors, the held-out split, the scores per view, bounds left
out."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from synthetic import analyze_store, write_run

from kernelzoo.analysis import prediction
from kernelzoo.analysis.capacity import VIEWS
from kernelzoo.analysis.runs import load_runs

TAU = 0.01


def write_ranked_store(exp) -> None:
    """ELU+1 (d_dot 64), two seeds probed at 32, 64 (ranks 60 and 62 there) and 96 (fails);
    DPFP-1 (d_dot 128) probed at 120 (within 25% of 128: rank 100) and 160; ReLU (d_dot 64)
    probed at 40 only (no probe near d_dot); softmax (unbounded)."""
    def run(n, loss, rank, **kw):
        write_run(exp, n_keys=n, loss=loss, accuracy=1.0 if loss < TAU else 0.5,
                  diagnostics={"phi_rank": rank, "phi_effective_rank": rank - 10,
                               "phi_rank_initial": rank - 1, "phi_effective_rank_initial": rank - 20,
                               "dead_keys": 0}, **kw)

    for seed, rank in ((1, 60.0), (2, 62.0)):
        for n, loss in ((32, 1e-4), (64, 1e-4), (96, 0.3)):
            run(n, loss, rank if n == 64 else 30.0, seed=seed)
    for n, loss in ((120, 1e-4), (160, 0.3)):
        run(n, loss, 100.0 if n == 120 else 50.0, feature_map="dpfp", params={"nu": 1},
            d_dot=128)
    for n, loss in ((20, 1e-4), (40, 0.3)):
        run(n, loss, 20.0, feature_map="relu")
    for n in (20, 60):
        write_run(exp, n_keys=n, loss=1e-5, feature_map="softmax", d_dot=None)


def test_the_diagnostics_at_the_d_dot_probe(tmp_path):
    write_ranked_store(tmp_path / "r")
    runs, _, _ = load_runs(tmp_path / "r")
    found = prediction.at_d_dot(runs)
    assert found.loc["ELU+1", "rank_at_d_dot"] == 61.0  # the mean over its two seeds at 64
    assert found.loc["ELU+1", "effective_rank_at_d_dot_initial"] == 41.0
    assert found.loc["DPFP-1", "rank_at_d_dot"] == 100.0  # 120 is within 25% of 128
    assert math.isnan(found.loc["ReLU", "rank_at_d_dot"])  # 40 is not within 25% of 64
    assert "softmax" not in found.index


def synthetic_capacity(rng_seed: int = 0) -> pd.DataFrame:
    """Five maps x four d_dot: the failure point is 0.9 x the numerical rank at the d_dot probe
    in every view (times a little noise), the rank a map-specific share of d_dot, the same at
    initialisation."""
    rng = np.random.default_rng(rng_seed)
    rows = []
    for share, fmap in zip((1.0, 0.8, 0.6, 0.5, 0.3), ("a", "b", "c", "d", "e")):
        for d in (32, 64, 128, 256):
            rank = share * d
            value = 0.9 * rank * math.exp(rng.normal(0, 0.02))
            rows.append({"feature_map": fmap, "label": f"{fmap}{d}", "predicted_capacity": d,
                         "rank_at_d_dot": rank, "effective_rank_at_d_dot": rank * 0.8,
                         "rank_at_d_dot_initial": rank, "effective_rank_at_d_dot_initial": d * 0.7,
                         **{f"observed_capacity{s}": value for s in ("", "_acc", "_keys")},
                         **{f"outcome{s}": "fails_at" for s in ("", "_acc", "_keys")}})
    return pd.DataFrame(rows)


def test_the_scores_per_view_and_the_leave_one_map_out_fit():
    table = synthetic_capacity()
    scores = prediction.score(table)
    for view in VIEWS:
        by = scores.by[view]
        assert scores.n[view] == 20
        assert by["probe_rank"] == pytest.approx(abs(math.log(0.9)), abs=0.03)
        assert by["d_dot"] > 0.5 and by["c·d_dot"] > 0.3  # the shares vary from 1 to 0.3
        assert by["c·probe_x_untrained_rank"] < 0.05  # its constant, from the other maps, is 0.9
        assert by["c·untrained_rank"] < 0.05
    # a map's own rows never enter its constants: changing map a's failure points leaves its
    # predictions unchanged
    moved = table.assign(observed_capacity=np.where(table["feature_map"] == "a", 1.0,
                                                    table["observed_capacity"]))
    rows, shifted = prediction.scored(table, "loss"), prediction.scored(moved, "loss")
    before = prediction.one_map_out(rows, rows["observed_capacity"])
    after = prediction.one_map_out(shifted, shifted["observed_capacity"])
    a = table["feature_map"] == "a"
    assert np.allclose(before[a], after[a]) and not np.allclose(before[~a], after[~a])


def stores() -> pd.DataFrame:
    """zoo at d_dot 64 (two maps resolve it to 64 and 66) and 128 (128, 136), dot_scaling at
    32 and 128, figure2 at 64: every failure point 0.7 d_dot, the untrained rank exactly the
    failure point, the probe's rank d_dot, the effective ranks a quarter of it."""
    rows = []
    for store, sizes in (("zoo", (64, 66, 128, 136)), ("dot_scaling", (32, 128)),
                         ("figure2", (64,))):
        for i, d in enumerate(sizes):
            value = 0.7 * d
            rows.append({"store": store, "feature_map": f"m{i}", "label": f"{store}{d}",
                         "predicted_capacity": d, "rank_at_d_dot": d,
                         "effective_rank_at_d_dot": d / 4, "rank_at_d_dot_initial": value,
                         "effective_rank_at_d_dot_initial": d / 4,
                         **{f"observed_capacity{s}": value for s in ("", "_acc", "_keys")},
                         **{f"outcome{s}": "fails_at" for s in ("", "_acc", "_keys")}})
    return pd.DataFrame(rows)


def test_the_held_out_split_fits_on_zoo_64_and_dot_scaling_and_scores_zoo_128():
    table = stores()
    fit, test = prediction.selected(table, prediction.FIT), prediction.selected(table, prediction.SCORE)
    assert list(table.loc[fit, "label"]) == ["zoo64", "zoo66", "dot_scaling32", "dot_scaling128"]
    assert list(table.loc[test, "label"]) == ["zoo128", "zoo136"]
    frame = prediction.held_out(table).set_index(["view", "predictor"])
    assert (frame["configurations"] == 2).all() and (frame["fitted_on"] == 4).all()
    # the predictor that is the truth scores 0; c·d_dot fitted on exact data recovers c = 0.7
    assert frame.loc[("loss", "untrained_rank"), "score"] == pytest.approx(0, abs=1e-12)
    assert frame.loc[("loss", "c·d_dot"), "constant"] == pytest.approx(0.7, rel=1e-12)
    assert frame.loc[("loss", "c·d_dot"), "score"] == pytest.approx(0, abs=1e-12)
    assert frame.loc[("loss", "d_dot"), "score"] == pytest.approx(abs(math.log(0.7)))
    assert frame.loc[("loss", "c·probe_effective_rank"), "constant"] == pytest.approx(2.8)
    assert math.isnan(frame.loc[("loss", "d_dot"), "constant"])
    assert frame.loc[("loss", "untrained_rank"), "kind"] == "before training"
    assert frame.loc[("loss", "c·probe_rank"), "kind"] == "early diagnostic"
    better, worse = prediction.compared(frame.reset_index(), "loss", "d_dot")
    assert worse == ["untrained_effective_rank", "probe_effective_rank"]  # ln 2.8 > |ln 0.7|
    assert "c·d_dot" in better and "untrained_rank" in better and "probe_rank" not in better
    # rows outside both selections change nothing
    other = table.assign(observed_capacity=np.where(table["store"] == "figure2", 1.0,
                                                    table["observed_capacity"]))
    assert prediction.held_out(other).equals(prediction.held_out(table))
    # a scored row of the fit's store at the other size moves the score, not the constants
    moved = table.assign(observed_capacity=np.where(table["label"] == "zoo136", 0.35 * 136,
                                                    table["observed_capacity"]))
    again = prediction.held_out(moved).set_index(["view", "predictor"])
    assert again.loc[("loss", "c·d_dot"), "constant"] == pytest.approx(0.7)
    assert again.loc[("loss", "c·d_dot"), "score"] == pytest.approx(math.log(2) / 2)


def test_where_raw_d_dot_wins_per_configuration():
    table = stores()
    at_d_dot = table["label"] == "zoo136"  # this one fails at d_dot itself
    for s in ("", "_acc", "_keys"):
        table.loc[at_d_dot, f"observed_capacity{s}"] = 136.0
    found = prediction.predict(table, "loss")
    assert list(found.observed.index) == ["zoo128", "zoo136"]
    assert found.constants["c·d_dot"] == pytest.approx(0.7)  # the fit set is unchanged
    errors = found.errors()
    assert errors.loc["zoo136", "d_dot"] == pytest.approx(0, abs=1e-12)
    assert errors.loc["zoo136", "c·d_dot"] == pytest.approx(-math.log(0.7))
    assert errors.loc["zoo128", "c·d_dot"] == pytest.approx(0, abs=1e-12)
    closer, best = prediction.d_dot_wins(found)
    assert closer == ["zoo136"] and best == ["zoo136"]  # probe_rank ties there: d_dot counts


def test_bounds_are_left_out_and_counted_not_scored():
    table = stores()
    bound = table["label"] == "zoo136"
    censored = table.assign(observed_capacity_keys=np.where(bound, 5000.0,
                                                            table["observed_capacity_keys"]),
                            outcome_keys=np.where(bound, "never_fails", table["outcome_keys"]))
    censored.loc[censored["label"] == "dot_scaling32", "outcome_keys"] = "fails_everywhere"
    frame = prediction.held_out(censored).set_index(["view", "predictor"])
    keys, loss = frame.loc["keys_retrieved"], frame.loc["loss"]
    assert (keys["configurations"] == 1).all() and (keys["bounds_left_out"] == 1).all()
    assert (keys["fitted_on"] == 3).all()  # the fit's bound is left out too
    assert keys.loc["untrained_rank", "score"] == pytest.approx(0, abs=1e-12)  # not ln(5000/95)
    assert (loss["configurations"] == 2).all() and (loss["bounds_left_out"] == 0).all()


def test_a_keys_retrieved_plateau_is_a_point_fitted_and_scored():
    table = stores()
    plateau = table.assign(outcome_keys=np.where(table["label"] == "zoo136", "plateau",
                                                 table["outcome_keys"]))
    keys = prediction.held_out(plateau).set_index(["view", "predictor"]).loc["keys_retrieved"]
    assert (keys["configurations"] == 2).all() and (keys["bounds_left_out"] == 0).all()


def test_the_analysis_writes_the_columns_and_the_section_and_the_command_scores(tmp_path, capsys):
    results = tmp_path / "results"
    write_ranked_store(results / "r")
    exp = analyze_store(results, "r", TAU, figures=True)
    table = pd.read_csv(exp / "capacity.csv")
    columns = list(table.columns)
    at = columns.index("label")
    assert columns[at - len(prediction.COLUMNS):at] == list(prediction.COLUMNS)
    assert not (exp / "capacity_vs_rank.png").exists()  # the tautology is gone
    report = (exp / "report.md").read_text()
    assert ("## Predicting the failure point: before training, and an early diagnostic at the "
            "n_keys = d_dot probe") in report
    assert "| loss | 2 |" in report  # two maps, each predicted with the other one's constant

    old = tmp_path / "old" / "capacity.csv"
    old.parent.mkdir()
    table.drop(columns=list(prediction.COLUMNS)).to_csv(old, index=False)
    (tmp_path / "bad.csv").write_bytes(b"\xff\xfe\x00")
    for store in ("zoo", "dot_scaling"):
        (tmp_path / store).mkdir()
        stores()[lambda t, s=store: t["store"] == s].drop(columns="store").to_csv(
            tmp_path / store / "capacity.csv", index=False)
    found, lines = prediction.read_stores([tmp_path / "zoo" / "capacity.csv", old,
                                           tmp_path / "bad.csv"])
    assert sorted(set(found["store"])) == ["zoo"] and len(found) == 4
    assert "no predictor columns" in lines[0] and "unreadable" in lines[1]
    capsys.readouterr()
    prediction.main([str(tmp_path / s / "capacity.csv") for s in ("zoo", "dot_scaling")])
    out = capsys.readouterr().out.splitlines()
    assert len(out) == len(VIEWS) * len(prediction.PREDICTORS)
    assert out[1] == ("loss: c·d_dot (before training) 0.000 on 2 configurations (fitted on 4, "
                      "0 bounds left out), c = 0.700")
