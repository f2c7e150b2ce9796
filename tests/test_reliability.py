"""Reliability tests (issue 7): SIGKILL and resume, concurrent sweeps, bad input, numerical
faults, wandb without network, reproducibility, and a results store without pickles.

Command-line behaviour is tested in subprocesses (see conftest.py); numerical faults, the claim
race and the no-pickle reading are tested in-process through Hydra's compose API.
"""

from __future__ import annotations

import concurrent.futures
import csv
import json
import math
import os
import pickle
import random
import re
import shutil
from pathlib import Path

import pytest
import torch
from conftest import (DONE, INFEASIBLE, PYTHON, REPO, SMOKE_INFEASIBLE, SMOKE_POINTS, TINY,
                      base_env, copy_results, done_counts, json_file, leftover_temp_files,
                      once_per_session, read_all, run_cmd, run_ids, runs_dir, smoke_args,
                      snapshot, sweep, train)
from hydra import compose, initialize_config_dir

from kernelzoo import config
from kernelzoo.records import store
from kernelzoo.records.summary import STATUSES
from kernelzoo import train as train_module
from kernelzoo.training import job as train_job
from kernelzoo.core.model import RetrievalModel
from kernelzoo.training.pack import Pack

ANALYZE_MISSING = not (REPO / "src" / "kernelzoo" / "analyze.py").is_file()
SUITE_MAX_LINES = 5   # a message of the suite's own validation (exit 2)
HYDRA_MAX_LINES = 8   # Hydra's own config errors (exit 1): non-blank lines
# the step, then why (diagnostics.divergence, measured at the last evaluation before it)
STEP_REASON = re.compile(
    r"non-finite (train|eval) loss at step (\d+); at (?:step \d+|initialisation) .+")


# ================================================================== helpers

def summary_of(ret):
    """job.run returns (run_id, summary) for each run of the job; these jobs are one run."""
    ((_, summary),) = ret
    return summary


def compose_cfg(results: Path, *overrides):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose("config", overrides=[f"results_dir={results}", *TINY, *overrides])


def run_inprocess(results: Path, *overrides, echo=None):
    lines = []
    ret = train_job.run(compose_cfg(results, *overrides), echo=echo or lines.append)
    return summary_of(ret), lines


def curve_rows(results: Path, experiment: str, rid: str) -> list[dict]:
    with open(runs_dir(results, experiment) / rid / "curve.csv") as f:
        return list(csv.DictReader(f))


