"""The prediction made before the answer (kernelzoo.analysis.prediction): the diagnostics at the
n_keys = d_dot probe, the leave-one-map-out fit and the scores per view."""

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
        assert by["rank_at_d_dot"] == pytest.approx(abs(math.log(0.9)), abs=0.03)
        assert by["d_dot"] > 0.5  # the shares vary from 1 to 0.3
        assert by["fitted"] < 0.05  # its constant, from the other maps, is 0.9
        assert "best: fitted" in scores.words(view)
    # a map's own rows never enter its fit: changing map a's failure points leaves its
    # predictions unchanged
    moved = table.assign(observed_capacity=np.where(table["feature_map"] == "a", 1.0,
                                                    table["observed_capacity"]))
    rows = prediction.scored(table, "loss")
    before = prediction.fitted(rows, rows["observed_capacity"])
    after = prediction.fitted(prediction.scored(moved, "loss"),
                              prediction.scored(moved, "loss")["observed_capacity"])
    assert np.allclose(before[table["feature_map"] == "a"], after[table["feature_map"] == "a"])


def test_the_analysis_writes_the_columns_and_the_section_and_pools(tmp_path, capsys):
    results = tmp_path / "results"
    write_ranked_store(results / "r")
    exp = analyze_store(results, "r", TAU)
    table = pd.read_csv(exp / "capacity.csv")
    columns = list(table.columns)
    at = columns.index("label")
    assert columns[at - len(prediction.COLUMNS):at] == list(prediction.COLUMNS)
    assert not (exp / "capacity_vs_rank.png").exists()  # the tautology is gone
    report = (exp / "report.md").read_text()
    assert "## A prediction made before the answer: measured at the n_keys = d_dot probe" in report
    assert "| loss | 2 |" in report  # two maps, each predicted with the other one's constant

    old = tmp_path / "old.csv"
    table.drop(columns=list(prediction.COLUMNS)).to_csv(old, index=False)
    (tmp_path / "bad.csv").write_bytes(b"\xff\xfe\x00")
    synthetic_capacity().to_csv(tmp_path / "syn.csv", index=False)
    scores, lines = prediction.pooled([tmp_path / "syn.csv", old, tmp_path / "bad.csv"])
    assert scores.n["loss"] == 20
    assert "no predictor columns" in lines[0] and "unreadable" in lines[1]
    capsys.readouterr()
    prediction.main([str(tmp_path / "syn.csv")])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("pooled, loss view, 20 configurations: d_dot ")
