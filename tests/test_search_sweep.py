"""``search=bisect`` end to end on the smoke experiment: rounds of probes through the real
command line, an interrupted search continuing from its probes, a finished one training
nothing, and the analysis of its sparse probes."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from conftest import DONE, analyze, smoke_args, sweep

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
    assert Counter(s["verdict"]["outcome"] for s in series.values()) == \
        {"unfinished": 6, "infeasible": 2}

    second = sweep("smoke", smoke_args(results, *SEARCH), cli_env)
    assert second.returncode == 0, second.explain()
    assert "read from the store" in second.stdout
    trained_second = set(DONE.findall(second.stdout))
    assert trained_second and not trained_first & trained_second  # round 1 is not retrained
    series = probes_of(results)
    for s in series.values():
        assert s["verdict"]["outcome"] in ("fails_at", "fails_everywhere", "never_fails",
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
    assert "## Search probes" in report and "bracket: " in report


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
