"""End-to-end tests of sweeps (issue 4): the smoke sweep through every launcher, resuming,
seeds as an axis, ``make sweep``, a SIGKILL in the middle, and a diverging point.

Every test drives the real command lines in subprocesses (see conftest.py). The smoke sweep runs
once per session (``smoke_results``); tests that change a store work on a copy.
"""

from __future__ import annotations

import os

import csv
import re
import shutil
from pathlib import Path

import pytest
from conftest import (DONE, INFEASIBLE, PYTHON, REPO, SKIP, SMOKE_INFEASIBLE, SMOKE_POINTS,
                      analyze, copy_results, done_counts, json_file, leftover_temp_files,
                      read_all, run_cmd, run_ids, runs_dir, smoke_args, snapshot, sweep, train)

from kernelzoo.records import store
from kernelzoo.records.summary import STATUSES

ANALYZE_MISSING = not (REPO / "src" / "kernelzoo" / "analyze.py").is_file()
FINISHED = re.compile(r"^sweep (\S+) finished in [\d.]+ min: (.*)$", re.M)


def outcomes(text: str) -> dict:
    """The sweep's final totals line as {outcome: count}."""
    m = FINISHED.search(text)
    assert m, f"no 'sweep ... finished' line in:\n{text[-2000:]}"
    return {k: int(v) for v, k in (p.split(" ")[::-1] for p in m.group(2).split(", "))}


def nonzero(counts: dict) -> dict:
    return {k: v for k, v in counts.items() if v}


def check_complete_smoke_store(results: Path, expected_points: int = SMOKE_POINTS,
                               expected_infeasible: int = SMOKE_INFEASIBLE) -> dict:
    """Every point has one run directory with a valid summary (and curve/config if trained)."""
    summaries = read_all(results, "smoke")
    assert len(summaries) == expected_points, sorted(summaries)
    infeasible = [s for s in summaries.values() if s["status"] == "infeasible"]
    assert len(infeasible) == expected_infeasible, [s["status"] for s in summaries.values()]
    for s in infeasible:
        assert "d_dot=12" in s["reason"], s["reason"]
        assert s["steps"] == 0
    for rid, s in summaries.items():
        path = runs_dir(results, "smoke") / rid
        assert s["experiment"] == "smoke"
        if s["status"] == "infeasible":
            assert not (path / "curve.csv").exists()
            continue
        assert s["status"] in STATUSES and 0 < s["steps"] <= 300, s
        assert s["device"] == "cpu"
        assert (path / "config.yaml").is_file()
        with open(path / "curve.csv") as f:
            rows = list(csv.DictReader(f))
        assert rows and list(rows[0]) == list(store.CURVE_COLUMNS)
        assert int(rows[-1]["step"]) <= s["steps"]
    assert not leftover_temp_files(runs_dir(results, "smoke"))
    return summaries


# ----------------------------------------------------------------- the smoke sweep, basic launcher

def test_smoke_sweep_end_to_end(smoke_results):
    res = smoke_results.result
    assert res.returncode == 0, res.explain()
    assert "Traceback" not in res.output, res.explain()
    assert f"sweep smoke: {SMOKE_POINTS} points" in res.stdout
    summaries = check_complete_smoke_store(smoke_results.results)

    # one "done" line per trained point, with the status its summary records
    done = {m.group(1): m.group(2) for m in DONE.finditer(res.stdout)}
    assert len(done) == SMOKE_POINTS - SMOKE_INFEASIBLE, res.stdout
    for rid, status in done.items():
        assert summaries[rid]["status"] == status
    # the infeasible point is announced with its reason, and recorded with it
    [(rid, reason)] = INFEASIBLE.findall(res.stdout)
    assert summaries[rid]["status"] == "infeasible" and summaries[rid]["reason"] == reason
    assert "dpfp cannot reach d_dot=12" in reason

    totals = outcomes(res.stdout)
    assert totals.get("infeasible") == SMOKE_INFEASIBLE
    assert sum(totals.values()) == SMOKE_POINTS and "failed" not in totals

    history = json_file(smoke_results.results / "smoke" / "sweep.json")
    inv = history["invocations"][0]
    assert inv["points"] == SMOKE_POINTS and nonzero(inv["outcomes"]) == totals
    assert inv["launcher"] == "JoblibLauncher"  # the default: one worker per usable core
    assert history["wall_seconds"] >= inv["wall_seconds"] >= 0


