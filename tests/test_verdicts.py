"""Every verdict as facts (analysis/verdicts.py, verdicts.csv): stable ids, a closed vocabulary of
outcomes, each kind's calibration as the committed calibration table measured it, and a missed
kind's decisive outcomes said as "uncalibrated"."""

from __future__ import annotations

import math
import re
from pathlib import Path

import calibrate
import pandas as pd
import pytest
from test_optimisation import study

from kernelzoo.analysis import optimisation, verdicts
from kernelzoo.analysis.labels import is_search

ROOT = Path(__file__).resolve().parents[1]
STORES = sorted((ROOT / "results" / "reference").glob("*/verdicts.csv"))
OUTCOMES = {  # each kind's closed vocabulary
    "n* <= d_dot": r"below|at|above|cannot tell",
    "published comparison": r"consistent|differs|same bound|other outcome|one seed|cannot tell",
    "d_dot law": r"rejected|consistent|cannot tell|uncalibrated",
    "tiers": r"tier \d+|apart: (bound|a seed is a bound|one seed|no spread)",
    "between sizes": r"rank correlation|moved by its own change: (falls|rises)",
    "optimisation": "|".join(map(re.escape, (*optimisation.VERDICTS, "uncalibrated"))),
    "factorial effects": r"raises|lowers|cannot tell",
    "stall clearance": r"cleared|still fails|passed before its check"}


def test_the_committed_stores_have_facts_with_stable_ids():
    assert len(STORES) >= 9
    for path in STORES:
        facts = pd.read_csv(path)
        assert list(facts.columns) == list(verdicts.COLUMNS), path
        assert facts["id"].is_unique, path
        assert set(facts["kind"]) <= set(verdicts.KINDS), path
        for r in facts.itertuples():
            assert r.id.startswith(verdicts.KINDS[r.kind] + "."), r
            assert re.fullmatch(OUTCOMES[r.kind], r.outcome), r
            assert r.calibration in ("met", "not run", "not harnessed", "missed"), r


def test_each_kind_is_said_calibrated_only_where_the_committed_table_met_its_bounds():
    table = pd.read_csv(ROOT / "results" / "calibration.csv")
    met = table.groupby("kind")["met"].all()
    names = {"published comparison": ["published comparison"], "d_dot law": ["d_dot law"],
             "tiers": ["tiers"], "optimisation": ["optimisation, learning rate (Welch)",
                                                  "optimisation, stopping rule (paired)"]}
    for kind, word in verdicts.CALIBRATION.items():
        if kind in names:
            assert word == ("met" if all(met[n] for n in names[kind]) else "missed"), kind
        else:
            assert word == "not harnessed" and kind not in calibrate.KINDS, kind


def test_a_missed_kind_says_uncalibrated_and_keeps_its_numbers():
    fact = verdicts._fact("d_dot law", "ELU+1", "loss", estimate=0.8, low=0.7, high=0.9,
                          outcome="rejected", calibration="missed")
    assert fact["outcome"] == verdicts.UNCALIBRATED
    assert (fact["estimate"], fact["low"], fact["high"]) == (0.8, 0.7, 0.9)
    undecided = verdicts._fact("d_dot law", "ELU+1", "loss", outcome="cannot tell",
                               calibration="missed")
    assert undecided["outcome"] == "cannot tell"  # it decided nothing: nothing to retract


def test_the_paper_bound_facts_are_the_loss_views_intervals_against_d_dot():
    capacity = pd.DataFrame({"label": ["a", "b"], "predicted_capacity": [64.0, 32.0],
                             "outcome": ["fails_at", "fails_at"], "ratio": [0.5, 0.9],
                             "ci_low": [30.0, 27.0], "ci_high": [34.0, 33.0], "n_seeds": [3, 5],
                             "ci_level": [0.75, 0.9375]})
    found = pd.DataFrame(verdicts.paper_bound(capacity)).set_index("subject")
    assert found.loc["a", "outcome"] == "below" and found.loc["b", "outcome"] == "at"
    assert found.loc["a", "high"] == pytest.approx(34 / 64) and found.loc["b", "n"] == 5


def test_the_optimisation_fact_is_the_decisive_levels_bound():
    """One row per configuration and view: the level with the highest lower bound and the
    largest upper bound over the levels, the verdict decide() reads from them."""
    seeds, capacity = study({("ELU+1", 64): {"0.001": [50.0, 51.0, 49.0],
                                             "0.003": [63.0, 64.0, 62.0],
                                             "0.0003": [50.0, 52.0, 48.0]}})
    tables = optimisation.tables(seeds, capacity)
    found = pd.DataFrame(verdicts.moves(tables))
    loss = found[found["view"] == "loss"].iloc[0]
    assert loss["id"] == "optimisation.ELU+1.loss.lr"
    assert loss["outcome"] == "rises beyond the margin" and loss["estimate"] == pytest.approx(13)
    assert loss["low"] > loss["against"] == pytest.approx(6.4)
    assert loss["level"] == 1 - optimisation.ALPHA and not math.isnan(loss["high"])
    grid = pd.DataFrame(verdicts.moves(optimisation.tables(seeds, capacity, grid=True)))
    assert set(grid["calibration"]) == {"missed"} and set(grid["outcome"]) == {"cannot tell"}