def nonblank(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def check_store_complete(results: Path, experiment: str = "smoke",
                         points: int = SMOKE_POINTS, infeasible: int = SMOKE_INFEASIBLE) -> dict:
    summaries = read_all(results, experiment)
    assert len(summaries) == points, sorted(summaries)
    assert sum(s["status"] == "infeasible" for s in summaries.values()) == infeasible
    for rid, s in summaries.items():
        if s["status"] != "infeasible":
            rows = curve_rows(results, experiment, rid)
            steps = [int(r["step"]) for r in rows]
            assert steps == sorted(set(steps)) and steps[-1] <= s["steps"], (rid, steps)
    assert not leftover_temp_files(runs_dir(results, experiment)), \
        leftover_temp_files(runs_dir(results, experiment))
    return summaries


def check_partial_store(results: Path, experiment: str = "smoke") -> int:
    """After a kill: every summary.json present is valid, and the analysis' reader sees exactly
    those (directories without one are 'missing', temp files are never read). Returns #done."""
    d = runs_dir(results, experiment)
    if not d.is_dir():
        return 0
    finished = [p for p in d.iterdir() if (p / "summary.json").is_file()]
    for p in finished:
        store.read_summary(p)
    if not ANALYZE_MISSING:
        from kernelzoo.analysis.runs import load_runs

        runs, missing, corrupted = load_runs(results / experiment)
        assert not corrupted, corrupted
        assert len(runs) == len(finished)
        assert len(missing) == sum(1 for p in d.iterdir() if p.is_dir()) - len(finished)
    return len(finished)


def interrupted_run(results: Path) -> bool:
    d = runs_dir(results, "smoke")
    return d.is_dir() and any((p / "config.yaml").exists() and not (p / "summary.json").exists()
                              for p in d.iterdir())


# ================================================================== SIGKILL and resume

LOCAL2 = ["launcher=local", "hydra.launcher.n_jobs=2"]
RUN_LINE = re.compile(r"^run \S+: ", re.M)  # a run has started training


@pytest.mark.slow
def test_kill_two_workers_once_then_resume(tmp_path, cli_env, background):
    """Quick variant: 2 joblib workers, one SIGKILL of the whole process group mid-run."""
    results = tmp_path / "results"
    args = [PYTHON, "-m", "kernelzoo.sweep", "smoke", *smoke_args(results, *LOCAL2)]
    first = background(args, cli_env, "first")
    caught = first.wait_for(lambda b: len(b.done_ids()) >= 1 and interrupted_run(results),
                            timeout=300, poll=0.02)
    assert caught, "the sweep ended before it could be killed mid-run:\n" + first.stdout
    first.kill()
    check_partial_store(results)
    # resume with the basic launcher (cheaper to start; the slow variant resumes with workers)
    second = sweep("smoke", smoke_args(results), cli_env, timeout=400)
    assert second.returncode == 0, second.explain()
    counts = done_counts(first.stdout, second.stdout)
    assert all(n == 1 for n in counts.values()), counts
    summaries = check_store_complete(results)
    assert set(counts) == {r for r, s in summaries.items() if s["status"] != "infeasible"}


@pytest.mark.slow
def test_kill_two_workers_at_random_moments(tmp_path, cli_env, background):
    """SIGKILL a 2-worker sweep 5 times at seeded random moments, resuming each time.

    Twice the smoke points (seeds 1, 2) with 20000-step runs (seconds each), so the work
    outlasts the kills even on an idle machine. Each moment counts from the attempt's first
    run line: on a busy machine the sweep's start alone can take 15 s.
    """
    rng = random.Random(20240607)
    results = tmp_path / "results"
    extra = [*LOCAL2, "seed=1,2", "trainer.max_steps=20000", "trainer.patience=1000"]
    args = [PYTHON, "-m", "kernelzoo.sweep", "smoke", *smoke_args(results, *extra)]
    outputs, mid_run = [], 0
    for attempt in range(5):
        bg = background(args, cli_env, f"attempt{attempt}")
        started = bg.wait_for(lambda b: RUN_LINE.search(b.stdout), timeout=300)
        assert started, f"no run started before kill {attempt + 1}:\n{bg.stdout}{bg.stderr}"
        ended = bg.wait_for(lambda b: b.proc.poll() is not None, timeout=rng.uniform(0.5, 10.0))
        assert not ended, f"the sweep finished before kill {attempt + 1}:\n{bg.stdout}"
        bg.kill()
        outputs.append(bg.stdout)
        mid_run += interrupted_run(results)
        check_partial_store(results)
    assert mid_run >= 1, "no kill landed while a run was in progress"
    final = sweep("smoke", smoke_args(results, *extra), cli_env, timeout=500)
    assert final.returncode == 0, final.explain()
    outputs.append(final.stdout)
    counts = done_counts(*outputs)
    assert all(n == 1 for n in counts.values()), counts
    summaries = check_store_complete(results, points=2 * SMOKE_POINTS,
                                     infeasible=2 * SMOKE_INFEASIBLE)
    assert set(counts) == {r for r, s in summaries.items() if s["status"] != "infeasible"}


@pytest.mark.slow
def test_two_sweeps_at_once_share_the_work(tmp_path, cli_env, background):
    """Two sweeps started together on one results directory: no run_id is trained twice, no
    file is corrupted, and together they finish every point."""
    results = tmp_path / "results"
    args = [PYTHON, "-m", "kernelzoo.sweep", "smoke", *smoke_args(results), "--no-analysis"]
    a, b = background(args, cli_env, "a"), background(args, cli_env, "b")
    assert a.wait(timeout=400) == 0, a.stderr
    assert b.wait(timeout=400) == 0, b.stderr
    for bg in (a, b):
        assert "Traceback" not in bg.stdout + bg.stderr, bg.stdout + bg.stderr
    counts = done_counts(a.stdout, b.stdout)
    assert all(n == 1 for n in counts.values()), counts
    summaries = check_store_complete(results)
    assert set(counts) == {r for r, s in summaries.items() if s["status"] != "infeasible"}
    for rid in summaries:  # config.yaml is whole YAML, not two interleaved writes
        cfg = runs_dir(results, "smoke") / rid / "config.yaml"
        if cfg.exists():
            from omegaconf import OmegaConf

            assert OmegaConf.load(cfg).experiment == "smoke"
    history = json_file(results / "smoke" / "sweep.json")  # valid JSON
    assert 1 <= len(history["invocations"]) <= 2


def test_claim_rechecks_done_after_acquiring(tmp_path, monkeypatch):
    """The race of two workers, made deterministic: this worker saw the run unfinished just
    before the other one wrote its summary and released the claim."""
    results = tmp_path / "results"
    first, _ = run_inprocess(results, "trainer.max_steps=50")
    rid = first["run_id"]
    before = snapshot(runs_dir(results, "adhoc") / rid)
    real, calls = store.is_done, []

    def stale_once(path):
        calls.append(path)
        return False if len(calls) == 1 else real(path)

    monkeypatch.setattr(store, "is_done", stale_once)
    second, lines = run_inprocess(results, "trainer.max_steps=50")
    assert not any(line.startswith(f"done {rid}") for line in lines), lines
    assert second is None
    assert snapshot(runs_dir(results, "adhoc") / rid) == before


# ================================================================== bad input
#
# The command lines run in subprocesses, a few at a time, from one module fixture (``cli_runs``):
# each only starts up and fails (or runs a few steps). Values that plan() validates are also
# checked in-process (``test_bad_value_is_rejected_before_training``): main() maps every
# UsageError to "error: <message>" and exit 2, which the subprocess cases prove.

def _preexisting(smoke_results, results: Path) -> tuple[str, Path]:
    """Copy one finished run of the smoke sweep (elu, n_keys 6) into results/adhoc/runs."""
    src = next(p for p in runs_dir(smoke_results.results, "smoke").iterdir()
               if p.name.startswith("elu-dkey4-S6-sum-"))
    dst = runs_dir(results, "adhoc") / src.name
    shutil.copytree(src, dst)
    return src.name, dst


BAD_CLI = {  # id: (overrides, exit code (None: any non-zero), substrings stderr must name)
    "unknown_feature_map": (["feature_map=nope"], 2, ["feature_map=nope"]),
    "unknown_key_trainer": (["trainer.nope=1"], None, ["trainer.nope"]),
    "unknown_key_plus_top": (["+nope=1"], None, ["nope"]),
    "dpfp_nu_0": (["feature_map=dpfp", "feature_map.nu=0"], 2, ["nu", "0"]),
}
HYDRA_ERRORS = {"unknown_key_trainer", "unknown_key_plus_top"}  # may be Hydra's (exit 1)
CORRUPT = '{"run_id": "garbage", "status": [1, 2\n'


@pytest.fixture(scope="module")
def cli_runs(smoke_results, tmp_path_factory, worker_id):
    """Every command-line case of this module, run once per test session (``once_per_session``):
    {case: {result, results, rid, before}}. ``results`` is the case's results directory,
    ``rid`` its pre-existing finished run and ``before`` a snapshot of its runs (or of the
    whole store for the analysis case)."""
    return once_per_session(tmp_path_factory, worker_id, "cli",
                            lambda root: _cli_runs(smoke_results, root))


def _cli_runs(smoke_results, root):
    env = base_env(root)
    train_cmd = [PYTHON, "-m", "kernelzoo.train"]
    jobs = {}

    def with_preexisting(case):
        results = root / case / "results"
        rid, path = _preexisting(smoke_results, results)
        return results, rid, path

    for case, (overrides, _, _) in BAD_CLI.items():
        results, rid, _ = with_preexisting(case)
        jobs[case] = ([*train_cmd, f"results_dir={results}", *TINY, *overrides], results, rid)
    # a d_dot the map cannot reach: a single run records it infeasible (exit 0)
    results, rid, _ = with_preexisting("unreachable_d_dot")
    jobs["unreachable_d_dot"] = ([*train_cmd, f"results_dir={results}", *TINY,
                                 "feature_map=dpfp", "d_dot=100"], results, rid)
    # results_dir below a regular file: nobody (not even root) can create it
    afile = root / "not_writable" / "afile"
    afile.parent.mkdir(parents=True)
    afile.write_text("a regular file\n")
    jobs["results_dir_not_writable"] = ([*train_cmd, f"results_dir={afile / 'sub'}", *TINY],
                                        afile, None)
    # a corrupted summary of a finished run, then that exact run again
    results, rid, path = with_preexisting("corrupted")
    (path / "summary.json").write_text(CORRUPT)
    jobs["corrupted_summary"] = ([*train_cmd, f"results_dir={results}", *TINY, "n_keys=6"],
                                 results, rid)
    # an unknown experiment name
    jobs["unknown_experiment"] = ([PYTHON, "-m", "kernelzoo.sweep", "nope",
                                  f"results_dir={root / 'unknown_experiment'}"], None, None)
    # an analysis threshold outside (0, 1), on a copy of the finished smoke sweep
    if not ANALYZE_MISSING:
        results = copy_results(smoke_results.results, root / "threshold" / "results")
        jobs["analysis_threshold"] = ([PYTHON, "-m", "kernelzoo.analyze", "experiment=smoke",
                                      f"results_dir={results}", "threshold=1.5",
                                      "logger=none"], results, None)
    # an invalid value as the third point of a sweep, after valid ones
    results = root / "invalid_point" / "results"
    jobs["invalid_point_in_sweep"] = ([*train_cmd, "--multirun", f"results_dir={results}", *TINY,
                                      "trainer.max_steps=50", "feature_map=dpfp",
                                      "feature_map.nu=1,2,0"], results, None)

    def snap(case, res):
        if case == "analysis_threshold":
            return snapshot(res)
        if res is not None and runs_dir(res, "adhoc").is_dir():
            return snapshot(runs_dir(res, "adhoc"))
        return None

    before = {case: snap(case, res) for case, (_, res, _) in jobs.items()}

    def go(case):
        return case, run_cmd(jobs[case][0], env, timeout=300)

    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        done = dict(pool.map(go, jobs))
    return {case: {"result": done[case], "results": jobs[case][1], "rid": jobs[case][2],
                   "before": before[case]} for case in jobs}


def _check_message(message: str, names, max_lines) -> None:
    assert "Traceback" not in message, message
    lines = nonblank(message)
    assert 1 <= len(lines) <= max_lines, f"{len(lines)} lines:\n{message}"
    for name in names:
        assert name in message, f"the message does not name {name!r}:\n{message}"


def _check_rejected(entry, code, names, max_lines):
    res = entry["result"]
    if code is None:
        assert res.returncode != 0, res.explain()
    else:
        assert res.returncode == code, res.explain()
    _check_message(res.stderr, names, max_lines)
    assert not DONE.search(res.stdout), res.explain()


def _check_nothing_trained_or_deleted(entry):
    """The pre-existing finished run is untouched, and no other run (or summary) appeared."""
    results = entry["results"]
    assert snapshot(runs_dir(results, "adhoc")) == entry["before"]
    assert run_ids(results, "adhoc") == [entry["rid"]]
    assert [p.parent.name for p in Path(results).rglob("summary.json")] == [entry["rid"]]


@pytest.mark.slow
@pytest.mark.parametrize("case", [
    "unknown_feature_map",
    "unknown_key_trainer",
    pytest.param("unknown_key_plus_top"),
    "dpfp_nu_0",
])
def test_bad_command_line_is_rejected(cli_runs, case):
    overrides, code, names = BAD_CLI[case]
    max_lines = HYDRA_MAX_LINES if case in HYDRA_ERRORS else SUITE_MAX_LINES
    entry = cli_runs[case]
    _check_rejected(entry, code, names, max_lines)
    _check_nothing_trained_or_deleted(entry)


BAD_VALUES = {  # id: (overrides, substrings the message must name)
    "unknown_key_plus_trainer": (["+trainer.nope=1"], ["nope"]),
    "dpfp_nu_0": (["feature_map=dpfp", "feature_map.nu=0"], ["nu", "0"]),
    "favor_m_0": (["feature_map=favor", "feature_map.m=0"], ["m must", "0"]),
    "n_keys_0": (["n_keys=0"], ["n_keys=0"]),
    "setting1_seq_len": (["task.seq_len=7", "n_keys=5"], ["seq_len=7", "n_keys=5"]),
    "d_key_0": (["d_key=0"], ["d_key=0"]),
    "device_quantum": (["trainer.device=quantum"], ["quantum"]),
    "device_cuda_absent": (["trainer.device=cuda"], ["cuda"]),
    "seed_not_a_number": (["seed=abc"], ["seed", "abc"]),
    "seed_not_an_integer": (["seed=1.5"], ["seed", "1.5"]),
}


@pytest.mark.parametrize("case", [
    "unknown_key_plus_trainer", "dpfp_nu_0", "favor_m_0", "n_keys_0", "setting1_seq_len",
    "d_key_0", "device_quantum",
    pytest.param("device_cuda_absent", marks=pytest.mark.skipif(
        torch.cuda.is_available(), reason="a CUDA device is available here")),
    pytest.param("seed_not_a_number"),
    pytest.param("seed_not_an_integer"),
])
def test_bad_value_is_rejected_before_training(smoke_results, tmp_path, case):
    overrides, names = BAD_VALUES[case]
    results = tmp_path / "results"
    rid, _ = _preexisting(smoke_results, results)
    before = snapshot(runs_dir(results, "adhoc"))
    with pytest.raises(train_module.UsageError) as err:  # the command line's door, in process
        cfg = config.compose("config", [f"results_dir={results}", *TINY, *overrides])
        with config.as_job(cfg) as job:
            train_job.run(job, echo=lambda line: None)
    _check_message(f"error: {err.value}", names, SUITE_MAX_LINES)
    assert snapshot(runs_dir(results, "adhoc")) == before
    assert run_ids(results, "adhoc") == [rid]


@pytest.mark.slow
def test_unreachable_d_dot_is_recorded_infeasible(cli_runs):
    entry = cli_runs["unreachable_d_dot"]
    res = entry["result"]
    assert res.returncode == 0, res.explain()
    [(rid, reason)] = INFEASIBLE.findall(res.stdout)
    assert "d_dot=100" in reason and not DONE.search(res.stdout)
    summary = store.read_summary(runs_dir(entry["results"], "adhoc") / rid)
    assert summary["status"] == "infeasible" and summary["reason"] == reason
    assert summary["steps"] == 0 and summary["final_eval_loss"] is None
    run = runs_dir(entry["results"], "adhoc") / rid
    assert not (run / "curve.csv").exists() and not (run / "config.yaml").exists()
    assert sorted(run_ids(entry["results"], "adhoc")) == sorted([rid, entry["rid"]])
    after = snapshot(runs_dir(entry["results"], "adhoc"))
    assert {k: v for k, v in after.items() if k.startswith(entry["rid"] + "/")} == \
        entry["before"]


@pytest.mark.slow
def test_results_dir_below_a_file(cli_runs):
    entry = cli_runs["results_dir_not_writable"]
    afile = entry["results"]
    assert afile.read_text() == "a regular file\n"  # nothing deleted or overwritten
    _check_rejected(entry, 2, [str(afile)], SUITE_MAX_LINES)


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="running as root: chmod does not stop writes (covered by the "
                           "results_dir-below-a-file test)")
