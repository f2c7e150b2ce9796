"""The figures a reviewer keeps, on small synthetic stores (no training, no report): the
efficiency figure's seeds beside each median and its named interval; ``loss_vs_keys`` inside its
own x range with its annotations inside the axes and the rank bound's floor; fwm against its own
floor (and out of the heatmaps) and diverged runs marked at the top; every error bar named in
its legend; no figure of capacity against a quantity made from capacity."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure
from conftest import legend_labels
from synthetic import write_grid_store, write_update_store

from kernelzoo.analysis import efficiency, published, scaling
from kernelzoo.report import figures as capacity_figures
from kernelzoo.report import heatmaps, panels, plots, style
from kernelzoo.analysis.capacity import capacity_table, loss_failure, seed_table
from kernelzoo.analysis import pipeline
from kernelzoo.analysis.runs import load_runs

TAU = 0.01


def tables(exp):
    """(runs, seeds, capacity with its published columns, families) as ``analyze`` makes them."""
    runs, _, _ = load_runs(exp)
    runs["rank_bound"] = pipeline.rank_bounds(runs, TAU)
    seeds = seed_table(runs, TAU, 0.99)
    bounds = capacity_table(runs, seeds).set_index("label")["rank_bound"]
    capacity = published.capacity_columns(
        capacity_table(runs, seeds), published.points(runs),
        lambda label, n, loss: loss_failure(n, loss, np.zeros(len(n), bool), TAU,
                                            math.inf if pd.isna(bounds[label]) else bounds[label]))
    return runs, seeds, capacity, scaling.families(runs, seeds)


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    exp = tmp_path_factory.mktemp("results") / "grid"
    write_grid_store(exp)
    return tables(exp)


@pytest.fixture(scope="module")
def update(tmp_path_factory):
    exp = tmp_path_factory.mktemp("results") / "update"
    write_update_store(exp)
    return tables(exp)


@pytest.fixture
def drawn(monkeypatch, tmp_path):
    """Calls a figure function and returns the Figure it would have saved."""
    kept = []

    def keep(fig, path):
        kept.append(fig)
        return path

    for module in (plots, capacity_figures):
        monkeypatch.setattr(module, "save", keep)

    def draw(function, *args):
        function(*args, tmp_path)
        fig = kept.pop()
        fig.draw_without_rendering()  # lays out the texts, so their extents are real
        return fig
    return draw


def labels_of(fig) -> list[str]:
    """Every legend text of a figure, its axes' and its own."""
    legends = [ax.get_legend() for ax in fig.axes] + list(fig.legends)
    return [t.get_text() for leg in legends if leg is not None for t in leg.get_texts()]


def inside(artist, ax) -> bool:
    box, frame = artist.get_window_extent(), ax.get_window_extent()
    return (frame.x0 - 1 <= box.x0 and box.x1 <= frame.x1 + 1 and frame.y0 - 1 <= box.y0
            and box.y1 <= frame.y1 + 1)


def test_efficiency_shows_each_seed_beside_the_median_and_names_its_interval(grid, drawn):
    runs, seeds, capacity, _ = grid
    fig = drawn(capacity_figures.capacity_efficiency, capacity, seeds, style.config_colors(capacity["label"]))
    for ax in fig.axes:
        assert not ax.patches  # medians and intervals, no bars
        dots = [c for c in ax.collections if c.get_gid() == "seeds"]
        # ELU+1, DPFP-1, DPFP-2 with 3 seeds each; the one-seed configurations have no dots
        assert sum(len(c.get_offsets()) for c in dots) == 9
        bars = {c.get_gid(): c.get_linestyle() for c in ax.collections
                if c.get_gid() in ("interval", "bracket")}
        assert "interval" in bars
    texts = labels_of(fig)
    assert "solid bar: min-max of 3 seeds (order-statistic interval, 75%)" in texts
    assert "dashed bar: one seed's bracket [last pass, first fail]" in texts
    assert any(t.startswith("each seed") for t in texts)
    assert set(efficiency.efficiency_table(capacity)["interval"]) >= {
        "min-max of 3 seeds (order-statistic interval, 75%)",
        "bracket: one seed's [last pass, first fail]", "one seed: no interval"}