def test_a_grid_stores_law_is_missed_and_a_searchs_met_or_not_run():
    for path in STORES:
        facts = pd.read_csv(path)
        law = facts[facts["kind"] == "d_dot law"]
        if law.empty:
            continue
        runs = pd.read_parquet(path.parent / "runs.parquet")
        if "stall_check_of" in runs:
            runs = runs[runs["stall_check_of"].isna()]
        expected = {"missed"} if not is_search(runs) else {"met", "not run"}
        assert set(law["calibration"]) <= expected, path


def test_each_stores_headlines_say_what_its_facts_hold():
    """headlines.csv formats verdicts.csv: the n* <= d_dot counts, each published comparison's
    word and each law's verdict in a headline are its facts'."""
    for path in STORES:
        facts = pd.read_csv(path)
        lines = pd.read_csv(path.parent / "headlines.csv").set_index("id")["evidence"]
        paper = facts[facts["kind"] == "n* <= d_dot"]["outcome"].value_counts()
        if "n_le_d_dot" in lines:
            found = re.search(r"(\d+) fail before d_dot, (\d+) at it, (\d+) above it",
                              lines["n_le_d_dot"])
            assert tuple(map(int, found.groups())) == tuple(
                paper.get(w, 0) for w in ("below", "at", "above")), path
        for r in facts[facts["kind"] == "published comparison"].itertuples():
            assert f"{r.subject} " in lines["published"], (path, r.id)
            if r.outcome != "one seed":  # the headline leaves that word out
                assert r.outcome in lines["published"], (path, r.id)
        for r in facts[(facts["kind"] == "d_dot law") & facts["id"].str.endswith(".b")
                       & facts["estimate"].notna()].itertuples():
            assert f"{r.subject} b = {r.estimate:.2f} [{r.low:.2f}, {r.high:.2f}]" \
                in lines[f"law.{r.view}"], (path, r.id)
        first = facts[(facts["kind"] == "tiers") & (facts["outcome"] == "tier 1")]
        for (view, size), rows in first.groupby(["view", "size"]):
            line = lines.get(f"first_tier.{view}", "")
            at = line.partition(f"at d_dot {size} (")[2].partition(" | ")[0]
            if at:  # a size of fewer than 3 configurations has no first-tier line
                named = [s for s in rows["subject"] if f"{s} " in at]
                assert len(named) == len(rows), (path, view, size)
        moves = facts[facts["kind"] == "optimisation"]
        words = {"loss": "loss", "accuracy": "accuracy", "keys_retrieved": "keys retrieved"}
        for key in ("lr", "trainer.patience"):  # the settings' facts end with their key
            mine = moves[moves["id"].str.endswith("." + key)]
            for view, rows in mine.groupby("view"):
                line = lines[f"optimisation.{key}"]
                part = line.partition(f"{words[view]}: ")[2].partition(";")[0]
                for verdict, n in rows["outcome"].value_counts().items():
                    assert f"{verdict} {n}" in part, (path, key, view, verdict)


def test_a_failure_point_set_by_a_stall_is_counted_and_said_unchecked():
    """Seed 1's first failing probe stalled and has no check, seed 2's stalled and was checked,
    seed 3's did not stall, seed 4 never failed: 3 failure points, 2 set by stalls, 1 unchecked."""
    from kernelzoo.analysis import stalls

    runs = pd.DataFrame({"label": ["a"] * 4, "seed": [1, 2, 3, 4], "n_keys": [40, 42, 44, 64],
                         "stalled": [True, True, False, False]})
    seeds = pd.DataFrame({"label": ["a"] * 4, "seed": [1, 2, 3, 4],
                          "first_failure": [40.0, 42.0, 44.0, math.nan]})
    checked = pd.DataFrame({"label": ["a"], "seed": [2], "n_keys": [42]})
    assert stalls.resting(runs, seeds, checked) == (3, 2, 1)


def test_docs_quote_the_stores_stall_counts():
    """docs/analysis.md's Stalls section quotes lr_robustness' failure points set by stalls: the
    numbers are the store's headline's."""
    docs = " ".join((ROOT / "docs" / "analysis.md").read_text().split())
    quoted = re.search(r"lr_robustness: (\d+) of (\d+), none checked", docs).groups()
    line = pd.read_csv(ROOT / "results" / "reference" / "lr_robustness" / "headlines.csv"
                       ).set_index("id").loc["stalls", "evidence"]
    found = re.search(r"(\d+) of (\d+) seeds' loss-view failure points are set by a stalled run, "
                      r"(\d+) of them unchecked", line).groups()
    assert quoted == found[:2] and found[0] == found[2]


def test_docs_quote_make_compares_zoo_pair_as_the_store_gives_it():
    """docs/analysis.md ("The answer") quotes Welch's difference of ReLU² d_key=64 and Hedgehog
    d_key=32 in the zoo's loss view: recomputed from the zoo's runs.parquet."""
    from kernelzoo.analysis import compare
    from kernelzoo.analysis.capacity import seed_table

    runs = pd.read_parquet(ROOT / "results" / "reference" / "zoo" / "runs.parquet")
    seeds = seed_table(runs[runs["stall_check_of"].isna()], 0.01, 0.99)
    d = next(d for d in compare.compare(seeds, "ReLU² d_key=64", "Hedgehog d_key=32")
             if d.view == "loss")
    docs = " ".join((ROOT / "docs" / "analysis.md").read_text().split())
    assert d.verdict == "A holds more"
    assert f"(+{d.difference:.3g} keys [{d.low:.3g}, {d.high:.3g}])" in docs
