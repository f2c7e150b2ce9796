"""The store's promises around the stored results: atomic outputs (kill -9 at any write point,
a full disk), damaged inputs skipped and named, force=true keeping the finished run until the
new one is complete, and file modes that follow the umask.

A kill or a full disk "at a write point" is injected into the real command line: a small
wrapper (``harness``) patches ``os.fsync`` / ``os.replace``, the two steps of every atomic
write, to SIGKILL the process or raise ENOSPC at the n-th call, then runs the module as
``python -m`` would.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import stat
from pathlib import Path

import pytest
from conftest import (PYTHON, TINY, analyze, json_file, once_per_session, run_cmd, runs_dir,
                      smoke_args, snapshot, sweep, train)
from synthetic import write_run, write_series

from kernelzoo.records import files, store
from kernelzoo.training import job
from kernelzoo.analysis.runs import load_runs

GRID = [20, 40, 60, 80, 100, 120]
OUTPUTS = ("runs.parquet", "capacity.csv", "report.md", "loss_panels.png",
           "observed_vs_predicted.png", "heatmap_elu.png", "curves.png", "accuracy_panels.png")

HARNESS = """
import errno, os, runpy, signal, sys
module, at, how, args = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
calls, fsync, replace = [0], os.fsync, os.replace
def point(name):
    calls[0] += 1
    if calls[0] == at and how == "kill-" + name:
        os.kill(os.getpid(), signal.SIGKILL)
    if calls[0] >= at and how == "full-" + name:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
def patched_fsync(fd):
    point("fsync")
    fsync(fd)
def patched_replace(a, b):
    point("replace")
    replace(a, b)
os.fsync, os.replace = patched_fsync, patched_replace
sys.argv = [module, *args]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def harness(module: str, at: int, how: str, args: list, env: dict, cwd: Path | None = None):
    """``python -m <module> <args>`` with the at-th fsync/replace killed or failing (``how``:
    kill-fsync, kill-replace, full-fsync, full-replace)."""
    return run_cmd([PYTHON, "-c", HARNESS, module, at, how, *args], env, timeout=300,
                   **({"cwd": cwd} if cwd else {}))


def outputs(exp: Path) -> dict:
    return {name: (exp / name).read_bytes() for name in OUTPUTS if (exp / name).exists()}


def analysis_store(root: Path) -> Path:
    """Three seeds of ELU+1 at two d_dot (a heatmap) failing between 60 and 80 keys."""
    exp = root / "results" / "x"
    for seed in (1, 2, 3):
        for d_dot in (32, 64):
            write_series(exp, {n: 1e-4 if n <= d_dot else 0.3 for n in GRID}, seed=seed,
                         d_dot=d_dot, d_key=d_dot)
    return exp


def analysis_args(exp: Path) -> list:
    return [f"results_dir={exp.parent}", f"experiment={exp.name}", "logger=none"]


@pytest.fixture(scope="module")
def old_and_new(tmp_path_factory, worker_id):
    """A store analysed once (the old outputs), then grown by one seed; the outputs a complete
    analysis of the grown store writes (the new ones). Made once per test session
    (``once_per_session``)."""
    return once_per_session(tmp_path_factory, worker_id, "atomic", _old_and_new)


def _old_and_new(root: Path):
    env = _env(root)
    exp = analysis_store(root / "old")
    assert analyze(analysis_args(exp), env).returncode == 0
    old = outputs(exp)
    grown = root / "grown"
    shutil.copytree(root / "old", grown)
    write_series(grown / "results" / "x", {n: 1e-4 if n <= 40 else 0.3 for n in GRID}, seed=4,
                 d_dot=32, d_key=32)
    new_exp = grown / "results" / "x"
    assert analyze(analysis_args(new_exp), env).returncode == 0
    again = outputs(new_exp)
    assert analyze(analysis_args(new_exp), env).returncode == 0
    assert outputs(new_exp) == again, "the analysis' outputs are not reproducible to the byte"
    shutil.rmtree(new_exp)
    shutil.copytree(root / "old" / "results" / "x", new_exp)
    write_series(new_exp, {n: 1e-4 if n <= 40 else 0.3 for n in GRID}, seed=4, d_dot=32,
                 d_key=32)
    return grown, old, again, env


