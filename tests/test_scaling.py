"""The d_dot law per view (kernelzoo.analysis.scaling): the families of a synthetic store, their ratios
per level and laws, and what the analysis writes (no training). The law's fit and its coverage
are tested in test_intervals.py."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from synthetic import analyze_store, write_series

from kernelzoo.analysis import scaling, settings
from kernelzoo.analysis.capacity import seed_table
from kernelzoo.analysis.runs import load_runs
from kernelzoo.report import figures as capacity_figures
from kernelzoo.report import scaling as scaling_words

TAU = 0.01


def write_family_store(exp) -> None:
    """ELU+1 at d_key = d_dot 16, 32, 64 (one family: d_key follows d_dot); DPFP at d_key 16, nu
    1, 2, 3 (d_dot 32, 64, 96: one family); DPFP at d_key 8, nu 2, 4 (d_dot 32, 64: another
    family, at 2 d_dot values: not fitted); the fixed FAVOR+ failing everywhere; softmax. Seed
    1 passes to 0.5 d_dot, seed 2 to 0.75 d_dot, each failing from the next grid point (below
    the rank bound)."""
    configs = [dict(feature_map="elu", d_key=d, d_dot=d) for d in (16, 32, 64)]
    configs += [dict(feature_map="dpfp", params={"nu": nu}, d_key=16, d_dot=32 * nu)
                for nu in (1, 2, 3)]
    configs += [dict(feature_map="dpfp", params={"nu": nu}, d_key=8, d_dot=16 * nu)
                for nu in (2, 4)]
    for config in configs:
        grid = [config["d_dot"] * f // 4 for f in (2, 3, 4, 5)]
        for seed, last in ((1, grid[0]), (2, grid[1])):
            write_series(exp, {n: 1e-4 if n <= last else 0.3 for n in grid}, seed=seed, **config)
    for m in (32, 64, 128):
        write_series(exp, {n: 0.5 for n in (16, 32)}, feature_map="favor",
                     params={"m": m, "variant": "positive"}, d_key=16, d_dot=m)
    write_series(exp, {n: 1e-5 for n in (16, 32)}, feature_map="softmax", d_dot=None)


RATIOS = (0.5 + 0.25 * math.log(100) / math.log(3000), 0.75 + 0.25 * math.log(100) / math.log(3000))


def test_families_group_what_d_dot_decides_and_fit_from_three_levels(tmp_path):
    write_family_store(tmp_path / "s")
    runs, _, _ = load_runs(tmp_path / "s")
    found = scaling.families(runs, seed_table(runs, TAU, 0.99))
    assert [(f.name, f.d_key, f.laws["loss"] is not None) for f in found] == [
        ("DPFP d_key=8", 8, False), ("DPFP d_key=16", 16, True), ("ELU+1", None, True)]
    elu = found[2]
    assert len(elu.fitted("loss")) == 6 and set(elu.fitted("loss")["d_dot"]) == {16, 32, 64}
    levels = elu.departures("loss")
    assert levels["ratio"].tolist() == pytest.approx([np.mean(RATIOS)] * 3)  # 2 seeds: mean
    assert (levels["ratio_low"].tolist(), levels["ratio_high"].tolist()) == (
        pytest.approx([RATIOS[0]] * 3), pytest.approx([RATIOS[1]] * 3))
    assert levels["ratio_level"].tolist() == [0.5] * 3  # the min-max of 2 seeds
    law = elu.laws["loss"]
    assert law.b == pytest.approx(1.0) and law.a == pytest.approx(np.mean(RATIOS))
    # the same ratio at every level, 0.72 and not 1: n* = d_dot is rejected
    assert law.p_identity < 1e-9 and law.follows is False


@pytest.mark.slow  # draws the figures (make test-slow); test_plots writes scaling.csv end to end
def test_the_analysis_writes_scaling_csv_the_figure_and_the_section(tmp_path, capsys):
    results = tmp_path / "results"
    write_family_store(results / "s")
    exp = analyze_store(results, "s", TAU, figures=True)
    table = pd.read_csv(exp / "scaling.csv")
    assert list(table.columns) == list(scaling.COLUMNS)
    loss = table[table["view"] == "loss"]
    assert loss.groupby("family")["d_dot"].apply(list).to_dict() == {
        "DPFP d_key=8": [32, 64], "DPFP d_key=16": [32, 64, 96], "ELU+1": [16, 32, 64]}
    elu = loss[loss["family"] == "ELU+1"]
    assert elu["d_key"].isna().all() and (elu["n_seeds"] == 2).all()
    assert not elu["follows_d_dot"].any() and elu["b"].iloc[0] == pytest.approx(1.0)
    assert loss.loc[loss["family"] == "DPFP d_key=8", "b"].isna().all()
    assert (exp / "capacity_scaling.png").read_bytes()[:4] == b"\x89PNG"
    assert b"<svg" in (exp / "capacity_scaling.svg").read_bytes()[:500]
    report = (exp / "report.md").read_text()
    for needle in ("## Capacity against d_dot, per view",
                   f"| ELU+1 | loss | 3 | {np.mean(RATIOS):.3g} [",
                   f"| n* = d_dot rejected at 2.5% (F test p < 0.0001) | 16: {np.mean(RATIOS):.2f} "
                   f"[{RATIOS[0]:.2f}, {RATIOS[1]:.2f}] (50%); 32: ",
                   "| DPFP d_key=8 | loss | 2 | – | – | not fitted |",
                   "![](capacity_scaling.png)"):
        assert needle in report, needle
    capsys.readouterr()
    scaling_words.main([str(exp / "scaling.csv"), str(tmp_path / "none.csv")])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{exp / 'scaling.csv'}:"
    assert out[1].startswith("  DPFP d_key=8 (loss view): failure point / d_dot per level")
    assert "not fitted, failure points at 2 d_dot levels" in out[1]
    assert any(line.startswith("  ELU+1 (loss view): failure point") and "n* = d_dot rejected at 2.5%" in line
               for line in out)
    assert out[-1].startswith(f"{tmp_path / 'none.csv'}: unreadable")


def test_nearby_d_dot_levels_share_one_tick_labelled_with_their_range():
    assert capacity_figures._ticks([64, 65, 66, 128, 135, 136, 512]) == {64: "64-66", 128: "128-136",
                                                                512: "512"}


def test_a_law_on_bounds_alone_cannot_tell_and_names_the_bounds():
    """Three levels whose seeds all passed the top probe: no law, the verdict says so."""
    rows = pd.DataFrame([{"family": "ELU+1", "view": "keys_retrieved", "n_d_dot": 0,
                          "b": math.nan, "verdict": "cannot tell", "d_dot": d, "n_seeds": 0,
                          "n_bounds": 5, "ratio": math.nan, "ratio_lowest": 1.03,
                          "ratio_highest": math.inf, "ratio_low": 1.0, "ratio_high": math.inf,
                          "ratio_level": 0.9375} for d in (64, 128, 256)])
    words = scaling_words.sentence(rows)
    assert "256: >= 1.03 [1.00, inf) (94%; 5 of 5 seeds bounds)" in words
    assert words.endswith("n* = d_dot: cannot tell: bounded at >= 65.92 (d_dot 64), >= 131.8 "
                          "(d_dot 128), >= 263.7 (d_dot 256).")


def test_a_level_with_bounds_keeps_every_seed_and_a_weak_test_cannot_tell(tmp_path):
    """The last ELU+1 level: seed 2 never fails (a lower bound at its top probe), seed 1 fails
    at a point: both counted; the law's 2-seed design has little power: "cannot tell"."""
    write_family_store(tmp_path / "s")
    write_series(tmp_path / "s", {n: 1e-4 for n in (32, 48, 64)}, seed=3, feature_map="elu",
                 d_key=64, d_dot=64)
    runs, _, _ = load_runs(tmp_path / "s")
    elu = [f for f in scaling.families(runs, seed_table(runs, TAU, 0.99)) if f.name == "ELU+1"][0]
    top = elu.departures("loss").iloc[-1]
    assert (top["n_seeds"], top["n_bounds"]) == (2, 1) and top["ratio_high"] == math.inf
    assert top["ratio"] == pytest.approx(RATIOS[1])  # the median of 3: the bound lies above it
    rows = scaling.table([elu])
    loss = rows[rows["view"] == "loss"]
    assert set(loss["verdict"]) == {"cannot tell"} and loss["power"].iloc[0] < 0.5
    assert loss["p_identity"].iloc[0] >= 0.05


