"""``stall_check=true``: each stalled run of a sweep retrained with a longer stopping rule
(``hydra_plugins/kernelzoo_sweeper/stall_checks.py``), the config keys, run ids and summaries of
checks, and the replay a check relies on: the same overrides and seed retrace the stalled run's
curve and then go on."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import (DONE, REPO, copy_results, json_file, run_ids, runs_dir, smoke_args,
                      snapshot, sweep)
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from synthetic import write_run

from hydra_plugins.kernelzoo_sweeper import stall_checks
from kernelzoo import config, train
from kernelzoo.training import job
from kernelzoo.training import plan as planning
from kernelzoo.records import store
from kernelzoo.analysis.runs import load_runs
from kernelzoo.config import CONF, Config, UsageError


def composed(*overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def curve(path: Path) -> list[list[str]]:
    with open(path / "curve.csv") as f:
        return list(csv.reader(f))[1:]


# ------------------------------------------------------------------ config, run ids, summaries

def test_committed_runs_keep_their_run_ids():
    """Ordinary runs' ids are what they were: the first run (with a config.yaml) of every
    committed reference experiment is planned from its config.yaml to its own directory name."""
    checked = 0
    for exp in sorted((REPO / "results" / "reference").iterdir()):
        run = next((d for d in sorted((exp / "runs").iterdir())
                    if (d / "config.yaml").is_file() and d.name.startswith(("dpfp", "elu"))),
                   None)
        if run is None:
            continue
        raw = yaml.safe_load((run / "config.yaml").read_text())
        cfg = OmegaConf.merge(OmegaConf.structured(Config), raw)
        p = planning.plan(cfg)
        assert "stall_check_of" not in p.identity.as_dict()
        assert planning.locate(cfg, p.identity)[0] == run.name
        checked += 1
    assert checked >= 6


def test_a_check_has_its_own_run_id_and_says_whose_check_it_is():
    base = ("feature_map=dpfp", "feature_map.nu=2", "n_keys=260")
    p = planning.plan(composed(*base))
    rid = store.run_id(p.identity.as_dict(), {"nu": 2})
    q = planning.plan(composed(*base, f"stall_check_of={rid}"))
    assert q.identity.as_dict() == {**p.identity.as_dict(), "stall_check_of": rid}
    check = store.run_id(q.identity.as_dict(), {"nu": 2})
    assert q.identity.run_id == check and p.identity.run_id == rid
    assert check.startswith("dpfp-nu2-dkey64-S260-sum-seed1-check-") and check != rid
    assert q.identity.summary("adhoc", status="converged")["stall_check_of"] == rid
    assert p.identity.summary("adhoc", status="converged")["stall_check_of"] is None
    # stall_check (what the sweeper does) is no part of a run's identity
    assert planning.plan(composed(*base, "stall_check=true")).identity == p.identity


@pytest.mark.parametrize("override, needle", [
    ("stall_check_of=../elsewhere", "stall_check_of=../elsewhere is invalid"),
    ("stall_check=maybe", "stall_check=maybe"),
    ("stall_checks=true", "has no key 'stall_checks'"),
])
def test_bad_stall_check_values_are_one_line_errors(override, needle):
    with pytest.raises(UsageError, match=needle.replace(".", r"\.")):
        cfg = config.compose("config", [override])
        with config.as_job(cfg) as job:
            config.check(job)


def test_a_single_run_refuses_stall_check(capsys):
    with pytest.raises(SystemExit) as stop:
        train.precheck(["stall_check=true", "logger=none"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: stall_check=true: a single run has no sweep") and \
        len(err.splitlines()) == 1


def test_summaries_without_stall_check_of_read_as_null(tmp_path):
    old = write_run(tmp_path / "exp", n_keys=20, loss=0.001)
    assert "stall_check_of" not in json_file(old / "summary.json")
    assert store.read_summary(old)["stall_check_of"] is None
    summary = json_file(old / "summary.json")
    for value, ok in (("elu-dkey64-S20-sum-seed1-0123abcd", True), (None, True), (3, False),
                      ("a/b", False)):
        (old / "summary.json").write_text(json.dumps({**summary, "stall_check_of": value}))
        if ok:
            assert store.read_summary(old)["stall_check_of"] == value
        else:
            with pytest.raises(store.StoreError, match="stall_check_of is .*, not a run id"):
                store.read_summary(old)


# ------------------------------------------------------------------ which runs get a check

TRAINER = "trainer:\n  patience: 10\n  max_steps: 1000\n  eval_max_queries: 200\n"


def stall(exp: Path, n_keys: int, seed: int, **extra) -> Path:
    """A stalled-looking run: plateau, 1 dead key, its only error."""
    return write_run(exp, n_keys=n_keys, seed=seed, loss=0.05, status="plateau",
                     accuracy=1 - 1 / n_keys, diagnostics={"dead_keys": 1}, config=TRAINER,
                     **extra)


def test_plan_checks_each_stalled_run_of_the_sweep_once(tmp_path):
    exp = tmp_path / "exp"
    stalled = stall(exp, 40, 1).name
    before = stall(exp, 32, 3).name
    elsewhere = stall(exp, 44, 1).name
    write_run(exp, n_keys=48, seed=2, loss=0.001, diagnostics={"dead_keys": 0}, config=TRAINER)
    write_run(exp, n_keys=56, seed=2, loss=0.3, status="plateau", accuracy=0.5,  # over capacity
              diagnostics={"dead_keys": 20}, config=TRAINER)
    # a check of ``before``, itself stall-like: it is never checked and never makes a stall
    check = stall(tmp_path / "other", 32, 3)
    summary = {**json_file(check / "summary.json"), "run_id": "check-of-before",
               "stall_check_of": before}
    (check / "summary.json").write_text(json.dumps(summary))
    shutil.move(check, exp / "runs" / "check-of-before")

    points = {rid: [f"n_keys={rid.split('-S')[1].split('-')[0]}", "feature_map=elu",
                    "trainer.patience=10", "+experiments=x"] for rid in (stalled, before)}
    points["check-of-before"] = ["stall_check_of=" + before]
    found = stall_checks.find(exp, points, threshold=0.01)
    assert found.record() == {"stalled": 2, "checked_before": 1, "launched": 1,
                              "not_in_sweep": 1, "uncheckable": 0}
    (c,) = found.checks
    assert c.of == stalled
    assert c.point == ["n_keys=40", "feature_map=elu", "+experiments=x", "trainer.patience=30",
                       "trainer.max_steps=2000", f"stall_check_of={stalled}"]
    assert c.line == (f"stall check of {stalled} (plateau at step 500, 1 key of 40 never "
                      "learned): trainer.patience=30 trainer.max_steps=2000")
    # at a threshold where nothing of the configuration passes there is no stall
    assert stall_checks.find(exp, points, threshold=0.0001).record()["stalled"] == 0
    # a stalled run without its stopping rule in config.yaml is named, not checked
    for config in ("n_keys: 40\n", TRAINER.replace("patience: 10", "patience: -10")):
        (exp / "runs" / stalled / "config.yaml").write_text(config)  # a negative patience
        found = stall_checks.find(exp, points, threshold=0.01)  # ended the sweep, unrecorded
        assert not found.checks and found.unchecked == [
            f"{stalled}: its config.yaml gives no trainer.patience and trainer.max_steps "
            "(integers >= 1)"]


def test_a_store_without_an_index_gets_the_checks_of_its_search(tmp_path, monkeypatch, capsys):
    """A committed store carries no index/ (git-ignored): the search's probes record their run
    ids, and the sweeper hands them over, so their stalled runs are checked all the same."""
    exp = tmp_path / "results" / "exp"
    stalled = stall(exp, 40, 1).name
    write_run(exp, n_keys=48, seed=2, loss=0.001, diagnostics={"dead_keys": 0}, config=TRAINER)
    point = ["n_keys=40", "feature_map=elu", "trainer.patience=10", "+experiments=x"]
    launched = []

    class Sweeper:
        config = OmegaConf.create({"results_dir": str(tmp_path / "results"), "experiment": "exp",
                                   "search": {"threshold": 0.01}, "dry_run": False})
        plans: dict = {}

        def indexed(self, point):
            return None  # no index

        def checked(self, todo):
            return todo

        def launch(self, todo, label):
            launched.extend(todo)
            return []

    monkeypatch.setattr(stall_checks, "check_points", lambda sweeper, todo: {})
    sweeper = Sweeper()
    assert stall_checks.run(sweeper, [point]) == [] and not launched  # the index alone: none
    stall_checks.run(sweeper, [], {stalled: point})
    assert launched == [["n_keys=40", "feature_map=elu", "+experiments=x", "trainer.patience=30",
                         "trainer.max_steps=2000", f"stall_check_of={stalled}"]]
    assert "1 stalled run among the sweep's runs" in capsys.readouterr().out


def test_load_runs_reads_a_store_with_checks(tmp_path):
    exp = tmp_path / "exp"
    rid = stall(exp, 40, 1).name
    check = write_run(tmp_path / "other", n_keys=40, loss=0.001, config=TRAINER)
    (check / "summary.json").write_text(json.dumps(
        {**json_file(check / "summary.json"), "run_id": "a-check", "stall_check_of": rid}))
    shutil.move(check, exp / "runs" / "a-check")
    runs, missing, damaged = load_runs(exp)
    assert not missing and not damaged
    checks = runs.set_index("run_id")["stall_check_of"]
    assert checks.isna()[rid] and checks["a-check"] == rid


# ------------------------------------------------------------------ the replay

def test_a_check_replays_the_stalled_run_then_goes_on(tmp_path):
    """A run stopped by its patience, and its check (stall_checks.check_point: patience x 3,
    max_steps x 2, stall_check_of): the check's curve has the run's rows, the same steps and
    the same numbers as written, up to the step where the run stopped, then more."""
    point = ["feature_map=dpfp", "d_key=4", "n_keys=6", "logger=none", "trainer=smoke",
             "trainer.threads=1", "trainer.progress=false", f"results_dir={tmp_path}",
             "trainer.eval_every=10", "trainer.patience=1", "trainer.max_steps=80"]
    ((rid, first),) = job.run(composed(*point), echo=lambda line: None)
    assert first["status"] == "plateau" and first["steps"] < 80, first
    ((check, second),) = job.run(composed(*stall_checks.check_point(point, 1, 80, rid)),
                                   echo=lambda line: None)
    assert check != rid and second["stall_check_of"] == rid
    home = tmp_path / "adhoc" / "runs"
    ran, checked = curve(home / rid), curve(home / check)
    assert [int(r[0]) for r in ran] == list(range(10, first["steps"] + 1, 10))
    assert checked[:len(ran)] == ran
    assert len(checked) > len(ran) and second["steps"] > first["steps"]
    assert store.read_config_value(home / check, "trainer.patience") == 3
    assert store.read_config_value(home / check, "trainer.max_steps") == 160


# ------------------------------------------------------------------ end to end, the smoke sweep

@pytest.mark.slow
def test_stall_check_sweep_end_to_end(smoke_results, tmp_path):
    """The smoke sweep, with one of its runs made a stall (its summary: plateau, 1 dead key,
    its only error; another run of its configuration passing above it), swept again with
    stall_check=true: exactly one check, with the stalled run's overrides and the longer
    stopping rule; a rerun launches nothing."""
    assert smoke_results.result.returncode == 0, smoke_results.result.explain()
    results = copy_results(smoke_results.results, tmp_path / "results")
    home = runs_dir(results, "smoke")
    (stalled,) = [r for r in run_ids(results, "smoke") if r.startswith("elu-dkey4-S3-sum-")]
    (above,) = [r for r in run_ids(results, "smoke") if r.startswith("elu-dkey4-S6-sum-")]
    for rid, change in ((stalled, {"status": "plateau", "dead_keys": 1,
                                   "final_eval_accuracy": 2 / 3}),
                        (above, {"final_eval_loss": 0.005, "dead_keys": 0,
                                 "final_eval_accuracy": 1.0})):
        summary = json_file(home / rid / "summary.json")
        (home / rid / "summary.json").write_text(json.dumps({**summary, **change}))
    ordinary = set(run_ids(results, "smoke"))
    before = snapshot(home)

    res = sweep("smoke", smoke_args(results, "stall_check=true"), smoke_results.env)
    assert res.returncode == 0, res.explain()
    assert "stall_check: 1 stalled run among the sweep's runs (tau 0.01), 0 checked before; " \
           "launching 1 check" in res.stdout, res.stdout
    assert res.stdout.count("stall check of ") == 1
    assert f"stall check of {stalled} (plateau at step 300, 1 key of 3 never learned): " \
           "trainer.patience=9 trainer.max_steps=600" in res.stdout
    (check,) = set(run_ids(results, "smoke")) - ordinary
    assert [m.group(1) for m in DONE.finditer(res.stdout)] == [check]
    assert check.startswith("elu-dkey4-S3-sum-seed1-check-")
    summary = store.read_summary(home / check)
    assert summary["stall_check_of"] == stalled and summary["n_keys"] == 3
    assert 300 < summary["steps"] <= 600
    cfg = store.read_config(home / check)
    assert (cfg["trainer"]["patience"], cfg["trainer"]["max_steps"]) == (9, 600)
    assert cfg["stall_check_of"] == stalled and cfg["feature_map"]["name"] == "elu"
    assert (cfg["d_key"], cfg["seed"], cfg["experiment"]) == (4, 1, "smoke")
    ran, checked = curve(home / stalled), curve(home / check)
    assert [r[0] for r in checked[:len(ran)]] == [r[0] for r in ran]  # the stalled run trained
    for a, b in zip(ran, checked):  # in a pack, its check alone: equal to float32 rounding
        assert [float(x) for x in b] == pytest.approx([float(x) for x in a], rel=1e-4)
    assert {k: v for k, v in snapshot(home).items() if not k.startswith(check)} == before
    last = json_file(results / "smoke" / "sweep.json")["invocations"][-1]
    assert last["stall_checks"] == {"stalled": 1, "checked_before": 0, "launched": 1,
                                    "not_in_sweep": 0, "uncheckable": 0}
    assert last["points"] == 7 and last["outcomes"]["skipped"] == 6

    after = snapshot(home)
    again = sweep("smoke", smoke_args(results, "stall_check=true"), smoke_results.env)
    assert again.returncode == 0, again.explain()
    assert not DONE.search(again.stdout) and "stall check of" not in again.stdout
    assert "1 checked before; nothing to launch" in again.stdout, again.stdout
    assert snapshot(home) == after
    last = json_file(results / "smoke" / "sweep.json")["invocations"][-1]
    assert last["stall_checks"]["launched"] == 0 and last["points"] == 6

    runs = load_runs(results / "smoke")[0]
    assert list(runs.loc[runs["stall_check_of"].notna(), "run_id"]) == [check]


def test_a_check_clears_only_a_stalled_run_that_failed_the_view():
    """"Cleared 75" counted runs that had already passed: of the zoo's 75 stalled runs cleared
    in the loss view, 58 had passed it before any check. A check clears a view only where the
    stalled run failed it."""
    import pandas as pd

    from kernelzoo.analysis.stalls import check_outcomes

    runs = pd.DataFrame({"run_id": ["passed", "failed", "failed2"], "label": ["a"] * 3,
                         "seed": [1, 2, 3], "n_keys": [32] * 3, "status": ["plateau"] * 3,
                         "final_eval_loss": [0.005, 0.02, 0.03],
                         "final_eval_accuracy": [0.97, 0.97, 0.97], "stalled": [True] * 3})
    checks = pd.DataFrame({"run_id": ["c1", "c2", "c3"],
                           "stall_check_of": ["passed", "failed", "failed2"],
                           "status": ["converged", "converged", "plateau"],
                           "final_eval_loss": [1e-4, 1e-4, 0.03],
                           "final_eval_accuracy": [1.0, 1.0, 0.97]})
    found = check_outcomes(runs, checks, 0.01, 0.99).set_index("run_id")
    assert found["fails_loss"].to_dict() == {"passed": False, "failed": True, "failed2": True}
    assert found["clears_loss"].to_dict() == {"passed": False, "failed": True, "failed2": False}
    assert found["clears_accuracy"].to_dict() == {"passed": True, "failed": True,
                                                  "failed2": False}
