"""SIGTERM and SIGINT to a sweep, through each launcher: the sweep stops its workers (no process
of it survives), records the interruption in sweep.json, exits at once with one line and
128 + the signal number, and leaves the runs in flight without a summary, so that a rerun
completes them."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest
from conftest import PYTHON, _group_alive, group_members, json_file, train

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


@pytest.mark.slow  # a joblib sweep with two workers: ~30 s
def test_sigterm_to_one_joblib_worker_is_one_line_and_recorded(tmp_path, cli_env, background):
    """A worker ended by a signal (SIGTERM, the OOM killer's SIGKILL) ended the sweep with a
    traceback and nothing in sweep.json; now its one line names it, exit code 1, the other
    worker is stopped and sweep.json records the failure."""
    results = tmp_path / "results"
    sweep = background([PYTHON, "-m", "kernelzoo.train", *SWEEP, "trainer.max_steps=20000",
                        f"results_dir={results}", "launcher=local", "hydra.launcher.n_jobs=2"],
                       cli_env, "sweep")
    assert sweep.wait_for(lambda b: len(in_flight(results)) >= 2, timeout=300), sweep.stderr
    workers = [p for p in interrupt.descendants(sweep.proc.pid)
               if not interrupt._ignores(p, signal.SIGTERM)]  # not loky's resource tracker
    os.kill(workers[-1], signal.SIGTERM)
    assert sweep.wait(timeout=60) == 1, sweep.stderr
    lines = [line for line in sweep.stderr.splitlines() if line.strip()]
    assert "Traceback" not in sweep.stderr and lines[-1].startswith(
        "error: a worker of the sweep ended by itself (TerminatedWorkerError: ") and \
        "SIGTERM" in lines[-1], sweep.stderr
    last = json_file(results / "sig" / "sweep.json")["invocations"][-1]
    assert last["failed"] == lines[-1].removeprefix("error: ")
    assert not _group_alive(sweep.pgid) or sweep.wait_for(
        lambda b: not _group_alive(b.pgid), timeout=10), \
        f"a worker outlived its sweep: {group_members(sweep.pgid)}"


def test_a_closed_stdout_costs_output_not_a_run(monkeypatch):
    """``sweep | head -1``: the reader gone, a write met a broken pipe and the run writing it
    failed. Now the write is dropped and the descriptor points at /dev/null from then on."""
    import io

    read, write = os.pipe()
    os.close(read)  # the reader (head -1) is gone
    stream = io.TextIOWrapper(io.FileIO(write, "w"), line_buffering=True)
    monkeypatch.setattr("sys.stdout", stream)
    interrupt.survive_closed_output()
    interrupt.survive_closed_output()  # once is enough: not wrapped twice
    import sys

    assert sys.stdout._stream is stream
    print("done elu-S3: converged after 10 steps")  # BrokenPipeError before
    print("progress: 1/6 runs")
    assert os.path.samefile(f"/proc/self/fd/{write}", os.devnull)
    sys.stdout.flush()
    monkeypatch.undo()
    stream.close()


@pytest.mark.slow  # the smoke sweep: ~15 s
def test_a_sweep_piped_into_head_trains_every_run(tmp_path, cli_env):
    import subprocess

    from conftest import smoke_args

    results = tmp_path / "results"
    proc = subprocess.Popen([PYTHON, "-m", "kernelzoo.sweep", "smoke", *smoke_args(results)],
                            env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    first = proc.stdout.readline()
    proc.stdout.close()  # head -1
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 0 and "Traceback" not in err, err
    assert first.startswith("logs: ")  # the sweep's first line; every line after it is lost
    statuses = [store.read_summary(p)["status"] for p in (results / "smoke" / "runs").iterdir()]
    assert len(statuses) == 6 and statuses.count("infeasible") == 1


STOPPED_MID_WRITE = """
import os, signal, sys
import pandas as pd
_write = pd.DataFrame.to_parquet
def to_parquet(self, f, **kwargs):  # runs.parquet half written, then SIGTERM
    f.write(b"PAR1 half a table")
    os.kill(os.getpid(), signal.SIGTERM)
    return _write(self, f, **kwargs)
pd.DataFrame.to_parquet = to_parquet
from kernelzoo import analyze
sys.argv = ["analyze", "experiment=exp", "results_dir=" + sys.argv[1], "logger=none"]
analyze.main()
"""


@pytest.mark.slow  # one analysis on the command line: ~6 s
def test_sigterm_during_the_analysis_leaves_no_part_of_a_file(tmp_path, cli_env):
    """SIGTERM while the analysis wrote a file killed it with the temporary file left beside."""
    import subprocess

    from synthetic import write_series

    write_series(tmp_path / "exp", {10: 1e-4, 20: 0.5})
    res = subprocess.run([PYTHON, "-c", STOPPED_MID_WRITE, str(tmp_path)], env=cli_env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 128 + signal.SIGTERM, res.stderr
    assert res.stderr.strip().splitlines() == [
        "kernelzoo-analyze: stopped by SIGTERM; every output written is whole (the old file or "
        "the new), and a rerun writes them all"]
    # no part of a file; the marker says the analysis did not finish
    assert sorted(p.name for p in (tmp_path / "exp").iterdir()) == ["ANALYSIS_INCOMPLETE.txt",
                                                                    "runs"]


def test_an_interrupted_slurm_sweep_cancels_the_jobs_it_submitted(tmp_path, monkeypatch):
    """Each sweep's job folders lie in its own sweep directory: the folders submitit made for
    its array tasks (``<array id>_<task>``) name the arrays to scancel; another sweep's jobs in
    the same store, even those submitted after this one started, and other files are left
    alone (they were cancelled when newer than this sweep's start)."""
    import os

    from kernelzoo.training import interrupt

    mine, other = tmp_path / "hydra" / "a" / "slurm", tmp_path / "hydra" / "b" / "slurm"
    for folder, names in ((mine, ("4211_0", "4211_1", "4212_0")), (other, ("977_3", "4300_0"))):
        for name in names:
            (folder / name).mkdir(parents=True)
    (mine / "notes.txt").write_text("not a job\n")
    bin_dir, called = tmp_path / "bin", tmp_path / "scancel.args"
    bin_dir.mkdir()
    (bin_dir / "scancel").write_text(f"#!/bin/sh\necho \"$@\" > {called}\n")
    (bin_dir / "scancel").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    assert interrupt.cancel_slurm_jobs(f"{mine}/%j") == ["4211", "4212"]
    assert called.read_text().split() == ["4211", "4212"]
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert interrupt.cancel_slurm_jobs(f"{mine}/%j") == []


def _submitit_tasks() -> list[int]:
    """The pids of submitit's task processes (``python -m submitit.core._submit``)."""
    found = []
    for cmd in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if b"submitit.core._submit" in cmd.read_bytes():
                found.append(int(cmd.parent.name))
        except (OSError, ValueError):
            continue
    return found


def _submitit_job_training(results: Path, cli_env, background, *extra):
    """A submitit_local sweep of one long run (ELU+1, 6 keys, 20k steps), once it trains: the
    sweep and its task's pid."""
    sweep = background([PYTHON, "-m", "kernelzoo.sweep", "smoke", f"results_dir={results}",
                        "launcher=submitit_local", "grids=[0]", "feature_map=elu", "n_keys=6",
                        *extra, "trainer.max_steps=20000", "trainer.patience=1000",
                        "trainer.stop_loss=1e-12", "--no-analysis"], cli_env, "sweep")

    def training(_) -> bool:
        curves = list((results / "smoke" / "runs").glob("*/curve.csv"))
        return bool(curves) and len(curves[0].read_text().splitlines()) > 3
    assert sweep.wait_for(training, timeout=300, poll=0.1), sweep.stdout + sweep.stderr
    [task] = [pid for pid in _submitit_tasks() if pid in interrupt.descendants(sweep.proc.pid)]
    return sweep, task


@pytest.mark.slow
def test_a_warned_submitit_job_checkpoints_and_is_requeued(tmp_path, cli_env, background):
    """A fake time limit: SIGUSR2, the scheduler's warning, to a submitit_local job in flight.
    The run checkpoints at its next evaluation and says so in one line with its step, submitit
    requeues the job (max_num_timeout), and the requeued job continues the run from that step
    to its end: one summary, one resume. (~60 s.)"""
    results = tmp_path / "results"
    sweep, task = _submitit_job_training(results, cli_env, background,
                                         "+hydra.launcher.max_num_timeout=3")
    os.kill(task, signal.SIGUSR2)
    assert sweep.wait(timeout=400) == 0, sweep.stdout + sweep.stderr
    log = "".join(p.read_text()
                  for p in (results / "smoke" / "hydra").glob("*/submitit/**/*_log.out"))
    [(rid, step)] = re.findall(r"^timed out (\S+): checkpointed at step (\d+); the requeued job "
                               r"continues from there$", log, re.M)
    assert re.search(rf"^resume {re.escape(rid)}: from its checkpoint at step {step} ", log, re.M)
    summary = store.read_summary(results / "smoke" / "runs" / rid)
    assert (summary["status"], summary["steps"], summary["resumes"]) == ("max_steps", 20000, 1)
    assert 0 < int(step) < 20000


@pytest.mark.slow
def test_sigusr2_to_a_sweep_inside_a_job_is_one_line(tmp_path, cli_env, background):
    """A sweep run inside a SLURM job gets the scheduler's warning (SIGUSR2) before its time
    limit: it exited 140 without a line; now it stops as for SIGTERM, says so and records it."""
    interrupt_then_rerun(tmp_path, cli_env, background, [], signal.SIGUSR2, to_group=False,
                         max_steps=4000)


@pytest.mark.slow
def test_a_killed_submitit_job_ends_the_sweep_in_one_line_and_is_recorded(tmp_path, cli_env,
                                                                         background):
    """A submitit job SIGKILLed (the OOM killer, a lost node) ended the sweep in a 30-line
    traceback with no sweep.json record: now one line, exit 1, the failure recorded, and a rerun
    continues the run. (~40 s.)"""
    results = tmp_path / "results"
    sweep, task = _submitit_job_training(results, cli_env, background)
    os.kill(task, signal.SIGKILL)
    assert sweep.wait(timeout=120) == 1, sweep.stdout + sweep.stderr
    lines = [line for line in sweep.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: a worker of the sweep ended by "
                                                   "itself (UncompletedJobError: "), sweep.stderr
    assert "Traceback" not in sweep.stdout + sweep.stderr
    last = json_file(results / "smoke" / "sweep.json")["invocations"][-1]
    assert last["failed"] == lines[0].removeprefix("error: ")


def test_a_pack_indexes_each_run_as_it_stops(tmp_path, monkeypatch):
    """Ctrl-C while a pack trains: the runs of the pack that had stopped are indexed, so the
    sweep's closing line, sweep.json and the rerun's header count them (they said "nothing
    finished" with 9 of 16 runs done: a pack was indexed only when all of it had stopped)."""
    from conftest import TINY

    from kernelzoo import config
    from kernelzoo.training import job

    cfg = config.compose("config", [*TINY, f"results_dir={tmp_path}", "experiment=p",
                                    "pack_members=[[6,1]]"])
    point = ["feature_map=elu", "n_keys=3", "seed=1"]
    real = job.train_claimed

    def first_then_stop(todo, echo):
        yield next(real(todo, echo))
        raise KeyboardInterrupt
    monkeypatch.setattr(job, "train_claimed", first_then_stop)
    with pytest.raises(KeyboardInterrupt), config.as_job(cfg) as one:
        job.run(one, point=point)
    found = {n: store.point_summary(tmp_path, "p", [point[0], f"n_keys={n}", "seed=1"])
             for n in (3, 6)}
    assert found[3] is not None and found[3]["n_keys"] == 3 and found[6] is None
