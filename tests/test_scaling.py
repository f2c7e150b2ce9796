"""The d_dot law (kernelzoo.scaling): the fit on synthetic failure points drawn from known laws,
the families of a synthetic store, and what the analysis writes (no training)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from synthetic import analyze_store, write_series

from kernelzoo import analyze, scaling
from kernelzoo.capacity import seed_table

TAU = 0.01
D_DOTS = np.array([16, 32, 64, 128, 256])


def drawn(a: float, b: float, noise: float, seeds: int = 5, rng_seed: int = 1):
    """Failure points a d_dot^b times log-normal noise, ``seeds`` per d_dot of D_DOTS."""
    d_dot = np.repeat(D_DOTS, seeds)
    rng = np.random.default_rng(rng_seed)
    return d_dot, a * d_dot ** b * np.exp(rng.normal(0, noise, len(d_dot)))


def test_a_linear_law_is_recovered_within_its_interval_and_follows_d_dot():
    law = scaling.power_law(*drawn(0.9, 1.0, 0.05))
    assert law.a_low < law.a < law.a_high and law.b_low < law.b < law.b_high
    assert law.a_low <= 0.9 <= law.a_high and law.b_low <= 1.0 <= law.b_high
    assert law.b == pytest.approx(1.0, abs=0.03) and law.a == pytest.approx(0.9, rel=0.1)
    assert law.follows is True
    assert law == scaling.power_law(*drawn(0.9, 1.0, 0.05))  # RNG seed 0: the same interval


def test_a_sublinear_law_with_tight_noise_does_not_follow_d_dot():
    law = scaling.power_law(*drawn(2.0, 0.8, 0.02))
    assert law.b_low <= 0.8 <= law.b_high and law.a_low <= 2.0 <= law.a_high
    assert law.b_high < 1 and law.follows is False
    low, high = law.band(D_DOTS)
    assert np.all(low < law.a * D_DOTS ** law.b) and np.all(law.a * D_DOTS ** law.b < high)


def test_the_interval_covers_the_true_slope_most_of_the_time():
    """Percentile intervals from 5 seeds per d_dot are a little narrow (module docstring: about
    88%): over 100 drawn studies the 95% interval of b covers the truth in most."""
    covered = 0
    for rng_seed in range(100):
        law = scaling.power_law(*drawn(0.9, 1.0, 0.1, rng_seed=rng_seed), samples=500)
        covered += law.b_low <= 1.0 <= law.b_high
    assert covered >= 80


def test_one_seed_per_d_dot_has_a_fit_but_no_interval():
    law = scaling.power_law(*drawn(0.9, 1.0, 0.05, seeds=1))
    assert law.b == pytest.approx(1.0, abs=0.1)
    assert math.isnan(law.b_low) and math.isnan(law.a_high) and law.follows is None


def write_family_store(exp) -> None:
    """ELU+1 at d_key = d_dot 16, 32, 64 (one family: d_key follows d_dot); DPFP at d_key 16, nu
    1, 2, 3 (d_dot 32, 64, 96: one family); DPFP at d_key 8, nu 2, 4 (d_dot 32, 64: another
    family, at 2 d_dot values: not fitted); the fixed FAVOR+ failing everywhere; softmax. Seed
    1 passes to 0.75 d_dot, seed 2 to d_dot, each failing from the next grid point."""
    configs = [dict(feature_map="elu", d_key=d, d_dot=d) for d in (16, 32, 64)]
    configs += [dict(feature_map="dpfp", params={"nu": nu}, d_key=16, d_dot=32 * nu)
                for nu in (1, 2, 3)]
    configs += [dict(feature_map="dpfp", params={"nu": nu}, d_key=8, d_dot=16 * nu)
                for nu in (2, 4)]
    for config in configs:
        grid = [config["d_dot"] * f // 4 for f in (2, 3, 4, 5)]
        for seed, last in ((1, grid[1]), (2, grid[2])):
            write_series(exp, {n: 1e-4 if n <= last else 0.3 for n in grid}, seed=seed, **config)
    for m in (32, 64, 128):
        write_series(exp, {n: 0.5 for n in (16, 32)}, feature_map="favor",
                     params={"m": m, "variant": "positive"}, d_key=16, d_dot=m)
    write_series(exp, {n: 1e-5 for n in (16, 32)}, feature_map="softmax", d_dot=None)


RATIOS = (0.75 + 0.25 * math.log(100) / math.log(3000), 1 + 0.25 * math.log(100) / math.log(3000))


def test_families_group_what_d_dot_decides_and_skip_fewer_than_three_d_dot(tmp_path):
    write_family_store(tmp_path / "s")
    runs, _, _ = analyze.load_runs(tmp_path / "s")
    found = scaling.families(runs, seed_table(runs, TAU, 0.99))
    assert [(f.name, f.d_key, f.law is not None) for f in found] == [
        ("DPFP d_key=8", 8, False), ("DPFP d_key=16", 16, True), ("ELU+1", None, True)]
    elu = found[2]
    assert len(elu.fitted()) == 6 and set(elu.fitted()["d_dot"]) == {16, 32, 64}
    assert elu.law.b == pytest.approx(1.0)  # the same two ratios at every d_dot
    assert elu.law.a == pytest.approx(math.sqrt(RATIOS[0] * RATIOS[1]))
    assert elu.departures()["ratio"].tolist() == pytest.approx([np.mean(RATIOS)] * 3)
    assert "ELU+1: n* = " in elu.words() and "contains 1: it follows d_dot" in elu.words()
    assert found[0].words().startswith("DPFP d_key=8: not fitted, failure points at 2 d_dot values")


def test_the_analysis_writes_scaling_csv_the_figure_and_the_section(tmp_path, capsys):
    results = tmp_path / "results"
    write_family_store(results / "s")
    exp = analyze_store(results, "s", TAU)
    table = pd.read_csv(exp / "scaling.csv")
    assert list(table.columns) == list(scaling.COLUMNS)
    assert table.groupby("family")["d_dot"].apply(list).to_dict() == {
        "DPFP d_key=8": [32, 64], "DPFP d_key=16": [32, 64, 96], "ELU+1": [16, 32, 64]}
    elu = table[table["family"] == "ELU+1"]
    assert elu["d_key"].isna().all() and (elu["n_seeds"] == 2).all()
    assert elu["follows_d_dot"].all() and elu["b"].iloc[0] == pytest.approx(1.0)
    assert table.loc[table["family"] == "DPFP d_key=8", "b"].isna().all()
    assert (exp / "capacity_scaling.png").read_bytes()[:4] == b"\x89PNG"
    assert b"<svg" in (exp / "capacity_scaling.svg").read_bytes()[:500]
    report = (exp / "report.md").read_text()
    for needle in ("## Capacity against d_dot: n* = a d_dot^b per family", scaling.METHOD,
                   f"| ELU+1 | 6 | 16–64 | {math.sqrt(RATIOS[0] * RATIOS[1]):.3g} [",
                   f"| yes | 16: {np.mean(RATIOS):.2f}; 32: ", "- DPFP d_key=8: not fitted",
                   "![](capacity_scaling.png)"):
        assert needle in report, needle
    capsys.readouterr()
    scaling.main([str(exp / "scaling.csv"), str(tmp_path / "none.csv")])
    out = capsys.readouterr().out.splitlines()
    runs, _, _ = analyze.load_runs(exp)
    words = [f.words() for f in scaling.families(runs, seed_table(runs, TAU, 0.99))]
    assert out[1:4] == [f"  {w}" for w in words]  # the same sentences from the csv read back
    assert out[4].startswith(f"{tmp_path / 'none.csv'}: unreadable")
