"""Doors round 4 did not reach: the entry points read every file through the safe reader (a
YAML bomb or a FIFO in ./experiments/, a FIFO at index/analysed, the untrained CLI's config),
and a named sweep never writes into another experiment's store. Each case is one line and an
exit code, never a hang or a traceback."""

from __future__ import annotations

import os

import pytest
from conftest import PYTHON, run_cmd, smoke_args
from test_hostile_files import _bomb

HANG = 60  # seconds: each of these hung until killed


def sweep(args, env, cwd):
    return run_cmd([PYTHON, "-m", "kernelzoo.sweep", *args, "--no-analysis"], env, timeout=HANG,
                   cwd=cwd)


def _one_error(res) -> str:
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in res.output, res.explain()
    return lines[0]


def test_a_yaml_bomb_in_the_experiments_folder_is_one_line(tmp_path, cli_env):
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "bomb.yaml").write_text(_bomb(7))
    res = sweep(["bomb", *smoke_args(tmp_path / "results")], cli_env, tmp_path)
    assert res.returncode == 2
    assert _one_error(res) == (
        f"error: {tmp_path / 'experiments' / 'bomb.yaml'}: cannot be read as an experiment (more "
        "than 1048576 values once its aliases are expanded); valid: a YAML file of a mapping, "
        "e.g. a copy of a packaged experiment")


@pytest.mark.parametrize("name", ["smoke", "mine"])
def test_a_fifo_in_the_experiments_folder_is_never_waited_on(tmp_path, cli_env, name):
    """A FIFO named experiments/smoke.yaml in the working directory hung even the packaged
    ``sweep smoke`` (compared with the packaged file), and a FIFO of the user's own name hung
    its sweep."""
    (tmp_path / "experiments").mkdir()
    os.mkfifo(tmp_path / "experiments" / f"{name}.yaml")
    res = sweep([name, *smoke_args(tmp_path / "results"), "dry_run=true"], cli_env, tmp_path)
    assert res.returncode == 2
    assert _one_error(res).startswith(
        f"error: {tmp_path / 'experiments' / f'{name}.yaml'}: cannot be read as an experiment "
        "(")
    assert "not a regular file" in res.stderr


def test_bad_experiment_files_are_one_line(tmp_path, cli_env):
    """A tag, bytes that are not UTF-8, a file without read permission: one line each."""
    folder = tmp_path / "experiments"
    folder.mkdir()
    (folder / "tagged.yaml").write_text("experiment: !!python/object:os.system x\n")
    (folder / "binary.yaml").write_bytes(b"experiment: \xff\xfe\n")
    (folder / "text.yaml").write_text("just words\n")
    for name in ("tagged", "binary", "text"):
        res = sweep([name, *smoke_args(tmp_path / "results"), "dry_run=true"], cli_env, tmp_path)
        assert res.returncode == 2 and _one_error(res).startswith(
            f"error: {folder / f'{name}.yaml'}: "), res.explain()


def test_a_fifo_at_the_analysed_stamp_is_never_waited_on(tmp_path, cli_env):
    """index/analysed, the stamp of the last analysis, a FIFO: every sweep hung at its end.
    It reads as no stamp: the store is not up to date (exit 1), at once."""
    exp = tmp_path / "results" / "smoke"
    (exp / "index").mkdir(parents=True)
    os.mkfifo(exp / "index" / "analysed")
    res = run_cmd([PYTHON, "-m", "kernelzoo.records.analysed", "check", exp], cli_env,
                  timeout=HANG)
    assert res.returncode == 1 and res.stdout == "", res.explain()


@pytest.mark.parametrize("what", ["fifo", "bomb"])
def test_the_untrained_cli_reads_its_config_safely(tmp_path, cli_env, what):
    path = tmp_path / "config.yaml"
    if what == "fifo":
        os.mkfifo(path)
    else:
        path.write_text(_bomb(7))
    res = run_cmd([PYTHON, "-m", "kernelzoo.training.untrained", path], cli_env, timeout=HANG)
    assert res.returncode != 0
    line = _one_error(res)
    assert line.startswith(f"error: {path}: ") and line.endswith("valid: a run's config.yaml")
    assert ("not a regular file" if what == "fifo" else "more than 1048576 values") in line


@pytest.mark.parametrize("given", ["experiment=figure2", "++experiment=figure2",
                                   "+experiment=figure2"])
def test_a_named_sweep_cannot_write_into_another_experiments_store(tmp_path, cli_env, given):
    """``sweep smoke experiment=figure2`` was accepted: six toy runs joined figure2's 240 and
    its report was rewritten for the mixture. The ad-hoc path refused the same name."""
    res = sweep(["smoke", *smoke_args(tmp_path / "results"), given, "dry_run=true"], cli_env,
                tmp_path)
    assert res.returncode == 2
    assert _one_error(res) == (
        f"error: {given.lstrip('+')} names experiment 'figure2', whose store this sweep would mix "
        "into; valid: kernelzoo-sweep figure2 to run it, or a new name for this sweep's store")
    assert not (tmp_path / "results").exists()


def test_an_experiment_yaml_cannot_name_another_experiments_store(tmp_path, cli_env):
    folder = tmp_path / "experiments"
    folder.mkdir()
    (folder / "mine.yaml").write_text("# @package _global_\nexperiment: figure2\nd_key: 4\n")
    res = sweep(["mine", *smoke_args(tmp_path / "results"), "dry_run=true"], cli_env, tmp_path)
    assert res.returncode == 2
    assert _one_error(res) == (
        f"error: {folder / 'mine.yaml'} (experiment: figure2) names experiment 'figure2', whose "
        "store this sweep would mix into; valid: kernelzoo-sweep figure2 to run it, or a new "
        "name for this sweep's store")


@pytest.mark.slow  # a dry run: ~5 s
def test_a_named_sweep_may_keep_its_runs_under_a_new_name(tmp_path, cli_env):
    res = sweep(["smoke", *smoke_args(tmp_path / "results"), "experiment=my_smoke",
                 "dry_run=true"], cli_env, tmp_path)
    assert res.returncode == 0, res.explain()
    assert "sweep my_smoke: 6 points, a dry run" in res.stdout