def test_rerun_trains_nothing(smoke_results, tmp_path):
    """The same command again on the finished store (a copy: the session's store is shared
    by the test workers and stays as the sweep left it): every point is known finished from
    the index, though the copy lies elsewhere (its key was results_dir's too: a moved, copied
    or merged store said "0 already done"), nothing trains, and the sweep appends one
    invocation to the store's sweep.json."""
    results = copy_results(smoke_results.results, tmp_path / "results")
    assert smoke_results.result.returncode == 0, smoke_results.result.explain()
    before = snapshot(runs_dir(results, "smoke"))
    res = sweep("smoke", smoke_args(results), smoke_results.env)
    assert res.returncode == 0, res.explain()
    assert "Traceback" not in res.output, res.explain()
    assert not DONE.search(res.stdout) and not INFEASIBLE.search(res.stdout), res.stdout
    assert set(SKIP.findall(res.stdout)) <= set(run_ids(results, "smoke")), res.stdout
    assert nonzero(outcomes(res.stdout)) == {"skipped": SMOKE_POINTS}, res.stdout
    assert f"sweep smoke: {SMOKE_POINTS} points, {SMOKE_POINTS} already done" in res.stdout
    assert res.seconds < 60, f"the rerun of a finished sweep took {res.seconds:.0f} s"
    assert snapshot(runs_dir(results, "smoke")) == before
    last = json_file(results / "smoke" / "sweep.json")["invocations"][-1]
    assert nonzero(last["outcomes"]) == {"skipped": SMOKE_POINTS}


PLAN = re.compile(r"^plan (\S+): ", re.M)


@pytest.mark.slow
def test_a_sweep_of_one_point_says_one_point(tmp_path, cli_env):
    results = tmp_path / "results"
    res = sweep("smoke", smoke_args(results, "dry_run=true",
                                    "hydra.sweeper.grids=[{feature_map: elu, n_keys: 3}]"), cli_env)
    assert res.returncode == 0, res.explain()
    assert res.stdout.startswith("sweep smoke: 1 point, a dry run"), res.stdout
    assert len(PLAN.findall(res.stdout)) == 1, res.stdout


@pytest.mark.slow
def test_seeds_axis_doubles_the_points(smoke_results, tmp_path, cli_env):
    """``seed=1,2`` doubles the points, each with its own run id (a dry run: nothing trains);
    the seed-1 points are exactly the runs of the plain smoke sweep."""
    results = tmp_path / "results"
    res = sweep("smoke", smoke_args(results, "seed=1,2", "dry_run=true"), cli_env)
    assert res.returncode == 0, res.explain()
    assert f"sweep smoke: {2 * SMOKE_POINTS} points, a dry run: each is named below, done or " \
           "to train" in res.stdout  # not "0 already done": a dry run plans every point
    assert res.stdout.rstrip().endswith("sweep smoke: a dry run, nothing trained"), res.stdout
    planned = PLAN.findall(res.stdout) + [rid for rid, _ in INFEASIBLE.findall(res.stdout)]
    assert len(planned) == len(set(planned)) == 2 * SMOKE_POINTS, res.stdout
    seed1 = {r for r in planned if "-seed1-" in r}
    seed2 = {r for r in planned if "-seed2-" in r}
    assert len(seed1) == len(seed2) == SMOKE_POINTS
    assert seed1 == set(run_ids(smoke_results.results, "smoke"))
    for rid in seed1:  # each seed-1 run has its seed-2 twin: same name up to seed and hash
        twin = re.sub(r"-seed1-[0-9a-f]{8}$", "-seed2-", rid)
        assert sum(r.startswith(twin) for r in seed2) == 1, (rid, seed2)
    assert not DONE.search(res.stdout) and not list(results.rglob("summary.json"))


@pytest.mark.slow
def test_seeds_axis_trains_every_seed(smoke_results, tmp_path):
    """On a copy of the finished smoke store, ``seed=1,2`` skips seed 1 and trains seed 2."""
    results = copy_results(smoke_results.results, tmp_path / "results")
    res = sweep("smoke", smoke_args(results, "seed=1,2"), smoke_results.env)
    assert res.returncode == 0, res.explain()
    summaries = check_complete_smoke_store(results, 2 * SMOKE_POINTS, 2 * SMOKE_INFEASIBLE)
    assert {s["seed"] for s in summaries.values()} == {1, 2}
    trained = done_counts(res.stdout)
    assert {summaries[r]["seed"] for r in trained} == {2}
    assert len(trained) == SMOKE_POINTS - SMOKE_INFEASIBLE


# ----------------------------------------------------------------- other launchers