def test_loss_vs_keys_keeps_to_the_store_with_its_labels_inside(grid):
    runs, _, capacity, _ = grid
    points = published.points(runs)
    assert points["n_keys"].max() > 320  # the authors probed further than this store
    fig = Figure(figsize=(9, 5.5))
    ax = fig.add_subplot()
    plots.draw_loss_vs_keys(ax, runs, capacity, points, style.config_colors(capacity["label"]),
                            TAU)
    fig.draw_without_rendering()
    assert ax.get_xlim() == pytest.approx((0, 320 * 1.05))
    published_x = np.concatenate([line.get_xdata() for line in ax.get_lines()
                                  if line.get_gid() == "published"])
    assert len(published_x) and published_x.max() <= 320
    texts = [t for t in ax.texts if t.get_gid() == "d_dot-label"]
    assert [t.get_text() for t in texts] == ["d_dot 64, 65, 66", "d_dot 128", "d_dot 256"]
    assert all(inside(t, ax) for t in texts)
    floors = [line for line in ax.get_lines() if line.get_gid() == "rank-floor"]
    assert floors and max(max(line.get_xdata()) for line in floors) <= 320
    assert any("rank bound" in t for t in legend_labels(ax))


def test_fwm_against_its_floor_and_diverged_runs_at_the_top(update, drawn):
    runs, _, capacity, _ = update
    fig = drawn(plots.loss_vs_keys, runs, capacity, published.points(runs),
                style.config_colors(capacity["label"]), TAU)
    top, bottom = [ax for ax in fig.axes if ax.get_legend() is not None]
    assert "DPFP-1 fwm" in legend_labels(bottom)
    assert "DPFP-1 fwm" not in legend_labels(top)
    floor = [line for line in bottom.get_lines() if line.get_gid() == "fwm-floor"]
    assert len(floor) == 1
    assert floor[0].get_ydata() == pytest.approx(0.5 / floor[0].get_xdata())
    assert any("0.5 / S" in t for t in legend_labels(bottom))
    assert not any(line.get_gid() == "failure-point" for line in bottom.get_lines())
    assert not any(np.allclose(line.get_ydata(), TAU) for line in bottom.get_lines()
                   if len(line.get_ydata()))  # no tau line
    # FAVOR+ diverged at 60 and 100: x marks at the top of the axes, the median line broken
    marks = [line for line in top.get_lines() if line.get_gid() == "no-value"]
    assert [sorted(m.get_xdata()) for m in marks] == [[60, 100]]
    assert list(marks[0].get_ydata()) == [0.97, 0.97] and inside(marks[0], top)
    median = next(line for line in top.get_lines() if line.get_label() == "FAVOR+ m=32 delta")
    y = dict(zip(median.get_xdata(), median.get_ydata()))
    assert np.isnan(y[60]) and np.isnan(y[100]) and y[80] == pytest.approx(0.3)
    assert top.get_ylim()[1] < 1  # the marks do not stretch the scale
    assert any("2 diverged" in t for t in legend_labels(top))
    assert any("with replacement" in t for t in legend_labels(top))  # why no floor


def test_every_error_bar_says_what_it_is(grid, update, drawn):
    runs, seeds, capacity, families = grid
    colors = style.config_colors(capacity["label"])
    fig = drawn(capacity_figures.observed_vs_predicted, capacity, colors, TAU)
    texts = labels_of(fig)
    assert "solid bar: min-max of 3 seeds (order-statistic interval, 75%)" in texts
    assert "dashed bar: one seed's bracket [last pass, first fail]" in texts
    styles = {c.get_gid() for c in fig.axes[0].collections}
    assert {"interval", "bracket"} <= styles
    fig = drawn(capacity_figures.capacity_scaling, families)
    assert any(t.startswith("solid bar: min-max of 3 seeds") for t in labels_of(fig))
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["128", "256"]
    _, _, capacity, _ = update  # fwm's loss view has a floor: left out, and said so
    fig = drawn(capacity_figures.observed_vs_predicted, capacity, style.config_colors(capacity["label"]),
                TAU)
    assert any(t.startswith("left out: DPFP-1 fwm") for t in labels_of(fig))
    assert "DPFP-1 fwm" not in labels_of(fig)


def test_a_heatmap_leaves_fwm_out_and_says_so(grid, monkeypatch, tmp_path):
    runs = grid[0]
    dpfp = runs[runs["label"] == "DPFP-1"]
    with_fwm = pd.concat([runs, dpfp.assign(update_rule="fwm", label="DPFP-1 fwm",
                                            final_eval_loss=0.5)], ignore_index=True)
    figures = []
    monkeypatch.setattr(heatmaps, "save", lambda fig, path: figures.append(fig) or path)
    paths, omitted = heatmaps.heatmaps(with_fwm, TAU, tmp_path)
    assert [p.stem for p in paths] == ["heatmap_dpfp"]
    rows = [t.get_text() for t in figures[0].axes[0].get_yticklabels()]
    assert rows == ["DPFP-1 (d_dot=128)", "DPFP-2 (d_dot=256)"]
    assert any(line.startswith("heatmaps: the fwm configurations are left out") for line in omitted)