def test_a_configuration_split_by_a_setting_is_its_own_family(tmp_path):
    """ELU+1 at d_dot 16, 32, 64 with the normaliser (seeds 1, 2) and without it (seeds 3, 4):
    ``settings.split`` makes two configurations per d_dot, and each setting keeps its family."""
    for d in (16, 32, 64):
        grid = [d * f // 4 for f in (2, 3, 4, 5)]
        for seed, last, normalisation in ((1, grid[0], "attention"), (2, grid[1], "attention"),
                                          (3, grid[2], "none"), (4, grid[2], "none")):
            write_series(tmp_path / "s", {n: 1e-4 if n <= last else 0.3 for n in grid},
                         seed=seed, d_key=d, d_dot=d,
                         config=f"memory:\n  normalisation: {normalisation}\n")
    runs, _, _ = load_runs(tmp_path / "s")
    runs, lines = settings.split(runs)
    assert len(lines) == 3 and set(runs["setting"]) == {"memory.normalisation=attention",
                                                        "memory.normalisation=none"}
    found = scaling.families(runs, seed_table(runs, TAU, 0.99))
    assert [(f.name, len(f.points)) for f in found] == [
        ("ELU+1 memory.normalisation=attention", 6), ("ELU+1 memory.normalisation=none", 6)]
    assert found[1].departures("loss")["ratio"].tolist() == pytest.approx(
        [1.0 + 0.25 * math.log(100) / math.log(3000)] * 3)  # both seeds pass to d_dot