def test_results_dir_read_only(tmp_path, cli_env):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        res = train([f"results_dir={ro / 'results'}", *TINY], cli_env)
    finally:
        ro.chmod(0o700)
    assert res.returncode != 0, res.explain()
    _check_message(res.stderr, [str(ro)], SUITE_MAX_LINES)
    assert not list(ro.rglob("summary.json"))


@pytest.mark.slow
def test_corrupted_summary_is_reported_not_touched(cli_runs):
    entry = cli_runs["corrupted_summary"]
    summary = runs_dir(entry["results"], "adhoc") / entry["rid"] / "summary.json"
    _check_rejected(entry, 2, [str(summary)], SUITE_MAX_LINES)
    assert summary.read_text() == CORRUPT
    assert snapshot(runs_dir(entry["results"], "adhoc")) == entry["before"]


@pytest.mark.slow
def test_corrupted_summary_in_a_sweep(smoke_results, tmp_path):
    """A sweep over a store with one corrupted summary names the file, leaves it alone and
    still goes through every other point."""
    results = copy_results(smoke_results.results, tmp_path / "results")
    victim = next(p for p in runs_dir(results, "smoke").iterdir()
                  if p.name.startswith("elu-dkey4-S6-sum-")) / "summary.json"
    victim.write_text(CORRUPT)
    before = snapshot(runs_dir(results, "smoke"))
    res = sweep("smoke", smoke_args(results), smoke_results.env)
    assert victim.read_text() == CORRUPT
    assert snapshot(runs_dir(results, "smoke")) == before
    assert str(victim) in res.stderr and "Traceback" not in res.output, res.explain()
    # the other points are known done from the index, though the store was copied elsewhere
    assert f"sweep smoke: 6 points, {len(run_ids(results, 'smoke')) - 1} already done" \
        in res.stdout, res.stdout
    assert re.search(r"^sweep smoke finished", res.stdout, re.M), res.stdout


