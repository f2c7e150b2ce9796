"""Tests of the published column and the figures on a synthetic figure2-like store (no training)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import legend_labels
from matplotlib.figure import Figure
from synthetic import analyze_store, write_run, write_series

from kernelzoo.analysis import efficiency, published
from kernelzoo.report import heatmaps, plots, style
from kernelzoo.analysis.capacity import capacity_table, seed_table
from kernelzoo.report.markdown import has_published
from kernelzoo.analysis.runs import load_runs

TAU = 0.01
GRID = [20, 40, 60, 80, 100, 120, 140]
AUTHORS_FAVOR = {"variant": "hyperbolic", "orthogonal": True, "redraw": "every_call",
                 "input_scale": 1.0, "stabilize": False, "seed": None}
SHIPPED = Path(published.__file__).parents[1] / "data" / "published_figure2.csv"


def published_failure(name: str) -> float:
    """The rule on the shipped losses of one of the authors' maps, written out independently:
    the first failing n whose next point fails too, interpolated in log loss from the last pass."""
    with open(SHIPPED) as f:
        series = sorted((int(r["n_keys"]), float(r["final_eval_loss"]))
                        for r in csv.DictReader(f) if r["feature_map"] == name)
    fails = [loss > TAU for _, loss in series] + [True]
    i = next(i for i in range(len(series)) if fails[i] and fails[i + 1])
    (n_a, l_a), (n_b, l_b) = series[i - 1], series[i]
    return n_a + (math.log(TAU) - math.log(l_a)) / (math.log(l_b) - math.log(l_a)) * (n_b - n_a)


def make_figure2_like(exp: Path) -> None:
    """ELU+1, DPFP-1/2 and the authors' FAVOR+ m=64/128/512 at d_key 64 (their configurations),
    a scaled-input FAVOR+ (not theirs), softmax; DPFP-2 stopped by the step cap at 140."""
    write_series(exp, {n: 1e-4 if n <= 60 else 0.3 for n in GRID})
    for nu, last in ((1, 100), (2, 120)):
        write_series(exp, {n: 1e-4 if n <= last else 0.2 for n in GRID[:-1]}, feature_map="dpfp",
                     params={"nu": nu}, d_dot=128 * nu)
    write_run(exp, n_keys=140, loss=0.2, feature_map="dpfp", params={"nu": 2}, d_dot=256,
              status="max_steps")
    for m in (64, 128, 512):
        write_series(exp, {n: 0.5 for n in GRID}, feature_map="favor",
                     params={"m": m, **AUTHORS_FAVOR}, d_dot=2 * m)
    write_series(exp, {n: 0.4 for n in GRID}, feature_map="favor",
                 params={"m": 64, **AUTHORS_FAVOR, "input_scale": "performer"}, d_dot=128)
    write_series(exp, {n: 1e-5 for n in GRID}, feature_map="softmax", d_dot=None)


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    """The figure2-like store, analysed in process: (experiment dir, runs, capacity table)."""
    results = tmp_path_factory.mktemp("results")
    make_figure2_like(results / "fig")
    exp = analyze_store(results, "fig", TAU, figures=True)
    return exp, pd.read_parquet(exp / "runs.parquet"), pd.read_csv(exp / "capacity.csv")


def test_shipped_csv_names_are_all_known():
    table = published.load()
    assert len(table) == 240
    assert {published.configuration(name)[0] for name in table["feature_map"]} == {
        "elu", "dpfp", "favor", "softmax"}
    with pytest.raises(ValueError, match="unknown feature_map 'performer64'"):
        published.configuration("performer64")


def test_published_column_is_the_rule_over_the_published_losses(analysed):
    exp, _, capacity = analysed
    table = capacity.set_index("label")
    assert table.loc["ELU+1", "published_capacity"] == pytest.approx(published_failure("linear"))
    assert table.loc["DPFP-2", "published_capacity"] == pytest.approx(published_failure("dpfp2"))
    assert table.loc["ELU+1", "published_outcome"] == "fails_at"
    favor = table.loc["FAVOR+ input_scale=1 m=64"]
    assert (favor["published_outcome"], favor["published_capacity"]) == ("fails_everywhere", 20)
    assert (table.loc["softmax", "published_outcome"] == "fails_at"
            and table.loc["softmax", "published_capacity"] > 500)
    scaled = table.loc["FAVOR+ performer m=64"]  # not the authors' FAVOR+
    assert pd.isna(scaled["published_capacity"]) and pd.isna(scaled["published_outcome"])
    report = (exp / "report.md").read_text()
    assert "| loss / d_dot | published (loss) | flags |" in report
    elu = next(line for line in report.splitlines() if line.startswith("| ELU+1 |"))
    assert elu.startswith(f"| ELU+1 | 64 | 1 | {table.loc['ELU+1', 'observed_capacity']:.3g} "
                          "(between 60 and 80) |")
    assert f"| {published_failure('linear'):.3g} |" in elu
    favor = next(line for line in report.splitlines()
                 if line.startswith("| FAVOR+ performer m=64 |"))
    assert favor.startswith("| FAVOR+ performer m=64 | 128 | 1 | <= 20 |") and "| – |" in favor


def test_no_published_column_where_no_configuration_is_the_authors(tmp_path):
    write_series(tmp_path / "q", {n: 1e-4 if n <= 60 else 0.3 for n in GRID}, d_key=16, d_dot=16)
    runs, _, _ = load_runs(tmp_path / "q")
    assert published.points(runs).empty
    table = published.capacity_columns(capacity_table(
        runs, seed_table(runs, TAU, 0.99)), published.points(runs), None)
    assert table["published_outcome"].isna().all()
    assert not has_published(table)  # so the report shows no published column


def test_every_figure_is_written_as_png_and_svg(analysed):
    exp, _, _ = analysed
    pngs = sorted(p.name for p in exp.glob("*.png"))
    assert pngs == ["accuracy_panels.png", "capacity_efficiency.png", "capacity_scaling.png",
                    "curves.png", "headline.png", "heatmap_dpfp.png", "keys_retrieved_panels.png",
                    "loss_panels.png", "loss_vs_keys.png", "observed_vs_predicted.png"]
    # loss_vs_keys beside the panels: it shows the authors' published losses, on 8 lines
    for png in pngs:
        assert (exp / png).read_bytes()[:4] == b"\x89PNG"
        assert b"<svg" in (exp / png).with_suffix(".svg").read_bytes()[:500]
    report = (exp / "report.md").read_text()
    assert "![](loss_panels.png)" in report and "([SVG](loss_panels.svg))" in report
    # every FAVOR+ cell fails: no boundary to show, so no heatmap, and the report says why
    assert "heatmap_favor: left out, as no cell passes" in report


def test_no_family_at_three_d_dot_values_has_ratios_but_no_law(analysed):
    """DPFP-1 and -2 at d_key 64 are one family at 2 d_dot values, ELU+1 one at 1; the FAVOR+
    configurations fail everywhere (no failure point): scaling.csv has rows but no law, the
    report and the figure show DPFP's ratios per level."""
    exp, _, _ = analysed
    table = pd.read_csv(exp / "scaling.csv")
    loss = table[table["view"] == "loss"]
    assert loss[["family", "d_dot"]].values.tolist() == [["DPFP d_key=64", 128],
                                                         ["DPFP d_key=64", 256], ["ELU+1", 64]]
    assert set(table["view"]) == {"loss", "accuracy", "keys_retrieved"}
    assert table["b"].isna().all()
    report = (exp / "report.md").read_text()
    assert "## Capacity against d_dot, per view" in report
    assert "| DPFP d_key=64 | loss | 2 | – | – | not fitted | 128: " in report
    assert (exp / "capacity_scaling.png").stat().st_size > 0


