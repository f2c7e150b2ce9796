"""The wandb dashboard of an analysis: its tables carry feature_map and view to filter by, its
charts are wandb.plot charts drawn from those tables' rows, its figures PNG images. Nothing here
starts a wandb run (test_analyze's offline CLI run reads the files an offline run writes)."""

from __future__ import annotations

import pandas as pd
import pytest
import wandb
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from synthetic import write_grid_store, write_update_store
from test_figures import tables

from kernelzoo.analysis import capacity
from kernelzoo.report.panels import palette
from kernelzoo.report.style import save
from kernelzoo.report import dashboard


@pytest.fixture(scope="module")
def dashboards(tmp_path_factory):
    """The dashboard tables of the grid store and of the Figure 3-like one."""
    found = {}
    for name, write in (("grid", write_grid_store), ("update", write_update_store)):
        exp = tmp_path_factory.mktemp("results") / name
        write(exp)
        runs, _, table, families = tables(exp)
        found[name] = dashboard.dashboard_tables(runs, table, families)
    return found


def test_every_table_filters_by_map_and_view(dashboards):
    grid = dashboards["grid"]
    assert set(grid) == {"capacity", "efficiency", "scaling", "keys"}
    for name, frame in grid.items():
        assert {"feature_map", "view"} <= set(frame.columns), name
        assert set(frame["view"]) == set(capacity.VIEWS), name
    table = grid["capacity"]
    assert len(table) == 3 * table["label"].nunique()
    elu = table[(table["label"] == "ELU+1") & (table["view"] == "loss")].iloc[0]
    assert elu["feature_map"] == "elu" and elu["outcome"] == "fails_at"
    assert elu["interval"] == "min-max of 3 seeds (order-statistic interval, 75%)"
    assert elu["ci_low"] <= elu["failure_point"] <= elu["ci_high"]
    assert pd.notna(elu["published_capacity"])  # the authors' Linear at d_key 64
    keys = grid["keys"].set_index(["label", "view", "n_keys"])
    assert keys.loc[("ELU+1", "loss", 48), "value"] == pytest.approx(1e-4)  # 2 of 3 seeds pass
    assert keys.loc[("ELU+1", "loss", 48), "seeds"] == 3
    assert keys.loc[("ELU+1", "keys_retrieved", 48), "value"] == pytest.approx(48 * (1 - 1e-4))
    efficiency = grid["efficiency"]
    assert list(efficiency.loc[efficiency["view"] == "loss", "rank"]) == list(
        range(1, (efficiency["view"] == "loss").sum() + 1))
    diverged = dashboards["update"]["keys"].set_index(["label", "view", "n_keys"])
    assert pd.isna(diverged.loc[("FAVOR+ m=32 delta", "loss", 60), "value"])


def test_every_row_carries_its_family_and_the_figures_colour(tmp_path):
    """wandb's built-in charts pick their own colours, so each table row carries its family and
    that family's colour as the figures draw it (``panels.palette``), as a hex string."""
    exp = tmp_path / "grid"
    write_grid_store(exp)
    runs, _, table, families = tables(exp)
    found = dashboard.dashboard_tables(runs, table, families)
    colors = palette(families, table)
    assert len(set(colors.values())) == len(colors) == 5  # DPFP, ELU+1, FAVOR+, ReLU, ReLU²
    for name, frame in found.items():
        assert frame["family"].notna().all() and len(frame), name
        assert (frame["color"] == frame["family"].map(lambda f: to_hex(colors[f]))).all(), name
    keys = found["keys"].drop_duplicates("label").set_index("label")
    assert keys.loc["DPFP-1", "family"] == keys.loc["DPFP-2", "family"] == "DPFP d_key=64"
    assert keys.loc["DPFP-1", "color"] == keys.loc["DPFP-2", "color"] != keys.loc["ELU+1", "color"]


def test_the_payload_holds_tables_charts_and_figures(dashboards, tmp_path):
    fig = Figure()
    fig.add_subplot().plot([1, 2])
    png = save(fig, tmp_path / "loss_panels.png")
    payload = dashboard.dashboard_payload(dashboards["grid"], [png])
    for name in ("capacity", "efficiency", "scaling", "keys"):
        table = payload[f"tables/{name}"]
        assert isinstance(table, wandb.Table)
        assert {"feature_map", "view"} <= set(table.columns)
    kinds = {key: chart.spec.spec_name for key, chart in payload.items()
             if key.startswith("charts/")}
    assert kinds["charts/loss_vs_keys"] == "wandb/line/v0"
    assert kinds["charts/observed_vs_predicted"] == "wandb/scatter/v0"
    assert kinds["charts/capacity_scaling/loss"] == "wandb/scatter/v0"
    for view in capacity.VIEWS:
        assert kinds[f"charts/capacity_efficiency/{view}"] == "wandb/bar/v0"
        assert kinds[f"charts/{view}_vs_keys"] == "wandb/line/v0"
    line = payload["charts/loss_vs_keys"]
    assert line.spec.fields == {"x": "n_keys", "y": "value", "stroke": "series"}
    rows = line.table.get_dataframe()
    assert set(rows["view"]) == {"loss"} and rows["value"].notna().all()
    bars = payload["charts/capacity_efficiency/accuracy"].table.get_dataframe()
    assert list(bars["rank"]) == list(range(1, len(bars) + 1))
    assert isinstance(payload["figures/loss_panels"], wandb.Image)