def _env(root: Path) -> dict:
    from conftest import base_env

    return base_env(root)


def _check_old_or_new(exp: Path, old: dict, new: dict) -> None:
    for name, data in outputs(exp).items():
        assert data in (old[name], new[name]), f"{name} is neither the old nor the new file"
    assert set(outputs(exp)) == set(old)


def _fresh(grown: Path, tmp_path: Path) -> Path:
    work = tmp_path / "work"
    shutil.copytree(grown, work)
    return work / "results" / "x"


@pytest.mark.slow
@pytest.mark.parametrize("at, how", [(4, "kill-replace"), (9, "kill-fsync")])
def test_kill_9_at_a_write_point_leaves_old_or_new_files(old_and_new, tmp_path, at, how):
    grown, old, new, env = old_and_new
    exp = _fresh(grown, tmp_path)
    res = harness("kernelzoo.analyze", at, how, analysis_args(exp), env)
    assert res.returncode == -9, res.explain()
    _check_old_or_new(exp, old, new)


@pytest.mark.slow
def test_kill_9_at_random_write_points(old_and_new, tmp_path):
    """Eight seeded random write points (before the data is synced, before and after the
    rename), each on a fresh copy: every output is the old file or the new, whole."""
    grown, old, new, env = old_and_new
    rng = random.Random(7)
    for i in range(8):
        at, how = rng.randint(1, 9), rng.choice(["kill-fsync", "kill-replace"])
        exp = _fresh(grown, tmp_path / str(i))
        res = harness("kernelzoo.analyze", at, how, analysis_args(exp), env)
        assert res.returncode in (-9, 0), res.explain()
        _check_old_or_new(exp, old, new)


@pytest.mark.slow
def test_full_disk_is_one_line_and_keeps_the_old_file(old_and_new, tmp_path):
    grown, old, new, env = old_and_new
    exp = _fresh(grown, tmp_path)
    res = harness("kernelzoo.analyze", 3, "full-fsync", analysis_args(exp), env)
    assert res.returncode == 1, res.explain()
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "No space left on device; the outputs written before it are " \
        "newer than report.md (ANALYSIS_INCOMPLETE.txt says so)" in lines[0], res.explain()
    assert str(exp) in lines[0] and (exp / "ANALYSIS_INCOMPLETE.txt").exists()
    _check_old_or_new(exp, old, new)
    assert (exp / "report.md").read_bytes() == old["report.md"]
    assert not [p for p in exp.iterdir() if p.name.startswith(".")], "a temporary file is left"


@pytest.mark.slow
def test_full_disk_in_a_run_and_a_sweep_is_one_line(tmp_path, cli_env):
    results = tmp_path / "results"
    res = harness("kernelzoo.train", 1, "full-fsync", [f"results_dir={results}", *TINY], cli_env)
    assert res.returncode == 1, res.explain()
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") \
        and lines[0].endswith("config.yaml: No space left on device"), res.explain()
    assert not list(results.rglob("summary.json"))
    res = harness("kernelzoo.sweep", 1, "full-fsync", ["smoke", *smoke_args(results)], cli_env)
    assert res.returncode == 1, res.explain()
    assert "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines()[-1].endswith("sweep.json: No space left on device")


# ------------------------------------------------------------------ damaged inputs

