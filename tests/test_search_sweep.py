"""``search=bisect`` end to end on the smoke experiment: rounds of probes through the real
command line, an interrupted search continuing from its probes, a finished one training
nothing, and the analysis of its sparse probes."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from conftest import DONE, analyze, smoke_args, sweep

from kernelzoo.config import SearchConf
from hydra_plugins.kernelzoo_sweeper._search import Observation, make_spec, search_views

REFERENCE = Path(__file__).resolve().parents[1] / "results" / "reference"

SEARCH = ["search=bisect", "seed=1,2"]


def probes_of(results) -> dict:
    return json.loads((results / "smoke" / "search.json").read_text())["series"]


@pytest.mark.slow
def test_interrupted_search_continues_and_a_finished_one_trains_nothing(tmp_path, cli_env):
    results = tmp_path / "results"
    # "interrupted" after its first round: search.max_rounds=1
    first = sweep("smoke", smoke_args(results, *SEARCH, "search.max_rounds=1"), cli_env)
    assert first.returncode == 0, first.explain()
    assert "Traceback" not in first.output
    assert "round 1: launching" in first.stdout and "round 2" not in first.stdout
    trained_first = set(DONE.findall(first.stdout))
    series = probes_of(results)
    assert len(series) == 8  # 4 configurations x 2 seeds
    # the series' search is unfinished; "verdict" is the loss view's, which may be located
    assert Counter("unfinished" if any(v["outcome"] == "unfinished" for v in s["verdicts"].values())
                   else s["verdict"]["outcome"] for s in series.values()) == \
        {"unfinished": 6, "infeasible": 2}
    assert all(s["verdict"] == s["verdicts"]["loss"] for s in series.values())

    second = sweep("smoke", smoke_args(results, *SEARCH), cli_env)
    assert second.returncode == 0, second.explain()
    assert "read from the store" in second.stdout
    trained_second = set(DONE.findall(second.stdout))
    assert trained_second and not trained_first & trained_second  # round 1 is not retrained
    series = probes_of(results)
    for s in series.values():
        assert s["verdict"]["outcome"] in ("fails_at", "fails_everywhere", "never_fails",
                                           "infeasible"), s
        assert s["verdict"] == s["verdicts"]["loss"]
        assert s["verdicts"]["accuracy"]["outcome"] in ("fails_at", "fails_everywhere",
                                                        "never_fails", "infeasible"), s
        assert s["verdicts"]["keys_retrieved"]["outcome"] in ("peaks", "plateau", "never_peaks",
                                                              "infeasible"), s
        ns = [p["n_keys"] for p in s["probes"]]
        assert len(ns) == len(set(ns)), ns  # never the same n_keys twice for one seed
        assert all("run_id" in p and p["why"] for p in s["probes"])

    third = sweep("smoke", smoke_args(results, *SEARCH), cli_env)
    assert third.returncode == 0, third.explain()
    assert not DONE.findall(third.stdout), third.stdout
    assert "0 rounds launched" in third.stdout
    history = json.loads((results / "smoke" / "sweep.json").read_text())["invocations"]
    assert [i["search"]["rounds"] for i in history][0] == 1
    assert history[-1]["outcomes"] == {"skipped": history[-1]["points"]}

    res = analyze(["experiment=smoke", f"results_dir={results}", "logger=none"], cli_env)
    assert res.returncode == 0, res.explain()
    report = (results / "smoke" / "report.md").read_text()
    assert "## Search probes" in report and "`probes.csv`" in report
    probes = pd.read_csv(results / "smoke" / "probes.csv")
    assert probes["probe_why"].str.contains("bracket: ", regex=False).any()  # "loss: bracket: ..."


@pytest.mark.slow
def test_bad_search_settings_fail_in_one_line_before_training(tmp_path, cli_env):
    results = tmp_path / "results"
    for bad, needle in (("search.resolution=0.5", "search.resolution=0.5"),
                        ("search.multiples=[]", "search.multiples"),
                        ("search.max_keys=0", "search.max_keys=0"),
                        ("search.typo=3", "typo")):
        res = sweep("smoke", smoke_args(results, "search=bisect", bad), cli_env)
        assert res.returncode != 0, bad
        assert needle in res.stderr and "Traceback" not in res.output, res.explain()
        assert not list(results.rglob("summary.json")), bad


LOSS_ONLY_ROUNDS = 7  # the zoo's rounds before the search located every view


def test_a_loss_only_search_in_the_store_is_continued_from_its_probes(tmp_path, cli_env):
    """The committed zoo store's first 7 rounds were searched by the loss rule alone (and it
    has no index): a dry run on a copy cut back to those rounds reads every recorded probe of
    the series back and asks only for the probe the pure logic wants next from them."""
    results = tmp_path / "results"
    shutil.copytree(REFERENCE / "zoo", results / "zoo")
    record = json.loads((results / "zoo" / "search.json").read_text())
    for entry in record["series"].values():
        if isinstance(entry.get("probes"), list):
            for p in entry["probes"]:
                if isinstance(p, dict) and p.get("round", 0) > LOSS_ONLY_ROUNDS:
                    shutil.rmtree(results / "zoo" / "runs" / p["run_id"], ignore_errors=True)
            entry["probes"] = [p for p in entry["probes"]
                               if not isinstance(p, dict) or p.get("round", 0) <= LOSS_ONLY_ROUNDS]
    (results / "zoo" / "search.json").write_text(json.dumps(record, indent=2))
    before = (results / "zoo" / "search.json").read_text()
    res = sweep("zoo", [f"results_dir={results}", "grids=[2]", "seed=1", "dry_run=true"],
                cli_env)
    assert res.returncode == 0, res.explain()
    series = [s for s in json.loads(before)["series"].values()
              if {"feature_map=rebased", "d_dot=65", "seed=1"} <= set(s["overrides"])]
    assert len(series) == 1 and series[0]["verdict"]["outcome"] == "fails_at"
    probes = series[0]["probes"]
    assert f"search: {len(probes)} probes of the search so far read back" in res.stdout
    observed = {}
    for p in probes:
        summary = json.loads((results / "zoo" / "runs" / p["run_id"] / "summary.json").read_text())
        observed[p["n_keys"]] = Observation(summary["final_eval_loss"],
                                            summary["final_eval_accuracy"],
                                            summary["status"] == "diverged")
    spec = make_spec(SearchConf(name="bisect"), 65, 0, [8, 163])
    assert spec.max_keys == 260  # 4 x d_dot, above the grid's 163
    views = search_views(spec, observed)
    assert views.verdicts["loss"] is not None  # the loss view asks for nothing more
    assert views.probes and not any(p.why.startswith("loss") for p in views.probes)
    last = max(p["round"] for p in probes)
    wanted = ", ".join(str(p.n_keys) for p in views.probes)
    assert f"round {last + 1}: planning {len(views.probes)} probe" in res.stdout, res.stdout
    assert f"n_keys={wanted}" in res.stdout
    assert not DONE.findall(res.stdout)
    assert (results / "zoo" / "search.json").read_text() == before  # a dry run writes nothing


def test_two_searches_on_one_store_keep_each_others_located_verdicts():
    """Two searches on one store: the one whose probe the other trained ended that series
    "lost", and as the last writer replaced the other's located verdicts with it. Search
    records merge view by view: a view located wins over one not located ("lost", "dry_run",
    "not_searched": a loss-only rerun erased the other views' verdicts), this sweep's located
    verdict over a stored one, and only the analysis' views are kept (a record with invented
    views outlived every rerun)."""
    from hydra_plugins.kernelzoo_sweeper.search_rounds import is_located, merged

    probes = [{"n_keys": 64, "run_id": "r64", "fails": False}]
    found = {"outcome": "fails_at", "value": 112, "low": 96, "high": 128}
    lost = {"outcome": "lost", "reason": "the probe at n_keys=96 left no summary"}
    theirs = {"probes": probes, "verdict": found, "verdicts": {
        "loss": found, "accuracy": found, "keys_retrieved": {"outcome": "dry_run"}}}
    ours = {"probes": probes, "verdict": lost,
            "verdicts": {"loss": lost, "accuracy": lost, "keys_retrieved": lost}}
    assert [is_located(v) for v in (found, lost, {"outcome": "not_searched"}, None)] == \
        [True, False, False, False]
    stored = {"elu-1": theirs, "other": {"probes": []}}
    assert merged(stored, {"elu-1": ours, "dpfp-1": ours}) == {
        "elu-1": {**ours, "verdict": found,
                  "verdicts": {"loss": found, "accuracy": found, "keys_retrieved": lost}},
        "other": {"probes": []}, "dpfp-1": ours}
    better = {**theirs, "verdicts": {**theirs["verdicts"], "keys_retrieved": found}}
    assert merged(stored, {"elu-1": better})["elu-1"] == better
    # a loss-only rerun: its other views are not_searched, the stored located ones stay
    again = {"outcome": "fails_at", "value": 108, "low": 96, "high": 120}
    loss_only = {"probes": probes, "verdict": again, "verdicts": {
        "loss": again, "accuracy": {"outcome": "not_searched"},
        "keys_retrieved": {"outcome": "not_searched"}}}
    assert merged(stored, {"elu-1": loss_only})["elu-1"]["verdicts"] == {
        "loss": again, "accuracy": found, "keys_retrieved": {"outcome": "not_searched"}}
    # a falsified record: invented views are dropped, a located view is this sweep's
    forged = {"probes": probes, "verdict": {"outcome": "fails_at", "value": 999},
              "verdicts": {"loss": {"outcome": "fails_at", "value": 999},
                           **{f"view{i}": found for i in range(9)}}}
    assert merged({"elu-1": forged}, {"elu-1": loss_only})["elu-1"]["verdicts"] == \
        loss_only["verdicts"]


@pytest.mark.slow
def test_a_loss_only_search_trains_only_what_the_loss_view_asks_for(tmp_path, cli_env):
    """``search.views=[loss]`` on smoke's ELU+1 and DPFP-1 (d_key 4): every probe trained was
    asked for by the loss view, the other views are recorded ``not_searched`` and the report
    says "not searched" for them instead of a bound."""
    results = tmp_path / "results"
    res = sweep("smoke", smoke_args(results, "search=bisect", "search.views=[loss]", "grids=[0]"),
                cli_env, analysis=True)
    assert res.returncode == 0, res.explain()
    series = probes_of(results)
    assert len(series) == 2
    trained = {rid for rid, _ in DONE.findall(res.stdout)}
    probed = [p for s in series.values() for p in s["probes"]]
    assert {p["run_id"] for p in probed} == trained
    assert all(p["why"].startswith("loss: ") and "; " not in p["why"] for p in probed), probed
    for s in series.values():
        assert s["spec"]["views"] == ["loss"]
        assert s["verdicts"]["accuracy"] == s["verdicts"]["keys_retrieved"] == \
            {"outcome": "not_searched"}
        assert s["verdict"] == s["verdicts"]["loss"] and s["verdict"]["outcome"] != "not_searched"
    table = (results / "smoke" / "report.md").read_text()
    assert table.count("not searched") >= 4, table
    # no figure of the views left out: they were empty panels
    assert (results / "smoke" / "loss_panels.png").exists()
    assert not list((results / "smoke").glob("accuracy_panels.*"))
    assert not list((results / "smoke").glob("keys_retrieved_panels.*"))
