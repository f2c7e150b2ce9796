"""A new user's first hour: progress without a terminal, a log per run, Hydra's own habits
(`--cfg job`, `--help`, experiments that are multirun by themselves), `make help`, threads."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import PYTHON, REPO, run_cmd, smoke_args, train

from kernelzoo.records import progress

EXPERIMENTS = sorted((REPO / "experiments").glob("*.yaml"))


def test_a_sweep_reports_progress_per_job_without_a_terminal(smoke_results):
    """The session's smoke sweep ran with its output piped (no TTY): one progress line per job
    (two packs of 2 runs, two points alone, one of them infeasible), k/N runs with elapsed and
    ETA, k counting every run of the job; one start line per job that trains, a pack's other
    run in its log."""
    out = smoke_results.result.stdout
    lines = re.findall(r"^progress: (\d+)/(\d+) runs(?: \([^)]*\))?, elapsed [\d.]+ (?:s|min), "
                       r"ETA [\d.]+ (?:s|min)$", out, re.M)
    ks = [0] + [int(k) for k, _ in lines]
    assert sorted(b - a for a, b in zip(ks, ks[1:])) == [1, 1, 2, 2], lines
    assert {n for _, n in lines} == {"6"}
    starts = re.findall(r"^run \S+: cpu, 1 thread of \d+ cores?(.*)$", out, re.M)
    assert sorted(starts) == ["", ", a pack of 2 (with 1 other: train.log)",
                              ", a pack of 2 (with 1 other: train.log)"], out


def test_the_eta_weighs_runs_by_their_work(tmp_path, monkeypatch):
    """Largest runs first: after a run of work 3 in 60 s, the two of work 1 left take 40 s, not
    the 120 s a per-run mean gives; without work every run weighs one."""
    clock = iter([1000.0, 1060.0, 1080.0, 1100.0, 2000.0, 2060.0])
    monkeypatch.setattr(progress.time, "time", lambda: next(clock))
    progress.start(tmp_path, 3, work=5.0)
    assert progress.finished(tmp_path, 3.0) == "progress: 1/3 runs, elapsed 60 s, ETA 40 s"
    assert progress.finished(tmp_path, 1.0) == "progress: 2/3 runs, elapsed 80 s, ETA 20 s"
    assert progress.finished(tmp_path, 1.0) == "progress: 3/3 runs, elapsed 1.7 min, ETA 0 s"
    progress.start(tmp_path, 3, "round 1")
    assert progress.finished(tmp_path) == "progress: 1/3 runs of round 1, elapsed 60 s, ETA 2.0 min"
    assert progress.finished(tmp_path / "elsewhere") is None  # no open batch: no line


def test_each_run_logs_its_evaluations_to_its_log_file(smoke_results):
    """One log per job: the 6 points are 4 jobs (elu 3 and 6 keys are a pack, so are dpfp's);
    a pack's log names the run of each line."""
    logs = list((smoke_results.results / "smoke" / "hydra").rglob("train.log"))
    assert len(logs) == 4
    trained = [log.read_text() for log in logs if "step " in log.read_text()]
    assert len(trained) == 3  # the infeasible point trains nothing
    runs = [rid.name for rid in (smoke_results.results / "smoke" / "runs").iterdir()]
    for text in trained:
        assert re.search(r"step \d+: train loss \S+, eval loss \S+, eval accuracy \S+", text)
        assert re.search(r" threads? of \d+ cores?", text) and "done " in text
    packed = [text for text in trained if "a pack of 2" in text]
    assert len(packed) == 2
    for text in packed:
        named = {rid for rid in runs if re.search(rf"{rid}: step \d+: train loss", text)}
        assert len(named) == 2
    assert len({log.parents[1] for log in logs}) == 1  # one directory per sweep


def test_every_experiment_is_multirun_by_itself():
    for path in EXPERIMENTS:
        assert yaml.safe_load(path.read_text())["hydra"]["mode"] == "MULTIRUN", path.name


@pytest.mark.slow
def test_an_experiment_runs_as_a_sweep_without_dash_m(tmp_path, cli_env):
    res = train(["+experiments=smoke", *smoke_args(tmp_path / "results"), "dry_run=true"],
                cli_env)
    assert res.returncode == 0, res.explain()
    assert "sweep smoke: 6 points" in res.stdout


@pytest.mark.slow
def test_cfg_job_and_help(tmp_path, cli_env):
    res = run_cmd([PYTHON, "-m", "kernelzoo.train", "--cfg", "job", "feature_map=dpfp"], cli_env,
                  cwd=tmp_path)
    assert res.returncode == 0, res.explain()
    config = yaml.safe_load(res.stdout)
    assert config["feature_map"]["name"] == "dpfp" and config["trainer"]["threads"] == 1
    res = run_cmd([PYTHON, "-m", "kernelzoo.train", "--help"], cli_env, cwd=tmp_path)
    assert res.returncode == 0 and "feature_map: " in res.stdout and "search: " in res.stdout
    res = run_cmd([PYTHON, "-m", "kernelzoo.sweep", "--help"], cli_env, cwd=tmp_path)
    assert res.returncode == 0 and "experiments: " in res.stdout and "quick" in res.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_help_lists_the_targets(cli_env):
    res = run_cmd(["make", "-s", "help"], cli_env)
    assert res.returncode == 0, res.explain()
    for target in ("sweep", "test", "test-slow", "plots", "run", "bench", "sync", "install"):
        assert re.search(rf"^  make {re.escape(target)}\s", res.stdout, re.M), target
    assert "RESULTS=results/local" in res.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_takes_one_results_directory_from_args_or_results(cli_env):
    res = run_cmd(["make", "-s", "help", "ARGS=results_dir=/tmp/elsewhere seed=2"], cli_env)
    assert "RESULTS=/tmp/elsewhere" in res.stdout


@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2])
def test_a_run_says_how_many_threads_it_uses(tmp_path, cli_env, threads):
    res = train(["trainer=smoke", "logger=none", "d_key=4", "n_keys=3", "trainer.max_steps=50",
                 f"results_dir={tmp_path / 'r'}", f"trainer.threads={threads}"], cli_env)
    assert res.returncode == 0, res.explain()
    assert re.search(rf"^run \S+: cpu, {threads} threads? of \d+ cores?$", res.stdout, re.M)


