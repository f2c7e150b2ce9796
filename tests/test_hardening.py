"""A store with links, special files and odd contents, and sweeps ended in every way: the store
never reads or writes through a link out of itself, never waits on a special file, and every
case ends in one line (tests/test_store.py has the common damage: truncated and wrong files)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import TINY, runs_dir, snapshot

from kernelzoo.records import store
from kernelzoo.records.summary import new as new_summary
from kernelzoo import train as train_module
from kernelzoo.records.rundir import RunDir
from kernelzoo.training import job
from kernelzoo.config import UsageError


def _composed(results, *overrides):
    from hydra import compose, initialize_config_dir

    from kernelzoo.config import CONF

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=[f"results_dir={results}", *TINY,
                                            "trainer.max_steps=50", *overrides])


def _quiet(cfg):
    return job.run(cfg, echo=lambda line: None)


# ------------------------------------------------------------------ links out of the store

@pytest.fixture
def victim(tmp_path) -> Path:
    """A directory outside the store, with a file someone would miss."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "thesis.tex").write_text("years of work\n")
    return outside


def _run_path(results) -> tuple[str, Path]:
    """The run id and directory the composed tiny config trains into (planned, not trained)."""
    cfg = _composed(results, "dry_run=true")
    ((rid, _),) = _quiet(cfg)
    return rid, runs_dir(results, "adhoc") / rid