@pytest.mark.slow
def test_unknown_experiment(cli_runs):
    entry = cli_runs["unknown_experiment"]
    _check_rejected(entry, 2, ["nope", "smoke"], SUITE_MAX_LINES)


@pytest.mark.slow
@pytest.mark.skipif(ANALYZE_MISSING, reason="src/kernelzoo/analyze.py does not exist yet")
def test_analysis_threshold_outside_0_1(cli_runs):
    entry = cli_runs["analysis_threshold"]
    _check_rejected(entry, 2, ["threshold=1.5"], SUITE_MAX_LINES)
    exp = entry["results"] / "smoke"
    for name in ("report.md", "capacity.csv", "runs.parquet"):
        assert not (exp / name).exists(), f"{name} written despite the error"
    assert snapshot(entry["results"]) == entry["before"]


@pytest.mark.slow
def test_invalid_point_fails_the_sweep_before_anything_trains(cli_runs):
    """A bad value in the third point of a grid: the whole sweep is refused up front (every
    point is checked before the first trains), in one line naming the point, and nothing is
    written: no run, no Hydra log directory, no index, not even the results directory."""
    entry = cli_runs["invalid_point_in_sweep"]
    _check_rejected(entry, 2, ["feature_map.nu=0", "nu", "got 0"], SUITE_MAX_LINES)
    assert not entry["results"].exists(), sorted(entry["results"].rglob("*"))


