"""SIGTERM and SIGINT to a sweep, through each launcher: the sweep stops its workers (no process
of it survives), records the interruption in sweep.json, exits at once with one line and
128 + the signal number, and leaves the runs in flight without a summary, so that a rerun
completes them."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from conftest import PYTHON, _group_alive, json_file, train

from kernelzoo.records import store
from kernelzoo.training import interrupt

SWEEP = ["--multirun", "experiment=sig", "trainer=smoke", "logger=none", "trainer.threads=1",
         "d_key=4", "feature_map=elu", "n_keys=3,4",
         "trainer.patience=1000", "trainer.stop_loss=1e-12",
         "trainer.pack=1"]  # two jobs, so that two workers are in flight (packs: test_pack.py)


def in_flight(results: Path) -> list[Path]:
    """Run directories of started runs without a summary."""
    runs = results / "sig" / "runs"
    return [p for p in runs.iterdir() if (p / "config.yaml").exists()
            and not (p / "summary.json").exists()] if runs.is_dir() else []


def interrupt_then_rerun(tmp_path, cli_env, background, launcher: list, sig: int,
                         to_group: bool, max_steps: int = 20000) -> None:
    """``max_steps`` keeps the runs in flight long enough for the signal (workers must start);
    the rerun trains them to it."""
    results = tmp_path / "results"
    sweep_args = [*SWEEP, f"trainer.max_steps={max_steps}"]
    want = 1 if not launcher else 2  # with workers: both in flight, each past its start-up
    sweep = background([PYTHON, "-m", "kernelzoo.train", *sweep_args, f"results_dir={results}",
                        *launcher], cli_env, "sweep")
    assert sweep.wait_for(lambda b: len(in_flight(results)) >= want, timeout=300, poll=0.05), \
        sweep.stdout + sweep.stderr
    workers, flying = interrupt.descendants(sweep.proc.pid), in_flight(results)
    sent = time.monotonic()
    if to_group:  # Ctrl-C in a terminal: the whole foreground group gets it
        os.killpg(sweep.pgid, sig)
    else:  # kill <pid>, a scheduler's stop: the sweep process alone
        os.kill(sweep.proc.pid, sig)
    code = sweep.wait(timeout=60)
    seconds = time.monotonic() - sent
    name = signal.Signals(sig).name
    lines = [line for line in sweep.stderr.splitlines() if line.strip()]
    assert code == 128 + sig, sweep.stderr
    assert seconds < 20, f"{seconds:.1f} s from {name} to exit"
    assert len(lines) == 1 and lines[0].startswith(f"interrupted: sweep sig stopped by {name}"), \
        sweep.stderr
    end = time.monotonic() + 5
    while time.monotonic() < end and (_group_alive(sweep.pgid)
                                      or any(Path(f"/proc/{p}").exists() for p in workers)):
        time.sleep(0.1)
    assert not _group_alive(sweep.pgid), "a process of the sweep survived it"
    assert not [p for p in workers if interrupt._alive(p)], "a worker survived the sweep"
    last = json_file(results / "sig" / "sweep.json")["invocations"][-1]
    assert last["interrupted"] == name
    assert flying and not any((run / "summary.json").exists() for run in flying)

    rerun = train([*sweep_args, f"results_dir={results}"], cli_env)
    assert rerun.returncode == 0, rerun.explain()
    for run in flying:
        assert store.read_summary(run)["steps"] > 0
    assert json_file(results / "sig" / "sweep.json")["invocations"][-1].get("interrupted") is None


@pytest.mark.slow
def test_sigterm_stops_a_basic_sweep(tmp_path, cli_env, background):
    """The basic launcher trains in the sweep's own process: the run in flight unwinds. No
    workers to wait for, so shorter runs (the rerun trains both: ~8 s instead of ~40)."""
    interrupt_then_rerun(tmp_path, cli_env, background, [], signal.SIGTERM, to_group=False,
                         max_steps=4000)


@pytest.mark.slow
def test_an_interrupted_sweep_counts_the_runs_that_ended_before_the_signal(tmp_path, cli_env,
                                                                           background):
    """The exit line and sweep.json count the job that ended before SIGTERM (the basic launcher
    runs the 10-step point first, then the long one, which the signal stops)."""
    results = tmp_path / "results"
    args = [*(a for a in SWEEP if not a.startswith("n_keys=")), "n_keys=3",
            "trainer.max_steps=10,20000", f"results_dir={results}"]
    sweep = background([PYTHON, "-m", "kernelzoo.train", *args], cli_env, "sweep")
    assert sweep.wait_for(lambda b: len(in_flight(results)) == 1 and any(
        (results / "sig" / "runs").glob("*/summary.json")), timeout=300, poll=0.05), \
        sweep.stdout + sweep.stderr
    os.kill(sweep.proc.pid, signal.SIGTERM)
    assert sweep.wait(timeout=60) == 128 + signal.SIGTERM, sweep.stderr
    assert "stopped by SIGTERM after" in sweep.stderr and "min (max_steps 1); its workers" \
        in sweep.stderr, sweep.stderr
    last = json_file(results / "sig" / "sweep.json")["invocations"][-1]
    assert last["outcomes"] == {"skipped": 0, "max_steps": 1} and last["points"] == 2


@pytest.mark.slow
def test_sigint_stops_a_joblib_sweep(tmp_path, cli_env, background):
    """launcher=local (joblib, loky processes), Ctrl-C to the whole process group. (Slow: ~25 s.)"""
    interrupt_then_rerun(tmp_path, cli_env, background,
                         ["launcher=local", "hydra.launcher.n_jobs=2"], signal.SIGINT,
                         to_group=True)


@pytest.mark.slow
def test_sigterm_to_the_sweep_alone_stops_its_joblib_workers(tmp_path, cli_env, background):
    interrupt_then_rerun(tmp_path, cli_env, background,
                         ["launcher=local", "hydra.launcher.n_jobs=2"], signal.SIGTERM,
                         to_group=False)


@pytest.mark.slow
def test_sigterm_stops_a_submitit_sweep(tmp_path, cli_env, background):
    """launcher=submitit_local: submitit's tasks let SIGTERM pass, so they are killed. (~30 s.)"""
    interrupt_then_rerun(tmp_path, cli_env, background, ["launcher=submitit_local"],
                         signal.SIGTERM, to_group=False)