ACROSS = {"", "predicted capacity d_dot (log)", "d_dot (log)"}  # what capacity is drawn against


def test_no_figure_draws_capacity_against_a_quantity_made_from_it(grid, monkeypatch, tmp_path):
    """Every figure of the analysis: a failure point on one axis has d_dot or the
    configurations on the other, never a quantity measured at or defined from the failure point
    itself."""
    runs, seeds, capacity, families = grid
    figures = {}
    for module in (plots, capacity_figures, panels):
        monkeypatch.setattr(module, "save", lambda fig, path: figures.setdefault(path.stem, fig)
                            and path)
    paths, _ = capacity_figures.all_figures(runs, seeds, capacity, published.points(runs), pd.DataFrame(),
                                 families, tmp_path, TAU, 0.99, search=True)
    assert {p.stem for p in paths} == set(figures) == {
        "headline", "loss_panels", "accuracy_panels", "loss_vs_keys", "observed_vs_predicted",
        "capacity_scaling", "capacity_efficiency", "curves", "keys_retrieved_panels"}
    drawn = 0
    for name, fig in figures.items():
        for ax in fig.axes:
            if "failure point" in ax.get_ylabel():
                assert ax.get_xlabel() in ACROSS, (name, ax.get_xlabel())
                drawn += 1
            if "failure point" in ax.get_xlabel():  # the horizontal dot plot of efficiency
                assert ax.get_ylabel() in ACROSS, (name, ax.get_ylabel())
                drawn += 1
    # headline's first, observed_vs_predicted, capacity_scaling's first, 3 efficiencies
    assert drawn == 1 + 1 + 1 + 3


def test_the_keys_retrieved_panels_star_each_failure_point_under_y_equals_x(update, monkeypatch,
                                                                             tmp_path):
    """The keys-retrieved view in small multiples: one panel per family, every key retrieved the
    dotted y = x, and each configuration that fails at a point starred at its value (the most
    keys retrieved) over an n_keys it ran."""
    runs, _, capacity, families = update
    kept = []
    monkeypatch.setattr(panels, "save", lambda fig, path: kept.append((fig, path)) or path)
    path = panels.key_panels(runs, capacity, families, None, tmp_path, "keys_retrieved")
    fig, saved = kept.pop()
    assert path == saved == tmp_path / "keys_retrieved_panels.png"
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert len(shown) == len(panels.panels(families, capacity))
    diagonal = [line for ax in shown for line in ax.get_lines()  # to the panel's largest S
                if line.get_linestyle() == ":" and list(line.get_xdata())[0] == 0
                and list(line.get_xdata()) == list(line.get_ydata())]
    assert len(diagonal) == len(shown)
    stars = [line for ax in shown for line in ax.get_lines() if line.get_gid() == "failure-point"]
    failing = capacity[capacity["outcome_keys"] == "fails_at"]
    assert len(stars) == len(failing) > 0
    assert sorted(float(s.get_ydata()[0]) for s in stars) == \
        pytest.approx(sorted(failing["observed_capacity_keys"]))
    assert {float(s.get_xdata()[0]) for s in stars} <= set(runs["n_keys"].astype(float))


def test_a_familys_sizes_are_shades_of_its_hue_and_neighbours_never_twins():
    """DPFP-1/2/3 shared one blue (and marker), and past ten families tab20's pairs put ELU+1
    beside DPFP, ReLU beside ReLU^2 in near-identical colours."""
    import colorsys

    from matplotlib.colors import to_rgb

    from kernelzoo.report.style import family_colors, shades

    dpfp = shades("tab:blue", 3)
    assert len({c[:3] for c in dpfp}) == 3
    hues = {round(colorsys.rgb_to_hls(*c[:3])[0], 3) for c in dpfp}
    assert len(hues) == 1
    light = [colorsys.rgb_to_hls(*c[:3])[1] for c in dpfp]
    assert light == sorted(light)  # dark to light in size order
    many = family_colors([f"family {i}" for i in range(12)])
    ordered = [many[f"family {i}"] for i in range(12)]
    hue = lambda c: colorsys.rgb_to_hls(*to_rgb(c))[0]  # noqa: E731
    assert all(abs(hue(a) - hue(b)) > 0.02 for a, b in zip(ordered, ordered[1:10]))