# ================================================================== numerical faults

def _assert_diverged(summary, results, step=None, kind=None):
    assert summary["status"] == "diverged", summary
    m = STEP_REASON.fullmatch(summary["reason"] or "")
    assert m, summary["reason"]
    if kind:
        assert m.group(1) == kind
    assert int(m.group(2)) == summary["steps"]
    if step is not None:
        assert summary["steps"] == step
    assert summary["final_eval_loss"] is None
    on_disk = store.read_summary(runs_dir(results, "adhoc") / summary["run_id"])
    assert on_disk["status"] == "diverged" and on_disk["reason"] == summary["reason"]
    json.dumps(on_disk, allow_nan=False)  # strict JSON: no NaN tokens


def test_favor_huge_inputs_delta_rule_diverges_cleanly(tmp_path):
    """FAVOR+ with inputs x1000 under the authors' delta rule: features underflow to 0 and the
    sum-normalised keys are 0/0. run() returns normally with a diverged record (a single run's
    exit code is then 0; the sweep variant is test_sweep's diverged-point test)."""
    results = tmp_path / "results"
    summary, lines = run_inprocess(results, "feature_map=favor", "feature_map.m=4",
                                   "feature_map.input_scale=1000", "memory=delta")
    _assert_diverged(summary, results, step=1, kind="train")
    assert any(re.match(rf"done {re.escape(summary['run_id'])}: diverged", x) for x in lines)