@pytest.mark.parametrize("force", [False, True])
def test_a_linked_run_directory_is_refused_and_its_target_untouched(tmp_path, victim, force):
    results = tmp_path / "results"
    rid, path = _run_path(results)
    if force:  # a finished run, then its directory replaced by a link
        _quiet(_composed(results))
        store.remove(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(victim, target_is_directory=True)
    before = snapshot(victim)
    with pytest.raises(UsageError, match=f"{path}: a symbolic link"):
        _quiet(_composed(results, *(["force=true"] if force else [])))
    assert snapshot(victim) == before
    assert sorted(p.name for p in path.parent.iterdir()) == [rid]  # no .next left behind


@pytest.mark.parametrize("level", ["adhoc", "adhoc/runs"])
def test_a_linked_experiment_or_runs_directory_is_refused(tmp_path, victim, level):
    results = tmp_path / "results"
    results.mkdir()
    link = results / level
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(victim, target_is_directory=True)
    before = snapshot(victim)
    with pytest.raises(UsageError, match=f"{link}: a symbolic link"):
        _quiet(_composed(results))
    assert snapshot(victim) == before and sorted(os.listdir(victim)) == ["thesis.tex"]


def test_reset_removes_links_not_what_they_point_to(tmp_path, victim):
    run = tmp_path / "run"
    run.mkdir()
    (run / "curve.csv").symlink_to(victim / "thesis.tex")
    (run / "tmp").symlink_to(victim, target_is_directory=True)
    (run / "sub").mkdir()
    (run / "sub" / "link").symlink_to(victim, target_is_directory=True)
    RunDir(run).reset()
    assert sorted(os.listdir(run)) == [] and (victim / "thesis.tex").read_text() == "years of work\n"


def test_a_linked_claim_lock_is_not_truncated_through(tmp_path, victim):
    run = tmp_path / "run"
    run.mkdir()
    (run / ".claim").symlink_to(victim / "thesis.tex")
    with RunDir(run).claim() as claimed:
        assert claimed
    assert (victim / "thesis.tex").read_text() == "years of work\n"
    assert not (run / ".claim").is_symlink()


def test_a_planted_staging_link_is_removed_not_followed(tmp_path, victim):
    results = tmp_path / "results"
    ((rid, _),) = _quiet(_composed(results))
    path = runs_dir(results, "adhoc") / rid
    (path.parent / f".{rid}.next").symlink_to(victim, target_is_directory=True)
    before = snapshot(victim)
    ((_, summary),) = _quiet(_composed(results, "force=true"))
    assert summary["status"] and snapshot(victim) == before
    assert sorted(p.name for p in path.parent.iterdir()) == [rid]


# ------------------------------------------------------------------ special files and bad checkpoints

SHORT = ["feature_map=elu", "n_keys=6", "trainer.max_steps=150"]


@pytest.fixture(scope="module")
def stopped(tmp_path_factory) -> Path:
    """A store whose one run stopped after its first checkpoint (step 50 of 150)."""
    from test_resume import Stop, stop_at_checkpoint
    from test_resume import train as resume_train

    results = tmp_path_factory.mktemp("stopped")
    with pytest.MonkeyPatch.context() as m:
        stop_at_checkpoint(m, 2)
        with pytest.raises(Stop):
            resume_train(results, SHORT)
    return results


def _stopped_copy(stopped: Path, tmp_path: Path) -> tuple[str, Path]:
    """A copy of ``stopped``: its run's id and directory."""
    import shutil

    shutil.copytree(stopped, tmp_path, dirs_exist_ok=True)
    [path] = runs_dir(tmp_path, "adhoc").iterdir()
    return path.name, path


def _rewrite_checkpoint(path: Path, change) -> None:
    import torch

    from kernelzoo.training import checkpoint

    state = torch.load(path / checkpoint.NAME, weights_only=True)
    change(state)
    (path / checkpoint.NAME).unlink()
    checkpoint.write(RunDir(path), {k: v for k, v in state.items() if k != "format"})


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


SPOILED_CHECKPOINTS = {
    "fifo": (lambda p: _fifo(p / "checkpoint.pt"), "not a regular file"),
    "link": (lambda p: (p / "checkpoint.pt").unlink() or (p / "checkpoint.pt").symlink_to(
        "/dev/zero"), "a symbolic link"),
    "shape": (lambda p: _rewrite_checkpoint(p, lambda s: s["model"].update(
        {"W_q.weight": s["model"]["W_q.weight"][:, :3]})), "W_q.weight is (8, 3)"),
    "key": (lambda p: _rewrite_checkpoint(p, lambda s: s["model"].pop("W_k.bias")),
            "model's keys differ: W_k.bias"),
    "step": (lambda p: _rewrite_checkpoint(p, lambda s: s.update(step=10 ** 6)),
             "step 1000000, not an evaluation"),
    "adam": (lambda p: _rewrite_checkpoint(p, lambda s: s["adam"]["W_k.weight"].update(
        exp_avg=s["adam"]["W_k.weight"]["exp_avg"][:2])), "Adam exp_avg of W_k.weight"),
    "no loop": (lambda p: _rewrite_checkpoint(p, lambda s: s.pop("loop")), "no loop"),
}


@pytest.mark.parametrize("case", list(SPOILED_CHECKPOINTS))
def test_a_special_or_wrong_checkpoint_restarts_the_run_with_its_reason(tmp_path, stopped, case):
    from test_resume import train as resume_train

    spoil, why = SPOILED_CHECKPOINTS[case]
    rid, path = _stopped_copy(stopped, tmp_path)
    spoil(path)
    lines = []
    resume_train(tmp_path, [*SHORT, "dry_run=true"], echo=lines.append)
    assert lines == [f"plan {rid}: d_dot 8, to train"]  # not waiting on a FIFO, no traceback
    lines = []
    (summary,) = resume_train(tmp_path, SHORT, echo=lines.append).values()
    restart = [line for line in lines if line.startswith(f"restart {rid} from step 0: its ")]
    assert len(restart) == 1 and why in restart[0], lines
    assert summary["steps"] == 150 and summary["resumes"] == 0
    assert store.read_summary(path) == summary


def test_a_special_or_undecodable_config_is_named_by_the_analysis(tmp_path):
    from synthetic import write_series

    from kernelzoo.analysis.runs import load_runs

    exp = tmp_path / "exp"
    fifo, binary, fine = write_series(exp, {10: 1e-4, 20: 1e-4, 30: 0.5})
    _fifo(fifo / "config.yaml")
    (binary / "config.yaml").write_bytes(b"n_keys: \xff\xfe\n")
    runs, missing, damaged = load_runs(exp)  # a FIFO read would block here forever
    assert list(runs["run_dir"]) == [fine.name] and not missing
    assert sorted(damaged) == sorted([f"{fifo / 'config.yaml'}: not a regular file",
                                      f"{binary / 'config.yaml'}: not UTF-8 text (invalid "
                                      "start byte at byte 8)"])


# ------------------------------------------------------------------ every store analyses

def _trained_twice(exp: Path) -> None:
    """One configuration trained at each point under trainer.max_steps=500 (failing from 30
    keys) and again under 2000 (failing from 40), as two run ids per point."""
    import json
    import shutil

    from synthetic import write_series

    for path in write_series(exp, {10: 1e-4, 20: 1e-4, 30: 0.5, 40: 0.6},
                             config="trainer:\n  lr: 0.001\n  max_steps: 500\n",
                             diagnostics={"phi_effective_rank": 5.0}):
        again = path.with_name(path.name + "-longer")
        shutil.copytree(path, again)
        summary = json.loads((path / "summary.json").read_text())
        loss = 1e-4 if summary["n_keys"] <= 30 else 0.7
        summary.update(run_id=again.name, final_eval_loss=loss, best_eval_loss=loss)
        (again / "summary.json").write_text(json.dumps(summary))
        (again / "config.yaml").write_text(
            (path / "config.yaml").read_text().replace("max_steps: 500", "max_steps: 2000"))


def test_a_configuration_trained_under_two_settings_gets_a_failure_point_each(tmp_path):
    from kernelzoo.analysis import prediction
    from kernelzoo.analysis.pipeline import sort_out
    from kernelzoo.analysis.runs import load_runs
    from kernelzoo.analysis.capacity import capacity_table, seed_table

    _trained_twice(tmp_path / "two")
    runs, lines = sort_out(load_runs(tmp_path / "two")[0], "two")
    seeds = seed_table(runs, 0.01, 0.99)
    table = prediction.add_columns(capacity_table(runs, seeds), runs)  # a TypeError before
    assert dict(zip(table["label"], table["first_failure"])) == {
        "ELU+1 trainer.max_steps=500": 30, "ELU+1 trainer.max_steps=2000": 40}
    assert len(table) == 2 and len(lines) == 1


def test_settings_varied_at_different_n_keys_are_split_too(tmp_path):
    """An experiment that varies trainer.patience and trainer.max_steps (lr_patience) searches
    each setting's failure point at its own n_keys: no point is trained twice, and each setting
    is still one configuration. A run whose config.yaml lacks a setting splits nothing."""
    from synthetic import write_series

    from kernelzoo.analysis.capacity import capacity_table, seed_table
    from kernelzoo.analysis.pipeline import sort_out
    from kernelzoo.analysis.runs import load_runs

    exp = tmp_path / "patience"
    for patience, steps, grid, fails in ((10, 100000, (10, 20, 30, 40), 30),
                                         (30, 200000, (15, 25, 35, 45), 45)):
        write_series(exp, {n: 1e-4 if n < fails else 0.5 for n in grid},
                     config=f"trainer:\n  patience: {patience}\n  max_steps: {steps}\n")
    runs, lines = sort_out(load_runs(exp)[0], "patience")
    table = capacity_table(runs, seed_table(runs, 0.01, 0.99))
    assert dict(zip(table["label"], table["first_failure"])) == {
        "ELU+1 trainer.max_steps=100000 trainer.patience=10": 30,
        "ELU+1 trainer.max_steps=200000 trainer.patience=30": 45}
    assert lines == ["ELU+1: trained under 2 settings of trainer.max_steps, trainer.patience; "
                     "analysed as one configuration each: ELU+1 trainer.max_steps=100000 "
                     "trainer.patience=10; ELU+1 trainer.max_steps=200000 trainer.patience=30"]
    older = tmp_path / "older"
    write_series(older, {10: 1e-4, 20: 1e-4}, config="trainer:\n  patience: 10\n")
    write_series(older, {30: 0.5, 40: 0.5})  # no trainer section in its config.yaml
    runs, lines = sort_out(load_runs(older)[0], "older")
    assert set(runs["label"]) == {"ELU+1"} and lines == []


@pytest.mark.slow  # a whole analysis, figures included: ~5-13 s
def test_a_configuration_trained_under_two_settings_is_split_in_the_report(tmp_path):
    import pandas as pd
    from synthetic import analyze_store

    _trained_twice(tmp_path / "two")
    exp = analyze_store(tmp_path, "two", figures=True)  # a TypeError in prediction.py before
    capacity = pd.read_csv(exp / "capacity.csv").set_index("label")
    assert capacity["first_failure"].to_dict() == {"ELU+1 trainer.max_steps=500": 30,
                                                   "ELU+1 trainer.max_steps=2000": 40}
    assert ("  - ELU+1: trained under 2 settings of trainer.max_steps; analysed as one "
            "configuration each: ELU+1 trainer.max_steps=2000; ELU+1 trainer.max_steps=500"
            in (exp / "report.md").read_text().splitlines())


def test_foreign_runs_and_duplicate_ids_are_left_out_and_named(tmp_path):
    import json
    import shutil

    from synthetic import write_series

    from kernelzoo.analysis.pipeline import sort_out
    from kernelzoo.analysis.runs import load_runs

    exp = tmp_path / "mine"
    own = write_series(exp, {10: 1e-4, 20: 0.5})
    foreign = write_series(tmp_path / "theirs", {30: 1e-4}, seed=2)[0]
    shutil.copytree(foreign, exp / "runs" / foreign.name)
    copy = exp / "runs" / "copy-of-first"
    shutil.copytree(own[0], copy)
    twin = exp / "runs" / (own[1].name + "-twin")  # same point, same settings, its own id
    shutil.copytree(own[1], twin)
    summary = json.loads((twin / "summary.json").read_text())
    (twin / "summary.json").write_text(json.dumps({**summary, "run_id": twin.name}))
    runs, set_aside = sort_out(load_runs(exp)[0], "mine")
    assert sorted(runs["run_dir"]) == sorted(p.name for p in own)
    assert set_aside == [
        f"{foreign.name}: a run of experiment 'theirs', not 'mine' (copied in?); left out",
        f"copy-of-first: its summary is run {own[0].name!r}, another directory's id (a "
        "duplicate or a renamed copy); left out",
        f"{twin.name}: a second run of ELU+1, seed 1, n_keys 20 under the same settings; "
        "left out"]


# ------------------------------------------------------------------ no worker outlives its sweep

@pytest.mark.parametrize("depth", [1, 2])
def test_a_worker_dies_with_its_sweep_killed_outright(cli_env, depth):
    """A sweep process marks itself and starts a worker (depth 1, as loky does) or a controller
    that starts it (depth 2, as submitit's local executor does); the worker calls
    ``die_with_sweep``, then would sleep a minute. The sweep is SIGKILLed: the worker is gone
    within seconds."""
    import signal
    import subprocess
    import sys
    import time

    from kernelzoo.training import interrupt

    worker = ("import os, time; from kernelzoo.training import interrupt; interrupt.die_with_sweep(); "
              "print(os.getpid(), flush=True); time.sleep(60)")
    start = f"subprocess.Popen([sys.executable, '-c', {worker!r}])"
    for _ in range(depth - 1):  # a controller between: it prints its pid, then starts the next
        controller = ("import os, subprocess, sys, time; print(os.getpid(), flush=True); "
                      f"{start}; time.sleep(60)")
        start = f"subprocess.Popen([sys.executable, '-c', {controller!r}])"
    sweep = ("import subprocess, sys, time; from kernelzoo.training import interrupt; "
             f"interrupt.mark_sweep(); {start}; time.sleep(60)")
    main = subprocess.Popen([sys.executable, "-c", sweep], env=cli_env, stdout=subprocess.PIPE,
                            text=True)
    pids = [int(main.stdout.readline()) for _ in range(depth)]  # controllers first, then the worker
    try:
        main.kill()
        main.wait()
        end = time.monotonic() + 5
        while time.monotonic() < end and interrupt._alive(pids[-1]):
            time.sleep(0.02)
        assert not interrupt._alive(pids[-1]), "the worker outlived its sweep"
    finally:
        for pid in pids[:-1]:
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow  # a local sweep with two workers: ~25 s
def test_sighup_stops_a_joblib_sweep_and_is_recorded(tmp_path, cli_env, background):
    """A closed terminal or ssh session: handled as SIGTERM (one line, 129, sweep.json says
    SIGHUP, no worker left, the rerun completes the runs)."""
    import signal

    from test_signals import interrupt_then_rerun

    interrupt_then_rerun(tmp_path, cli_env, background,
                         ["launcher=local", "hydra.launcher.n_jobs=2"], signal.SIGHUP,
                         to_group=False)


@pytest.mark.slow  # a local sweep with two workers: ~25 s
def test_sigkill_of_a_joblib_sweep_takes_its_workers_and_the_rerun_cleans_shm(
        tmp_path, cli_env, background):
    import signal
    import time

    from conftest import PYTHON
    from conftest import train as cli_train
    from test_signals import SWEEP, in_flight

    from kernelzoo.training import interrupt, shm

    results = tmp_path / "results"
    args = [*SWEEP, "trainer.max_steps=20000", f"results_dir={results}", "launcher=local",
            "hydra.launcher.n_jobs=2"]
    sweep = background([PYTHON, "-m", "kernelzoo.train", *args], cli_env, "sweep")
    assert sweep.wait_for(lambda b: len(in_flight(results)) >= 2, timeout=300), sweep.stderr
    workers = interrupt.descendants(sweep.proc.pid)
    os.kill(sweep.proc.pid, signal.SIGKILL)
    sweep.wait(timeout=30)
    end = time.monotonic() + 10
    while time.monotonic() < end and any(interrupt._alive(p) for p in workers):
        time.sleep(0.1)
    assert not [p for p in workers if interrupt._alive(p)], "a worker outlived its sweep"
    [owner] = shm.SHM.glob(f"{shm.PREFIX}{sweep.proc.pid}-*")  # the killed sweep's token
    listed = (owner / shm.SEMAPHORES).read_text().split() if (owner / shm.SEMAPHORES).exists() \
        else []
    left = [owner, *(shm.SHM / name for name in listed[::2])]
    rerun = cli_train(args[:-1] + ["hydra.launcher.n_jobs=1"], cli_env)
    assert rerun.returncode == 0, rerun.explain()
    assert not [p for p in left if os.path.lexists(p)]


# ------------------------------------------------------------------ one clear line

def test_an_unset_environment_variable_in_a_value_is_one_line(tmp_path, monkeypatch):
    from kernelzoo import config
    from kernelzoo.training.plan import plan

    monkeypatch.delenv("KERNELZOO_UNSET", raising=False)
    typed = "trainer.lr=${oc.env:KERNELZOO_UNSET}"
    cfg = config.compose("config", [f"results_dir={tmp_path}", typed])
    with pytest.raises(UsageError) as err, config.as_job(cfg) as job:
        plan(job)  # the error formatter itself failed here, resolving the typed override
    assert str(err.value) == (f"{typed} is invalid (KeyError raised while resolving "
                              "interpolation: \"Environment variable 'KERNELZOO_UNSET' not "
                              "found\"); valid: a finite number > 0")


@pytest.mark.slow  # two command lines: ~6 s
def test_sweep_cfg_job_and_analyze_help_answer(cli_env):
    from conftest import PYTHON, run_cmd

    shown = run_cmd([PYTHON, "-m", "kernelzoo.sweep", "smoke", "--cfg", "job"], cli_env)
    assert shown.returncode == 0 and "Traceback" not in shown.output, shown.explain()
    assert "feature_map:\n  name: elu\n" in shown.stdout and "trainer:\n" in shown.stdout
    helped = run_cmd([PYTHON, "-m", "kernelzoo.analyze", "--help"], cli_env)
    assert helped.returncode == 0 and helped.stdout.startswith(
        "usage:\n    python -m kernelzoo.analyze experiment=<name>"), helped.explain()
    assert "report.md" in helped.stdout and "feature_map:" not in helped.stdout


def _precheck(argv: list, capsys) -> str:
    """``train.precheck``'s one line; it must exit 2."""
    with pytest.raises(SystemExit) as stop:
        train_module.precheck(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err.strip()


def test_chdir_with_a_relative_results_dir_is_refused(capsys):
    for argv in (["hydra.job.chdir=true", "results_dir=rel/store"],
                 ["--multirun", "hydra.job.chdir=true", "results_dir=rel/store", "seed=1,2"]):
        assert _precheck(argv, capsys) == (
            "error: hydra.job.chdir=true with the relative results_dir=rel/store would give "
            "every job a store of its own in its directory; valid: an absolute results_dir, or "
            "hydra.job.chdir=false")


@pytest.mark.parametrize("part", ["hydra", "index", "runs"])
def test_hydra_index_or_runs_as_a_regular_file_is_one_line(tmp_path, part, capsys):
    exp = tmp_path / "adhoc"
    exp.mkdir()
    (exp / part).write_text("not a directory\n")
    with pytest.raises(store.StoreError, match=f"^{exp / part}: not a directory"):
        store.guard_experiment(tmp_path, "adhoc")
    if part == "hydra":  # a single run: before Hydra makes its job directory there
        assert _precheck([f"results_dir={tmp_path}", *TINY], capsys) == (
            f"error: {exp / part}: not a directory, where the store keeps one; valid: rename "
            "or remove it")


def test_an_index_entry_naming_another_run_is_named_not_followed(tmp_path):
    import json

    other = store.run_dir(tmp_path, "idx", "elu-S30")
    other.mkdir(parents=True)
    summary = new_summary(run_id=other.name, experiment="idx", task=None, feature_map="elu",
                          feature_map_params={}, d_key=4, d_dot=None, predicted_capacity=None,
                          n_keys=30, seq_len=None, seed=1, steps=50, update_rule="sum",
                          normalisation=None, status="converged")
    (other / "summary.json").write_text(json.dumps(summary))
    point = ["feature_map=elu", "n_keys=20", "seed=1"]
    store.index_point(tmp_path, "idx", point, other.name)  # valid, but another point's run
    with pytest.raises(store.StoreError, match=f"names run {other.name}, which is not this "
                                               "point's \\(n_keys 30, not the point's 20\\)"):
        store.point_summary(tmp_path, "idx", point)
    store.index_point(tmp_path, "idx", [*point[:1], "n_keys=30", "seed=1"], other.name)
    assert store.point_summary(tmp_path, "idx", [*point[:1], "n_keys=30", "seed=1"])["n_keys"] == 30
    # a d_key the map set from the point's d_dot is its own (the summary's d_key is 4)
    sized = [*point[:1], "n_keys=30", "seed=1", "d_key=16", "d_dot=66"]
    store.index_point(tmp_path, "idx", sized, other.name)
    assert store.point_summary(tmp_path, "idx", sized)["d_key"] == 4
    store.index_point(tmp_path, "idx", sized[:-1], other.name)
    with pytest.raises(store.StoreError, match="d_key 4, not the point's 16"):
        store.point_summary(tmp_path, "idx", sized[:-1])


def test_a_plugin_failing_at_import_disables_only_itself(tmp_path, monkeypatch):
    from test_own_map import MODULE

    from kernelzoo.maps import base as feature_maps, catalog

    site = tmp_path / "site"
    for name, code in (("mymaps", MODULE), ("badmaps", "raise ImportError('no torch_extra')\n"),
                       ("exitmaps", "import sys\nsys.exit(0)\n")):
        (site / name).mkdir(parents=True)
        (site / name / "__init__.py").write_text(code)
    info = site / "three-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: three\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[kernelzoo.feature_maps]\nbad = badmaps\nexiting = exitmaps\ncube = mymaps\n")
    monkeypatch.syspath_prepend(str(site))
    saved = dict(feature_maps.FEATURE_MAPS)
    monkeypatch.setattr(catalog, "PLUGIN_FAILURES", {})
    monkeypatch.setattr(catalog, "_LOADED", set())
    try:
        phi = catalog.build_feature_map("cube", d_key=4)  # sys.exit at import ended runs here
        assert phi.name == "cube" and phi.d_dot == 4
        with pytest.raises(catalog.ConfigError) as err:
            catalog.build_feature_map("nosuch", d_key=4)
    finally:
        feature_maps.FEATURE_MAPS.clear()
        feature_maps.FEATURE_MAPS.update(saved)
    assert str(err.value).endswith(
        "; feature map plugins that failed: 'bad' (badmaps) failed to import: ImportError: no "
        "torch_extra; 'exiting' (exitmaps) failed to import: SystemExit: 0")


def test_submitit_local_runs_as_many_jobs_at_once_as_the_cores_hold(monkeypatch):
    from omegaconf import OmegaConf

    from hydra_plugins.kernelzoo_sweeper.grid_sweeper import batch_size

    local = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher"
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    launcher = OmegaConf.create({"_target_": local, "cpus_per_task": 1})
    assert batch_size(None, launcher) == 2  # every job at once before: 24 points, 48 processes
    assert batch_size(None, OmegaConf.create({"_target_": local, "cpus_per_task": 4})) == 1
    assert batch_size(5, launcher) == 5
    slurm = OmegaConf.create({"_target_": local.replace("LocalLauncher", "SlurmLauncher")})
    assert batch_size(None, slurm) is None


READ_ONLY_JOB_DIRS = """
import errno, os, re
_mkdir = os.mkdir
def mkdir(path, *args, **kwargs):  # Hydra's job directories (<sweep dir>/<job number>) fail
    if re.search(r"/hydra/[^/]+/[0-9]+$", os.fspath(path)):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(path))
    return _mkdir(path, *args, **kwargs)
os.mkdir = mkdir
"""


@pytest.mark.slow  # a sweep under each launcher: ~20 s
@pytest.mark.parametrize("launcher", [[], ["launcher=local", "hydra.launcher.n_jobs=2"]])
def test_a_read_only_store_mid_sweep_is_one_line_and_recorded(tmp_path, cli_env, launcher):
    """The store turns read-only for Hydra's job directories, in the sweep's process (basic)
    or in its workers (local): one line naming the directory, exit code 1, sweep.json says
    so."""
    import json

    from conftest import PYTHON, run_cmd, smoke_args

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(READ_ONLY_JOB_DIRS)  # imported by every worker too
    env = {**cli_env, "PYTHONPATH": f"{site}:{cli_env['PYTHONPATH']}"}
    results = tmp_path / "results"
    res = run_cmd([PYTHON, "-m", "kernelzoo.sweep", "smoke", *smoke_args(results), *launcher],
                  env)
    assert res.returncode == 1 and "Traceback" not in res.output, res.explain()
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith(f"error: {results / 'smoke' / 'hydra'}") and \
        lines[-1].endswith(": Read-only file system"), res.explain()
    last = json.loads((results / "smoke" / "sweep.json").read_text())["invocations"][-1]
    assert last["failed"] == lines[-1].removeprefix("error: ")


def test_the_analysis_reads_no_run_through_a_link(tmp_path):
    from synthetic import write_series

    from kernelzoo.analysis.runs import load_runs

    own = write_series(tmp_path / "mine", {10: 1e-4})
    [outside] = write_series(tmp_path / "elsewhere", {20: 1e-4})
    link = tmp_path / "mine" / "runs" / "linked"
    link.symlink_to(outside, target_is_directory=True)
    runs, missing, damaged = load_runs(tmp_path / "mine")
    assert list(runs["run_dir"]) == [own[0].name] and not missing
    assert damaged == [f"{link}: a symbolic link, not a run directory; left unread"]
