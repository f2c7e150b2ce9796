"""Ask from the command line: a sweep defined by overrides alone, under the user's name, with the
published protocol unless another is chosen explicitly (``trainer=quick``); the report's first
line names the protocol and counts the runs that stopped at the step cap."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from conftest import DONE, PYTHON, run_cmd

from kernelzoo.report.markdown import protocol_line


def runs(settings: list[dict], statuses: list[str], lr: str = "0.001") -> pd.DataFrame:
    return pd.DataFrame({"settings": [json.dumps(s) if s else "" for s in settings],
                         "status": statuses, "lr": [lr if s else "" for s in settings]})


def test_the_published_protocol_is_named_and_the_cap_counted():
    published = {"trainer.max_steps": 100000, "trainer.patience": 10, "task.name": "capacity"}
    table = runs([published, published, {}], ["converged", "max_steps", "infeasible"])
    assert protocol_line(table) == (
        "**Protocol**: the published one (trainer=paper). **Step cap**: 1 of 2 runs stopped "
        "at it, not by the stopping rule: a failure there may be slow learning rather than lack "
        "of capacity.")


def test_every_departure_is_named_with_the_values_seen():
    quick = {"trainer.max_steps": 3000, "trainer.patience": 5}
    table = runs([quick, {**quick, "trainer.patience": 30}, quick],
                 ["max_steps", "plateau", "converged"], lr="0.003")
    assert protocol_line(table) == (
        "**Protocol**: not the published one: lr 0.003 (published 0.001); max_steps 3000 "
        "(published 100000); patience 5, 30 (published 10). **Step cap**: 1 of 3 runs stopped "
        "at it, not by the stopping rule: a failure there may be slow learning rather than lack "
        "of capacity.")


def sweep(args, env, cwd):
    return run_cmd([PYTHON, "-m", "kernelzoo.sweep", *args], env, cwd=cwd)


def test_a_sweep_of_overrides_alone_needs_a_name_of_its_own(tmp_path, cli_env):
    res = sweep(["feature_map=elu", "n_keys=4,8"], cli_env, tmp_path)
    assert res.returncode == 2 and res.stderr.startswith(
        "error: a sweep of overrides alone needs a name for its store; valid: experiment=<name>"
    ), res.explain()
    res = sweep(["experiment=quick", "feature_map=elu"], cli_env, tmp_path)
    assert res.returncode == 2 and res.stderr.startswith(
        "error: experiment=quick names an experiment of its own"), res.explain()
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_an_asked_sweep_trains_the_published_protocol_unless_told(tmp_path, cli_env):
    """ELU+1 at d_key 4 with the published protocol (it converges in a few thousand steps),
    then the same question borrowing quick's protocol explicitly, capped lower still."""
    results = tmp_path / "results"
    common = ["feature_map=elu", "d_key=4", "n_keys=2,3", "logger=none", "trainer.threads=1",
              f"results_dir={results}"]
    res = sweep(["experiment=asked", *common], cli_env, tmp_path)
    assert res.returncode == 0, res.explain()
    assert len(DONE.findall(res.stdout)) == 2 and "analysed 2 runs of asked" in res.stdout
    for rid, _ in DONE.findall(res.stdout):
        summary = json.loads((results / "asked" / "runs" / rid / "summary.json").read_text())
        assert summary["status"] == "converged", summary
    report = (results / "asked" / "report.md").read_text().splitlines()
    assert report[2] == "**Protocol**: the published one (trainer=paper). **Step cap**: 0 of " \
                        "2 runs stopped at it."

    res = sweep(["experiment=borrowed", "trainer=quick", "trainer.max_steps=100", *common],
                cli_env, tmp_path)
    assert res.returncode == 0, res.explain()
    report = (results / "borrowed" / "report.md").read_text().splitlines()
    assert report[2].startswith(
        "**Protocol**: not the published one: max_steps 100 (published 100000); patience 5 "
        "(published 10). **Step cap**: 2 of 2 runs stopped at it, not by the stopping rule"), report[2]