@pytest.mark.parametrize("variant,memory", [
    ("hyperbolic", ["memory=sum"]),
    ("hyperbolic", ["memory=sum", "memory.normalisation=sum"]),
    ("hyperbolic", ["memory=sum", "memory.normalisation=none"]),
    ("hyperbolic", ["memory=fwm"]),
    ("positive", ["memory=sum"]),
    ("positive", ["memory=delta"]),
], ids=["sum-attention", "sum-sum", "sum-none", "fwm", "positive-sum-attention",
        "positive-delta"])
def test_favor_huge_inputs_never_crash(tmp_path, variant, memory):
    results = tmp_path / "results"
    summary, _ = run_inprocess(results, "trainer.max_steps=100", "feature_map=favor",
                               "feature_map.m=4",
                               f"feature_map.variant={variant}",
                               "feature_map.input_scale=1000", *memory)
    assert summary["status"] in STATUSES
    if summary["status"] == "diverged":
        _assert_diverged(summary, results)
    else:
        assert math.isfinite(summary["final_eval_loss"])
    store.read_summary(runs_dir(results, "adhoc") / summary["run_id"])


# FAVOR+ with inputs x1000 maps every key and query to the zero vector: each logit
# +-w.x - |x|^2/2 is of order -1e4, far below the -104 where exp underflows to 0 in float32.
ZERO_FEATURES = ["feature_map=favor", "feature_map.m=4", "feature_map.input_scale=1000"]