@pytest.mark.slow
def test_threads_must_be_positive(tmp_path, cli_env):
    res = train(["trainer.threads=0", f"results_dir={tmp_path / 'r'}"], cli_env)
    assert res.returncode == 2 and "trainer.threads=0" in res.stderr
    assert not Path(tmp_path / "r").exists() or not list(Path(tmp_path / "r").rglob("*.json"))


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_takes_a_results_directory_with_a_space(cli_env):
    """``make sweep RESULTS="a dir"`` gave Hydra two words, and an error without a hint."""
    res = run_cmd(["make", "-n", "sweep", "RESULTS=/tmp/a dir"], cli_env)
    assert res.returncode == 0, res.explain()
    assert '-m kernelzoo.sweep quick "results_dir=/tmp/a dir"' in res.stdout  # it analyses too
    res = run_cmd(["make", "-n", "plots", "RESULTS=/tmp/a dir"], cli_env)
    assert res.returncode == 0, res.explain()
    assert '-m kernelzoo.analyze experiment=quick "results_dir=/tmp/a dir"' in res.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_install_says_what_to_do_with_a_broken_venv(tmp_path, cli_env):
    """A venv whose python links to an interpreter that is gone failed without a hint; a venv
    with a current stamp but no kernelzoo was taken as installed."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(tmp_path / "gone" / "python3")
    res = run_cmd(["make", "-s", "install", f"VENV={venv}"], cli_env)
    assert res.returncode != 0 and res.stderr.splitlines()[0] == (
        f"error: {venv}/bin/python links to a Python that is gone; valid: make clean-venv, "
        "then make install"), res.explain()
    (venv / "bin" / "python").unlink()
    (venv / "bin" / "python").symlink_to(shutil.which("false"))  # runs, imports nothing
    (venv / ".installed").touch()
    res = run_cmd(["make", "-s", "venv-check", f"VENV={venv}"], cli_env)  # install's check
    assert res.returncode == 0 and not (venv / ".installed").exists(), res.explain()
    assert res.stdout == f"{venv} cannot import kernelzoo: installing it again\n"