def draw_loss(runs, capacity, points=None):
    ax = Figure().add_subplot()
    points = published.points(runs) if points is None else points
    plots.draw_loss_vs_keys(ax, runs, capacity, points, style.config_colors(capacity["label"]),
                            TAU)
    return ax


def test_loss_vs_keys_legend_markers_and_lines(analysed):
    _, runs, capacity = analysed
    ax = draw_loss(runs, capacity)
    labels = legend_labels(ax)
    assert labels[:8] == ["DPFP-1", "DPFP-2", "ELU+1", "FAVOR+ input_scale=1 m=64",
                          "FAVOR+ input_scale=1 m=128", "FAVOR+ input_scale=1 m=512",
                          "FAVOR+ performer m=64", "softmax"]
    assert any(lab.startswith("published (Schlag et al. 2021)") for lab in labels)
    assert any("step cap" in lab for lab in labels)
    # d_dot 64, 128 (DPFP-1 and two FAVOR+ m=64); 256 and 1024 lie beyond the store's 140 keys
    assert plots.capacity_lines(capacity)[128] == ["DPFP-1", "FAVOR+ input_scale=1 m=64",
                                                   "FAVOR+ performer m=64"]
    lines = [line for line in ax.get_lines() if line.get_gid() == "capacity"]
    assert sorted(line.get_xdata()[0] for line in lines) == [64, 128]
    assert "d_dot beyond the axis: DPFP-2, FAVOR+ input_scale=1 m=128 at 256" in ax.get_xlabel()
    assert ax.get_xlim()[1] == pytest.approx(140 * 1.05)
    # the rank bound's loss floor of each bounded configuration, as far as its keys go
    floors = [line for line in ax.get_lines() if line.get_gid() == "rank-floor"]
    assert len(floors) >= 1 and any("rank bound" in lab for lab in labels)
    stars = sorted((line.get_xdata()[0], line.get_ydata()[0])
                   for line in ax.get_lines() if line.get_gid() == "failure-point")
    fails_at = capacity[capacity["outcome"] == "fails_at"]["observed_capacity"]
    assert stars == [(pytest.approx(x), TAU) for x in sorted(fails_at)] and len(stars) == 3
    published_lines = [line for line in ax.get_lines() if line.get_gid() == "published"]
    assert len(published_lines) == 7  # every configuration but the scaled-input FAVOR+
    assert any(c.get_gid() == "step-cap" for c in ax.collections)