@pytest.mark.parametrize("memory,diverges", [
    (["memory=sum", "memory.normalisation=attention"], False),
    (["memory=sum", "memory.normalisation=sum"], True),   # 0 / (0 + key_eps 0) = NaN
    (["memory=sum", "memory.normalisation=none"], False),
    (["memory=delta"], True),                             # sum-normalised keys: 0/0
    (["memory=delta", "memory.normalisation=attention"], False),
    (["memory=delta", "memory.normalisation=none"], False),
    (["memory=fwm"], False),
], ids=["sum-attention", "sum-sum", "sum-none", "delta-sum", "delta-attention", "delta-none",
        "fwm"])
def test_all_zero_features_under_every_normalisation(tmp_path, memory, diverges):
    results = tmp_path / "results"
    summary, lines = run_inprocess(results, "trainer.max_steps=100", *ZERO_FEATURES, *memory)
    if diverges:
        _assert_diverged(summary, results, step=1, kind="train")
        assert summary["reason"].endswith("at initialisation 100.0% of written keys had all-zero "
                                          "features (the sum normalisation with key_eps = 0 "
                                          "makes each 0/0)")
    else:  # a zero read-out: y = 0, so the loss is exactly 0.5 and nothing is learnt
        assert summary["status"] in ("plateau", "max_steps"), summary
        assert summary["final_eval_loss"] == pytest.approx(0.5)
    assert any(line.startswith(f"done {summary['run_id']}") for line in lines)


def _inject_nan(monkeypatch, *, training: bool, at_call: int):
    """NaN out the at_call-th training step (the pack's forward: a run alone is a pack of one)
    or evaluation (the run's own model)."""
    cls, name = (Pack, "_forward") if training else (RetrievalModel, "forward")
    original, calls = getattr(cls, name), [0]

    def forward(self, *args):
        y = original(self, *args)
        if training or not self.training:
            calls[0] += 1
            if calls[0] == at_call:
                y = y * float("nan")
        return y

    monkeypatch.setattr(cls, name, forward)


def test_nan_in_a_training_batch(tmp_path, monkeypatch):
    _inject_nan(monkeypatch, training=True, at_call=73)
    results = tmp_path / "results"
    summary, _ = run_inprocess(results)
    _assert_diverged(summary, results, step=73, kind="train")
    assert summary["best_eval_loss"] is not None and math.isfinite(summary["best_eval_loss"])
    rows = curve_rows(results, "adhoc", summary["run_id"])
    assert [int(r["step"]) for r in rows] == [50]  # the evaluation before the fault only


def test_nan_in_an_evaluation(tmp_path, monkeypatch):
    _inject_nan(monkeypatch, training=False, at_call=2)
    results = tmp_path / "results"
    summary, _ = run_inprocess(results)
    _assert_diverged(summary, results, step=100, kind="eval")


# ================================================================== wandb without network

@pytest.mark.slow
def test_wandb_online_without_network(tmp_path, cli_env):
    """Online mode, a well-formed but fake key, a closed port: the server is found unreachable
    in milliseconds, one warning, the run goes on offline. (A sweep and its analysis:
    tests/test_tracking.py.)"""
    env = dict(cli_env, WANDB_MODE="online", WANDB_API_KEY="0123456789abcdef" * 2 + "01234567",
               WANDB_BASE_URL="http://127.0.0.1:9")
    results = tmp_path / "results"
    overrides = [f"results_dir={results}", *[a for a in TINY if a != "logger=none"],
                 "logger=wandb"]
    res = train(overrides, env, timeout=300)
    assert res.returncode == 0, res.explain()
    assert "Traceback" not in res.output, res.explain()
    [summary] = read_all(results, "adhoc").values()
    assert summary["status"] in ("converged", "plateau", "max_steps")
    run = runs_dir(results, "adhoc") / summary["run_id"]
    assert (run / "curve.csv").is_file() and (run / "config.yaml").is_file()
    warnings = [line for line in nonblank(res.stderr) if "wandb" in line.lower()]
    assert len(warnings) == 1 and warnings[0].startswith("warning"), res.stderr


