"""The refined prediction (kernelzoo.prediction) on a synthetic store with diagnostics."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from synthetic import analyze_store, write_run

from kernelzoo import analyze, prediction
from kernelzoo.capacity import capacity_table, seed_table

TAU = 0.01


def crossing(n_a, l_a, n_b, l_b, tau=TAU):
    return n_a + (math.log(tau) - math.log(l_a)) / (math.log(l_b) - math.log(l_a)) * (n_b - n_a)


def write_ranked_store(exp) -> None:
    """ELU+1 (d_dot 64), two seeds: seed 1 passes to 40 (effective rank 30 there) and fails at 60
    (rank 40); seed 2 passes to 60 (rank 45) and fails at 80 (rank 50). DPFP-1 (d_dot 128): passes
    to 100 (rank 90), diverges at 120 (no diagnostics). ReLU fails at 60 without diagnostics;
    softmax never fails."""
    def run(n, loss, rank, **kw):
        write_run(exp, n_keys=n, loss=loss, status="diverged" if loss is None else "plateau",
                  diagnostics={"phi_effective_rank": rank, "dead_keys": None if rank is None
                               else 0}, **kw)

    for n, loss, rank in ((20, 1e-4, 18.0), (40, 1e-4, 30.0), (60, 0.3, 40.0)):
        run(n, loss, rank, seed=1)
    for n, loss, rank in ((20, 1e-4, 19.0), (60, 1e-4, 45.0), (80, 0.3, 50.0)):
        run(n, loss, rank, seed=2)
    for n, loss, rank in ((20, 1e-4, 20.0), (100, 1e-4, 90.0), (120, None, None)):
        run(n, loss, rank, feature_map="dpfp", params={"nu": 1}, d_dot=128)
    for n, loss in ((20, 1e-4), (60, 0.3)):
        write_run(exp, n_keys=n, loss=loss, feature_map="relu")
    for n in (20, 60):
        run(n, 1e-5, None, feature_map="softmax", d_dot=None)


def expected():
    """(ELU+1's failure point and effective rank, DPFP-1's), written out from the docstring."""
    c1, c2 = crossing(40, 1e-4, 60, 0.3), crossing(60, 1e-4, 80, 0.3)
    e1, e2 = 30 + (c1 - 40) / 20 * 10, 45 + (c2 - 60) / 20 * 5
    return ((c1 + c2) / 2, (e1 + e2) / 2), (110.0, 90.0)


def test_effective_rank_at_failure_and_the_comparison(tmp_path):
    write_ranked_store(tmp_path / "r")
    runs, _, _ = analyze.load_runs(tmp_path / "r")
    seeds = seed_table(runs, TAU, 0.99)
    table = prediction.add_columns(capacity_table(runs, seeds), runs, seeds).set_index("label")
    (elu, elu_rank), (dpfp, dpfp_rank) = expected()
    assert table.loc["ELU+1", "observed_capacity"] == pytest.approx(elu)
    assert table.loc["ELU+1", "effective_rank_at_failure"] == pytest.approx(elu_rank)
    assert table.loc["ELU+1", "rank_ratio"] == pytest.approx(elu / elu_rank)
    assert table.loc["DPFP-1", "effective_rank_at_failure"] == pytest.approx(dpfp_rank)
    assert table.loc["ReLU", "outcome"] == "fails_at"
    assert math.isnan(table.loc["ReLU", "effective_rank_at_failure"])
    assert math.isnan(table.loc["softmax", "effective_rank_at_failure"])
    comparison = prediction.compare(table.reset_index())
    assert comparison == prediction.Comparison(
        2, pytest.approx(np.mean([abs(math.log(elu / 64)), abs(math.log(dpfp / 128))])),
        pytest.approx(np.mean([abs(math.log(elu / elu_rank)), abs(math.log(dpfp / dpfp_rank))])))
    assert "over 2 configurations failing at a point" in comparison.words()
    assert comparison.words().endswith(": d_dot predicts the failure point better")  # here


def test_a_store_without_diagnostics_has_no_effective_rank(tmp_path):
    for n, loss in ((20, 1e-4), (40, 1e-4), (60, 0.3)):
        write_run(tmp_path / "old", n_keys=n, loss=loss)
    runs, _, _ = analyze.load_runs(tmp_path / "old")
    seeds = seed_table(runs, TAU, 0.99)
    table = prediction.add_columns(capacity_table(runs, seeds), runs, seeds)
    assert table["effective_rank_at_failure"].isna().all()
    assert prediction.compare(table).n == 0
    assert prediction.compare(table).words().startswith("no configuration fails at a point")


def test_analysis_writes_the_columns_the_section_and_the_figure(tmp_path, capsys):
    results = tmp_path / "results"
    write_ranked_store(results / "r")
    exp = analyze_store(results, "r", TAU)
    table = pd.read_csv(exp / "capacity.csv")
    columns = list(table.columns)
    assert columns[columns.index("label") - 2:columns.index("label")] == list(prediction.COLUMNS)
    assert (exp / "capacity_vs_rank.png").read_bytes()[:4] == b"\x89PNG"
    assert b"<svg" in (exp / "capacity_vs_rank.svg").read_bytes()[:500]
    report = (exp / "report.md").read_text()
    (elu, elu_rank), _ = expected()
    for needle in ("## Refined prediction: the effective rank at the failure point",
                   "Comparison over 2 configurations failing at a point",
                   f"| ELU+1 | 64 | {elu:.3g} | {elu_rank:.3g} | {elu / 64:.2f} | "
                   f"{elu / elu_rank:.2f} |", "![](capacity_vs_rank.png)"):
        assert needle in report, needle

    # pooled: this store, one analysed before the column existed, one that is not a csv
    old = tmp_path / "old.csv"
    table.drop(columns=list(prediction.COLUMNS)).to_csv(old, index=False)
    (tmp_path / "bad.csv").write_bytes(b"\xff\xfe\x00")
    comparison, lines = prediction.pooled([exp / "capacity.csv", exp / "capacity.csv", old,
                                           tmp_path / "bad.csv"])
    assert comparison.n == 4  # the same two configurations twice
    assert comparison.by_rank == pytest.approx(prediction.compare(table).by_rank)
    assert "no effective_rank_at_failure" in lines[2] and "unreadable" in lines[3]
    capsys.readouterr()
    prediction.main([str(exp / "capacity.csv")])
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == f"pooled: {prediction.compare(table).words()}"