def test_damaged_inputs_are_listed_and_the_analysis_goes_on(tmp_path, cli_env):
    exp = analysis_store(tmp_path)
    runs = exp / "runs"
    wrong_type = next(runs.glob("elu-dkey32-ddot32-S20-*seed1"))
    summary = json.loads((wrong_type / "summary.json").read_text())
    (wrong_type / "summary.json").write_text(json.dumps({**summary, "n_keys": "twenty"}))
    binary = next(runs.glob("elu-dkey32-ddot32-S40-*seed1"))
    (binary / "summary.json").write_bytes(b"\xff\xfe\x00garbage")
    fifo_run = next(runs.glob("elu-dkey32-ddot32-S60-*seed1"))
    (fifo_run / "summary.json").unlink()
    os.mkfifo(fifo_run / "summary.json")
    os.mkfifo(runs / "a-fifo")
    # the curves plotted beside ELU+1 d_dot 64's failure point (seed 1: 60 and 80 keys)
    curve = next(runs.glob("elu-dkey64-ddot64-S60-*seed1")) / "curve.csv"
    curve.write_text("step,train_loss,eval_loss,eval_accuracy\n100,abc,0.1,0.9\n")
    fifo_curve = next(runs.glob("elu-dkey64-ddot64-S80-*seed1")) / "curve.csv"
    fifo_curve.unlink()
    os.mkfifo(fifo_curve)
    (exp / "sweep.json").write_text('{"invocations": [{"points": 6, "wall_')
    (exp / "search.json").write_text('{"series": [1, 2]}')

    res = analyze([*analysis_args(exp), "figures=false"], cli_env, timeout=120)
    assert res.returncode == 0, res.explain()
    assert "Traceback" not in res.output
    report = (exp / "report.md").read_text()
    section = report[report.index("Damaged files (skipped): 8"):]
    for needle in (f"{wrong_type}/summary.json: n_keys is \"twenty\", not an integer",
                   f"{binary}/summary.json", "not UTF-8",
                   f"{fifo_run}/summary.json", "not a regular file",
                   f"{runs / 'a-fifo'}: not a run directory",
                   f"{curve}: not a curve", f"{fifo_curve}: not a regular file",
                   f"{exp / 'sweep.json'}: not readable JSON",
                   f"{exp / 'search.json'}: not a search record"):
        assert needle in section, needle
    for needle in ("sweep.json", "a-fifo", "n_keys is"):
        assert needle in res.stderr


@pytest.mark.slow
def test_damaged_sweep_record_and_index_do_not_stop_a_sweep(smoke_results, tmp_path):
    from conftest import copy_results

    results = copy_results(smoke_results.results, tmp_path / "results")
    exp = results / "smoke"
    (exp / "sweep.json").write_text('{"invocations": [{"points": 6, "wall_')
    common = ["+experiments=smoke", *smoke_args(results)]  # the index is keyed by the overrides
    index = [store._point_file(results, "smoke", [f"feature_map={m}", f"n_keys={n}", *common])
             for m, n in (("elu", 3), ("elu", 6), ("dpfp", 3))]
    index[0].parent.mkdir(exist_ok=True)
    index[0].write_bytes(b"\xff\xfe not a run id")
    index[1].unlink(missing_ok=True)  # the copy's index is valid where it lies: replaced
    os.mkfifo(index[1])
    index[2].write_text("../../../etc\n")
    before = snapshot(runs_dir(results, "smoke"))
    res = sweep("smoke", smoke_args(results), smoke_results.env, timeout=300)
    assert res.returncode == 0, res.explain()
    assert "Traceback" not in res.output and "done " not in res.stdout, res.explain()
    for needle in (str(index[0]), "not UTF-8", str(index[1]), "not a regular file", str(index[2]),
                   "a run id is one path component", "sweep.json: not readable JSON",
                   "kept as sweep.json.damaged"):
        assert needle in res.stderr, needle
    assert (exp / "sweep.json.damaged").read_text() == '{"invocations": [{"points": 6, "wall_'
    assert json_file(exp / "sweep.json")["invocations"][0]["outcomes"] == {"skipped": 6}
    assert snapshot(runs_dir(results, "smoke")) == before
    assert all(stat.S_ISREG(p.stat().st_mode) for p in index[:3]), "the index is not mended"


def test_a_summary_with_wrong_types_is_a_store_error(tmp_path):
    path = write_run(tmp_path, n_keys=20, loss=1e-4)
    summary = json.loads((path / "summary.json").read_text())
    for key, bad in (("final_eval_loss", "low"), ("seed", True), ("feature_map_params", [1]),
                     ("d_dot", 1.5), ("status", 3)):
        (path / "summary.json").write_text(json.dumps({**summary, key: bad}))
        with pytest.raises(store.StoreError, match=key):
            store.read_summary(path)


# ------------------------------------------------------------------ force=true

def _composed(results, *overrides):
    from hydra import compose, initialize_config_dir

    from kernelzoo.config import CONF

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=[f"results_dir={results}", *TINY,
                                            "trainer.max_steps=50", *overrides])