def test_without_published_points_no_overlay(analysed):
    _, runs, capacity = analysed
    ax = draw_loss(runs, capacity, pd.DataFrame(columns=list(published.POINT_COLUMNS)))
    assert not any(lab.startswith("published") for lab in legend_labels(ax))
    assert not any(line.get_gid() == "published" for line in ax.get_lines())


def test_heatmap_helpers():
    assert heatmaps.cell_edges(np.array([8, 16, 24, 32, 48])).tolist() == [4, 12, 20, 28, 40, 56]
    passing = pd.DataFrame([[1e-4, 0.3]], columns=[20, 40])
    failing = pd.DataFrame([[0.5, np.inf]], columns=[20, 40])
    assert heatmaps.shows_boundary(passing, TAU) and not heatmaps.shows_boundary(failing, TAU)
    norm = heatmaps.shared_norm([passing, failing], TAU)
    assert (norm.vmin, norm.vcenter, norm.vmax) == pytest.approx((-4, -2, math.log10(0.5)))
    assert norm(-2) == pytest.approx(0.5)


def test_capacity_efficiency_ranks_failure_point_per_d_dot(analysed):
    exp, _, _ = analysed
    capacity = pd.read_csv(exp / "capacity.csv")
    for view, ratio in (("loss", "ratio"), ("accuracy", "ratio_acc")):
        ranked = efficiency.efficiency_order(capacity, view)
        assert set(ranked["view"]) == {view}  # the view's rows of the long table
        assert list(ranked["ratio"]) == sorted(capacity[ratio].dropna(), reverse=True)
        assert (ranked["efficiency_low"] <= ranked["ratio"] + 1e-12).all()
    report = (exp / "report.md").read_text()
    assert "## Failure point / d_dot, per view" in report
    # tiers per size: one seed per configuration, so none is tested; bounds shown apart
    assert "### Tiers per view" in report and "| DPFP-1 | apart (one seed): 0.88 |" in report
    assert "| FAVOR+ performer m=64 | bound: <= 0.16 |" in report
