"""Tiers and measured flags (kernelzoo.analysis.tiers): configurations whose intervals overlap
share a tier, bounds stand apart, the flags come from the runs; and on the committed zoo store
how many of the swaps between views a flag bears on."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from kernelzoo.analysis import pipeline, tiers
from kernelzoo.report.rankings import flag_words, tier_section
from synthetic import seeds_of_capacity

ZOO = Path(__file__).resolve().parents[1] / "results" / "reference" / "zoo"


def capacity_of(rows: list[tuple]) -> pd.DataFrame:
    """Capacity rows (label, d_dot, accuracy median, low, high, outcome); every view alike."""
    out = []
    for label, d_dot, value, low, high, outcome in rows:
        row = {"label": label, "predicted_capacity": d_dot, "d_key": 16, "n_seeds": 3,
               "ci_level": 0.75}
        for s in ("", "_acc", "_keys"):
            row.update({f"observed_capacity{s}": value, f"ci_low{s}": low, f"ci_high{s}": high,
                        f"ratio{s}": value / d_dot, f"outcome{s}": outcome})
        out.append(row)
    return pd.DataFrame(out)


def test_tiers_are_cut_by_tukeys_hsd_and_bounds_stand_apart():
    capacity = capacity_of([("A", 64, 60, 58, 62, "fails_at"), ("B", 64, 57, 55, 59, "fails_at"),
                            ("C", 64, 50, 45, 56, "fails_at"), ("D", 64, 40, 38, 42, "fails_at"),
                            ("E", 64, 40, 38, 42, "fails_at"), ("F", 64, 256, 256, 256,
                                                               "never_fails")])
    seeds = seeds_of_capacity(capacity)
    placed = {p.label: p for p in tiers.tiers(capacity, seeds) if p.view == "accuracy"}
    # HSD does not separate A and B, nor B and C, but A and C: C opens the next tier, never one
    # by a chain (ReLU [0.62, 0.79] shared the zoo's first tier with DPFP-4 [0.95, 0.96]); D
    # and E tie
    hsd = stats.tukey_hsd(*[seeds.loc[seeds["label"] == x, "value_acc"] for x in "ABCDE"])
    assert hsd.pvalue[0, 1] >= tiers.ALPHA and hsd.pvalue[1, 2] >= tiers.ALPHA
    assert hsd.pvalue[0, 2] < tiers.ALPHA and hsd.pvalue[2, 3] < tiers.ALPHA
    assert {k: p.tier for k, p in placed.items()} == {"A": 1, "B": 1, "C": 2, "D": 3, "E": 3,
                                                      "F": None}
    assert placed["F"].efficiency == 4.0
    lines = tier_section(capacity, tuple(placed_all := tiers.tiers(capacity, seeds)), None)
    assert placed["F"].apart == "bound" and len(placed_all) == 18
    row = next(line for line in lines if line.startswith("| F |"))
    assert "bound: >= 4.00" in row
    assert [line.split(" |")[0] for line in lines if line.startswith("| ")][1:] == [
        "| A", "| B", "| C", "| D", "| E", "| F"]


def test_flags_are_measured_on_the_runs():
    """Seed 1 of X fails the loss view at 40 keys while answering every key (diluted), and both
    seeds retrieve 2 x the keys they pass the accuracy view at (partial retrieval)."""
    runs = pd.DataFrame([
        {"label": "X", "seed": s, "n_keys": n, "status": "plateau", "final_eval_loss": loss,
         "final_eval_accuracy": acc}
        for s in (1, 2) for n, loss, acc in ((20, 1e-4, 1.0), (40, 0.5 if s == 1 else 1e-4,
                                                                 1.0), (100, 0.5, 0.8))])
    capacity = capacity_of([("X", 64, 40, 40, 40, "fails_at")])
    found = tiers.flags(capacity, runs, 0.01, 0.99).iloc[0]
    assert found["diluted"] and found["partial"] and found["bound"] == []
    assert flag_words(found) == "diluted read-out; partial retrieval"


# (worse in the first view, better in the second): the flag that bears on a swap between them
BEARS = {("loss", "accuracy"): ("diluted", None), ("accuracy", "keys_retrieved"): (None, "partial"),
         ("loss", "keys_retrieved"): ("diluted", "partial")}


def explains(placed, flag_rows: pd.DataFrame) -> tuple[int, int]:
    """(swaps a flag bears on, swaps) as docs/analysis.md defines them: a swap is two
    configurations of one size in different tiers in two views, in opposite orders; a flag bears
    on it in its direction (BEARS: the one worse in the loss view has a diluted read-out, or the
    one better in keys retrieved partial retrieval, and the other has not)."""
    tier_rows = pd.DataFrame([(p.label, p.size, p.view, p.tier) for p in placed],
                             columns=["label", "size", "view", "tier"]).astype({"tier": "Int64"})
    flagged = flag_rows.set_index("label")
    borne = swaps = 0
    for _, rows in tier_rows.groupby("size"):
        rows = rows.pivot(index="label", columns="view", values="tier").reindex(
            columns=list(tiers.VIEWS))
        for (a, b), (worse_a, better_b) in BEARS.items():
            ta, tb = rows[a], rows[b]
            both = rows.index[ta.notna() & tb.notna()]
            for i, x in enumerate(both):
                for y in both[i + 1:]:
                    if ta[x] == ta[y] or tb[x] == tb[y] or (ta[x] < ta[y]) == (tb[x] < tb[y]):
                        continue
                    swaps += 1
                    low_a, high_a = (x, y) if ta[x] > ta[y] else (y, x)  # worse in a
                    borne += any(flagged.loc[low_a, f] and not flagged.loc[high_a, f]
                                 for f in (worse_a, better_b) if f)
    return borne, swaps


@pytest.mark.skipif(not (ZOO / "runs.parquet").exists(), reason="no committed zoo store")
def test_the_flags_describe_the_swaps_between_views_in_the_zoo():
    """The zoo store (d_dot 64 and 128): the flags bear on 36 of the 37 swaps between views. A
    description, not a test against chance: each flag is close to the swap it bears on by its
    definition (a diluted read-out fails the loss view while answering every key), so no share
    of random swaps is claimed (docs/analysis.md, Tiers per view and measured flags)."""
    capacity = pd.read_csv(ZOO / "capacity.csv")
    runs = pd.read_parquet(ZOO / "runs.parquet")
    runs = runs[runs["stall_check_of"].isna()]
    seeds = pipeline.seeds_of(ZOO, "zoo", 0.01, 0.99)
    assert explains(tiers.tiers(capacity, seeds), tiers.flags(capacity, runs, 0.01, 0.99)) \
        == (36, 37)


def test_the_tiers_hsd_is_scipys_tukey_hsd():
    """On random families (2 to 8 configurations of 2 to 5 seeds), a pair is separated exactly
    where scipy's ``tukey_hsd`` gives p below ALPHA."""
    rng = np.random.default_rng(7)
    for _ in range(12):  # scipy's p-values are the slow part: ~0.2 s a family
        k = int(rng.integers(2, 9))
        samples = {f"c{i}": rng.normal(rng.normal(0, 1.5), 1.0, int(rng.integers(2, 6)))
                   for i in range(k)}
        ours = tiers.separated(samples)
        p = stats.tukey_hsd(*samples.values()).pvalue
        labels = list(samples)
        assert ours == {(a, b): bool(p[i, j] < tiers.ALPHA) for i, a in enumerate(labels)
                        for j, b in enumerate(labels) if i != j}
    assert tiers.separated({"a": np.ones(3), "b": np.ones(3)}) is None  # no spread: no test


def test_the_seeds_to_separate_a_pair_are_the_tiers_own_power_solved_for_n():
    """Four configurations, one 0.12 above the others, seeds spread by 0.06 (failure point /
    d_dot): HSD separates the pair with 80% power first at n = 8 seeds each, checked against
    the test itself on 2000 simulated families at n and n - 1 (80.3% and 74.4%)."""
    k, sd, d = 4, 0.06, 0.12
    n = tiers.seeds_to_separate(d, sd ** 2, k)
    assert n == 8
    rng = np.random.default_rng(0)

    def rate(m: int) -> float:
        hits = 0
        for _ in range(2000):
            found = tiers.separated({f"c{i}": rng.normal(d if i == 0 else 0.0, sd, m)
                                      for i in range(k)})
            hits += found["c0", "c1"]
        return hits / 2000
    assert 0.78 <= rate(n) and rate(n - 1) < 0.78
    assert tiers.seeds_to_separate(0.0, sd ** 2, k) is None
    assert tiers.seeds_to_separate(d, 0.0, k) is None