def _check_same_runs_as_basic(results: Path, smoke_results) -> None:
    """A launcher changes how, not what: same run ids and, on CPU, the same eval losses."""
    summaries = check_complete_smoke_store(results)
    reference = read_all(smoke_results.results, "smoke")
    assert sorted(summaries) == sorted(reference)
    for rid, s in summaries.items():
        assert (s["status"], s["steps"], s["final_eval_loss"]) == (
            reference[rid]["status"], reference[rid]["steps"], reference[rid]["final_eval_loss"])
        if s["status"] != "infeasible":
            ours, theirs = (runs_dir(r, "smoke") / rid / "curve.csv"
                            for r in (results, smoke_results.results))
            assert ours.read_text() == theirs.read_text(), rid


@pytest.mark.slow
def test_local_launcher_two_workers(smoke_results, tmp_path, cli_env):
    """hydra-joblib-launcher with 2 workers: the same runs and results as the basic launcher.
    (Slow: ~20 s; the default run covers 2 workers in test_reliability's kill test.)"""
    results = tmp_path / "results"
    res = sweep("smoke", smoke_args(results, "launcher=local", "hydra.launcher.n_jobs=2"),
                cli_env, timeout=400)
    assert res.returncode == 0, res.explain()
    assert "n_jobs=2" in res.output and "Traceback" not in res.output, res.explain()
    assert outcomes(res.stdout).get("infeasible") == SMOKE_INFEASIBLE, res.explain()
    _check_same_runs_as_basic(results, smoke_results)
    assert json_file(results / "smoke" / "sweep.json")["invocations"][0]["launcher"] == \
        "JoblibLauncher"


@pytest.mark.slow
def test_submitit_local_launcher(smoke_results, tmp_path, cli_env):
    """The SLURM code path (hydra-submitit-launcher) with its local executor (~60 s on 2 cores),
    in a group-shared store (umask 002): the job folders are the sweep's own, in its sweep
    directory, and owner-only, so nobody else can replace the pickles its jobs run
    (``test_cluster.py``: another user's replacement refused)."""
    results = tmp_path / "results"
    umask = os.umask(0o002)
    try:
        res = sweep("smoke", smoke_args(results, "launcher=submitit_local"), cli_env, timeout=500)
    finally:
        os.umask(umask)
    assert res.returncode == 0, res.explain()
    assert outcomes(res.stdout).get("infeasible") == SMOKE_INFEASIBLE, res.explain()
    _check_same_runs_as_basic(results, smoke_results)
    [folder] = (results / "smoke" / "hydra").glob("*/submitit")
    assert folder.stat().st_mode & 0o777 == 0o700
    assert sorted(folder.glob("*/*.pkl")), "no submitit job folders"


def test_a_dry_run_lists_a_slurm_array_without_slurm(tmp_path, cli_env):
    """launcher=slurm dry_run=true where there is no srun: the array it would submit (its
    settings, a job per pack) is listed, nothing is submitted or trained; without dry_run the
    same command is refused in one line."""
    env = {**cli_env, "PATH": str(Path(PYTHON).parent)}  # no srun, no sbatch
    results = tmp_path / "results"
    setup = "hydra.launcher.setup=['module load cuda','source ~/kz/.venv/bin/activate']"
    res = sweep("smoke", [f"results_dir={results}", "launcher=slurm", "dry_run=true", setup,
                          "hydra.launcher.qos=short"], env)
    assert res.returncode == 0, res.explain()
    head = next(line for line in res.stdout.splitlines() if line.startswith("slurm array "))
    assert head.startswith("slurm array smoke: 4 jobs, partition=None account=None qos=short "
                           "cpus_per_task=4 gpus_per_node=1 mem_gb=16 timeout_min=240 "
                           "signal_delay_s=120 max_num_timeout=3 array_parallelism=64"), head
    assert head.endswith("setup ['module load cuda', 'source ~/kz/.venv/bin/activate']")
    jobs = re.findall(r"^  job (\d+): (.*)$", res.stdout, re.M)
    assert [int(i) for i, _ in jobs] == [0, 1, 2, 3]
    assert sum("pack_members=[[3,1]]" in j for _, j in jobs) == 2
    assert all(" dry_run=" not in f" {j}" and "+experiments=smoke" in j for _, j in jobs), jobs
    assert not list(results.rglob("summary.json")) and not list(results.rglob("slurm"))
    res = sweep("smoke", [f"results_dir={results}", "launcher=slurm"], env)
    assert res.returncode == 2 and "there is no srun here" in res.stderr, res.explain()


# ----------------------------------------------------------------- make sweep