# ================================================================== reproducibility

@pytest.mark.parametrize("overrides", [
    ["feature_map=elu"],
    ["feature_map=dpfp", "memory=delta", "task=update", "n_keys=4"],
    ["feature_map=favor", "feature_map.m=4"],  # a new projection per call, from the seeded RNG
    ["feature_map=favor", "feature_map.m=4", "feature_map.redraw=never"],
], ids=["elu", "dpfp-delta-update", "favor-redraw", "favor-fixed"])
def test_same_seed_same_curve(tmp_path, overrides):
    """Same config and seed, twice in one process (as a basic-launcher sweep or a joblib worker
    runs its points): identical curve.csv, to the last digit."""
    curves = []
    for i in range(2):
        results = tmp_path / f"results{i}"
        torch.rand(17)  # whatever ran before must not matter
        summary, _ = run_inprocess(results, "trainer.max_steps=150", *overrides)
        curves.append([(r["step"], r["train_loss"], r["eval_loss"])
                       for r in curve_rows(results, "adhoc", summary["run_id"])])
    assert curves[0] and curves[0] == curves[1]


@pytest.mark.slow
def test_same_seed_same_curve_across_processes(smoke_results, tmp_path, cli_env):
    """A smoke point run alone in a fresh process reproduces the sweep's run exactly.
    (Slow only for the budget: one more process, ~6 s.)"""
    reference = next(p for p in runs_dir(smoke_results.results, "smoke").iterdir()
                     if p.name.startswith("elu-dkey4-S3-sum-"))
    results = tmp_path / "results"
    res = train([f"results_dir={results}", *TINY, "experiment=smoke"], cli_env)
    assert res.returncode == 0, res.explain()
    assert run_ids(results, "smoke") == [reference.name]
    ours = runs_dir(results, "smoke") / reference.name
    assert (ours / "curve.csv").read_text() == (reference / "curve.csv").read_text()


# ================================================================== no pickles

PICKLE_SUFFIXES = {".pkl", ".pickle", ".pt", ".pth", ".ckpt", ".joblib", ".npy", ".npz"}


def _pickles_under(root: Path) -> list[Path]:
    found = []
    for p in Path(root).rglob("*"):
        if not p.is_file() or "wandb" in p.relative_to(root).parts:
            continue
        with open(p, "rb") as f:
            head = f.read(2)
        if p.suffix in PICKLE_SUFFIXES or head[:1] == b"\x80" or head == b"PK":
            found.append(p)
    return found


def test_results_store_holds_no_pickles(smoke_results, tmp_path, monkeypatch):
    """No pickle in a finished sweep's store, and reading it (summaries, the analysis) never
    unpickles anything."""
    assert not _pickles_under(smoke_results.results)
    results = copy_results(smoke_results.results, tmp_path / "results")

    def forbidden(*args, **kwargs):
        raise AssertionError("a results reader unpickled something")

    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(pickle, "loads", forbidden)
    monkeypatch.setattr(pickle, "Unpickler", forbidden)
    monkeypatch.setattr(torch, "load", forbidden)
    import pandas

    monkeypatch.setattr(pandas, "read_pickle", forbidden)
    for rid in run_ids(results, "smoke"):
        store.read_summary(runs_dir(results, "smoke") / rid)
    if ANALYZE_MISSING:
        return
    from omegaconf import OmegaConf

    from kernelzoo import analyze as analyze_module

    cfg = OmegaConf.create({"experiment": "smoke", "results_dir": str(results),
                            "threshold": 0.01, "accuracy_threshold": 0.99,
                            "logger": {"name": "none", "project": "kernelzoo", "entity": None}})
    analyze_module.analyze(cfg)
    assert (results / "smoke" / "report.md").is_file()
    assert (results / "smoke" / "runs.parquet").read_bytes()[:4] == b"PAR1"
    assert not _pickles_under(results)