def test_force_keeps_the_finished_run_until_the_new_one_is_complete(tmp_path, monkeypatch):
    results = tmp_path / "results"
    ((rid, first),) = job.run(_composed(results), echo=lambda line: None)
    path = runs_dir(results, "adhoc") / rid
    finished = {k: v for k, v in snapshot(path).items() if k != ".claim"}

    def crash(members):
        where = members[0].run.path
        assert where != path and where.parent == path.parent and where.name.startswith(".")
        assert {k: v for k, v in snapshot(path).items() if k != ".claim"} == finished
        raise RuntimeError("killed mid-training")

    monkeypatch.setattr(job, "fit", crash)
    with pytest.raises(RuntimeError):
        job.run(_composed(results, "force=true"), echo=lambda line: None)
    assert {k: v for k, v in snapshot(path).items() if k != ".claim"} == finished
    runs, missing, damaged = load_runs(results / "adhoc")
    assert list(runs["run_id"]) == [rid] and not missing and not damaged
    monkeypatch.undo()

    lines = []
    ((rid2, second),) = job.run(_composed(results, "force=true"), echo=lines.append)
    assert rid2 == rid and store.read_summary(path) == second  # the rerun's summary, in place
    assert any(line.startswith(f"done {rid}") for line in lines)  # trained again, not skipped
    assert sorted(p.name for p in path.parent.iterdir()) == [rid]


@pytest.mark.slow
def test_force_killed_mid_training_keeps_the_finished_run(tmp_path, cli_env, background):
    results = tmp_path / "results"
    args = [f"results_dir={results}", *TINY, "trainer.max_steps=1000", "trainer.patience=1000",
            "trainer.stop_loss=1e-12"]
    assert train(args, cli_env).returncode == 0
    [path] = runs_dir(results, "adhoc").iterdir()
    finished = {k: v for k, v in snapshot(path).items() if k != ".claim"}
    forced = background([PYTHON, "-m", "kernelzoo.train", *args, "force=true"], cli_env)
    staged = path.parent / f".{path.name}.next"
    assert forced.wait_for(lambda b: (staged / "config.yaml").exists(), timeout=120)
    forced.kill()
    assert {k: v for k, v in snapshot(path).items() if k != ".claim"} == finished
    res = analyze([f"results_dir={results}", "experiment=adhoc", "logger=none"], cli_env)
    assert res.returncode == 0 and "without summary.json (in progress or interrupted): none" \
        in (results / "adhoc" / "report.md").read_text(), res.explain()


# ------------------------------------------------------------------ file modes

@pytest.mark.slow
def test_files_follow_the_umask_and_stay_in_results_dir(tmp_path, cli_env):
    """With umask 002 (a group sharing a cluster's results): files 664, directories 775,
    none left at mkstemp's 600. A one-point sweep (run, index, sweep.json, Hydra's logs), then
    its analysis, from an empty working directory that stays empty."""
    results, cwd = tmp_path / "results", tmp_path / "cwd"
    cwd.mkdir()
    script = (f"umask 002 && {PYTHON} -m kernelzoo.train -m results_dir={results} "
              f"experiment=modes {' '.join(TINY)} && {PYTHON} -m kernelzoo.analyze "
              f"experiment=modes results_dir={results} logger=none")
    res = run_cmd(["bash", "-c", script], cli_env, timeout=300, cwd=cwd)
    assert res.returncode == 0, res.explain()
    assert not list(cwd.iterdir())
    modes = {p: stat.S_IMODE(p.stat().st_mode) for p in results.rglob("*")}
    files = {p: m for p, m in modes.items() if p.is_file()}
    assert {"summary.json", "config.yaml", "curve.csv", "report.md", "sweep.json",
            "runs.parquet", "curves.png"} <= {p.name for p in files}
    assert any(p.parent.name == "index" for p in files)
    assert {m for m in files.values()} == {0o664}, {str(p): oct(m) for p, m in files.items()
                                                      if m != 0o664}
    assert {m for p, m in modes.items() if p.is_dir()} == {0o775}


def test_atomic_write_names_the_file_on_failure(tmp_path, monkeypatch):
    target = tmp_path / "out.txt"
    target.write_text("old\n")

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as err:
        files.atomic_write_text(target, "new\n")
    assert err.value.filename == str(target) and err.value.errno == errno.ENOSPC
    assert files.one_line(err.value) == f"{target}: No space left on device"
    assert target.read_text() == "old\n" and sorted(tmp_path.iterdir()) == [target]