@pytest.mark.skipif(ANALYZE_MISSING, reason="src/kernelzoo/analyze.py does not exist yet")
@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_sweep_smoke(smoke_results, tmp_path):
    """``make sweep EXPERIMENT=smoke``: the sweep, then its analysis (report.md, capacity.csv);
    made again, with every point done, it analyses nothing (``records.analysed``).

    Runs on a copy of the session's finished smoke store (the sweep part is the same command
    tested above, so it only skips here); ``-o .venv/.installed`` keeps make from reinstalling
    the package when pyproject.toml is newer than the stamp (no network in tests).
    """
    results = copy_results(smoke_results.results, tmp_path / "results")
    venv = Path(PYTHON).parents[1]
    args = ["make", "-s", "-o", f"{venv}/.installed", "sweep", f"VENV={venv}",
            "EXPERIMENT=smoke", f"RESULTS={results}",
            f"ARGS=trainer.threads=1 results_dir={results}"]
    res = run_cmd(args, smoke_results.env, timeout=400)
    assert res.returncode == 0, res.explain()
    assert "Traceback" not in res.output, res.explain()
    assert "sweep smoke finished" in res.stdout
    exp = results / "smoke"
    report = (exp / "report.md").read_text()
    assert "smoke" in report
    with open(exp / "capacity.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows and {"feature_map", "observed_capacity", "outcome"} <= set(rows[0])
    assert {r["feature_map"] for r in rows} == {"elu", "dpfp"}
    analysed = (exp / "report.md").stat().st_mtime_ns
    again = run_cmd(args, smoke_results.env, timeout=400)  # every point done: no analysis
    assert again.returncode == 0, again.explain()
    assert f"the analysis of {exp} is up to date" in again.stdout, again.explain()
    assert (exp / "report.md").stat().st_mtime_ns == analysed


README_SEARCH = re.compile(r'^\s+make sweep EXPERIMENT=(\w+) ARGS="([^"]*search=bisect[^"]*)"$', re.M)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_readme_search_example_analyses_the_experiment_it_names(tmp_path, cli_env):
    """README's search example, its ARGS as written, on smoke's first grid narrowed to elu: the
    sweep runs under the name its ARGS give (``experiment=my_search``), and both ``make sweep``
    and ``make plots`` with those ARGS analyse that experiment, not EXPERIMENT."""
    experiment, args = README_SEARCH.search((REPO / "README.md").read_text()).groups()
    assert experiment == "figure2" and "experiment=my_search" in args.split()
    results = tmp_path / "results"
    venv = Path(PYTHON).parents[1]
    tiny = f"{args} grids=[0] feature_map=elu logger=none trainer.threads=1"
    make = ["make", "-s", "-o", f"{venv}/.installed", f"VENV={venv}", "EXPERIMENT=smoke",
            f"RESULTS={results}", f"ARGS={tiny}"]
    res = run_cmd([*make[:4], "sweep", *make[4:]], cli_env, timeout=400)
    assert res.returncode == 0, res.explain()
    assert "sweep my_search finished" in res.stdout, res.explain()
    assert f"analysed {len(run_ids(results, 'my_search'))} runs of my_search -> " in res.stdout
    assert (results / "my_search" / "report.md").is_file()
    assert sorted(p.name for p in results.iterdir()) == ["my_search"]  # no smoke store
    res = run_cmd([*make[:4], "plots", *make[4:]], cli_env, timeout=400)
    assert res.returncode == 0, res.explain()
    assert "runs of my_search -> " in res.stdout, res.explain()


@pytest.mark.slow
def test_grids_runs_some_grids_as_a_sweep_of_every_grid_would(smoke_results, tmp_path):
    """``grids=[2]`` trains only the third grid's point, under the run id the full sweep gave
    it; sweep.json records the selection and the experiment's size, so the report says the
    store is partial. On the finished store the same selection trains nothing."""
    results = tmp_path / "results"
    res = sweep("smoke", smoke_args(results, "grids=[2]"), smoke_results.env)
    assert res.returncode == 0, res.explain()
    assert f"sweep smoke, grids [2]: 1 of its {SMOKE_POINTS} points, 0 already done" in res.stdout
    [rid] = run_ids(results, "smoke")
    assert rid in run_ids(smoke_results.results, "smoke") and "-delta-" in rid
    [inv] = json_file(results / "smoke" / "sweep.json")["invocations"]
    assert (inv["points"], inv["experiment_points"], inv["grids"]) == (1, SMOKE_POINTS, [2])
    res = analyze([f"results_dir={results}", "experiment=smoke", "logger=none"],
                  smoke_results.env)
    assert res.returncode == 0, res.explain()
    report = (results / "smoke" / "report.md").read_text()
    assert f"- Points of the experiment: {SMOKE_POINTS}; with a summary: 1 (partial sweep)." \
        in report
    assert "1 point of grids [2] (1 trained)" in report
    assert (f"- Points of the experiment without a summary: {SMOKE_POINTS - 1} (`python -m "
            f"kernelzoo.sweep smoke dry_run=true results_dir={results}` names each point") in report

    full = copy_results(smoke_results.results, tmp_path / "full")
    res = sweep("smoke", smoke_args(full, "grids=[0,2]"), smoke_results.env)
    assert res.returncode == 0, res.explain()
    assert nonzero(outcomes(res.stdout)) == {"skipped": 5}, res.stdout


# ----------------------------------------------------------------- SIGKILL and resume

def _interrupted_run(results: Path) -> bool:
    """Some run directory holds a started run (config.yaml) without its summary."""
    d = runs_dir(results, "smoke")
    return d.is_dir() and any((p / "config.yaml").exists() and not (p / "summary.json").exists()
                              for p in d.iterdir())


@pytest.mark.slow
def test_kill_mid_sweep_then_resume(tmp_path, cli_env, background):
    """Basic launcher: SIGKILL mid-run after some runs finished, then rerun to completion.
    (Slow; the default run has the 2-worker variant in test_reliability.)"""
    results = tmp_path / "results"
    args = [PYTHON, "-m", "kernelzoo.sweep", "smoke", *smoke_args(results)]
    first = background(args, cli_env, "first")
    # kill while a run is in progress, after at least one has finished
    caught = first.wait_for(lambda b: len(b.done_ids()) >= 1 and _interrupted_run(results),
                            timeout=240, poll=0.02)
    assert caught, "the sweep ended before it could be killed mid-run:\n" + first.stdout
    first.kill()
    finished_before = set(first.done_ids())
    assert 1 <= len(finished_before) < SMOKE_POINTS - SMOKE_INFEASIBLE
    # every summary present after the kill is valid (written atomically)
    for rid in run_ids(results, "smoke"):
        if (runs_dir(results, "smoke") / rid / "summary.json").exists():
            store.read_summary(runs_dir(results, "smoke") / rid)

    second = sweep("smoke", smoke_args(results), cli_env)
    assert second.returncode == 0, second.explain()
    assert not finished_before & set(done_counts(second.stdout)), second.stdout
    assert outcomes(second.stdout).get("skipped", 0) >= len(finished_before), second.stdout
    counts = done_counts(first.stdout, second.stdout)
    assert all(n == 1 for n in counts.values()), counts
    summaries = check_complete_smoke_store(results)
    assert set(counts) == {r for r, s in summaries.items() if s["status"] != "infeasible"}


# ----------------------------------------------------------------- a diverging point

def test_diverged_point_does_not_stop_the_sweep(tmp_path, cli_env):
    """FAVOR+ on huge inputs: every feature underflows to 0, and the delta rule's sum-normalised
    keys (key_eps 0, as the authors) give 0/0 = NaN at step 1. The next point still runs."""
    results = tmp_path / "results"
    res = train(["--multirun", f"results_dir={results}", "trainer=smoke", "logger=none",
                 "trainer.threads=1", "d_key=4", "n_keys=3", "feature_map=favor",
                 "feature_map.m=4", "feature_map.input_scale=1000", "memory=delta,sum"], cli_env)
    assert res.returncode == 0, res.explain()
    assert "Traceback" not in res.output and "failed:" not in res.output, res.explain()
    totals = outcomes(res.stdout)
    assert totals.get("diverged") == 1 and sum(totals.values()) == 2, totals
    summaries = read_all(results, "adhoc")
    assert len(summaries) == 2
    [bad] = [s for s in summaries.values() if s["update_rule"] == "delta"]
    [good] = [s for s in summaries.values() if s["update_rule"] == "sum"]
    assert bad["status"] == "diverged"
    m = re.fullmatch(r"non-finite (train|eval) loss at step (\d+); at .+", bad["reason"] or "")
    assert m, bad["reason"]
    assert int(m.group(2)) == bad["steps"] >= 1
    assert bad["final_eval_loss"] is None
    assert good["status"] in ("converged", "plateau", "max_steps") and good["steps"] > bad["steps"]
    assert set(done_counts(res.stdout)) == set(summaries)
    # the diverged point's "done" line carries its reason
    assert re.search(rf"^done {re.escape(bad['run_id'])}: diverged .*\[non-finite", res.stdout,
                     re.M), res.stdout
