"""Your experiments, first class: an experiment YAML in a folder of the user's (``./experiments/``
of the working directory, or ``experiments_dir=<folder>``) runs through ``python -m
kernelzoo.sweep``, ``kernelzoo-sweep`` and ``make sweep`` with the checks and the report of a
packaged one."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conftest import DONE, PYTHON, REPO, run_cmd

MINE = """# @package _global_
# my own experiment: ELU+1 at d_key 4, two key counts, tiny runs
d_key: 4
defaults:
  - override /trainer: smoke
  - override /logger: none
hydra:
  mode: MULTIRUN
  sweeper:
    grids:
      - feature_map: elu
        n_keys: 3,6
"""


def folder(root: Path, name: str = "experiments", text: str = MINE) -> Path:
    (root / name).mkdir(parents=True)
    (root / name / "mine.yaml").write_text(text)
    return root / name


def front_door(args, env, cwd) -> object:
    return run_cmd([PYTHON, "-m", "kernelzoo.sweep", *args], env, cwd=cwd)


def test_an_unknown_name_lists_the_users_experiments_too(tmp_path, cli_env):
    folder(tmp_path)
    res = front_door(["nope"], cli_env, tmp_path)
    assert res.returncode == 2, res.explain()
    assert res.stderr.startswith("error: unknown experiment 'nope'; valid: dot_scaling, ")
    assert res.stderr.rstrip().endswith(f"yours in {tmp_path / 'experiments'}: mine")
    assert not (tmp_path / "results").exists()


def test_a_users_experiment_may_not_shadow_a_packaged_one(tmp_path, cli_env):
    (folder(tmp_path) / "quick.yaml").write_text(MINE)
    res = front_door(["quick", "dry_run=true"], cli_env, tmp_path)
    assert res.returncode == 2, res.explain()
    assert res.stderr.strip() == (
        f"error: experiment 'quick' is both in {tmp_path / 'experiments'} and packaged with "
        f"kernelzoo; valid: another name for {tmp_path / 'experiments' / 'quick.yaml'}")


@pytest.mark.slow
def test_a_users_experiment_is_checked_as_a_packaged_one(tmp_path, cli_env):
    """A bad value in the user's grid: one line naming the point, exit 2, nothing written."""
    exps = folder(tmp_path / "elsewhere", "exps", MINE.replace("n_keys: 3,6", "n_keys: 3,0"))
    results = tmp_path / "results"
    res = front_door(["mine", f"experiments_dir={exps}", f"results_dir={results}"], cli_env,
                     tmp_path)
    assert res.returncode == 2, res.explain()
    assert res.stderr.strip() == "error: point n_keys=0: n_keys=0 is invalid; valid: an " \
                                 "integer from 1 to 1048576", res.explain()
    assert not results.exists()


@pytest.mark.slow
def test_a_users_experiment_runs_through_every_front_door(tmp_path, cli_env):
    """``python -m kernelzoo.sweep mine`` from the folder above ``experiments/`` trains and
    analyses it under its file's name; ``kernelzoo-sweep`` and ``make sweep`` with
    ``experiments_dir`` find the same points, done."""
    exps = folder(tmp_path / "project")
    results = tmp_path / "results"
    res = front_door(["mine", f"results_dir={results}", "trainer.threads=1"], cli_env,
                     tmp_path / "project")
    assert res.returncode == 0, res.explain()
    trained = sorted(rid for rid, _ in DONE.findall(res.stdout))
    assert len(trained) == 2 and "sweep mine finished" in res.stdout, res.explain()
    assert "analysed 2 runs of mine -> " in res.stdout
    assert "mine" in (results / "mine" / "report.md").read_text()

    script = Path(PYTHON).with_name("kernelzoo-sweep")
    doors = [[script, "mine", f"experiments_dir={exps}"]] if script.exists() else []
    if shutil.which("make"):
        venv = Path(PYTHON).parents[1]
        doors.append(["make", "-s", "-C", REPO, "-o", f"{venv}/.installed", "sweep",
                      f"VENV={venv}", "EXPERIMENT=mine", f"RESULTS={results}",
                      f"ARGS=experiments_dir={exps} dry_run=true"])
    for door in doors:
        res = run_cmd([*door, f"results_dir={results}", "dry_run=true"]
                      if door[0] != "make" else door, cli_env, cwd=tmp_path)
        assert res.returncode == 0, res.explain()
        planned = sorted(line.split()[1].rstrip(":") for line in res.stdout.splitlines()
                         if line.startswith("plan "))
        assert planned == trained and res.stdout.count(": d_dot 4, done") == 2, res.explain()
